"""The acceptance math on hand-made p and q."""

import torch

from specviz.acceptance import acceptance_probability, residual, verify
from specviz.sampling import make_generator


def _rig(monkeypatch, draws):
    it = iter(draws)
    import specviz.acceptance as acc

    monkeypatch.setattr(acc, "uniform", lambda gen: next(it))


def test_acceptance_probability():
    assert acceptance_probability(0.3, 0.6) == 0.5
    assert acceptance_probability(0.6, 0.3) == 1.0
    assert acceptance_probability(0.0, 0.4) == 0.0


def test_residual_is_normalised_positive_part():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.6, 0.2])
    r = residual(p, q)
    assert torch.allclose(r, torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    p = torch.tensor([0.4, 0.4, 0.2])
    q = torch.tensor([0.1, 0.2, 0.7])
    assert torch.allclose(residual(p, q), torch.tensor([0.6, 0.4, 0.0], dtype=torch.float64))


def test_residual_falls_back_to_p_when_p_equals_q():
    p = torch.tensor([0.5, 0.5])
    assert torch.allclose(residual(p, p.clone()), p.double())


def test_single_position_output_is_exactly_p():
    """P(out = x) = q(x) min(1, p/q) + P(reject) r(x) = p(x), for arbitrary p, q."""
    torch.manual_seed(0)
    for _ in range(20):
        p = torch.softmax(torch.randn(7) * 2, -1).double()
        q = torch.softmax(torch.randn(7) * 2, -1).double()
        kept = q * torch.minimum(torch.ones_like(p), p / q)
        out = kept + (1 - kept.sum()) * residual(p, q)
        assert torch.allclose(out, p, atol=1e-12)


def _pq():
    p = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8]])
    q = torch.tensor([[0.3, 0.6, 0.1], [0.5, 0.25, 0.25]])
    return p, q


def test_all_accepted_gives_bonus_from_last_p(monkeypatch):
    p, q = _pq()
    _rig(monkeypatch, [0.99, 0.99])
    v = verify([0, 1], p, q, make_generator(0))  # p/q = 2 and 2: always kept
    assert v.accepted == 2 and v.kind == "bonus"
    assert v.accept_probs == [1.0, 1.0]
    assert torch.equal(v.p_next, p[2])


def test_rejection_resamples_from_residual(monkeypatch):
    p, q = _pq()
    _rig(monkeypatch, [0.1, 0.9])
    # x0 = 0: p/q = 2 -> kept; x1 = 0: p/q = 0.2/0.5 = 0.4, draw 0.9 -> rejected
    v = verify([0, 0], p, q, make_generator(0))
    assert v.accepted == 1 and v.kind == "resample"
    assert abs(v.accept_probs[1] - 0.4) < 1e-6
    assert v.draws == [0.1, 0.9]
    expected = residual(p[1], q[1]).float()  # [0, 1, 0.2/... ] -> only where p > q
    assert torch.allclose(v.p_next, expected)
    assert v.p_next[0] == 0  # the rejected token can't come back when p < q there
    assert v.next_token in (1, 2)


def test_first_rejection_stops_examination(monkeypatch):
    p, q = _pq()
    _rig(monkeypatch, [0.95, 0.0])
    v = verify([1, 0], p, q, make_generator(0))  # x0 = 1: p/q = 0.5, draw 0.95 -> rejected
    assert v.accepted == 0
    assert v.draws[1] is None


def test_one_hot_q_for_lookup(monkeypatch):
    p, _ = _pq()
    _rig(monkeypatch, [0.25])
    v = verify([1], p[:2], None, make_generator(0))  # q one-hot: accept with p(x) = 0.3 > 0.25
    assert v.accepted == 1 and abs(v.accept_probs[0] - 0.3) < 1e-6
    _rig(monkeypatch, [0.35])
    v = verify([1], p[:2], None, make_generator(0))
    assert v.accepted == 0
    # residual of one-hot q: p with x removed, renormalised
    assert torch.allclose(v.p_next, torch.tensor([0.6 / 0.7, 0.0, 0.1 / 0.7]))


