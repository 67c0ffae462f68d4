"""Drafters: whatever proposes tokens for the target to verify.

The protocol is two verbs (after transformers' candidate generators):
  ``propose(ids, max_tokens, sampling, generator) -> Proposal``  the next tokens and their q;
  ``commit(ids)``  the verified sequence, so the drafter can roll its own state back.
``reset(prompt_ids)`` starts a new run.  A proposal may be empty: the engine then takes a plain
target step (used when a drafter has nothing worth proposing).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .errors import SpecvizError
from .lm import CachedLM, Timer, early_exit_view
from .sampling import SamplingConfig, logits_to_probs, sample


@dataclass
class Proposal:
    tokens: list[int]
    q_rows: torch.Tensor | None  # (gamma, V) distributions the tokens were drawn from; None = one-hot
    q_raw: list[float] = field(default_factory=list)  # softmax (T=1) prob of each token, for display
    reason: str = ""  # why this many tokens (shown in the UI)
    draft_ms: float = 0.0


class Drafter:
    kind = "base"
    name = "drafter"
    wants_costs = False  # True: the engine measures verify costs and sets ``costs`` before a run
    costs: list[float] | None = None

    def reset(self, prompt_ids: list[int]) -> None:  # pragma: no cover - interface
        pass

    def propose(self, ids: list[int], max_tokens: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:  # pragma: no cover - interface
        raise NotImplementedError

    def commit(self, ids: list[int]) -> None:
        pass

    def observe(self, proposed: int, accepted: int) -> None:
        """How the last proposal fared (for drafters that adapt their length)."""

    def describe(self) -> dict:
        return {"kind": self.kind, "name": self.name}


class ModelDrafter(Drafter):
    """A small causal LM sharing the target's tokenizer, decoding autoregressively with its own cache."""

    kind = "model"

    def __init__(self, model: torch.nn.Module, name: str = "draft model", vocab_size: int | None = None):
        self.lm = CachedLM(model, vocab_size)
        self.name = name
        self._seq: list[int] = []  # tokens whose KV is in the draft cache, in order

    def reset(self, prompt_ids: list[int]) -> None:
        self.lm.reset()
        self._seq = []
        if len(prompt_ids) > 1:  # prefill now, so it counts as prefill and not as drafting
            self.lm.feed(list(prompt_ids[:-1]), keep_logits=1)
            self._seq = list(prompt_ids[:-1])

    def _sync(self, ids: list[int]) -> None:
        """Roll the cache back to the longest prefix it shares with ``ids``."""
        n = 0
        limit = min(len(self._seq), len(ids) - 1)
        while n < limit and self._seq[n] == ids[n]:
            n += 1
        self.lm.rollback(n)
        del self._seq[n:]

    def propose(self, ids, max_tokens, sampling, generator) -> Proposal:
        if max_tokens <= 0:
            return Proposal([], None, [], "no room left")
        tokens: list[int] = []
        q_rows: list[torch.Tensor] = []
        q_raw: list[float] = []
        with Timer(self.lm.device) as t:
            self._sync(ids)
            pending = list(ids[len(self._seq):])
            for _ in range(max_tokens):
                logits = self.lm.feed(pending, keep_logits=1)[-1]
                self._seq.extend(pending)
                q = logits_to_probs(logits, sampling)
                x = sample(q, generator)
                tokens.append(x)
                q_rows.append(q)
                q_raw.append(float(logits.softmax(-1)[x]))
                pending = [x]
        return Proposal(tokens, torch.stack(q_rows), q_raw, f"{max_tokens} draft steps", t.ms)

    def commit(self, ids: list[int]) -> None:
        self._sync(ids)


class EarlyExitDrafter(ModelDrafter):
    """The target's own first L layers + final norm + head: a free draft with a real q."""

    kind = "early_exit"

    def __init__(self, target_model: torch.nn.Module, layers: int, vocab_size: int | None = None):
        super().__init__(early_exit_view(target_model, layers), f"early exit @ layer {layers}", vocab_size)
        self.layers = layers

    def describe(self) -> dict:
        return {"kind": self.kind, "name": self.name, "layers": self.layers}


