"""Sampled speculative output follows the target's distribution: exact enumeration on tiny
models, chi-square tests at fixed seeds.

False-alarm rate: each test rejects when its p-value is below ALPHA = 1e-3, so a correct engine
fails a given test with probability 0.1% over seeds; the seeds are fixed, so the suite is
deterministic.  The "power" tests show the same test catches known ways of breaking exactness.
"""


import pytest
import torch

import specviz.acceptance as acceptance
from specviz.check import chi_square, first_token_check
from specviz.drafters import EarlyExitDrafter, ModelDrafter, PromptLookupDrafter
from specviz.engine import DecodeConfig, encode_prompt, speculative_decode
from specviz.backends.transformers import CachedLM
from specviz.sampling import SamplingConfig, logits_to_probs

ALPHA = 1e-3


def make_drafter(kind, target_model, draft_model):
    return {"model": lambda: ModelDrafter(draft_model),
            "early-exit": lambda: EarlyExitDrafter(target_model, 1),
            "lookup": lambda: PromptLookupDrafter(max_ngram=2, adaptive=False)}[kind]()


@pytest.mark.parametrize("kind", ["model", "early-exit", "lookup"])
@pytest.mark.parametrize("sampling", [SamplingConfig(1.0), SamplingConfig(0.7, top_k=8, top_p=0.9)])
def test_first_token_matches_target(kind, sampling, target_model, draft_model, tok):
    target = CachedLM(target_model, len(tok))
    # a prompt whose last character recurs, so prompt lookup has proposals too
    ids = encode_prompt(tok, "ab ab ab a", False)
    cfg = DecodeConfig(gamma=4, sampling=sampling, seed=11)
    res = first_token_check(target, make_drafter(kind, target_model, draft_model), tok, ids, cfg, 1500)
    assert res.accept_rate is not None and 0 < res.accept_rate < 1  # both branches exercised
    assert res.p_value > ALPHA, (res.chi2, res.dof, res.tv)


def exact_joint(target, tok, ids, sampling, depth):
    """The target's exact distribution over its first ``depth`` tokens (enumerated)."""
    out = {}

    def rec(prefix, prob):
        if len(prefix) == depth:
            out[tuple(prefix)] = prob
            return
        target.reset()
        p = logits_to_probs(target.feed(ids + prefix)[-1], sampling).double()
        for t in torch.nonzero(p > 0).flatten().tolist():
            rec(prefix + [t], prob * float(p[t]))

    rec([], 1.0)
    return out


def sample_joint(target, drafter_fn, tok, ids, sampling, depth, n, seed):
    counts = {}
    for i in range(n):
        cfg = DecodeConfig(gamma=4, max_new_tokens=depth + 3, sampling=sampling, seed=seed * 100003 + i)
        out = []
        for ev in speculative_decode(target, drafter_fn(), tok, ids, cfg):
            if ev.event == "iteration":
                out += ev.emitted
                if len(out) >= depth:
                    break
        key = tuple(out[:depth])
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_joint_of_three_tokens_matches_target(target_model, draft_model, tok):
    """Whole runs (acceptance at every position, resampling, bonus, rollback between iterations):
    the joint law of the first three tokens equals the target's."""
    target = CachedLM(target_model, len(tok))
    ids = encode_prompt(tok, "joint", True)
    sampling = SamplingConfig(1.0, top_k=3)
    exact = exact_joint(target, tok, ids, sampling, 3)
    n = 1200
    counts = sample_joint(target, lambda: ModelDrafter(draft_model), tok, ids, sampling, 3, n, seed=1)
    stat, dof, p = chi_square(counts, exact, n)
    assert p > ALPHA, (stat, dof)


def test_power_always_accepting_is_caught(target_model, draft_model, tok, monkeypatch):
    """Keeping every proposal (output = the draft's law) must fail the same test."""
    monkeypatch.setattr(acceptance, "acceptance_probability", lambda p, q: 1.0)
    target = CachedLM(target_model, len(tok))
    ids = encode_prompt(tok, "ab ab ab a", False)
    cfg = DecodeConfig(gamma=4, sampling=SamplingConfig(1.0), seed=11)
    res = first_token_check(target, ModelDrafter(draft_model), tok, ids, cfg, 1500)
    assert res.p_value < 1e-6


def test_power_greedy_draft_under_sampling_is_caught(target_model, draft_model, tok, monkeypatch):
    """transformers #32867: a draft that decodes greedily while q claims its sampled law."""
    import specviz.drafters.model as model_drafter

    calls = []

    def greedy(probs, gen):
        calls.append(1)
        return int(probs.argmax())

    monkeypatch.setattr(model_drafter, "sample", greedy)
    target = CachedLM(target_model, len(tok))
    ids = encode_prompt(tok, "ab ab ab a", False)
    cfg = DecodeConfig(gamma=4, sampling=SamplingConfig(1.0), seed=11)
    res = first_token_check(target, ModelDrafter(draft_model), tok, ids, cfg, 1500)
    assert calls, "the broken (greedy) draft never ran"
    assert res.p_value < 1e-6


def test_chi_square_pooling_and_impossible_tokens():
    exact = {0: 0.5, 1: 0.3, 2: 0.199, 3: 0.001}
    stat, dof, p = chi_square({0: 500, 1: 300, 2: 199, 3: 1}, exact, 1000)
    assert stat < 1e-9 and p > 0.99 and dof == 3  # bins 0, 1, 2 and the pooled rest (token 3)
    stat, dof, p = chi_square({0: 500, 1: 300, 2: 199, 9: 1}, {0: 0.5, 1: 0.3, 2: 0.2}, 1000)
    assert p == 0.0  # a token the target can't produce
