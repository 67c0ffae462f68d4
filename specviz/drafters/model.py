"""A draft model: a small causal LM sharing the target's tokenizer, decoding with its own KV cache."""

from __future__ import annotations

import torch

from ..backends.base import Timer
from ..backends.transformers import CachedLM
from ..errors import SpecvizError
from ..sampling import logits_to_probs, sample
from .base import Drafter, DrafterKind, Proposal


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
        return Proposal(tokens, torch.stack(q_rows), q_raw, f"{max_tokens} draft step{'' if max_tokens == 1 else 's'}", t.ms)

    def commit(self, ids: list[int]) -> None:
        self._sync(ids)


class ModelKind(DrafterKind):
    name = "model"
    source = "a draft model"

    def parse(self, arg: str) -> dict:
        return {"kind": self.name, "model": arg}

    def check(self, spec: dict, where: str, base=None) -> dict:
        super().check(spec, where)
        if not isinstance(spec.get("model"), str) or not spec["model"]:
            raise SpecvizError(f"{where}: a model drafter needs `model`, a model name")
        return spec

    def draft_model(self, spec: dict) -> str | None:
        return spec["model"]

    def build(self, spec, target, draft) -> Drafter:
        if draft is None:
            raise SpecvizError(f"the model drafter needs its draft model {spec.get('model')!r} loaded")
        return ModelDrafter(draft.model, f"draft {draft.name}", len(target.tokenizer))

    def peer(self, drafter, gamma, draft):
        if draft is None:
            return None
        return {"assistant_model": draft.model, "num_assistant_tokens": gamma,
                "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}
