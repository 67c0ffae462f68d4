"""Token Recycling: the successor table, its harvest from verify logits, exactness (greedy equality
with vanilla decoding, and the sampled joint law of three tokens)."""

import pytest
import torch

from specviz.backends.transformers import CachedLM
from specviz.check import chi_square
from specviz.drafters import Drafter, Proposal, RecyclingDrafter, parse_drafter
from specviz.drafters.recycling import RecyclingKind
from specviz.engine import DecodeConfig, encode_prompt, speculative_decode, vanilla_decode
from specviz.errors import SpecvizError
from specviz.sampling import SamplingConfig
from tests.test_distribution import ALPHA, exact_joint, sample_joint
from tests.test_engine import PROMPTS


class Eager(RecyclingDrafter):
    """Always believes its chain: every recycled successor is proposed (exercises verification)."""

    PRIOR_FIRST = PRIOR_NEXT = (0.99,) * 5


def test_harvest_maps_rows_to_the_tokens_they_follow():
    d = RecyclingDrafter(10, top_k=2, lookup=False)
    logits = torch.full((3, 10), -10.0)
    logits[0, 7] = 5.0  # after token 4 (the pending token)
    logits[1, 8] = 5.0  # after proposal 5
    logits[2, 9] = 5.0  # after proposal 6
    d.harvest([1, 2, 4, 5, 6], logits)
    assert d.next_of(None, 4)[0] == 7 and d.next_of(None, 5)[0] == 8 and d.next_of(None, 6)[0] == 9
    assert d.next_of(2, 4)[0] == 7 and d.next_of(4, 5)[0] == 8  # token pairs too
    assert d.succ[4, 1] >= 0 and d.prob[4, 0] > 0.9
    assert d.next_of(None, 3) == (-1, 0.0)
    # the chain follows top successors: 4 -> 7 (then nothing is known after 7)
    assert d.chain([0, 4], 5)[0] == [7]
    d.harvest([7], torch.nn.functional.one_hot(torch.tensor([4]), 10).float() * 9)
    assert d.chain([0, 4], 5)[0] == [7, 4, 7, 4, 7]
    d.reset([])
    assert d.chain([0, 4], 5) == ([], [])


def test_pair_successor_wins_over_the_single_token():
    d = RecyclingDrafter(10, top_k=1, lookup=False)
    a = torch.full((1, 10), -10.0)
    a[0, 1] = 5.0
    d.harvest([2, 3], a)  # after (2, 3): 1
    b = torch.full((1, 10), -10.0)
    b[0, 8] = 5.0
    d.harvest([5, 3], b)  # after (5, 3): 8; after 3 alone, the latest: 8
    assert d.next_of(2, 3)[0] == 1 and d.next_of(5, 3)[0] == 8 and d.next_of(0, 3)[0] == 8


def test_cost_aware_choice_and_learning():
    d = RecyclingDrafter(10, top_k=1, lookup=False)
    d.costs = [1.0] + [10.0] * 10  # verification costs 10 steps: nothing pays
    logits = torch.full((1, 10), -10.0)
    logits[0, 4] = 10.0
    d.harvest([3, 4], logits)  # 4 -> 4 with p ~ 1
    assert d.propose([3, 4], 4, None, None).tokens == []
    d.costs = [1.0] * 11
    p = d.propose([3, 4], 4, None, None)
    assert p.tokens == [4, 4, 4, 4] and "recycled" in p.reason
    before = d.keep_chance(4, first=True)
    for _ in range(30):
        d.propose([3, 4], 4, None, None)
        d.observe(4, 0)
    assert d.keep_chance(4, first=True) < before / 3


@pytest.mark.parametrize("make", [lambda V: Eager(V, top_k=4, lookup=False),
                                  lambda V: RecyclingDrafter(V, top_k=4, lookup=True),
                                  lambda V: Eager(V, top_k=2, lookup=True, pairs=False)])
