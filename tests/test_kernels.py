"""MKL-packed linears: same numbers as torch, row-count independent, and the engine stays exact."""

import pytest
import torch
import torch.nn.functional as F

from specviz.backends import cpu_kernels as kernels
from specviz.drafters import ModelDrafter, PromptLookupDrafter
from specviz.events import IterationEvent
from specviz.engine import DecodeConfig, encode_prompt, speculative_decode, vanilla_decode
from specviz.backends.transformers import CachedLM
from tests.fixtures.tiny import tiny_llama

needs_mkl = pytest.mark.skipif(not kernels.available(torch.nn.Linear(2, 2)),
                               reason="this torch build has no MKL packed GEMM")


@pytest.fixture()
def packed_model():
    model = tiny_llama(seed=0, layers=4, sharpness=12.0)
    assert kernels.pack_linears(model) == kernels.packed_count(model) > 0
    return model


@needs_mkl
def test_packed_linear_matches_torch_for_every_row_count():
    torch.manual_seed(0)
    layer = torch.nn.Linear(96, 200)
    plain = torch.nn.Linear(96, 200)
    plain.load_state_dict(layer.state_dict())
    wrapper = torch.nn.Sequential(layer)
    assert kernels.pack_linears(wrapper) == 1 and isinstance(layer, kernels.PackedLinear)
    x = torch.randn(2, 80, 96)
    with torch.inference_mode():
        for rows in list(range(1, 20)) + [63, 64, 65, 80]:
            got, want = layer(x[:, :rows]), plain(x[:, :rows])
            assert got.shape == want.shape == (2, rows, 200)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _cpu_vendor() -> str:
    try:
        return open("/proc/cpuinfo").read().split("vendor_id", 1)[1].split(":", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


@needs_mkl
def test_packed_rows_do_not_depend_on_how_many_rows_share_the_call():
    """On Intel CPUs MKL's packed GEMM gives each row the same bits whatever the number of rows in
    the call; on AMD CPUs MKL takes other code paths and rows differ in the last bits (measured:
    up to 4e-7 on an AMD EPYC), so there only closeness holds (README: What is guaranteed)."""
    torch.manual_seed(1)
    layer = torch.nn.Linear(64, 300)
    kernels.pack_linears(torch.nn.Sequential(layer))
    x = torch.randn(kernels.MAX_ROWS, 64)
    bitwise = _cpu_vendor() == "GenuineIntel"
    with torch.inference_mode():
        full = layer(x)
        for rows in range(kernels.MIN_ROWS, kernels.MAX_ROWS + 1, 5):
            if bitwise:
                assert torch.equal(layer(x[:rows]), full[:rows]), rows
            else:
                torch.testing.assert_close(layer(x[:rows]), full[:rows], rtol=1e-5, atol=1e-6)


@needs_mkl
def test_pack_is_idempotent_reversible_and_stays_out_of_state_dict(packed_model):
    n = kernels.packed_count(packed_model)
    assert kernels.pack_linears(packed_model) == n
    assert not any("svz" in key for key in packed_model.state_dict())
    kernels.unpack_linears(packed_model)
    assert kernels.packed_count(packed_model) == 0
    assert all(type(m) is torch.nn.Linear for m in packed_model.modules() if isinstance(m, torch.nn.Linear))


@needs_mkl
def test_switched_off_or_not_float32(monkeypatch):
    assert kernels.pack_linears(tiny_llama(seed=0, layers=1)) > 0  # control: float32 packs here
    monkeypatch.setenv("SPECVIZ_PACKED", "0")
    assert kernels.pack_linears(tiny_llama(seed=0, layers=1)) == 0
    monkeypatch.delenv("SPECVIZ_PACKED")
    assert kernels.pack_linears(tiny_llama(seed=0, layers=1, dtype=torch.bfloat16)) == 0


@needs_mkl
@pytest.mark.parametrize("kind", ["lookup", "model"])
@pytest.mark.parametrize("gamma", [3, 6, 12])
def test_greedy_identical_with_packed_verify(kind, gamma, packed_model, draft_model, tok):
    target = CachedLM(packed_model, len(tok))
    for prompt in ["hello hello hello world", "The cat sat on the mat. The cat", "1, 2, 3, 4, 5, 6, 7"]:
        ids = encode_prompt(tok, prompt, True)
        cfg = DecodeConfig(gamma=gamma, max_new_tokens=48)
        expected = list(vanilla_decode(target, tok, ids, cfg))[-1].output_ids
        drafter = ModelDrafter(draft_model) if kind == "model" else PromptLookupDrafter(3, adaptive=False)
        events = list(speculative_decode(target, drafter, tok, ids, cfg))
        assert events[-1].output_ids == expected, (kind, gamma, prompt)
        verified = [len(e.proposed) + 1 for e in events if isinstance(e, IterationEvent)]
        assert max(verified) >= kernels.MIN_ROWS  # the packed path really verified something


@needs_mkl
def test_verify_logits_match_one_token_logits(packed_model):
    """A verify pass over 8 tokens gives the logits of 8 one-token steps (up to float rounding)."""
    lm = CachedLM(packed_model)
    ids = list(range(5, 30))
    lm.reset()
    lm.feed(ids[:10], keep_logits=1)
    together = lm.feed(ids[10:18])
    lm.rollback(10)
    apart = torch.cat([lm.feed([t]) for t in ids[10:18]])
    torch.testing.assert_close(together, apart, rtol=1e-4, atol=1e-4)
    assert torch.equal(together.argmax(-1), apart.argmax(-1))
    assert not torch.allclose(F.softmax(together, -1)[0], F.softmax(together, -1)[1])  # not trivial


def test_cpu_gqa_attention_gives_the_same_logits(tok):
    """Grouped-query SDPA without copying the KV cache: same numbers for 1 and several tokens."""
    model = tiny_llama(seed=3, layers=2)  # 4 query heads over 2 KV heads
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    lm = CachedLM(model)
    ids = list(range(5, 40))

    def logits():
        lm.reset()
        lm.feed(ids[:20], keep_logits=1)
        many = lm.feed(ids[20:27])
        one = lm.feed([ids[27]])
        return many, one

    from transformers.integrations import sdpa_attention

    was_on = getattr(sdpa_attention.use_gqa_in_sdpa, "_specviz", False)
    kernels.disable_cpu_gqa()
    want = logits()
    try:
        assert kernels.enable_cpu_gqa()
        got = logits()
    finally:
        if not was_on:
            kernels.disable_cpu_gqa()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