class PromptLookupDrafter(Drafter):
    """Prompt lookup (n-gram) drafting: find the most recent earlier occurrence of the sequence's
    last n tokens (longest n first) and propose what followed it.  q is one-hot.

    Adaptive (cost-aware): the proposal length g maximises the expected tokens per unit of time,
    E(g) / v(g), where E(g) = 1 + a1 (1 - ac^g) / (1 - ac) with a1 the estimated chance that the
    first token of an n-gram match is kept (learned per n during the run, from a prior) and ac the
    chance each further token is kept given the previous one was, and v(g) the measured cost of
    verifying g proposals relative to a plain step.  When no g beats a plain step (E/v <= 1), or
    there is no match, nothing is proposed: that iteration costs what vanilla decoding costs.
    """

    kind = "prompt_lookup"
    wants_costs = True
    # priors measured with scripts/lookup_stats.py on prompts the benchmark leaves out
    PRIOR_FIRST = {1: 0.25, 2: 0.5, 3: 0.55, 4: 0.7, 5: 0.8}  # chance the first token of an n-gram match is kept
    PRIOR_CONT = 0.75  # chance a further token is kept after a kept one
    PRIOR_WEIGHT = 3.0

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, adaptive: bool = True, vote: bool = True):
        if not 1 <= min_ngram <= max_ngram:
            raise SpecvizError(f"prompt lookup needs 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.adaptive, self.vote = adaptive, vote
        self.name = f"prompt lookup (n={min_ngram}..{max_ngram}{', adaptive' if adaptive else ''})"
        self.costs: list[float] | None = None  # v[g], set by the engine from a measurement
        self.reset([])

    def reset(self, prompt_ids: list[int]) -> None:
        self._first: dict[int, list[float]] = {}  # n -> [kept, examined] for first tokens
        self._cont = [0.0, 0.0]  # [kept, examined] for tokens after a kept one
        self._last_n = 0

    def find(self, ids: list[int], max_tokens: int) -> tuple[list[int], int]:
        """The continuation of a match of the longest suffix n-gram that has one, and n.

        Among several earlier occurrences, the continuation whose first token follows the n-gram
        most often wins (ties: the most recent), so a common phrase beats a one-off."""
        arr = np.asarray(ids, dtype=np.int64)
        L = len(arr)
        for n in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            pattern = arr[L - n:]
            # candidate starts i < L - n, so the match is not the suffix itself
            windows = np.lib.stride_tricks.sliding_window_view(arr[: L - 1], n)
            hits = np.flatnonzero((windows == pattern).all(axis=1))
            if hits.size:
                nxt = arr[hits + n]
                if hits.size > 1 and self.vote:
                    values, counts = np.unique(nxt, return_counts=True)
                    top = values[counts == counts.max()]
                    hits = hits[np.isin(nxt, top)]
                start = int(hits[-1]) + n
                return arr[start: start + max_tokens].tolist(), n
        return [], 0

    def estimates(self, n: int) -> tuple[float, float]:
        """(a1, ac): posterior means of the first-token and continuation acceptance."""
        prior = self.PRIOR_FIRST.get(n, max(self.PRIOR_FIRST.values()))
        kept, seen = self._first.get(n, [0.0, 0.0])
        a1 = (kept + prior * self.PRIOR_WEIGHT) / (seen + self.PRIOR_WEIGHT)
        ac = (self._cont[0] + self.PRIOR_CONT * self.PRIOR_WEIGHT) / (self._cont[1] + self.PRIOR_WEIGHT)
        return a1, ac

    def choose_length(self, n: int, available: int) -> tuple[int, str]:
        a1, ac = self.estimates(n)
        costs = self.costs
        best_g, best_val, best_e = 0, 1.0, 1.0
        for g in range(1, available + 1):
            e = 1.0 + a1 * (g if ac >= 1 else (1 - ac ** g) / (1 - ac))
            v = costs[g] if costs and g < len(costs) else (costs[-1] if costs else 1.0)
            if e / v > best_val:
                best_g, best_val, best_e = g, e / v, e
        why = f"{n}-gram match, est. keep first {a1:.2f}, then {ac:.2f}"
        if best_g == 0:
            return 0, why + ": no length pays off, plain step"
        return best_g, why + f": proposing {best_g} (expects {best_e:.2f} tokens for {best_e / best_val:.2f}x a step)"

    def propose(self, ids, max_tokens, sampling, generator) -> Proposal:
        with Timer(torch.device("cpu")) as t:
            tokens, n = self.find(ids, max_tokens) if max_tokens > 0 else ([], 0)
            if not tokens:
                reason = "no n-gram match: plain step" if max_tokens > 0 else "no room left"
            elif self.adaptive:
                g, reason = self.choose_length(n, len(tokens))
                tokens = tokens[:g]
            else:
                reason = f"{n}-gram match, proposing {len(tokens)}"
        self._last_n = n if tokens else 0
        return Proposal(tokens, None, [1.0] * len(tokens), reason, t.ms)

    def observe(self, proposed: int, accepted: int) -> None:
        if not proposed or not self._last_n:
            return
        first = self._first.setdefault(self._last_n, [0.0, 0.0])
        first[1] += 1
        first[0] += accepted >= 1
        if accepted >= 1:
            self._cont[1] += min(accepted, proposed - 1)
            self._cont[0] += accepted - 1

    def describe(self) -> dict:
        return {"kind": self.kind, "name": self.name, "max_ngram": self.max_ngram,
                "min_ngram": self.min_ngram, "adaptive": self.adaptive}
