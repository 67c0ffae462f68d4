"""Drafters: whatever proposes tokens for the target to verify, one module per kind.

``KINDS`` is the one table of drafter kinds. models.yaml's ``drafter: {kind: ...}``, the
``--draft`` shorthand (``lookup:4``, ``early-exit:8``, a model name), the app's drafter list
and the bench's transformers peer all read it. Adding a kind: a ``Drafter`` and a
``DrafterKind`` in a new module here, and one entry below.
"""

from __future__ import annotations

from ..errors import SpecvizError
from .base import Drafter, DrafterKind, Proposal
from .early_exit import EarlyExitDrafter, EarlyExitKind
from .head import HeadDrafter, HeadKind
from .lookup import LookupKind, PromptLookupDrafter
from .model import ModelDrafter, ModelKind
from .quantized import SelfDraftDrafter, SelfDraftKind
from .recycling import RecyclingDrafter, RecyclingKind

KINDS: dict[str, DrafterKind] = {k.name: k for k in (LookupKind(), EarlyExitKind(), ModelKind(), RecyclingKind(),
                                                     SelfDraftKind(), HeadKind())}


def kind(name: str, where: str = "drafter") -> DrafterKind:
    if name not in KINDS:
        raise SpecvizError(f"{where}: drafter kind must be one of {sorted(KINDS)}, got {name!r}")
    return KINDS[name]


def parse_drafter(text: str, model_names) -> dict:
    """A shorthand (``lookup``, ``lookup:N``, ``early-exit:L``, ``recycling``, ``self:int8``, ``head``...: each
    kind's aliases) or a model name -> a drafter spec."""
    head, _, arg = str(text).partition(":")
    for k in KINDS.values():
        if head in k.aliases:
            return k.parse(arg)
    if text in model_names:
        return KINDS["model"].parse(text)
    shorthands = sorted({a for k in KINDS.values() for a in k.aliases[:1]})
    raise SpecvizError(f"unknown drafter {text!r}: use {', '.join(shorthands)} (with :N) or a model "
                       f"from models.yaml ({', '.join(model_names)})")


def choices(model_names) -> list[str]:
    """Shorthands a front end offers: each kind's, then the registry's models (as draft models)."""
    return [c for k in KINDS.values() for c in k.choices] + list(model_names)


def forms(target: str) -> list[str]:
    """Every kind's shorthands that can run beside ``target`` (the API's model listing); model
    drafters are listed by name apart."""
    return [f for k in KINDS.values() for f in k.forms(target)]


__all__ = ["KINDS", "Drafter", "DrafterKind", "Proposal", "PromptLookupDrafter", "EarlyExitDrafter",
           "ModelDrafter", "RecyclingDrafter", "HeadDrafter", "SelfDraftDrafter", "kind", "parse_drafter", "choices",
           "forms"]
