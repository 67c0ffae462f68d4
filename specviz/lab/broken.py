"""Deliberately broken acceptance rules, for the Lab's "break it" check and the tests. TEACHING
CODE ONLY: nothing in the engine, the app's normal runs or the CLI's ``run`` can reach these.

Each rule takes the target's processed p, the draft's processed q (what it samples from) and the
draft's raw softmax (T = 1) at one position, and returns the first token the iteration emits.
The first emitted token depends on that position alone, so drawing it many times and comparing
the counts with p (chi-square) tests the rule itself on the real distributions of the loaded
models. ``correct`` runs the real rule, :func:`specviz.acceptance.verify`.

  raw_q            q taken from raw logits while the draft sampled from processed ones and p is
                   processed (transformers #47932)
  greedy_draft     the draft proposes its argmax while the target samples; q(x) still used as if
                   x had been drawn from q (transformers #32867)
  resample_from_p  after a rejection, draw from p instead of norm(max(0, p - q))
  no_correction    the explainer's simplified loop: a refused draft is thrown away and drafted
                   again; the target never contributes a token (no resample, no bonus)
"""

from __future__ import annotations

import torch

from ..acceptance import residual

VARIANTS: dict[str, str] = {
    "correct": "the rule specviz runs: min(1, p/q), resample from norm(max(0, p - q)), bonus from p",
    "raw_q": "q from raw logits while p and the draft's sampling are processed (transformers #47932)",
    "greedy_draft": "greedy draft against a sampled target (transformers #32867)",
    "resample_from_p": "after a rejection, resample from p instead of norm(max(0, p - q))",
    "no_correction": "simplified loop: refused drafts are redrafted, no resample and no bonus token",
}
BROKEN = [v for v in VARIANTS if v != "correct"]
MAX_REDRAFTS = 200


def draw_counts(rule: str, p: torch.Tensor, q: torch.Tensor, q_raw: torch.Tensor, n: int,
                seed: int) -> dict[int, int]:
    """How often each token came first in ``n`` iterations under ``rule`` (p, q, q_raw: 1-D
    distributions at the position). The n iterations are drawn together (one vectorised draw per
    step of the rule), with :func:`specviz.acceptance.residual` for norm(max(0, p - q)) as in
    :func:`specviz.acceptance.verify`; ``correct`` is that rule, the others break one step of it."""
    if rule not in VARIANTS:
        raise ValueError(f"unknown rule {rule!r}: one of {', '.join(VARIANTS)}")
    gen = torch.Generator().manual_seed(seed)
    p, q, q_raw = p.double(), q.double(), q_raw.double()

    def draw(dist: torch.Tensor, k: int) -> torch.Tensor:
        if k == 0:
            return torch.zeros(0, dtype=torch.long)
        return torch.multinomial(dist.float(), k, replacement=True, generator=gen)

    def keep(x: torch.Tensor, q_used: torch.Tensor) -> torch.Tensor:
        u = torch.rand(len(x), generator=gen, dtype=torch.float64)
        return u < torch.clamp(p[x] / q_used[x].clamp_min(1e-300), max=1.0)

    if rule == "no_correction":  # refused drafts are drafted again until one is kept
        out, left = [], n
        for _ in range(MAX_REDRAFTS):
            x = draw(q, left)
            kept = keep(x, q)
            out.append(x[kept])
            left -= int(kept.sum())
            if left == 0:
                break
        if left:  # still redrafting: where p and q barely overlap the loop takes ~1 / sum(min(p, q))
            # drafts; it ends with its own law, norm(min(p, q)), never with p (drawing those from p hid
            # the bug exactly where it shows most)
            out.append(draw(law(rule, p, q, q_raw), left))
        first = torch.cat(out)
    else:
        x = torch.full((n,), int(q.argmax())) if rule == "greedy_draft" else draw(q, n)
        kept = keep(x, q_raw if rule == "raw_q" else q)
        refused = int((~kept).sum())
        if rule == "resample_from_p":
            again = draw(p, refused)
        else:
            again = draw(residual(p, q_raw if rule == "raw_q" else q), refused)
        first = torch.cat([x[kept], again])
    ids, counts = torch.unique(first, return_counts=True)
    return {int(i): int(c) for i, c in zip(ids, counts)}


def law(rule: str, p: torch.Tensor, q: torch.Tensor, q_raw: torch.Tensor) -> torch.Tensor:
    """The exact distribution of the first token under ``rule`` (p for the correct rule): where a
    bug shows, and how much (its total variation distance from p)."""
    p, q, q_raw = p.double(), q.double(), q_raw.double()
    if rule == "correct":
        return p
    if rule == "raw_q":
        kept = q * torch.clamp(p / q_raw.clamp_min(1e-300), max=1.0)
        return kept + (1 - kept.sum()) * residual(p, q_raw)
    if rule == "greedy_draft":
        x = int(q.argmax())
        a = min(1.0, float(p[x] / q[x]))
        out = (1 - a) * residual(p, q)
        out[x] += a
        return out
    both = torch.minimum(p, q)
    if rule == "resample_from_p":
        return both + (1 - both.sum()) * p
    if rule == "no_correction":  # p and q with no token in common: the loop never ends; counted
        return both / both.sum() if both.sum() > 0 else p  # as p so that the Lab never shows it there
    raise ValueError(f"unknown rule {rule!r}")


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a.double() - b.double()).abs().sum())


def where_it_shows(rule: str, P: torch.Tensor, Q: torch.Tensor, Q_raw: torch.Tensor) -> tuple[int, float]:
    """The row (position) where ``rule``'s first-token law is furthest from p, and that distance."""
    d = [tv(law(rule, P[j], Q[j], Q_raw[j]), P[j]) for j in range(P.shape[0])]
    j = max(range(len(d)), key=d.__getitem__)
    return j, d[j]
