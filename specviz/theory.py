"""Leviathan et al. 2023: what speculation should buy, from an acceptance rate a, a proposal
length gamma, a draft cost c (one draft step / one target step) and a verify cost v (one
verify pass of gamma + 1 tokens / one 1-token target step).
"""

from __future__ import annotations

import math


def expected_tokens(a: float, gamma: int) -> float:
    """E[tokens emitted per iteration] = (1 - a^(gamma+1)) / (1 - a)  (gamma + 1 when a = 1)."""
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance rate must be in [0, 1], got {a}")
    if gamma < 0:
        raise ValueError("gamma must be >= 0")
    if a >= 1.0:
        return float(gamma + 1)
    return (1.0 - a ** (gamma + 1)) / (1.0 - a)


def accepted_length_pmf(a: float, gamma: int) -> list[float]:
    """P(k proposals kept), k = 0..gamma: a truncated geometric distribution."""
    pmf = [(a ** k) * (1.0 - a) for k in range(gamma)]
    pmf.append(a ** gamma)
    return pmf


def predicted_speedup(a: float, gamma: int, c: float, v: float = 1.0) -> float:
    """Speedup over plain decoding = E[tokens] / (gamma * c + v)."""
    cost = gamma * c + v
    if cost <= 0:
        raise ValueError("the cost of an iteration must be positive")
    return expected_tokens(a, gamma) / cost


def best_gamma(a: float, c: float, v: float | list[float] = 1.0, max_gamma: int = 16) -> tuple[int, float]:
    """The gamma in 1..max_gamma with the highest predicted speedup, and that speedup.

    ``v`` may be a constant or a list where v[g] is the verify cost of g + 1 tokens.
    """
    best = (1, -math.inf)
    for g in range(1, max_gamma + 1):
        vg = v if isinstance(v, (int, float)) else v[min(g, len(v) - 1)]
        s = predicted_speedup(a, g, c, vg)
        if s > best[1]:
            best = (g, s)
    return best


def measured_costs(gammas: list[int], verify_ms_by_gamma: dict[int, float], draft_ms: float,
                   step_ms: float) -> tuple[float, dict[int, float]]:
    """(c, v) from measured times, in units of one plain 1-token step: v[g] is the mean verify
    time of the iterations that proposed g tokens (``verify_ms_by_gamma`` holds their total),
    c the draft time per proposed token."""
    counts: dict[int, int] = {}
    for g in gammas:
        counts[g] = counts.get(g, 0) + 1
    v = {g: verify_ms_by_gamma[g] / n / step_ms for g, n in counts.items()}
    proposed = sum(gammas)
    return (draft_ms / proposed / step_ms if proposed else 0.0), v


def predicted_speedup_mixed(a: float, gammas: list[int], c: float, v: dict[int, float]) -> float:
    """Predicted speedup of a run whose iterations proposed ``gammas[i]`` tokens each (0 = a
    plain step), with verify cost v[g] (relative to a 1-token step) for each length used:
    sum of E[tokens] over sum of costs.  With a single gamma this is :func:`predicted_speedup`."""
    tokens = sum(expected_tokens(a, g) if g else 1.0 for g in gammas)
    cost = sum(g * c + v[g] for g in gammas)
    return tokens / cost if cost > 0 else 0.0


def cost_model(gammas: list[int], verify_ms_by_gamma: dict[int, float], draft_ms: float, step_ms: float,
               alpha: float | None) -> tuple[float, dict[int, float], float]:
    """(c, v, predicted speedup) of a run (or runs) from measured times and the measured
    per-position acceptance alpha, one plain step as the unit. The bench and the app use this."""
    c, v = measured_costs(gammas, verify_ms_by_gamma, draft_ms, step_ms)
    return c, v, (predicted_speedup_mixed(alpha or 0.0, gammas, c, v) if gammas else 0.0)