def test_greedy_one_hot_rule():
    p = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    v = verify([0], p, q, make_generator(0))
    assert v.accepted == 0 and v.next_token == 1  # target's argmax
    q = torch.tensor([[0.0, 1.0, 0.0]])
    v = verify([1], p, q, make_generator(0))
    assert v.accepted == 1 and v.kind == "bonus" and v.next_token == 0


def test_empty_proposal_draws_the_next_token_from_p():
    """With nothing proposed the rule's only draw is the "bonus" draw from p itself (the engine
    labels such an iteration a plain step): its law must be p."""
    p = torch.tensor([[0.2, 0.0, 0.8]])
    gen = make_generator(0)
    draws = [verify([], p, None, gen) for _ in range(2000)]
    assert all(v.accepted == 0 and v.kind == "bonus" and torch.equal(v.p_next, p[0]) for v in draws)
    share = sum(v.next_token == 2 for v in draws) / len(draws)
    assert abs(share - 0.8) < 0.04 and not any(v.next_token == 1 for v in draws)


def test_one_hot_p_rejection_gives_what_the_residual_gives():
    """A greedy row (one-hot p) refusing a one-hot q's token resamples p itself: the same token and
    the same p_next, bit for bit, as norm(max(0, p - q)) computed in full."""
    from specviz.acceptance import one_hot

    p = torch.zeros(3, 50)
    p[0, 7], p[1, 3], p[2, 9] = 1.0, 1.0, 1.0
    v = verify([7, 4], p, None, make_generator(0))
    assert v.accepted == 1 and v.kind == "resample" and v.next_token == 3
    full = residual(p[1], one_hot(4, p[1])).float()
    assert torch.equal(v.p_next, full) and v.draws[1] is not None
    # a p with more than one token in its support still goes through the residual
    p[1, 4], p[1, 3] = 0.0, 0.0
    p[1, 11], p[1, 12] = 0.5, 0.5
    v = verify([7, 4], p, None, make_generator(0))
    assert v.accepted == 1 and v.next_token in (11, 12)
    assert torch.equal(v.p_next, residual(p[1], one_hot(4, p[1])).float())


def test_greedy_verdict_from_argmaxes_is_the_full_rules():
    """``verify_logits`` under greedy with a one-hot q takes the argmaxes alone (``verify_greedy``):
    the same verdict as ``verify`` on the one-hot rows, coins and generator state included, on
    logits with agreeing, refused and tied proposals, and lengths 0..5."""
    from specviz.acceptance import verify_logits
    from specviz.sampling import SamplingConfig, logits_to_probs

    greedy = SamplingConfig(0.0)
    g = torch.Generator().manual_seed(3)
    seen = set()
    for trial in range(200):
        gamma = trial % 6
        logits = torch.randn(gamma + 1, 50, generator=g)
        if trial % 7 == 0:
            logits[:, 11] = logits[:, 12] = logits.max() + 1  # a tie: the first index is the argmax
        best = logits.argmax(-1).tolist()
        proposed = [b if torch.rand((), generator=g) < 0.7 else (b + 1) % 50 for b in best[:gamma]]
        fast_gen, full_gen = make_generator(trial), make_generator(trial)
        fast, p_at = verify_logits(proposed, logits, None, greedy, fast_gen)
        full = verify(proposed, logits_to_probs(logits, greedy), None, full_gen)
        assert (fast.accepted, fast.accept_probs, fast.draws, fast.next_token, fast.kind) == \
            (full.accepted, full.accept_probs, full.draws, full.next_token, full.kind)
        assert torch.equal(fast.p_next, full.p_next) and fast.p_next.dtype == full.p_next.dtype
        assert p_at == [float(logits_to_probs(logits, greedy)[i, x]) for i, x in enumerate(proposed)]
        assert torch.equal(fast_gen.get_state(), full_gen.get_state())
        seen.add((fast.kind, fast.accepted == gamma))
    assert {("bonus", True), ("resample", False)} <= seen
