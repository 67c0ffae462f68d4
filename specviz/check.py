"""Does speculative sampling follow the target's distribution?  Sample many first tokens
speculatively and compare them with the target's exact distribution (chi-square, TV distance).

Each sample is one real speculative iteration (drafter proposals, acceptance test, resample or
bonus) from the same prefilled prompt: the cache is rolled back between samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .engine import DecodeConfig, Run, speculative_step
from .sampling import logits_to_probs


@dataclass
class CheckResult:
    samples: int
    exact: dict[int, float]  # the target's distribution of the first token (tokens with p > 0)
    counts: dict[int, int]
    tv: float
    chi2: float
    dof: int
    p_value: float
    accept_rate: float | None
    tv_noise: float = 0.0  # median TV of as many exact draws from the target: what sampling noise alone gives

    def to_dict(self, tokenizer=None, top: int = 20) -> dict:
        """The statistics, and the two distributions side by side: every token sampled at least once
        and the target's ``top`` likeliest (id, text where a tokenizer is given, target p, samples),
        likeliest first, then the rest of the vocabulary as one entry (the whole vocabulary would be
        ~50k entries of near-zero mass)."""
        tested = self.dof > 0  # too few samples for the test: no statistic, no p-value (null)
        shown = set(sorted(self.exact, key=self.exact.get, reverse=True)[:top]) | set(self.counts)
        rows = []
        for t in sorted(shown, key=lambda t: (-self.exact.get(t, 0.0), t)):
            row = {"id": int(t), "p": self.exact.get(t, 0.0), "count": self.counts.get(t, 0),
                   "freq": self.counts.get(t, 0) / self.samples}
            if tokenizer is not None:
                row["text"] = tokenizer.decode([t])
            rows.append(row)
        return {"samples": self.samples, "tv": self.tv, "tv_noise": self.tv_noise,
                "chi2": self.chi2 if tested else None, "dof": self.dof,
                "p_value": self.p_value if tested else None, "acceptance_rate": self.accept_rate,
                "tokens": rows,
                "others": {"p": max(0.0, 1.0 - sum(r["p"] for r in rows)),
                           "count": self.samples - sum(r["count"] for r in rows)}}


def tv_of_exact_draws(exact: dict[int, float], n: int, trials: int = 200, seed: int = 0) -> float:
    """The median TV distance between ``n`` draws straight from ``exact`` and ``exact`` itself: the
    distance a perfectly correct sampler shows at this sample size (over a whole vocabulary, with a
    few hundred samples, far from 0)."""
    tokens = list(exact)
    probs = torch.tensor([exact[t] for t in tokens], dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    tvs = []
    for _ in range(trials):
        counts = torch.bincount(torch.multinomial(probs, n, replacement=True, generator=gen), minlength=len(tokens))
        tvs.append(0.5 * float((counts.double() / n - probs).abs().sum()))
    return sorted(tvs)[len(tvs) // 2]


def chi_square(counts: dict[int, int], exact: dict[int, float], n: int, min_expected: float = 5.0):
    """Pearson's chi-square over tokens with expected count >= min_expected, the rest pooled."""
    big = [t for t, p in exact.items() if p * n >= min_expected]
    obs = [counts.get(t, 0) for t in big]
    exp = [exact[t] * n for t in big]
    rest_obs = n - sum(obs)
    rest_exp = n - sum(exp)
    if rest_exp >= 1e-9 * n:
        obs.append(rest_obs)
        exp.append(rest_exp)
    elif rest_obs > 0:  # observed a token the target gives no mass: certainly wrong
        return float("inf"), max(1, len(obs) - 1), 0.0
    if len(obs) < 2:  # one bin: nothing to compare (no token expected min_expected times or more)
        return 0.0, 0, float("nan")
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp) if e > 0)
    dof = len(obs) - 1
    p = float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                      torch.tensor(stat / 2.0, dtype=torch.float64)))
    return stat, dof, p


def first_token_check(target, drafter, tokenizer, prompt_ids: list[int], cfg: DecodeConfig,
                      samples: int) -> CheckResult:
    step_cfg = DecodeConfig(gamma=cfg.gamma, max_new_tokens=cfg.gamma + 1, sampling=cfg.sampling,
                            seed=cfg.seed, costs=cfg.costs)
    run = Run("speculative", target, tokenizer, prompt_ids, step_cfg, drafter, None)
    run.use_cost_profile()
    run.start()
    # the exact distribution: the target's processed p after the prompt
    logits = target.feed(prompt_ids[-1:], keep_logits=1)[-1]
    target.rollback(len(prompt_ids) - 1)
    p = logits_to_probs(logits, cfg.sampling).double()
    nz = torch.nonzero(p > 0).flatten().tolist()
    exact = {int(t): float(p[t]) for t in nz}
    counts: dict[int, int] = {}
    for _ in range(samples):
        run.rewind()
        ev = speculative_step(run, cfg.gamma)
        first = ev.emitted[0]
        counts[first] = counts.get(first, 0) + 1
    tv = 0.5 * sum(abs(counts.get(t, 0) / samples - exact.get(t, 0.0)) for t in set(exact) | set(counts))
    stat, dof, pv = chi_square(counts, exact, samples)
    rate = run.accepted / run.proposed if run.proposed else None
    return CheckResult(samples, exact, counts, tv, stat, dof, pv, rate, tv_of_exact_draws(exact, samples))
