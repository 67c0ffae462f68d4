"""Comparing sampled first tokens with the target's exact distribution (the statistics of
``specviz.check``, for counts gathered elsewhere)."""

from __future__ import annotations

from dataclasses import dataclass

from ..check import chi_square


@dataclass
class Fit:
    samples: int
    tv: float  # total variation distance between the sampled frequencies and p
    chi2: float
    dof: int
    p_value: float


def fit(counts: dict[int, int], exact: dict[int, float]) -> Fit:
    n = sum(counts.values())
    tv = 0.5 * sum(abs(counts.get(t, 0) / n - exact.get(t, 0.0)) for t in set(exact) | set(counts))
    stat, dof, pv = chi_square(counts, exact, n)
    return Fit(n, tv, stat, dof, pv)
