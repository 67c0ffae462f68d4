import pytest
import torch

from specviz.errors import SpecvizError
from specviz.sampling import SamplingConfig, logits_to_probs, make_generator, sample


def test_greedy_is_one_hot_on_first_argmax():
    logits = torch.tensor([0.5, 2.0, 2.0, -1.0])
    p = logits_to_probs(logits, SamplingConfig(0.0))
    assert p.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_temperature_scales_softmax():
    logits = torch.tensor([1.0, 2.0, 3.0])
    p = logits_to_probs(logits, SamplingConfig(2.0))
    assert torch.allclose(p, torch.softmax(logits / 2.0, -1))


def test_top_k_keeps_k_largest_and_renormalises():
    logits = torch.tensor([1.0, 4.0, 3.0, 2.0])
    p = logits_to_probs(logits, SamplingConfig(1.0, top_k=2))
    assert p[0] == 0 and p[3] == 0
    assert torch.allclose(p[[1, 2]], torch.softmax(torch.tensor([4.0, 3.0]), -1))


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    p = logits_to_probs(probs.log(), SamplingConfig(1.0, top_p=0.8))
    # 0.5 < 0.8, 0.5 + 0.3 reaches 0.8: the first two stay
    assert (p > 0).tolist() == [True, True, False, False]
    assert torch.allclose(p[:2], torch.tensor([0.625, 0.375]))
    p = logits_to_probs(probs.log(), SamplingConfig(1.0, top_p=0.81))
    assert (p > 0).tolist() == [True, True, True, False]


def test_top_p_always_keeps_one_token():
    p = logits_to_probs(torch.tensor([5.0, 0.0, 0.0]), SamplingConfig(1.0, top_p=0.01))
    assert p.tolist() == [1.0, 0.0, 0.0]


def test_rows_processed_independently():
    logits = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    p = logits_to_probs(logits, SamplingConfig(1.0, top_k=1))
    assert p.tolist() == [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]


def test_seeded_sampling_repeats():
    probs = torch.softmax(torch.randn(50), -1)
    a = [sample(probs, g) for g in [make_generator(7)] for _ in range(20)]
    g = make_generator(7)
    b = [sample(probs, g) for _ in range(20)]
    assert a == b


def test_one_hot_needs_no_draw_but_any_other_mass_does():
    """A one-hot p (every greedy step) has one outcome, returned without touching the generator;
    a distribution with any other mass, however small, is still drawn from (exactness)."""
    one_hot = torch.zeros(1000)
    one_hot[417] = 1.0
    g, ref = make_generator(3), make_generator(3)
    assert [sample(one_hot, g) for _ in range(5)] == [417] * 5
    assert torch.equal(g.get_state(), ref.get_state())
    almost = one_hot.clone()
    almost[3] = 1e-30
    sample(almost, g)
    assert not torch.equal(g.get_state(), ref.get_state())
    tiny_rival = torch.zeros(2)
    tiny_rival[0], tiny_rival[1] = 1e-3, 1.0
    draws = [sample(tiny_rival, make_generator(s)) for s in range(6000)]
    assert 0 < draws.count(0) < 30  # ~6 expected: the rival is not rounded away


@pytest.mark.parametrize("kwargs,needle", [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_k": -1}, "top-k"),
    ({"top_k": 1.5}, "top-k"),
    ({"top_p": 0.0}, "top-p"),
    ({"top_p": 1.5}, "top-p"),
])
def test_bad_settings_raise_clear_errors(kwargs, needle):
    with pytest.raises(SpecvizError, match=needle):
        SamplingConfig(**kwargs)


def test_argmax_matches_torch_first_index_on_ties_and_nan():
    """The fast CPU argmax (numpy's kernel) picks what torch.argmax picks: greedy decoding's token."""
    from specviz.sampling import argmax

    g = torch.Generator().manual_seed(0)
    rows = torch.randn(7, 49152, generator=g)
    rows[1, 10] = rows[1, 20] = rows[1].max() + 1  # a tie: the first index wins
    rows[2, 5] = float("nan")  # NaN counts as the largest, as in torch
    rows[3] = 0.0  # all equal
    rows[4, -1] = float("inf")
    assert torch.equal(argmax(rows), rows.argmax(-1))
    for r in rows:
        assert int(argmax(r)) == int(r.argmax())
    cols = rows[:, :4096].T  # a strided view, and a 3-D stack
    assert torch.equal(argmax(cols), cols.argmax(-1))
    assert torch.equal(argmax(rows.view(7, 4, -1)), rows.view(7, 4, -1).argmax(-1))
    half = rows.half()  # other dtypes take torch's own path
    assert torch.equal(argmax(half), half.argmax(-1))
    assert torch.equal(logits_to_probs(rows[:2], SamplingConfig(0.0)).argmax(-1), rows[:2].argmax(-1))
