"""Early exit: the target's own first L layers + final norm + head, a free draft with a real q."""

from __future__ import annotations

import torch

from ..backends.transformers import early_exit_view
from ..errors import SpecvizError
from .base import Drafter, DrafterKind, whole
from .model import ModelDrafter


class EarlyExitDrafter(ModelDrafter):
    """The target's own first L layers + final norm + head: a free draft with a real q."""

    kind = "early_exit"

    def __init__(self, target_model: torch.nn.Module, layers: int, vocab_size: int | None = None):
        super().__init__(early_exit_view(target_model, layers), f"early exit @ layer {layers}", vocab_size)
        self.layers = layers

    def label(self) -> str:
        return f"early exit {self.layers}"

    def describe(self) -> dict:
        return {"kind": self.kind, "name": self.name, "layers": self.layers}


class EarlyExitKind(DrafterKind):
    name = "early_exit"
    aliases = ("early-exit", "early_exit")
    choices = ("early-exit:4", "early-exit:8", "early-exit:12")

    def forms(self, target: str) -> tuple[str, ...]:
        return ("early-exit:L",)
    source = "the target's weights"

    def parse(self, arg: str) -> dict:
        return {"kind": self.name, "layers": whole(arg or 8, "early-exit layers")}

    def check(self, spec: dict, where: str, base=None) -> dict:
        super().check(spec, where)
        if not (isinstance(spec.get("layers"), int) and spec["layers"] >= 1):
            raise SpecvizError(f"{where}: early_exit needs `layers`, a whole number >= 1")
        return spec

    def build(self, spec, target, draft) -> Drafter:
        return EarlyExitDrafter(target.model, int(spec.get("layers", 8)), len(target.tokenizer))

    # no peer: transformers' assistant_early_exit drops the final norm, so it drafts differently
