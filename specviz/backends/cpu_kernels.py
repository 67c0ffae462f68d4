"""Cheaper verify passes on x86 CPUs: each weight matrix packed once for MKL's GEMM.

A verify pass multiplies a handful of rows (the gamma + 1 tokens) by every weight matrix. torch's
``Linear`` sends 1-3 rows down MKL's matrix-vector path and 4 or more rows to ``sgemm``, which
repacks the whole weight matrix into its blocked layout on every call: for a 135M model that copy
is most of the cost, so a pass over 8 tokens took ~1.9x a 1-token pass on this project's 2-core
Xeon. Packing each weight once (MKL's ``gemm_pack`` / ``gemm_compute``, the kernels torch's own
compiler uses for frozen CPU linears) removes the copy: 8 tokens cost ~1.45x.

Only passes of ``MIN_ROWS``..``MAX_ROWS`` rows take the packed path. One-token decoding (vanilla
decoding, the drafter's steps) keeps torch's matrix-vector path, which is ~3% faster for one row,
and long prefills keep torch's GEMM, so vanilla decoding is never slowed down to flatter the
speedup. On Intel CPUs the packed GEMM gives each row the same bits whatever the number of rows in
the call; on AMD CPUs MKL takes other paths and rows differ in the last bits (up to 4e-7 measured).

Set ``SPECVIZ_PACKED=0`` to switch it off (to measure what it buys).

Attention has the same problem for grouped-query models (SmolLM2: 9 query heads share 3 KV
heads): given a mask, which every pass of 2+ tokens has, transformers copies the whole KV cache
to 9 heads in every layer before calling SDPA, so a verify pass grows dearer with the context
(2 tokens after 600: 1.20x a 1-token pass). torch's CPU SDPA takes the mask and the shared heads
directly (``enable_gqa``) with the same result bit for bit: 1.04x. ``enable_cpu_gqa`` asks for
that on CPU tensors only (CUDA kernels would fall back to a slow path with a mask).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

MIN_ROWS = 4   # measured here: 2-3 rows are faster on the matrix-vector path
MAX_ROWS = 64  # prefills of hundreds of rows: torch's sgemm is as fast or faster
PACK_ROWS = 32  # the row count the layout is packed for (measured: 4-16-row passes fastest)


def available(model: torch.nn.Module) -> bool:
    """MKL's packed GEMM applies to float32 weights on the CPU of an MKL build of torch."""
    if os.environ.get("SPECVIZ_PACKED", "1") == "0":
        return False
    if not (torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")):
        return False
    p = next(model.parameters(), None)
    return p is not None and p.device.type == "cpu" and p.dtype == torch.float32


class PackedLinear(torch.nn.Linear):
    """A ``Linear`` that also holds its weight in MKL's packed layout for few-row products.

    The packed copy is a plain attribute, not a buffer: MKL forbids moving it, so it must stay out
    of ``state_dict`` and ``.to()``. ``unpack_linears`` restores plain ``Linear`` modules.
    """

    _svz_packed: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if not MIN_ROWS <= rows <= MAX_ROWS or torch.is_grad_enabled() and self.weight.requires_grad:
            return F.linear(x, self.weight, self.bias)
        x2 = x.reshape(rows, x.shape[-1])
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        y = torch.ops.mkl._mkl_linear(x2, self._svz_packed, self.weight, self.bias, rows)
        return y.reshape(*x.shape[:-1], y.shape[-1])


def pack_linears(model: torch.nn.Module) -> int:
    """Give every float32 ``Linear`` of a CPU model a packed copy of its weight (in place).

    Returns how many layers were packed (0 where MKL or the dtype/device do not allow it).
    Idempotent; costs one extra copy of the linear weights in memory."""
    if not available(model):
        return 0
    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.dtype == torch.float32:
            w = module.weight.detach()
            module._svz_packed = torch.ops.mkl._mkl_reorder_linear_weight(w, PACK_ROWS)
            module.__class__ = PackedLinear
            count += 1
        elif isinstance(module, PackedLinear):
            count += 1
    if count and not _agrees(model):
        unpack_linears(model)
        return 0
    return count


@torch.inference_mode()
def _agrees(model: torch.nn.Module) -> bool:
    """A packed layout is reused for every row count in range; check that MKL agrees with torch
    on each layer shape before trusting it (any disagreement: stay on torch's path)."""
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for module in model.modules():
        if not isinstance(module, PackedLinear) or module.weight.shape in seen:
            continue
        seen.add(module.weight.shape)
        for rows in (MIN_ROWS, MIN_ROWS + 3, MAX_ROWS):
            x = torch.randn(rows, module.in_features, generator=gen)
            want = F.linear(x, module.weight, module.bias)
            got = module(x)
            if not torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()) + 1e-6):
                return False
    return True


def unpack_linears(model: torch.nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, PackedLinear):
            module.__class__ = torch.nn.Linear
            del module._svz_packed


def enable_cpu_gqa() -> bool:
    """Let transformers' SDPA attention use grouped-query heads directly on CPU even with a mask
    (instead of copying the KV cache per layer). Returns whether it is in effect."""
    if os.environ.get("SPECVIZ_PACKED", "1") == "0":
        return False
    try:
        from transformers.integrations import sdpa_attention
    except ImportError:  # pragma: no cover - other transformers layouts
        return False
    original = getattr(sdpa_attention, "use_gqa_in_sdpa", None)
    if original is None:  # pragma: no cover
        return False
    if getattr(original, "_specviz", False):
        return True

    def use_gqa_in_sdpa(attention_mask, key, value, *args, **kwargs):
        if key.device.type == "cpu" and key.shape[-1] == value.shape[-1]:
            return True
        return original(attention_mask, key, value, *args, **kwargs)

    use_gqa_in_sdpa._specviz = True
    use_gqa_in_sdpa._original = original
    sdpa_attention.use_gqa_in_sdpa = use_gqa_in_sdpa
    return True


def disable_cpu_gqa() -> None:
    from transformers.integrations import sdpa_attention

    current = sdpa_attention.use_gqa_in_sdpa
    if getattr(current, "_specviz", False):
        sdpa_attention.use_gqa_in_sdpa = current._original


def packed_count(model: torch.nn.Module) -> int:
    return sum(isinstance(m, PackedLinear) for m in model.modules())
