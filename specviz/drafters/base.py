"""What a drafter is (the protocol the engine drives) and what a kind of drafter is (the one entry
the registry, the loader, the app and the bench read).

The drafter protocol is two verbs (after transformers' candidate generators):
  ``propose(ids, max_tokens, sampling, generator) -> Proposal``  the next tokens and their q;
  ``commit(ids)``  the verified sequence, so the drafter can roll its own state back.
``reset(prompt_ids)`` starts a new run; ``observe(proposed, accepted)`` says how the last
proposal fared. A proposal may be empty: the engine then takes a plain target step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..errors import SpecvizError
from ..sampling import SamplingConfig

if TYPE_CHECKING:  # pragma: no cover
    from ..backends.transformers import Loaded


@dataclass
class Proposal:
    tokens: list[int]
    q_rows: torch.Tensor | None  # (gamma, V) distributions the tokens were drawn from; None = one-hot
    q_raw: list[float] = field(default_factory=list)  # softmax (T=1) prob of each token, for display
    reason: str = ""  # why this many tokens (shown in the UI)
    draft_ms: float = 0.0


class Drafter:
    kind = "base"
    name = "drafter"
    wants_costs = False  # True: the engine hands it the target's cost profile before a run
    costs: list[float] | None = None

    def reset(self, prompt_ids: list[int]) -> None:  # pragma: no cover - interface
        pass

    def propose(self, ids: list[int], max_tokens: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:  # pragma: no cover - interface
        raise NotImplementedError

    def commit(self, ids: list[int]) -> None:
        pass

    def observe(self, proposed: int, accepted: int) -> None:
        """How the last proposal fared (for drafters that adapt their length)."""

    def harvest(self, ids: list[int], logits: torch.Tensor) -> None:
        """The target's raw logits from the verify pass just run (optional; Token Recycling
        learns from them): row j is its prediction for the token after
        ``ids[len(ids) - len(logits) + j]``, where ``ids`` is the context plus this iteration's
        proposals (rows past a refused proposal were conditioned on it). Called before
        ``commit``; the engine computed these rows anyway, so this costs nothing extra."""

    def describe(self) -> dict:
        return {"kind": self.kind, "name": self.name}

    def label(self) -> str:
        """A short name for a chart's legend or a map's marker ("draft head + lookup + datastore");
        ``name`` is the long one, with the drafter's settings."""
        return self.name

    def fixed(self) -> "Drafter":
        """This drafter proposing as many tokens as it is asked for, where it can (the Lab's sweep of
        fixed γ). A drafter that chooses no length of its own (a draft model, early exit) is that
        already and returns itself; one that does returns a copy without the choice."""
        return self


class DrafterKind:
    """One kind of drafter, everything the rest of specviz needs to know about it.

    Subclass it next to the drafter, give it a ``name`` and add it to ``KINDS`` in
    ``specviz/drafters/__init__.py``: models.yaml, ``--draft``, the app's drafter list and the
    bench's peer then know it.
    """

    name = "base"  # the `kind:` in models.yaml
    aliases: tuple[str, ...] = ()  # shorthand heads for --draft / the app ("lookup", "early-exit")
    choices: tuple[str, ...] = ()  # shorthands offered in the app's drafter list
    source = ""  # where its proposals come from (shown as the draft's source)

    def parse(self, arg: str) -> dict:
        """The shorthand's argument (after ':') -> a drafter spec as in models.yaml."""
        if arg:
            raise SpecvizError(f"drafter {self.name} takes no argument, got {arg!r}")
        return {"kind": self.name}

    def check(self, spec: dict, where: str, base=None) -> dict:
        """Validate a models.yaml drafter spec (raise SpecvizError); return it normalised
        (``base``: the registry's folder, for relative paths)."""
        if "datastore" in spec:
            raise SpecvizError(f"{where}: only a prompt_lookup drafter can use a datastore")
        return spec

    def forms(self, target: str) -> tuple[str, ...]:
        """The shorthands a listing (the API's /v1/models) offers for ``target``: those that can run
        beside it, with placeholders for arguments ("lookup:N")."""
        return self.choices

    def draft_model(self, spec: dict) -> str | None:
        """The registry model this drafter needs loaded beside the target, if any."""
        return None

    def build(self, spec: dict, target: "Loaded", draft: "Loaded | None") -> Drafter:  # pragma: no cover
        raise NotImplementedError

    def peer(self, drafter: Drafter, gamma: int, draft: "Loaded | None") -> dict[str, Any] | None:
        """Keyword arguments for transformers' ``generate`` doing the same kind of drafting
        (the bench's peer), or None where transformers has no equivalent."""
        return None


def whole(value, what: str, minimum: int = 1) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise SpecvizError(f"{what} must be a whole number, got {value!r}") from None
    if n != value and str(n) != str(value) or n < minimum:
        raise SpecvizError(f"{what} must be a whole number >= {minimum}, got {value!r}")
    return n
