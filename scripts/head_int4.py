"""What 4-bit head products would buy: the default pair's draft head with its matrix-vector products
in torch's weight-only int4 kernel (groups of 32 along the input, a scale and a zero per group,
bfloat16 activations) instead of int8, then ``scripts/step_times.py`` on the same prompts.

A head step after a target pass reads its 6.9 MB of int8 weights from memory (0.84 ms for the first
step of an iteration, 0.38 ms with warm caches); int4 halves the bytes. The head's precision moves q
only, never the output's law, but a coarser q can change what the head proposes, so the iterations
count as much as the milliseconds (the iteration counts are deterministic; the milliseconds are one
run each on a shared box).

    python scripts/head_int4.py --which all --prompts ../shared/prompts/specbench-dev.jsonl --limit 1
    python scripts/step_times.py --prompts ../shared/prompts/specbench-dev.jsonl --limit 1   # int8, as shipped

``--which``: all (every head product), out (the 6,144-token vocabulary product only) or inner (fc,
gate|up and down only).
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specviz.drafters import head  # noqa: E402

GROUP = 32


class Int4RowProduct:
    """``w @ x`` for one row ``x``, ``w`` in 4 bits (asymmetric, one scale and zero per group)."""

    int8 = False

    def __init__(self, w: torch.Tensor):
        w = w.detach().float()
        n, k = w.shape
        g = w.reshape(n, k // GROUP, GROUP)
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15).clamp_min(1e-8)
        q = torch.round((g - lo) / scale).clamp(0, 15).to(torch.int32).reshape(n, k)
        zero = lo + 8 * scale  # the kernel computes (q - 8) * scale + zero
        self.sz = torch.stack([scale.reshape(n, -1).t(), zero.reshape(n, -1).t()], -1).contiguous().bfloat16()
        self.packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
        self.shape = (n, k)
        self.w = self.packed  # DraftHead.step reads its products' device from .w

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(x.bfloat16()[None], self.packed, GROUP, self.sz)[0].float()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--which", choices=("all", "out", "inner"), default="all")
    args, rest = ap.parse_known_args()
    init = head.HeadDrafter.__init__

    def patched(self, target_model, *a, **kw) -> None:
        init(self, target_model, *a, **kw)  # builds the vocabulary product in int8 (head.RowProduct)
        if args.which in ("all", "out"):
            rows = target_model.get_output_embeddings().weight.detach()[self.vocab]
            self.out_rows = Int4RowProduct(rows)
        if args.which in ("all", "inner"):  # the head's own products are built at its first step
            head.RowProduct = lambda w, int8=None: Int4RowProduct(w)

    head.HeadDrafter.__init__ = patched
    sys.argv = [str(ROOT / "scripts" / "step_times.py")] + rest
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
