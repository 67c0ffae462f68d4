"""What a small operation costs right after a target pass: warm (run just before) against after
streaming a model's worth of memory through the caches, as a verify pass of SmolLM2-135M does (540 MB
of float32 weights). Where an iteration's work outside its pass goes (drafting, probabilities,
acceptance, bookkeeping): each first call after the pass finds torch's and Python's code and data
evicted, so it pays more for the number of distinct calls than for their arithmetic.

    python scripts/cold_ops.py            # a norm, an add, an int8 product, a softmax, a top-k
    python scripts/cold_ops.py --mb 540 --rounds 30

Median microseconds of each operation, warm and cold, and the ratio. Timing only: nothing is checked.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=540, help="megabytes streamed between calls (a pass's weights)")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    flood = torch.randn(args.mb * 1024 * 1024 // 4)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(576, generator=gen)
    norm = torch.nn.RMSNorm(576)
    w = torch.randint(-127, 128, (6144, 576), dtype=torch.int8, generator=gen)
    s = torch.rand(6144, generator=gen).bfloat16()
    rows = torch.randn(4, 49152, generator=gen)
    ops = {
        "RMSNorm (576)": lambda: norm(x),
        "add (576)": lambda: x + 1.0,
        "int8 product (6144 x 576)": lambda: torch._weight_int8pack_mm(x.bfloat16()[None], w, s),
        "softmax (4 x 49152)": lambda: rows.softmax(-1),
        "top-5 (4 x 49152)": lambda: torch.topk(rows, 5, dim=-1),
    }
    print(f"| operation | warm us | after {args.mb} MB streamed us | ratio |\n|---|---|---|---|")
    for name, op in ops.items():
        warm, cold = [], []
        for _ in range(args.rounds):
            op()
            t = time.perf_counter()
            op()
            warm.append((time.perf_counter() - t) * 1e6)
            flood.sum()  # read-only: what a pass does to the weights
            t = time.perf_counter()
            op()
            cold.append((time.perf_counter() - t) * 1e6)
        w_us, c_us = statistics.median(warm), statistics.median(cold)
        print(f"| {name} | {w_us:.0f} | {c_us:.0f} | {c_us / w_us:.1f}x |")
    print(f"\n({torch.get_num_threads()} threads, torch {torch.__version__}; median of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
