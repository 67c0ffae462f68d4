"""A pair, assembled: a loaded target behind the ``Target`` protocol, its drafter and tokenizer.

``Pipeline`` is what the app, the CLI, the bench and the lab drive. Its shape (``name``,
``gamma``, ``tokenizer``, ``encode``, ``speculative``, ``vanilla``, ``info``) is the backend
seam above the engine: a remote serving engine offers the same verbs and yields the same events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

from . import drafters
from .backends.transformers import CachedLM, Loaded, check_tokenizers, load_model, model_eos_ids
from .drafters import Drafter
from .engine import DecodeConfig, encode_prompt, speculative_decode, vanilla_decode
from .errors import SpecvizError
from .registry import PairSpec, Registry, default_gamma


@dataclass
class Pipeline:
    name: str
    target: Loaded
    drafter: Drafter
    gamma: int
    draft: Loaded | None = None
    target_lm: CachedLM = field(init=False)

    def __post_init__(self) -> None:
        self.target_lm = CachedLM(self.target.model, len(self.target.tokenizer),
                                  eos=model_eos_ids(self.target.model, self.target.tokenizer),
                                  info=self.target.info())

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def info(self) -> dict:
        d = {"target": self.target.info(), "draft": self.draft.info() if self.draft else {}}
        if not self.draft:
            own = self.drafter.describe().get("precision")  # a self-draft's copy: not the target's dtype
            d["draft"] = {"name": self.drafter.name, "device": str(self.target.device),
                          "dtype": own or str(self.target.dtype).replace("torch.", ""),
                          "source": drafters.kind(self.drafter.kind).source}
        return d

    def warm_up(self, max_gamma: int | None = None) -> None:
        """Measure the cost profile a cost-aware drafter needs now, not during the first run."""
        if self.drafter.wants_costs:
            self.target_lm.cost_profile((max_gamma or self.gamma) + 1, self.encode("Warm up, please."))

    def encode(self, prompt: str, chat: bool = True) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, chat)

    def _ids(self, prompt: str | list[int], chat: bool) -> list[int]:
        return list(prompt) if isinstance(prompt, list) else self.encode(prompt, chat)

    def speculative(self, prompt: str | list[int], cfg: DecodeConfig, chat: bool = True) -> Iterator:
        return speculative_decode(self.target_lm, self.drafter, self.tokenizer, self._ids(prompt, chat), cfg,
                                  self.info())

    def vanilla(self, prompt: str | list[int], cfg: DecodeConfig, chat: bool = True) -> Iterator:
        return vanilla_decode(self.target_lm, self.tokenizer, self._ids(prompt, chat), cfg, self.info())

    def peer_kwargs(self, gamma: int) -> dict | None:
        """transformers' ``generate`` arguments for the same kind of drafting (the bench's peer)."""
        return drafters.kind(self.drafter.kind).peer(self.drafter, gamma, self.draft)


def build_drafter(spec: dict, target: Loaded, draft: Loaded | None) -> Drafter:
    return drafters.kind(spec.get("kind")).build(spec, target, draft)


def resolve_pair(registry: Registry, pair: str | None = None, target: str | None = None,
                 drafter: str | dict | None = None, gamma: int | None = None) -> PairSpec:
    """The pair to run: by name (optionally with another drafter), or a target and a drafter."""
    if pair and target:
        raise SpecvizError("give either a pair or a target (with a drafter), not both")

    def spec_of(d):
        return d if isinstance(d, dict) else drafters.parse_drafter(d, list(registry.models))

    if target:  # without a γ, the drafter runs at its pair's in models.yaml (default_gamma), as in the API
        registry.model(target)
        d = spec_of(drafter or "lookup")
        return PairSpec(f"{target}+{drafter or 'lookup'}", target, d, gamma or default_gamma(registry, target, d))
    spec = registry.pair(pair or registry.default())
    if drafter:
        d = spec_of(drafter)
        spec = PairSpec(spec.name, spec.target, d, gamma or default_gamma(registry, spec.target, d), spec.description)
    return spec


def build_pipeline(registry: Registry, pair: str | None = None, target: str | None = None,
                   drafter: str | dict | None = None, device: str = "auto", dtype: str = "auto",
                   gamma: int | None = None, progress: Callable[[str], None] | None = None) -> Pipeline:
    """Load and assemble a pair by name, or a target and a drafter named directly."""
    say = progress or (lambda msg: None)
    if gamma is not None:  # checked before any model loads (a start-up cost profile measures gamma + 1 rows)
        from .engine import MAX_GAMMA, _whole

        gamma = _whole(gamma, "gamma", 1, MAX_GAMMA)
    spec = resolve_pair(registry, pair, target, drafter, gamma)
    say(f"loading target {spec.target}")
    tgt = load_model(registry.model(spec.target), device, dtype)
    drf = None
    if spec.draft_model:
        say(f"loading draft {spec.draft_model}")
        drf = load_model(registry.model(spec.draft_model), device, dtype)
        check_tokenizers(tgt.tokenizer, drf.tokenizer, spec.target, spec.draft_model)
    return Pipeline(spec.name, tgt, build_drafter(spec.drafter, tgt, drf), gamma or spec.gamma, drf)
