"""The Target protocol: the few verbs speculative decoding needs from the model it verifies with.

The engine keeps one invariant: the target has cached the first ``cached`` tokens of the running
sequence. ``feed`` appends tokens and returns their logits; ``rollback`` crops rejected positions
off the end. Nothing else of a backend is visible to the engine, ``check`` or ``exactness``
(tests/test_defects.py drives the engine with a stub target that has only these).
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

import torch


def synchronize(device: torch.device | None) -> None:
    if device is None:
        return
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class Timer:
    """Wall time in ms, synchronised with a device so GPU work is counted where it happens."""

    def __init__(self, device: torch.device | None = None):
        self.device = device
        self.ms = 0.0

    def __enter__(self) -> "Timer":
        synchronize(self.device)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        synchronize(self.device)
        self.ms = (time.perf_counter() - self._t0) * 1000.0


@runtime_checkable
class Target(Protocol):
    vocab_size: int  # logits are sliced to this (the vocabulary shared with tokenizer and draft)
    cached: int  # how many tokens of the running sequence the cache holds

    @property
    def context_length(self) -> int: ...

    @property
    def eos_ids(self) -> set[int]: ...

    def reset(self) -> None:
        """Empty the cache."""

    def feed(self, tokens: list[int], keep_logits: int | None = None) -> torch.Tensor:
        """Append ``tokens``; return float32 CPU logits (n, vocab) of the last ``keep_logits``."""

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` cached positions."""

    def timer(self) -> Timer:
        """A timer synchronised with wherever this target computes."""

    def cost_profile(self, max_tokens: int, context: list[int]) -> list[float]:
        """v[g]: one pass over g + 1 tokens relative to a 1-token pass, g = 0..max_tokens - 1."""

    def describe(self) -> dict:
        """name, device, dtype, ... for the start event."""
