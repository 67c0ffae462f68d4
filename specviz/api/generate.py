"""From a checked request to text: which target and drafter, the loaded pipeline, the prompt's
token ids, and decoding as a generator of text pieces ending with an :class:`Outcome`.

Nothing here knows about HTTP. The accept/reject loop stays invisible to the caller: what comes
out is text and token counts, identical to plain decoding's for greedy requests (the engine
guarantees the ids; stop sequences and counting are applied token by token, so where an
iteration's tokens are cut does not depend on how many tokens that iteration produced).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Iterator

from .. import drafters
from ..backends.transformers import load_model
from ..engine import DecodeConfig
from ..errors import SpecvizError
from ..events import IterationEvent, StartEvent, SummaryEvent
from ..pipeline import Pipeline, build_pipeline
from ..registry import DEFAULT_GAMMA, PairSpec, Registry, default_gamma, recommended_pair
from ..sampling import SamplingConfig
from .errors import ApiError, bad
from .requests import GenRequest



def drafter_label(spec: dict) -> str:
    """A drafter spec as the ``draft_model`` shorthand (for listings and snippets)."""
    kind = spec.get("kind")
    if kind == "model":
        return str(spec.get("model"))
    if kind == "early_exit":
        return f"early-exit:{spec.get('layers')}"
    return "lookup" if kind == "prompt_lookup" else str(kind)


@dataclass
class Plan:
    """What a request will run: a target and, for speculative requests, a drafter and gamma."""

    target: str
    draft: str | None = None  # the request's draft_model ("auto" kept as asked); None: plain decoding
    drafter: dict | None = None  # the drafter spec
    gamma: int = 0
    pair: str | None = None  # the pair "auto" chose

    @property
    def speculative(self) -> bool:
        return self.drafter is not None


def plan(registry: Registry, req: GenRequest) -> Plan:
    """Which models and drafter a request names; 404 for an unknown model, 400 for a bad drafter."""
    if req.model not in registry.models:
        hint = ""
        if req.model in registry.pairs:
            p = registry.pairs[req.model]
            hint = (f" ({req.model!r} is a pair: ask for its target {p.target!r} with "
                    "\"speculative\": {\"draft_model\": \"auto\"})")
        raise ApiError(404, f"the model {req.model!r} does not exist{hint}; GET /v1/models lists the models",
                       "model", "model_not_found")
    spec = req.speculative
    if spec is None:
        return Plan(req.model)
    pair = recommended_pair(registry, req.model)
    if spec.draft_model == "auto":
        if pair is None:
            raise bad(f"models.yaml has no pair with target {req.model!r}, so \"auto\" has nothing to use: name a "
                      "draft_model (\"lookup\", \"early-exit:L\" or a model)", "speculative.draft_model")
        return Plan(req.model, "auto", dict(pair.drafter), spec.num_speculative_tokens or pair.gamma, pair.name)
    try:
        drafter = drafters.parse_drafter(spec.draft_model, list(registry.models))
    except SpecvizError as e:
        raise bad(str(e), "speculative.draft_model", "unknown_draft_model") from None
    return Plan(req.model, spec.draft_model, drafter,
                spec.num_speculative_tokens or default_gamma(registry, req.model, drafter))


def load(registry: Registry, p: Plan, device: str = "auto", dtype: str = "auto") -> Pipeline:
    """The plan's pipeline (models come from the process-wide cache the page uses too).
    503 when a model cannot be loaded here; 400 when the drafter does not fit the target."""
    draft_model = drafters.kind(p.drafter["kind"]).draft_model(p.drafter) if p.drafter else None
    for name, param in [(p.target, "model"), (draft_model, "speculative.draft_model")]:
        if name is None:
            continue
        try:
            load_model(registry.model(name), device, dtype)
        except SpecvizError as e:
            raise ApiError(503, f"model {name!r} cannot be loaded on this server: {e}", param,
                           "model_unavailable") from None
    try:
        return build_pipeline(registry, pair=p.pair, target=None if p.pair else p.target,
                              drafter=None if p.pair else (p.drafter or "lookup"), device=device, dtype=dtype,
                              gamma=p.gamma or None)
    except SpecvizError as e:
        if p.speculative:  # the drafter does not fit this target (early-exit:99 on 30 layers, no trained head)
            raise bad(str(e), "speculative.draft_model", "unsupported_draft_model") from None
        raise bad(str(e), "model") from None


def encode(pipe: Pipeline, req: GenRequest) -> list[int]:
    """Prompt token ids, the way plain decoding of the same prompt would see them: a chat request
    through the target's chat template, a completion as plain text."""
    tok = pipe.tokenizer
    try:
        if req.kind == "completion":
            ids = pipe.encode(req.prompt, chat=False)
        elif getattr(tok, "chat_template", None):
            enc = tok.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=True)
            ids = [int(i) for i in (enc["input_ids"] if hasattr(enc, "keys") else enc)]
        else:  # a model without a chat template: a plain transcript
            text = "".join(f"{m['role']}: {m['content']}\n" for m in req.messages) + "assistant:"
            ids = pipe.encode(text, chat=False)
    except SpecvizError as e:
        raise bad(str(e), req.prompt_param) from None
    except Exception as e:  # a chat template may refuse a conversation (roles must alternate, ...)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise bad(f"the model's chat template refused these messages: {first}", "messages") from None
    if not ids:
        raise bad("the prompt encodes to no tokens", req.prompt_param)
    context = pipe.target_lm.context_length
    if len(ids) >= context:
        raise bad(f"the prompt is {len(ids)} tokens; the model's context is {context} tokens",
                  req.prompt_param, "context_length_exceeded")
    if req.max_tokens_param and len(ids) + req.max_tokens > context:  # as OpenAI and vLLM answer: not clipped quietly
        raise bad(f"the prompt is {len(ids)} tokens and {req.max_tokens_param} asks for {req.max_tokens} more; the "
                  f"model's context is {context} tokens: ask for at most {context - len(ids)}",
                  req.max_tokens_param, "context_length_exceeded")
    return ids


