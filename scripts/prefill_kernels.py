"""Which float32 kernel a prefill's linear layers could use: one decoder layer's four products of
SmolLM2-135M's shapes (q|k|v, o, gate|up, down) at prompt lengths the benchmark has, through

* oneDNN with the weight prepared for 32 rows (what the exact mode uses beyond 32 rows),
* oneDNN with the weight prepared for exactly this many rows,
* torch's ``F.linear`` (MKL's sgemm on the plain weight),
* MKL's packed GEMM with the weight packed for exactly this many rows (``_mkl_linear`` takes its
  packed weight only at the row count it was packed for, and falls back to ``F.linear`` otherwise:
  the last column shows that).

Median of 30 calls each, milliseconds per layer (a prefill makes 30 of them).

    python scripts/prefill_kernels.py
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in): q|k|v, o, gate|up, down


def timed(fn, n: int = 30) -> float:
    fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


def main() -> None:
    torch.manual_seed(0)
    ws = [torch.randn(n, k) for n, k in SHAPES]
    dnn32 = [torch.ops.mkldnn._reorder_linear_weight(w, batch_size=32) for w in ws]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per layer (4 products)")
    print("rows  oneDNN(32)  oneDNN(rows)  F.linear  MKL packed(rows)  MKL packed(32) at rows")
    for m in (48, 100, 200, 400):
        dnn = [torch.ops.mkldnn._reorder_linear_weight(w, batch_size=m) for w in ws]
        mkl = [torch.ops.mkl._mkl_reorder_linear_weight(w, m) for w in ws]
        mkl32 = [torch.ops.mkl._mkl_reorder_linear_weight(w, 32) for w in ws]
        sums = [0.0] * 5
        for i, w in enumerate(ws):
            x = torch.randn(m, w.shape[1])
            for j, fn in enumerate([
                    lambda: torch.ops.mkldnn._linear_pointwise(x, dnn32[i], None, "none", [], ""),
                    lambda: torch.ops.mkldnn._linear_pointwise(x, dnn[i], None, "none", [], ""),
                    lambda: F.linear(x, w),
                    lambda: torch.ops.mkl._mkl_linear(x, mkl[i], w, None, m),
                    lambda: torch.ops.mkl._mkl_linear(x, mkl32[i], w, None, 32)]):
                sums[j] += timed(fn)
        print(f"{m:4d}  " + "  ".join(f"{s:10.3f}" for s in sums))


if __name__ == "__main__":
    main()
