"""Token Recycling (Luo et al. 2024): draft from the target's own top-k successors of each token,
harvested from the logits every verify pass computes anyway.

The table maps a token to the k tokens the target ranked highest right after it, the last time it
scored a position holding that token (and, more specifically, after a pair of tokens). Drafting
follows the top successor from the last token: t -> M[t][0] -> M[M[t][0]][0] ... Building the table
costs a top-k over logits already computed: no model, no training, nothing stored between runs.

Combined with prompt lookup and the datastore (``lookup: true``, the default), the drafter
proposes, each iteration, whichever source promises the most tokens per unit of measured cost
(the cost-aware choice of :class:`~specviz.drafters.lookup.PromptLookupDrafter`). For a recycled
chain the estimate is per position: each drafted token carries the probability the target gave it
when it was harvested; a band of that probability has a chance to be kept, learned during the run
from a prior, and E(g) = 1 + sum_j prod_{i<=j} keep(band_i).  q is one-hot (the chain is
deterministic), so the acceptance rule is exact as for any drafter.
"""

from __future__ import annotations

import numpy as np
import torch

from ..backends.base import Timer
from ..errors import SpecvizError
from .base import Drafter, Proposal, whole
from .lookup import BandedLookupDrafter, BesideLookupKind, band_of

BANDS = (0.0, 0.3, 0.5, 0.7, 0.9)  # lower edges of the bands of the harvested top-1 probability


def band(p: float) -> int:
    return band_of(p, BANDS)


