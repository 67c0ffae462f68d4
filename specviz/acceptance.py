"""The accept / reject / resample rule of speculative sampling (Leviathan et al. 2023, Chen et al. 2023).

Convention used everywhere in specviz: **p is the target's distribution, q the draft's.**

For each proposed token x_i (drawn from q_i), in order:
  1. draw u_i ~ U[0, 1) and keep x_i if u_i < min(1, p_i(x_i) / q_i(x_i));
  2. at the first rejection, emit a token drawn from norm(max(0, p_i - q_i)) and stop;
  3. if all gamma proposals are kept, emit a bonus token drawn from p_{gamma+1}.
The emitted sequence then follows the target's distribution exactly.  With greedy processing p
and q are one-hot, so the rule reduces to "keep while the draft agrees with the target's argmax,
then emit the target's argmax".

A drafter with a deterministic proposal (prompt lookup) has a one-hot q: ``q_rows=None``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sampling import SamplingConfig, argmax, logits_to_probs, sample, uniform


@dataclass
class Verdict:
    accepted: int  # how many proposals were kept (0..gamma)
    accept_probs: list[float]  # min(1, p/q) for every proposal (also those never examined)
    draws: list[float | None]  # the uniform draw of each examined proposal, None after a rejection
    next_token: int  # the resampled token (after a rejection) or the bonus token
    kind: str  # "resample" | "bonus"
    p_given: torch.Tensor | None = field(repr=False)  # p_next, or None where that is one-hot (greedy)
    vocab: int = 0  # the one-hot p_next's length

    @property
    def p_next(self) -> torch.Tensor:
        """The distribution next_token was drawn from (a greedy one built on first read)."""
        if self.p_given is None:
            self.p_given = torch.zeros(self.vocab)
            self.p_given[self.next_token] = 1.0
        return self.p_given


def acceptance_probability(p_x: float, q_x: float) -> float:
    """min(1, p(x)/q(x)). q(x) > 0 because x was drawn from q: a drafter that reports q(x) = 0 for
    a token it proposed has a bug that would silently break exactness, so that raises."""
    if not q_x > 0.0:
        raise ValueError(f"the drafter proposed a token it gives probability q(x) = {q_x}: "
                         "q must be the distribution the token was drawn from")
    return min(1.0, p_x / q_x)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): the distribution a rejected position is resampled from.

    Mathematically its mass is positive whenever a rejection can happen (p(x) < q(x) for the
    rejected x); if rounding ever leaves no mass, p itself is the right fallback.
    """
    r = (p.double() - q.double()).clamp_min(0.0)
    total = r.sum()
    if not torch.isfinite(total) or total <= 0:
        return p.double() / p.double().sum()
    return r / total


def one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    q = torch.zeros_like(like)
    q[token] = 1.0
    return q


def verify(
    proposed: list[int],
    p_rows: torch.Tensor,
    q_rows: torch.Tensor | None,
    generator: torch.Generator | None,
) -> Verdict:
    """Run the acceptance test on ``proposed`` (gamma tokens).

    p_rows: (gamma + 1, V) target distributions at each proposal and after the last one.
    q_rows: (gamma, V) draft distributions each proposal was drawn from, or None for one-hot q.
    """
    gamma = len(proposed)
    assert p_rows.shape[0] == gamma + 1, (p_rows.shape, gamma)
    accept_probs: list[float] = []
    for i, x in enumerate(proposed):
        q_x = 1.0 if q_rows is None else float(q_rows[i, x])
        accept_probs.append(acceptance_probability(float(p_rows[i, x]), q_x))
    draws: list[float | None] = [None] * gamma
    for i, x in enumerate(proposed):
        u = uniform(generator)
        draws[i] = u
        if u < accept_probs[i]:
            continue
        if q_rows is None and p_rows[i, x] == 0 and int(torch.count_nonzero(p_rows[i])) == 1:
            r = p_rows[i]  # a one-hot p (every greedy row) less a one-hot q off its support: p itself
        else:
            q_i = one_hot(x, p_rows[i]) if q_rows is None else q_rows[i]
            r = residual(p_rows[i], q_i).float()
        return Verdict(i, accept_probs, draws, sample(r, generator), "resample", r)
    p_bonus = p_rows[gamma]
    return Verdict(gamma, accept_probs, draws, sample(p_bonus, generator), "bonus", p_bonus)


def verify_greedy(proposed: list[int], best: list[int], vocab: int, generator: torch.Generator | None) -> Verdict:
    """``verify`` where every p row is one-hot (greedy) and q is one-hot (``q_rows=None``), from each
    row's argmax ``best`` (gamma + 1 of them) alone: the same verdict, coins and generator state as
    ``verify`` gives on the one-hot rows (tested against it), without building those rows over the
    whole vocabulary. p(x) is 1 where the draft agrees with the argmax and 0 elsewhere, so a kept
    token's coin always lands under 1 and a refused one's never under 0: the proposals up to the
    first disagreement are examined, and their coins are drawn in one call (the same numbers as one
    call each); the resampled or bonus token is that row's argmax."""
    gamma = len(proposed)
    assert len(best) == gamma + 1, (len(best), gamma)
    accept_probs = [1.0 if x == b else 0.0 for x, b in zip(proposed, best)]
    k = next((i for i, a in enumerate(accept_probs) if a == 0.0), gamma)
    examined = min(k + 1, gamma)
    coins = torch.rand(examined, generator=generator, dtype=torch.float64).tolist() if examined else []
    draws: list[float | None] = coins + [None] * (gamma - examined)
    return Verdict(k, accept_probs, draws, best[k], "resample" if k < gamma else "bonus", None, vocab)


def verify_logits(proposed: list[int], logits: torch.Tensor, q_rows: torch.Tensor | None,
                  sampling: SamplingConfig, generator: torch.Generator | None) -> tuple[Verdict, list[float]]:
    """The rule on the target's logits for ``proposed`` and the token after them ((gamma + 1, V)):
    p = ``logits_to_probs(logits, sampling)``, then ``verify``. Returns the verdict and p at each
    proposed token. Under greedy with a one-hot q, through ``verify_greedy`` on the rows' argmaxes."""
    if sampling.greedy and q_rows is None:
        best = argmax(logits.float()).view(-1).tolist()
        verdict = verify_greedy(proposed, best, logits.shape[-1], generator)
        return verdict, [1.0 if x == b else 0.0 for x, b in zip(proposed, best)]
    p_rows = logits_to_probs(logits, sampling)
    p_at = p_rows[: len(proposed)].gather(1, torch.tensor(proposed, dtype=torch.long)[:, None]).view(-1).tolist() \
        if proposed else []
    return verify(proposed, p_rows, q_rows, generator), p_at