def config(req: GenRequest, p: Plan) -> DecodeConfig:
    try:
        sampling = SamplingConfig(req.temperature, req.top_k, req.top_p)
        seed = req.seed if req.seed is not None else secrets.randbelow(2 ** 31)
        # a negative int64 seeds the generator as torch itself reads it (two's complement)
        costs = req.speculative.costs if req.speculative is not None else None
        return DecodeConfig(gamma=p.gamma or DEFAULT_GAMMA, max_new_tokens=req.max_tokens, sampling=sampling,
                            seed=seed % 2 ** 64, costs=costs)
    except SpecvizError as e:
        raise bad(str(e)) from None


class TextStream:
    """Token ids in, text out in pieces that are safe to send: a piece never ends inside a
    character (bytes still arriving) or inside what may become a stop sequence."""

    def __init__(self, tokenizer, stops: list[str]):
        self.tok, self.stops = tokenizer, stops
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0
        self.stopped = False

    def push(self, token: int) -> str:
        self.ids.append(token)
        self.text = self.tok.decode(self.ids, skip_special_tokens=True)
        hits = [i for i in (self.text.find(s, self.sent) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self.text = self.text[:min(hits)]
            return self._take(len(self.text))
        safe = len(self.text)
        while safe > self.sent and self.text[safe - 1] == "\ufffd":
            safe -= 1
        hold = 0  # the longest tail that a stop sequence may start with
        for s in self.stops:
            hold = max([hold] + [k for k in range(1, min(len(s) - 1, safe - self.sent) + 1)
                                 if self.text[safe - k:safe] == s[:k]])
        return self._take(safe - hold)

    def finish(self) -> str:
        return self._take(len(self.text))

    def _take(self, upto: int) -> str:
        piece = self.text[self.sent:upto] if upto > self.sent else ""
        self.sent = max(self.sent, upto)
        return piece


@dataclass
class Outcome:
    text: str
    completion_tokens: int
    finish_reason: str  # "stop" (EOS or a stop sequence) | "length"
    stats: dict = field(default_factory=dict)  # the usage extension object


def decode(pipe: Pipeline, ids: list[int], cfg: DecodeConfig, p: Plan, stops: list[str],
           queued_s: float = 0.0) -> Iterator[str | Outcome]:
    """Decode (speculatively when the plan says so); yield text pieces, then one Outcome.
    Closing the generator stops decoding at once."""
    started = time.perf_counter()
    events = pipe.speculative(ids, cfg) if p.speculative else pipe.vanilla(ids, cfg)
    text = TextStream(pipe.tokenizer, stops)
    stats = {"mode": "speculative" if p.speculative else "plain", "draft_model": p.draft,
             "drafter": None, "num_speculative_tokens": cfg.gamma if p.speculative else 0,
             "target_passes": 0, "proposed": 0, "accepted": 0, "acceptance_rate": None, "tokens_per_pass": None,
             "prefill_ms": 0.0, "draft_ms": 0.0, "verify_ms": 0.0, "decode_ms": 0.0,
             "queue_ms": round(queued_s * 1000.0, 1), "costs": None,
             "seed": cfg.seed - 2 ** 64 if cfg.seed >= 2 ** 63 else cfg.seed}  # as the request gave it (int64)
    if p.pair:
        stats["pair"] = p.pair
    finish = "length"
    try:
        for ev in events:
            if isinstance(ev, StartEvent):
                stats["prefill_ms"] = ev.prefill_ms
                if p.speculative:
                    stats["drafter"] = ev.drafter.get("name")
                    stats["costs"] = ev.costs or None  # the profile a cost-aware drafter chose lengths by
            elif isinstance(ev, IterationEvent):
                stats["target_passes"] += 1
                stats["proposed"] += len(ev.proposed)
                stats["accepted"] += ev.accepted
                stats["draft_ms"] += ev.draft_ms
                stats["verify_ms"] += ev.verify_ms
                piece = "".join(text.push(t) for t in ev.emitted if not text.stopped)
                if piece:
                    yield piece
                if text.stopped:
                    finish = "stop"
                    break
            elif isinstance(ev, SummaryEvent):
                finish = "stop" if ev.stop_reason == "eos" else "length"
    finally:
        events.close()
    rest = text.finish()
    if rest:
        yield rest
    n = len(text.ids)
    stats["acceptance_rate"] = stats["accepted"] / stats["proposed"] if stats["proposed"] else None
    stats["tokens_per_pass"] = n / stats["target_passes"] if stats["target_passes"] else None
    stats["decode_ms"] = (time.perf_counter() - started) * 1000.0
    for k in ("prefill_ms", "draft_ms", "verify_ms", "decode_ms"):
        stats[k] = round(stats[k], 1)
    yield Outcome(text.text, n, finish, stats)