class RecyclingDrafter(BandedLookupDrafter):
    """Token Recycling's successor table, optionally with prompt lookup + datastore beside it."""

    kind = "recycling"
    own_label = "recycling"
    # chance a recycled token is kept, per band of its harvested probability: the first of a chain,
    # and a later one after a kept one (measured with scripts/recycling_stats.py on greedy answers
    # to prompts the benchmark leaves out: --skip 3 --per-category 1, 1,200 positions)
    PRIOR_FIRST = (0.34, 0.38, 0.57, 0.62, 0.73)
    PRIOR_NEXT = (0.68, 0.77, 0.77, 0.9, 0.9)
    BANDS = BANDS

    def __init__(self, vocab_size: int, top_k: int = 8, lookup: bool = True, pairs: bool = True,
                 max_ngram: int = 4, min_ngram: int = 1, datastore=None):
        self.vocab_size, self.top_k, self.lookup, self.pairs = vocab_size, top_k, lookup, pairs
        super().__init__(max_ngram, min_ngram, True, datastore=datastore)  # calls reset()
        parts = ["token recycling (top-%d%s)" % (top_k, ", pairs" if pairs else "")]
        if lookup:
            parts.append(self.name)
        self.name = " + ".join(parts)

    def reset(self, prompt_ids: list[int]) -> None:
        super().reset(prompt_ids)
        self.succ = np.full((self.vocab_size, self.top_k), -1, dtype=np.int64)  # token -> top-k successors
        self.prob = np.zeros((self.vocab_size, self.top_k), dtype=np.float32)  # and their probabilities
        self.pair_succ: dict[tuple[int, int], tuple[int, float]] = {}

    # -- the table -------------------------------------------------------------------------
    def harvest(self, ids: list[int], logits: torch.Tensor) -> None:
        """Row j of ``logits`` is the target's prediction after ``ids[len(ids) - len(logits) + j]``:
        store its top-k as that token's successors (and the top-1 after the token pair)."""
        n = logits.shape[0]
        if n == 0:
            return
        probs = logits.float().softmax(-1)
        vals, idx = torch.topk(probs, min(self.top_k, probs.shape[-1]), dim=-1)
        vals, idx = vals.numpy(), idx.numpy()
        start = len(ids) - n
        for j in range(n):
            t = ids[start + j]
            if 0 <= t < self.vocab_size:
                self.succ[t, : idx.shape[1]] = idx[j]
                self.prob[t, : vals.shape[1]] = vals[j]
            if self.pairs and start + j >= 1:
                self.pair_succ[(ids[start + j - 1], t)] = (int(idx[j, 0]), float(vals[j, 0]))

    def next_of(self, prev: int | None, t: int) -> tuple[int, float]:
        if self.pairs and prev is not None:
            hit = self.pair_succ.get((prev, t))
            if hit is not None:
                return hit
        if 0 <= t < self.vocab_size and self.succ[t, 0] >= 0:
            return int(self.succ[t, 0]), float(self.prob[t, 0])
        return -1, 0.0

    def chain(self, ids: list[int], max_tokens: int) -> tuple[list[int], list[float]]:
        """Follow the top successor from the last token: the draft and each token's harvested p."""
        tokens, ps = [], []
        prev, t = (ids[-2] if len(ids) > 1 else None), ids[-1]
        while len(tokens) < max_tokens:
            x, p = self.next_of(prev, t)
            if x < 0:
                break
            tokens.append(x)
            ps.append(p)
            prev, t = t, x
        return tokens, ps

    # -- choosing ----------------------------------------------------------------------------
    def chain_value(self, ps: list[float]) -> tuple[int, float, float]:
        """(g, E(g)/v(g), E(g)) for the best length of a recycled chain (g = 0: nothing pays)."""
        best_g, best_val, best_e = 0, 1.0, 1.0
        e, alive = 1.0, 1.0
        for g, p in enumerate(ps, 1):
            alive *= self.keep_chance(band(p), first=g == 1)
            e += alive
            v = self.cost(g)
            if e / v > best_val:
                best_g, best_val, best_e = g, e / v, e
        return best_g, best_val, best_e

    def propose(self, ids, max_tokens, sampling, generator) -> Proposal:
        with Timer(torch.device("cpu")) as t:
            best = None  # (value, g, tokens, bands or None, key, reason)
            if max_tokens > 0:
                tokens, ps = self.chain(ids, max_tokens)
                if tokens and self.fixed_chain:
                    best = (1.0, len(tokens), tokens, [band(p) for p in ps], None,
                            f"recycled chain (its first token harvested at p {ps[0]:.2f}), fixed length", len(tokens))
                elif tokens:
                    g, val, e = self.chain_value(ps)
                    best = (val, g, tokens[:g], [band(p) for p in ps[:g]], None,
                            f"recycled chain (its first token harvested at p {ps[0]:.2f})", e)
                if self.lookup and not self.fixed_chain:
                    for key, toks, what in self.candidates(ids, max_tokens):
                        g, val, e, a1, ac = self.value(key, len(toks))
                        if best is None or val > best[0]:
                            best = (val, g, toks[:g], None, key, f"{what}, est. keep first {a1:.2f}, then {ac:.2f}", e)
            self._last, self._bands = None, []
            out: list[int] = []
            if max_tokens <= 0:
                reason = "no room left"
            elif best is None:
                reason = "no recycled successor or match: plain step"
            elif best[1] == 0:
                reason = best[5] + ": no length pays off, plain step"
            else:
                val, g, out, bands, key, what, e = best
                self._last, self._bands = key, bands or []
                reason = what + f": proposing {g} (expects {e:.2f} tokens for {e / val:.2f}x a step)"
        return Proposal(out, None, [1.0] * len(out), reason, t.ms)

    def describe(self) -> dict:
        d = super().describe()
        d.update(kind=self.kind, name=self.name, top_k=self.top_k, lookup=self.lookup, pairs=self.pairs)
        return d


class RecyclingKind(BesideLookupKind):
    name = "recycling"
    aliases = ("recycling", "token-recycling", "recycle")
    choices = ("recycling", "recycling:only")
    source = "the target's own top successors of each token (+ the prompt, output and datastore)"

    def parse_more(self, arg: str) -> dict:
        return {"kind": self.name, "top_k": whole(arg, "recycling top-k")}

    def check(self, spec: dict, where: str, base=None) -> dict:
        if "top_k" in spec and not (isinstance(spec["top_k"], int) and spec["top_k"] >= 1):
            raise SpecvizError(f"{where}: top_k must be a whole number >= 1")
        return super().check(spec, where, base, flags=("lookup", "pairs"))

    def build(self, spec, target, draft) -> Drafter:
        store = self.datastore(spec, target)
        return RecyclingDrafter(len(target.tokenizer), int(spec.get("top_k", 8)), bool(spec.get("lookup", True)),
                                bool(spec.get("pairs", True)), int(spec.get("max_ngram", 4)),
                                int(spec.get("min_ngram", 1)), datastore=store)
