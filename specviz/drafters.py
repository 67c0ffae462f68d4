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
    deterministic = False  # True when q is one-hot (a proposal is a lookup, not a sample)

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

    def describe(self) -> dict:
        return {"kind": self.kind, "name": self.name}


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

    Adaptive: no match means no proposal (a plain target step, never slower than vanilla); the
    proposal grows with the match length (a long match predicts a long copy) and with how much of
    the recent proposals was accepted, and shrinks after rejections.
    """

    kind = "prompt_lookup"
    deterministic = True

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, adaptive: bool = True,
                 min_tokens: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise SpecvizError(f"prompt lookup needs 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.adaptive = adaptive
        self.min_tokens = min_tokens
        self.name = f"prompt lookup (n={min_ngram}..{max_ngram})"
        self._last_len = 0
        self._accept_ema = 1.0

    def reset(self, prompt_ids: list[int]) -> None:
        self._last_len = 0
        self._accept_ema = 1.0

    def find(self, ids: list[int], max_tokens: int) -> tuple[list[int], int]:
        """The continuation of the most recent match of the longest suffix n-gram, and n."""
        arr = np.asarray(ids, dtype=np.int64)
        L = len(arr)
        for n in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            pattern = arr[L - n:]
            # candidate starts i < L - n, so the match is not the suffix itself
            windows = np.lib.stride_tricks.sliding_window_view(arr[: L - 1], n)
            hits = np.flatnonzero((windows == pattern).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return arr[start: start + max_tokens].tolist(), n
        return [], 0

    def propose(self, ids, max_tokens, sampling, generator) -> Proposal:
        with Timer(torch.device("cpu")) as t:
            want = max_tokens
            if self.adaptive and max_tokens > 0:
                tokens, n = self.find(ids, max_tokens)
                # trust long matches and a history of acceptance; be brief otherwise
                budget = max(self.min_tokens, round(max_tokens * min(1.0, 0.25 + self._accept_ema)))
                if n >= 3:
                    budget = max_tokens
                want = min(max_tokens, budget)
                tokens = tokens[:want]
            else:
                tokens, n = self.find(ids, max_tokens) if max_tokens > 0 else ([], 0)
        self._last_len = len(tokens)
        if not tokens:
            reason = "no n-gram match: plain step" if max_tokens > 0 else "no room left"
        else:
            reason = f"{n}-gram match, proposing {len(tokens)} of up to {max_tokens}"
        return Proposal(tokens, None, [1.0] * len(tokens), reason, t.ms)

    def observe(self, proposed: int, accepted: int) -> None:
        if proposed:
            self._accept_ema = 0.6 * self._accept_ema + 0.4 * (accepted / proposed)

    def describe(self) -> dict:
        return {"kind": self.kind, "name": self.name, "max_ngram": self.max_ngram,
                "min_ngram": self.min_ngram, "adaptive": self.adaptive}
