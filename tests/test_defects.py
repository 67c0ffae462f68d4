"""The five defects an audit reproduced at 651ebc9, each pinned by a test that failed there, and
the engine driven by a stub target that has nothing but the Target protocol."""

import math

import pytest
import torch

from specviz.acceptance import acceptance_probability, verify
from specviz.backends.base import Target, Timer
from specviz.drafters import Drafter, PromptLookupDrafter, Proposal
from specviz.engine import DecodeConfig, Run, speculative_decode, vanilla_decode
from specviz.errors import SpecvizError
from specviz.sampling import SamplingConfig, make_generator
from specviz.theory import expected_tokens
from specviz.trace import Trace

V = 6
EOS = 5


class StubTarget:
    """A 'model' whose next-token logits depend only on the last token: the Target protocol and
    nothing else (no .model, no .device, no transformers)."""

    def __init__(self, table: torch.Tensor, context: int = 64):
        self.table = table  # (V, V): logits of the next token given the last one
        self.vocab_size = V
        self.cached = 0
        self._ids: list[int] = []
        self._context = context
        self.cost_calls = 0

    @property
    def context_length(self) -> int:
        return self._context

    @property
    def eos_ids(self) -> set[int]:
        return {EOS}

    def reset(self) -> None:
        self.cached, self._ids = 0, []

    def feed(self, tokens, keep_logits=None):
        self._ids += list(tokens)
        self.cached += len(tokens)
        keep = len(tokens) if keep_logits is None else keep_logits
        return torch.stack([self.table[t] for t in self._ids[-keep:]])

    def rollback(self, length: int) -> None:
        self._ids = self._ids[:length]
        self.cached = min(self.cached, length)

    def timer(self) -> Timer:
        return Timer(None)

    def cost_profile(self, max_tokens, context):
        self.cost_calls += 1
        return [1.0 + 0.1 * g for g in range(max_tokens)]

    def describe(self) -> dict:
        return {"name": "stub", "device": "none"}


class Tok:
    eos_token_id = EOS

    def decode(self, ids, skip_special_tokens=False):
        return "".join("abcde$"[i] for i in ids)


class Fixed(Drafter):
    """Proposes the same tokens every time (one-hot q)."""

    name = "fixed"

    def __init__(self, tokens):
        self.tokens = tokens

    def propose(self, ids, max_tokens, sampling, generator):
        return Proposal(self.tokens[:max_tokens], None, [1.0] * len(self.tokens[:max_tokens]), "fixed")


def chain_table(next_of: dict[int, int]) -> torch.Tensor:
    t = torch.full((V, V), -10.0)
    for a, b in next_of.items():
        t[a, b] = 10.0
    return t


def test_stub_target_is_a_target_and_drives_the_engine():
    target = StubTarget(chain_table({0: 1, 1: 2, 2: 3, 3: 4, 4: 0, 5: 0}))
    assert isinstance(target, Target)
    cfg = DecodeConfig(gamma=3, max_new_tokens=12)
    spec = Trace.of(speculative_decode(target, Fixed([1, 2, 3]), Tok(), [0], cfg))
    van = Trace.of(vanilla_decode(target, Tok(), [0], cfg))
    assert spec.output_ids == van.output_ids == [1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2]
    assert spec.summary.text == "bcdeabcdeabc"


def test_defect1_no_statistics_for_proposals_after_an_emitted_eos():
    """First token EOS with 8 proposals: one token, one kept proposal, not 8."""
    target = StubTarget(chain_table({0: EOS, EOS: EOS}))
    cfg = DecodeConfig(gamma=8, max_new_tokens=20)
    events = list(speculative_decode(target, Fixed([EOS] * 8), Tok(), [0], cfg))
    summary = events[-1]
    assert summary.new_tokens == 1 and summary.stop_reason == "eos"
    assert summary.accepted == 1 and summary.proposed == 1
    assert summary.accepted_by_position == [[1, 1]]
    assert Trace.of(events).by_position() == [(1, 1)]