@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_identical_to_vanilla(make, gamma, target_model, tok):
    target = CachedLM(target_model, len(tok))
    proposed = 0
    for prompt in PROMPTS:
        ids = encode_prompt(tok, prompt, True)
        cfg = DecodeConfig(gamma=gamma, max_new_tokens=40, costs=(1.0, 1.05, 1.1, 1.15, 1.2))
        expected = list(vanilla_decode(target, tok, ids, cfg))[-1].output_ids
        events = list(speculative_decode(target, make(len(tok)), tok, ids, cfg))
        assert events[-1].output_ids == expected, prompt
        proposed += events[-1].proposed
    assert proposed > 0


def test_recycled_proposals_are_verified(target_model, tok):
    target = CachedLM(target_model, len(tok))
    ids = encode_prompt(tok, "The cat sat on the mat. The cat", True)
    cfg = DecodeConfig(gamma=4, max_new_tokens=60, costs=(1.0, 1.05, 1.1, 1.15, 1.2))
    events = [e for e in speculative_decode(target, Eager(len(tok), lookup=False), tok, ids, cfg)
              if e.event == "iteration"]
    assert any(e.proposed and "recycled" in e.reason for e in events)
    assert any(e.accepted > 0 for e in events)


def test_joint_of_three_tokens_matches_target(target_model, tok):
    """Sampled runs with recycled drafts: the first three tokens follow the target's law."""
    target = CachedLM(target_model, len(tok))
    ids = encode_prompt(tok, "joint", True)
    sampling = SamplingConfig(1.0, top_k=3)
    exact = exact_joint(target, tok, ids, sampling, 3)
    n = 1200
    counts = sample_joint(target, lambda: Eager(len(tok), top_k=3, lookup=False), tok, ids, sampling, 3, n, seed=5)
    stat, dof, p = chi_square(counts, exact, n)
    assert p > ALPHA, (stat, dof)


def test_kind_parses_and_checks():
    assert parse_drafter("recycling", []) == {"kind": "recycling"}
    assert parse_drafter("recycling:only", []) == {"kind": "recycling", "lookup": False}
    assert parse_drafter("recycling:4", []) == {"kind": "recycling", "top_k": 4}
    with pytest.raises(SpecvizError, match="top_k"):
        RecyclingKind().check({"kind": "recycling", "top_k": 0}, "pair x")
    with pytest.raises(SpecvizError, match="lookup"):
        RecyclingKind().check({"kind": "recycling", "lookup": "yes"}, "pair x")


def test_base_drafter_ignores_harvest():
    class Plain(Drafter):
        def propose(self, ids, max_tokens, sampling, generator):
            return Proposal([], None)

    Plain().harvest([1, 2], torch.zeros(1, 5))  # the optional hook is a no-op by default


def test_the_fixed_copy_chains_its_table_alone(target_model, tok):
    """The Lab's sweep of fixed γ: the recycled chain alone, as far as asked where the table has
    successors, no lookup and no length choice; greedy output still equals vanilla decoding's."""
    d = RecyclingDrafter(len(tok), top_k=4, lookup=True)
    f = d.fixed()
    assert f is not d and f.fixed_chain and not f.lookup and d.lookup and "fixed length" in f.name
    target = CachedLM(target_model, len(tok))
    ids = encode_prompt(tok, "The cat sat on the mat. The cat", True)
    cfg = DecodeConfig(gamma=4, max_new_tokens=40, costs=(1.0, 1.05, 1.1, 1.15, 1.2))
    expected = list(vanilla_decode(target, tok, ids, cfg))[-1].output_ids
    events = list(speculative_decode(target, f, tok, ids, cfg))
    assert events[-1].output_ids == expected
    its = [e for e in events if e.event == "iteration" and e.proposed]
    assert its and all("recycled chain" in e.reason and "fixed length" in e.reason for e in its)
    assert any(len(e.proposed) == 4 for e in its)
