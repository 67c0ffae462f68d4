"""Self-speculation with a lower-precision copy: the target's own weights in bfloat16 or int8
(dynamic quantisation of every Linear) as a separate draft model with its own KV cache.

It is a real draft model (its q differs from p: coarser numerics), available wherever the target
is, offline. Whether it pays depends on the CPU: bfloat16 is ~2x cheaper per token where the CPU
has native bf16 dot products (AVX512-BF16, AMX) and slower elsewhere; int8 dynamic quantisation is
cheaper almost everywhere but agrees less often with the fp32 target (per-channel scales help).
"""

from __future__ import annotations

import warnings

import torch

from ..errors import SpecvizError
from .base import Drafter, DrafterKind
from .model import ModelDrafter

PRECISIONS = {"bfloat16": "bfloat16", "bf16": "bfloat16", "int8": "int8", "qint8": "int8"}
_COPIES: dict[tuple, torch.nn.Module] = {}


def lower_precision_copy(model: torch.nn.Module, precision: str) -> torch.nn.Module:
    """A separate copy of ``model`` in ``precision`` (cached per model and precision)."""
    key = (id(model), precision)
    if key in _COPIES:
        return _COPIES[key]
    copy = type(model)(model.config)  # fresh modules: plain Linear layers, no packed weights
    missing, unexpected = copy.load_state_dict(model.state_dict(), strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:  # a tied head is rebuilt by the class
        raise SpecvizError(f"could not copy the target for a {precision} draft: {missing or unexpected}")
    if getattr(model.config, "tie_word_embeddings", False):
        copy.tie_weights()
    copy = copy.to(next(model.parameters()).device).eval()
    if precision == "bfloat16":
        copy = copy.to(torch.bfloat16)
    else:
        if next(model.parameters()).device.type != "cpu":
            raise SpecvizError("int8 dynamic quantisation runs on the CPU only; use precision: bfloat16")
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        with warnings.catch_warnings():  # torch's notice that quantized tensors are deprecated, at every load
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*deprecated")
            copy = quantize_dynamic(copy, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
    if hasattr(copy, "generation_config") and hasattr(model, "generation_config"):
        copy.generation_config = model.generation_config
    _COPIES.clear()  # one copy at a time: they are as large as (int8: a quarter of) the target
    _COPIES[key] = copy
    return copy


class SelfDraftDrafter(ModelDrafter):
    kind = "self_quantized"

    def __init__(self, target_model: torch.nn.Module, precision: str, vocab_size: int | None = None):
        super().__init__(lower_precision_copy(target_model, precision), f"the target in {precision}", vocab_size)
        self.precision = precision

    def label(self) -> str:
        return f"self-draft ({self.precision})"

    def describe(self) -> dict:
        return {"kind": self.kind, "name": self.name, "precision": self.precision}


class SelfDraftKind(DrafterKind):
    name = "self_quantized"
    aliases = ("self", "self-quantized", "self_quantized")
    choices = ("self:bf16", "self:int8")
    source = "the target's own weights at lower precision"

    def parse(self, arg: str) -> dict:
        if (arg or "int8") not in PRECISIONS:
            raise SpecvizError(f"self draft precision must be one of {', '.join(sorted(PRECISIONS))}, got {arg!r}")
        return {"kind": self.name, "precision": PRECISIONS[arg or "int8"]}

    def check(self, spec: dict, where: str, base=None) -> dict:
        super().check(spec, where)
        if spec.get("precision", "int8") not in PRECISIONS:
            raise SpecvizError(f"{where}: precision must be one of {sorted(PRECISIONS)}")
        return spec

    def build(self, spec, target, draft) -> Drafter:
        return SelfDraftDrafter(target.model, PRECISIONS[spec.get("precision", "int8")], len(target.tokenizer))

    # no peer yet: transformers' assisted generation with a dynamically quantized (or bf16 beside
    # fp32) assistant is untested here; the bench runs without one for this kind
