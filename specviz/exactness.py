"""Comparing a speculative output with vanilla decoding's, and explaining any difference.

On torch's own kernels a multi-token verify pass sums in another order than one-token decoding,
so logits differ in the last bits and greedy output may diverge at a near tie.  A divergence is
reported with the top-2 logit margin of the vanilla target at that point: ~1e-5 is numerics, more
is a bug.  On the exact kernels (``backends/exact.py``, the fp32 CPU default) there is no such
noise: any divergence at all is a bug, and ``exact_kernels`` says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from .backends.base import Target


# The largest top-2 margin that differently ordered sums can explain, per dtype: a verify pass and a
# one-token step differ by up to ~1e-4 in a float32 logit (CPU, torch's kernels; 2.3e-5 on an H200)
# and by up to 0.14 in a bfloat16 one (an H200, SmolLM2-1.7B's shapes: scripts/gpu_check.py --rows).
NEAR_TIE = {"float32": 1e-3, "float16": 0.05, "bfloat16": 0.25}


@dataclass
class Exactness:
    identical: bool
    index: int | None = None  # first differing position in the new tokens
    vanilla_token: int | None = None
    speculative_token: int | None = None
    margin: float | None = None  # the vanilla target's top-1 minus top-2 logit there
    exact_kernels: bool = False  # the target ran on row-invariant kernels: no numerical excuse
    dtype: str = "float32"  # the target's: how large a margin numerics can explain depends on it

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        if self.identical:
            return "identical to vanilla"
        if self.margin is None:
            return f"differs from vanilla at new token {self.index + 1}"
        if self.exact_kernels:
            kind = "a BUG: the kernels are row-invariant, so numerics cannot explain it"
        else:
            tie = NEAR_TIE.get(self.dtype, NEAR_TIE["float32"])
            kind = "a near tie (numerics)" if self.margin < tie else "NOT a near tie"
        return (f"differs from vanilla at new token {self.index + 1} (top-2 logit margin "
                f"{self.margin:.2e}: {kind})")


def differing_rows(target: Target, seq: list[int], ctx: int, max_rows: int = 16) -> list[tuple[int, float, int]]:
    """Row invariance, measured: feed ``seq[ctx:ctx + r]`` as one pass for r = 1..max_rows after
    ``seq[:ctx]`` and compare each pass's logits with the same tokens fed one at a time. Returns
    the pass lengths whose bits differ, with the largest difference and how many of the pass's
    argmaxes moved (empty: row-invariant here)."""
    target.reset()
    target.feed(seq[:ctx], keep_logits=1)
    alone = torch.stack([target.feed([seq[ctx + j]], keep_logits=1)[0] for j in range(max_rows)])
    bad = []
    for r in range(1, max_rows + 1):
        target.rollback(ctx)
        block = target.feed(seq[ctx:ctx + r])
        if not torch.equal(block, alone[:r]):
            bad.append((r, float((block - alone[:r]).abs().max()), int((block.argmax(-1) != alone[:r].argmax(-1)).sum())))
    return bad


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(target: Target, prompt_ids: list[int], vanilla_ids: list[int], spec_ids: list[int]) -> Exactness:
    i = first_difference(vanilla_ids, spec_ids)
    if i is None:
        return Exactness(True)
    margin = None
    if i < len(vanilla_ids) and i < len(spec_ids):
        target.reset()
        logits = target.feed(prompt_ids + vanilla_ids[:i], keep_logits=1)[-1]
        top2 = torch.topk(logits, 2).values
        margin = float(top2[0] - top2[1])
    info = target.describe() or {}
    return Exactness(False, i, vanilla_ids[i] if i < len(vanilla_ids) else None,
                      spec_ids[i] if i < len(spec_ids) else None, margin, info.get("kernels") == "exact",
                      str(info.get("dtype", "float32")))
