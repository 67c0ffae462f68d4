"""Logits -> probabilities -> a token.

Speculative decoding is exact only if the draft's q is the very distribution the draft sampled
from and the target's p went through the same processing (temperature, top-k, top-p).  Every
distribution in specviz comes out of :func:`logits_to_probs`, so that holds by construction.
Temperature 0 means greedy: the distribution is one-hot on the argmax (first index on ties).
Temperatures between 0 and ``MIN_TEMPERATURE`` are refused: dividing logits by them overflows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from .errors import SpecvizError

MIN_TEMPERATURE = 1e-3  # below this (and above 0) logits / T overflow float32 or make p a near one-hot


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or self.temperature != self.temperature:
            raise SpecvizError(f"temperature must be a number, got {self.temperature!r}")
        if self.temperature < 0 or self.temperature == float("inf"):
            raise SpecvizError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise SpecvizError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, got {self.temperature}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise SpecvizError(f"top-k must be a whole number >= 0 (0 = off), got {self.top_k}")
        if not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise SpecvizError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict:
        return asdict(self)


def logits_to_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Processed distribution over the last dim (float32). Works on (V,) or (n, V)."""
    logits = logits.float()
    if cfg.greedy:
        out = torch.zeros_like(logits)
        return out.scatter_(-1, argmax(logits).unsqueeze(-1), 1.0)
    logits = logits / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # drop a token when the mass strictly before it already reaches top_p (the first always stays)
        drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= cfg.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """Index of the largest value along the last dim, the first one on ties (NaN counts as the
    largest), as ``torch.argmax`` gives it. On a CPU through numpy's kernel: torch's CPU argmax took
    ~0.12 ms for one 49k-token row on this project's AMD EPYC, numpy's 0.008, and greedy decoding
    takes one per row of every pass (plain and speculative alike)."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and not x.requires_grad:
        return torch.from_numpy(np.asarray(x.numpy().argmax(-1)))
    return x.argmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a 1-D distribution with the caller's generator.

    A one-hot distribution (every greedy step) has one possible outcome: it is returned without a
    draw. ``torch.multinomial`` over a 49k vocabulary costs ~1 ms on a CPU, as much as a fifth of a
    135M model's step, and would slow plain decoding as much as speculative decoding."""
    if int(torch.count_nonzero(probs)) == 1:
        return int(argmax(probs))
    return int(torch.multinomial(probs, 1, generator=generator).item())


def uniform(generator: torch.Generator | None) -> float:
    """One U[0, 1) draw from the caller's generator (the acceptance test's coin)."""
    return float(torch.rand((), generator=generator, dtype=torch.float64).item())


def make_generator(seed: int | None, device: str | torch.device = "cpu") -> torch.Generator:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed) if seed is not None else torch.seed())
    return gen
