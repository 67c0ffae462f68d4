"""The in-place KV cache layer: the same keys and values as transformers' DynamicLayer through any
sequence of appends and crops, and the padded-key view the exact attention reads."""

import torch
from transformers.cache_utils import DynamicLayer

from specviz.backends import kv


def test_roomy_layer_holds_what_dynamic_layer_holds_through_appends_and_crops():
    gen = torch.Generator().manual_seed(0)
    plain, roomy = DynamicLayer(), DynamicLayer()
    roomy.__class__ = kv.RoomyLayer
    steps = [("add", 37), ("add", 1), ("crop", 1), ("add", 11), ("crop", 7), ("add", 300), ("add", 5),
             ("crop", 120), ("add", 1)]
    for what, n in steps:
        if what == "add":
            k, v = torch.randn(1, 3, n, 8, generator=gen), torch.randn(1, 3, n, 8, generator=gen)
            got = roomy.update(k, v)
            want = plain.update(k, v)
            assert all(torch.equal(a, b) for a, b in zip(got, want))
        else:
            plain.crop(-n)
            roomy.crop(-n)
        assert roomy.get_seq_length() == plain.get_seq_length()
        assert torch.equal(roomy.keys, plain.keys) and torch.equal(roomy.values, plain.values)
    roomy.reset()
    assert roomy.get_seq_length() == 0


def test_room_widens_a_buffer_view_and_refuses_a_plain_tensor():
    layer = DynamicLayer()
    layer.__class__ = kv.RoomyLayer
    k = torch.randn(1, 3, 70, 8)
    keys, _ = layer.update(k, k.clone())
    wide = kv.room(keys, 128)
    assert wide is not None and wide.shape == (1, 3, 128, 8)
    assert torch.equal(wide[:, :, :70], k) and wide.data_ptr() == keys.data_ptr()
    assert kv.room(keys, layer._kbuf.shape[-2]) is not None
    assert kv.room(keys, layer._kbuf.shape[-2] + 1) is None  # past the buffer
    assert kv.room(k, 128) is None  # a tensor with no room after it
