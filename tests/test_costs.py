"""Cost profiles: fitted from timed passes so that a noisy machine does not steer the drafter."""

import math

import pytest

from specviz.backends import transformers as tb
from specviz.backends.transformers import CachedLM
from specviz.costs import fit_profile
from specviz.errors import SpecvizError
from tests.fixtures.tiny import tiny_llama


def test_the_fastest_pass_of_each_length_counts():
    # a neighbour slowed one pass of each length; the fastest is the length's cost
    profile = fit_profile([[10.0, 31.0, 10.5], [30.0, 11.0, 12.0], [12.0, 40.0, 13.0]])
    assert profile == [1.0, 1.1, 1.2]


def test_a_dip_is_pooled_with_its_neighbours_and_the_profile_never_falls():
    # least squares under the order constraint: a run that falls is replaced by its mean
    assert fit_profile([[10.0], [9.0], [8.0], [12.0]]) == [1.0, 1.0, 1.0, 12.0 / 9.0]  # 10, 9, 8 pooled: 9
    assert fit_profile([[10.0], [12.0], [11.0], [13.0]]) == [1.0, 1.15, 1.15, 1.3]
    # the profile seen on a busy box: a 4-token pass measured cheaper than one token
    fastest = [10.0, 9.7, 9.2, 8.0, 8.7, 9.6, 9.8, 10.2, 9.2, 9.7, 10.9]
    profile = fit_profile([[t] for t in fastest])
    assert len(profile) == len(fastest) and profile[0] == 1.0
    assert all(b >= a for a, b in zip(profile, profile[1:]))
    # pooled: the first five (mean 9.12), then 9.6 alone, then 9.8, 10.2, 9.2, 9.7 (mean 9.725)
    want = [9.12] * 5 + [9.6] + [9.725] * 4 + [10.9]
    assert all(math.isclose(v, w / 9.12) for v, w in zip(profile, want))


def test_an_ordered_profile_is_kept_as_measured():
    times = [50.0, 50.5, 52.0, 60.0, 71.0]
    assert fit_profile([[t, t + 5] for t in times]) == [t / 50.0 for t in times]


@pytest.mark.parametrize("bad", [[], [[1.0], []]])
def test_a_length_without_a_timed_pass_is_refused(bad):
    with pytest.raises(SpecvizError):
        fit_profile(bad)


def test_a_model_measures_a_non_decreasing_profile_after_a_longer_context(monkeypatch):
    """The measurement feeds PROFILE_CONTEXT tokens of context (capped by the model's window) and
    returns a fitted profile, 1.0 first, never falling."""
    monkeypatch.setattr(tb, "_COSTS", {})
    model = tiny_llama(seed=2, layers=2)
    lm = CachedLM(model)
    fed = []
    real_feed = lm.feed
    monkeypatch.setattr(lm, "feed", lambda tokens, keep_logits=None: fed.append(len(tokens)) or real_feed(tokens, keep_logits))
    v = lm.cost_profile(6, [5, 6, 7])
    assert fed[0] == min(tb.PROFILE_CONTEXT, lm.context_length - 7)
    assert len(v) == 6 and v[0] == 1.0 and all(b >= a for a, b in zip(v, v[1:]))
    assert fed.count(6) in [k * tb.PROFILE_ROUNDS for k in range(1, tb.PROFILE_ATTEMPTS + 1)]  # more on a noisy box
    assert lm.cached == 0  # leaves the cache empty


def test_a_profile_measured_while_the_machine_was_busy_is_measured_again(monkeypatch):
    """Timed beside a busy neighbour, the rounds of each length disagreed and the fitted profile came
    out flat (1.0 for every length, shown as "measured on this machine"); the measurement is repeated
    while its rounds disagree by more than PROFILE_NOISE, and the quietest attempt is kept."""
    monkeypatch.setattr(tb, "_COSTS", {})
    lm = CachedLM(tiny_llama(seed=2, layers=2))
    n, rounds = 4, tb.PROFILE_ROUNDS
    busy = [[80.0 if r % 2 else 10.0 + g for g in range(n)] for r in range(rounds)]  # 8x apart, every length
    quiet = [[10.0 + 2 * g + 0.1 * r for g in range(n)] for r in range(rounds)]
    times = iter([t for attempt in (busy, quiet) for row in attempt for t in row])

    class Scripted:
        def __init__(self, device=None):
            self.ms = 0.0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.ms = next(times)

    monkeypatch.setattr(tb, "Timer", Scripted)
    v = lm.cost_profile(n, [5, 6, 7])
    assert v == fit_profile([[row[g] for row in quiet] for g in range(n)])  # the second, quiet attempt
    assert next(times, None) is None  # and no third
