"""A causal LM plus its KV cache, behind the few verbs decoding needs.

Invariant kept by the engine: the cache holds the first ``cached`` tokens of the running
sequence; ``feed`` appends tokens and returns their logits; ``rollback`` crops rejected
positions off the end (no recomputation of the prefix).
"""

from __future__ import annotations

import copy
import time

import torch
from transformers import DynamicCache


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class Timer:
    """Wall time in ms, synchronised with the device so GPU work is counted where it happens."""

    def __init__(self, device: torch.device):
        self.device = device
        self.ms = 0.0

    def __enter__(self) -> "Timer":
        synchronize(self.device)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        synchronize(self.device)
        self.ms = (time.perf_counter() - self._t0) * 1000.0


_COSTS: dict[tuple, list[float]] = {}


class CachedLM:
    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None):
        self.model = model
        self.config = model.config
        self.device = next(model.parameters()).device
        out_features = model.get_output_embeddings().weight.shape[0]
        # slice logits to the vocabulary shared with the tokenizer / the other model
        self.vocab_size = min(vocab_size or out_features, out_features)
        self.cache: DynamicCache | None = None
        self.cached = 0

    @property
    def context_length(self) -> int:
        text_cfg = getattr(self.config, "get_text_config", lambda: self.config)()
        return int(getattr(text_cfg, "max_position_embeddings", 0) or 1 << 30)

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.config)
        self.cache.activate_past_recording()  # sliding-window layers must stay croppable
        self.cached = 0

    @torch.inference_mode()
    def feed(self, tokens: list[int], keep_logits: int | None = None) -> torch.Tensor:
        """Append ``tokens`` to the cache; return float32 CPU logits of the last ``keep_logits``
        positions (all by default) as (n, vocab)."""
        if self.cache is None:
            self.reset()
        n = len(tokens)
        keep = n if keep_logits is None else keep_logits
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=keep)
        self.cached += n
        return out.logits[0, -keep:, : self.vocab_size].float().cpu()

    def verify_costs(self, max_tokens: int, context: list[int]) -> list[float]:
        """v[g]: the time of one forward pass over g + 1 tokens relative to a 1-token pass, for
        g = 0..max_tokens - 1, measured on this model and device (once per process, then reused).

        Drafters use it to propose only what pays on this hardware.  Leaves the cache empty."""
        key = (id(self.model), str(self.device))
        known = _COSTS.get(key, [])
        if len(known) >= max_tokens:
            return known[:max_tokens]
        ctx = list(context[:64]) or [0]
        self.reset()
        self.feed(ctx, keep_logits=1)
        ms: dict[int, list[float]] = {}
        probe = (ctx * (max_tokens // len(ctx) + 1))[:max_tokens]
        for _ in range(3):
            for n in range(1, max_tokens + 1):
                with Timer(self.device) as t:
                    self.feed(probe[:n])
                self.rollback(len(ctx))
                ms.setdefault(n, []).append(t.ms)
        med = [sorted(ms[n])[1] for n in range(1, max_tokens + 1)]
        costs = [m / med[0] for m in med]
        _COSTS[key] = costs
        self.reset()
        return costs

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` cached positions."""
        drop = self.cached - length
        if drop > 0:
            self.cache.crop(-drop)
            self.cached = length


def early_exit_view(model: torch.nn.Module, layers: int) -> torch.nn.Module:
    """The target's first ``layers`` decoder layers + its final norm + its head, sharing weights.

    No extra parameters: a shallow structural copy whose layer list is truncated.
    """
    inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    total = len(inner.layers)
    if not 1 <= layers < total:
        from .errors import SpecvizError

        raise SpecvizError(f"early-exit layers must be between 1 and {total - 1}, got {layers}")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    for key in ("layer_types",):
        if getattr(config, key, None) is not None:
            setattr(config, key, list(getattr(config, key))[:layers])
    view_inner = copy.copy(inner)
    view_inner._modules = dict(inner._modules)
    view_inner.layers = torch.nn.ModuleList(list(inner.layers)[:layers])
    view_inner.config = config
    view = copy.copy(model)
    view._modules = dict(model._modules)
    for name, child in model._modules.items():
        if child is inner:
            view._modules[name] = view_inner
    view.config = config
    return view