def test_defect2_alpha_is_kept_over_examined():
    """alpha = 0.8, gamma = 4: the law says E[tokens] = 3.36; accepted/proposed fed into it says
    ~2.27. The engine reports the estimator the law needs."""
    gen = torch.Generator().manual_seed(0)
    accepted = examined = proposed = tokens = 0
    for _ in range(20000):
        k = 0
        while k < 4 and torch.rand((), generator=gen) < 0.8:
            k += 1
        accepted += k
        examined += k + (k < 4)
        proposed += 4
        tokens += k + 1
    alpha, naive = accepted / examined, accepted / proposed
    assert abs(alpha - 0.8) < 0.01
    assert abs(expected_tokens(alpha, 4) - tokens / 20000) < 0.03
    assert expected_tokens(naive, 4) < 2.4  # what the old estimator predicted

    # and the engine/trace compute alpha that way
    table = torch.zeros(V, V)  # uniform target: a one-hot proposal is kept with p = 1/6
    target = StubTarget(table)
    cfg = DecodeConfig(gamma=4, max_new_tokens=200, sampling=SamplingConfig(1.0), seed=1)
    trace = Trace.of(speculative_decode(target, Fixed([1, 2, 3, 4]), Tok(), [0], cfg))
    s = trace.summary
    assert s.alpha == pytest.approx(s.accepted / s.examined) == pytest.approx(trace.alpha)
    assert s.examined == sum(n for _, n in s.accepted_by_position) < s.proposed
    assert trace.alpha > trace.acceptance_rate


def test_defect3_pinned_cost_profile_reproduces_a_sampled_lookup_run():
    """Same seed + same pinned profile = same output, whatever this machine measures."""
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(3))
    prompt = [0, 1, 2, 0, 1, 2, 0, 1]
    outs = []
    for fake in ([1.0, 1.01, 1.02, 1.03, 1.04, 1.05], [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]):
        target = StubTarget(table)
        target.cost_profile = lambda n, ctx, f=fake: f[:n]  # two machines that measure differently
        cfg = DecodeConfig(gamma=5, max_new_tokens=40, sampling=SamplingConfig(1.0), seed=7,
                           costs=(1.0, 1.05, 1.1, 1.2, 1.3, 1.4))
        events = list(speculative_decode(target, PromptLookupDrafter(), Tok(), prompt, cfg))
        assert events[0].costs["source"] == "pinned"
        outs.append(events[-1].output_ids)
    assert outs[0] == outs[1]
    # and unpinned, the measured profile is used and recorded
    target = StubTarget(table)
    events = list(speculative_decode(target, PromptLookupDrafter(), Tok(), prompt,
                                     DecodeConfig(gamma=5, max_new_tokens=5)))
    assert target.cost_calls == 1 and events[0].costs["source"].startswith("measured")


@pytest.mark.parametrize("t", [1e-39, 1e-6, 5e-4])
def test_defect4_tiny_temperature_is_a_clear_error(t):
    with pytest.raises(SpecvizError, match="temperature must be 0"):
        SamplingConfig(t)
    with pytest.raises(SpecvizError, match="temperature"):
        DecodeConfig.from_settings(4, t, 0, 1.0, 8, 0)
    SamplingConfig(1e-3)  # the documented threshold itself is fine


def test_defect5_q_zero_for_a_proposed_token_raises():
    with pytest.raises(ValueError, match="q\\(x\\) = 0"):
        acceptance_probability(0.5, 0.0)
    p = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    with pytest.raises(ValueError):
        verify([1], p, q, make_generator(0))  # token 1 was "drawn" from a q that gives it 0


def test_run_rewind_goes_back_to_the_prompt():
    target = StubTarget(chain_table({0: 1, 1: 2, 2: 3, 3: 4, 4: 0}))
    run = Run("speculative", target, Tok(), [0, 4, 0], DecodeConfig(gamma=2, max_new_tokens=6), Fixed([1, 2]))
    run.start()
    from specviz.engine import speculative_step

    first = speculative_step(run, 2).emitted
    run.rewind()
    assert run.ids == [0, 4, 0] and target.cached == 2
    assert speculative_step(run, 2).emitted == first


def test_from_settings_validates_front_end_values():
    cfg = DecodeConfig.from_settings("4", "0.5", "3", 0.9, 32.0, "7")
    assert (cfg.gamma, cfg.sampling.temperature, cfg.sampling.top_k, cfg.max_new_tokens, cfg.seed) == (4, 0.5, 3, 32, 7)
    for bad, needle in [((0, 0, 0, 1, 8, 0), "gamma"), ((4, "x", 0, 1, 8, 0), "temperature"),
                        ((4, 0, -1, 1, 8, 0), "top-k"), ((4, 0, 0, 1.5, 8, 0), "top-p"),
                        ((4, 0, 0, 1, 8, 1.5), "seed"), ((4, math.inf, 0, 1, 8, 0), "temperature")]:
        with pytest.raises(SpecvizError, match=needle):
            DecodeConfig.from_settings(*bad)
