"""Request bodies of ``/v1/chat/completions`` and ``/v1/completions``, checked field by field.

``parse(body, kind, limits)`` returns a :class:`GenRequest` or raises :class:`ApiError` (400) naming
the field (``param``) and saying what would be accepted. Fields a client library sends with their
default values (``n: 1``, ``presence_penalty: 0``, ``logprobs: false``, ...) are accepted; a
non-default value of something specviz does not do is refused, never silently ignored.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

from ..events import lone_surrogate
from .errors import bad

MAX_SPECULATIVE_TOKENS = 31  # engine.MAX_GAMMA: passes stay within the exact mode's 32 rows
MAX_STOPS = 4


@dataclass(frozen=True)
class Limits:
    """What a server owner allows (environment variables, read per request)."""

    max_tokens: int = 1024  # SPECVIZ_API_MAX_TOKENS: the most new tokens one request may ask for
    max_prompt_chars: int = 20_000  # SPECVIZ_API_MAX_PROMPT_CHARS: the longest prompt (all messages)
    default_max_tokens: int = 256  # when a request gives no max_tokens (capped by max_tokens)
    max_queue: int = 16  # SPECVIZ_API_MAX_QUEUE: runs queued (page's included) beyond which requests get a 429

    @classmethod
    def from_env(cls, env=os.environ) -> "Limits":
        def read(name, default):
            try:
                value = int(env.get(name, default))
            except ValueError:
                return default
            return value if value >= 1 else default

        max_tokens = read("SPECVIZ_API_MAX_TOKENS", cls.max_tokens)
        return cls(max_tokens, read("SPECVIZ_API_MAX_PROMPT_CHARS", cls.max_prompt_chars),
                   min(cls.default_max_tokens, max_tokens), read("SPECVIZ_API_MAX_QUEUE", cls.max_queue))

    @property
    def max_body_bytes(self) -> int:
        return max(1 << 20, 8 * self.max_prompt_chars)


@dataclass
class Speculative:
    draft_model: str | None  # None: plain decoding; "auto", "lookup[:N]", "early-exit:L" or a model
    num_speculative_tokens: int | None = None  # None: the recommended pair's gamma
    costs: tuple[float, ...] | None = None  # a pinned cost profile (None: this server's measured one)


@dataclass
class GenRequest:
    kind: str  # "chat" | "completion"
    model: str
    messages: list[dict] | None = None  # chat: [{"role", "content": str}], roles system/user/assistant
    prompt: str | None = None  # completion
    max_tokens: int = 256
    max_tokens_param: str | None = None  # the field that set max_tokens; None: the server's default
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    speculative: Speculative | None = None

    @property
    def prompt_param(self) -> str:
        return "messages" if self.kind == "chat" else "prompt"


# fields accepted when they hold what specviz does anyway (value -> accepted?)
def _default(*allowed):
    """Accepted when null or equal to one of ``allowed`` of the same kind (``true`` is not ``1``)."""
    return lambda v: v is None or any(v == a and isinstance(v, bool) == isinstance(a, bool) for a in allowed)


_DEFAULT_ONLY = {
    "n": _default(1),
    "best_of": _default(1),
    "presence_penalty": _default(0),
    "frequency_penalty": _default(0),
    "repetition_penalty": _default(1),
    "logprobs": _default(False, 0),
    "top_logprobs": _default(0),
    "echo": _default(False),
    "suffix": _default(""),
    "logit_bias": lambda v: not v,
    "tools": lambda v: not v,
    "functions": lambda v: not v,
    "tool_choice": _default("none", "auto"),
    "function_call": _default("none", "auto"),
    "parallel_tool_calls": lambda v: True,
    "response_format": lambda v: v is None or (isinstance(v, dict) and v.get("type") == "text"),
    "modalities": lambda v: v is None or v == ["text"],
    "reasoning_effort": lambda v: v is None,
    "prediction": lambda v: v is None,
    "audio": lambda v: v is None,
    "web_search_options": lambda v: v is None,
}
_IGNORED = {"user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key"}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
           "stream_options", "speculative"}
_FIELDS = {"chat": _COMMON | {"messages", "max_completion_tokens"}, "completion": _COMMON | {"prompt"}}
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _int(value, param: str, lo: int, hi: int | None = None, what: str = "a whole number") -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"{param} must be {what}, got {_show(value)}", param)
    if value < lo or (hi is not None and value > hi):
        span = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise bad(f"{param} must be {span}, got {value}", param)
    return value


def _num(value, param: str, lo: float, hi: float, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad(f"{param} must be a number, got {_show(value)}", param)
    if value < lo or value > hi or (lo_open and value == lo):
        left = "(" if lo_open else "["
        raise bad(f"{param} must be in {left}{lo:g}, {hi:g}], got {value:g}", param)
    return float(value)


def _show(value) -> str:
    """A request's value as the client wrote it: JSON (true, null, "text"), not Python (True, None, 'text')."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unicode(text: str, param: str) -> str:
    """``text`` as sent, refused where JSON's escapes made it no Unicode (a lone surrogate such as
    "\\ud800", which no tokenizer can encode)."""
    at = lone_surrogate(text)
    if at is not None:
        raise bad(f"{param} is not valid Unicode: it holds a lone surrogate ({text[at]!a}) at "
                  f"character {at}", param)
    return text


def _text(content, param: str) -> str:
    """A message's content: a string, or a list of text parts (what the OpenAI client sends)."""
    if isinstance(content, str):
        return _unicode(content, param)
    if isinstance(content, list):
        out = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"{param}[{i}]: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported",
                          f"{param}[{i}]")
            out.append(_unicode(part["text"], f"{param}[{i}].text"))
        return "".join(out)
    raise bad(f"{param} must be a string or a list of text parts, got {_show(content)}", param)


def _messages(value) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise bad("messages must be a non-empty list of {\"role\", \"content\"} objects", "messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{where} must be an object with role and content", where)
        role = m.get("role")
        if role not in _ROLES:
            raise bad(f"{where}.role must be one of system, developer, user, assistant; got {_show(role)}",
                      f"{where}.role")
        extra = set(m) - {"role", "content", "name"}
        if extra:
            raise bad(f"{where}: unsupported field(s) {', '.join(sorted(extra))} (tools are not supported)", where)
        content = m.get("content")
        if content is None and role != "assistant":
            raise bad(f"{where}.content is missing", f"{where}.content")
        out.append({"role": _ROLES[role], "content": "" if content is None else _text(content, f"{where}.content")})
    if not any(m["content"].strip() for m in out):
        raise bad("messages: every message is empty (or only whitespace)", "messages")
    return out


def _prompt(value) -> str:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if isinstance(value, list):
        raise bad("prompt must be one string (batches of prompts and token-id prompts are not supported)", "prompt")
    if not isinstance(value, str):
        raise bad(f"prompt must be a string, got {_show(value)}", "prompt")
    if not value.strip():
        raise bad("prompt is empty (or only whitespace)", "prompt")
    return _unicode(value, "prompt")


def _stop(value) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("stop must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOPS:
        raise bad(f"stop takes at most {MAX_STOPS} sequences, got {len(stops)}", "stop")
    if any(not s or len(s) > 200 for s in stops):
        raise bad("each stop sequence must be 1 to 200 characters", "stop")
    for s in stops:
        _unicode(s, "stop")
    return list(dict.fromkeys(stops))


def _speculative(value) -> Speculative | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad("speculative must be an object like {\"draft_model\": \"lookup\", \"num_speculative_tokens\": 4} "
                  "or null", "speculative")
    extra = set(value) - {"draft_model", "num_speculative_tokens", "costs"}
    if extra:
        raise bad(f"speculative: unknown field(s) {', '.join(sorted(extra))}; it takes draft_model, "
                  "num_speculative_tokens and costs", "speculative")
    draft = value.get("draft_model", "auto")
    if draft is not None and (not isinstance(draft, str) or not draft.strip()):
        raise bad("speculative.draft_model must be \"auto\", a drafter (\"lookup\", \"early-exit:L\", \"recycling\", "
                  "\"self:int8\", \"head\"...: GET /v1/models lists them), a model name, or null; got "
                  f"{_show(draft)}", "speculative.draft_model")
    n = value.get("num_speculative_tokens")
    if n is not None:
        n = _int(n, "speculative.num_speculative_tokens", 1, MAX_SPECULATIVE_TOKENS)
    costs = _costs(value.get("costs"))
    if draft is None:
        return None
    return Speculative(draft.strip(), n, costs)


def _costs(value) -> tuple[float, ...] | None:
    """``speculative.costs``: "measured" (or null: this server's profile, measured at its first run),
    "reference" (the one shipped in specviz/costs.py), or a profile as ``usage.speculative.costs.v``
    reports it. The lookup and head drafters choose proposal lengths from it, so a seeded sampled
    run repeats across servers and restarts only with the profile pinned."""
    from ..costs import MAX_COST, MAX_LENGTHS, REFERENCE

    if value is None or value == "measured":
        return None
    if value == "reference":
        return REFERENCE
    param = "speculative.costs"  # costs.check_profile's rule, said per element in the API's words
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_LENGTHS:
        raise bad(f"{param} must be \"measured\", \"reference\" or a list of 1 to {MAX_LENGTHS} "
                  f"positive numbers (usage.speculative.costs.v of an earlier response), got {_show(value)}", param)
    return tuple(_num(x, param, 0.0, MAX_COST, lo_open=True) for x in value)


def parse(body, kind: str, limits: Limits) -> GenRequest:
    """Check a decoded JSON body; ``kind`` is "chat" or "completion"."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    for name in body:
        if name in _FIELDS[kind] or name in _IGNORED:
            continue
        if name in _DEFAULT_ONLY:
            if not _DEFAULT_ONLY[name](body[name]):
                raise bad(f"{name}: {_show(body[name])} is not supported by specviz (only its default)", name)
            continue
        if name == "max_completion_tokens" or name == "messages" or name == "prompt":
            endpoint = "/v1/chat/completions" if name != "prompt" else "/v1/completions"
            raise bad(f"{name} belongs to {endpoint}", name)
        raise bad(f"unrecognized request argument: {name}", name)
    model = body.get("model")
    if "model" not in body or model == "":
        raise bad("model is required: one of the ids GET /v1/models lists", "model")
    if not isinstance(model, str):
        raise bad(f"model must be a string, one of the ids GET /v1/models lists; got {_show(model)}", "model")
    req = GenRequest(kind, model)
    if kind == "chat":
        req.messages = _messages(body.get("messages"))
        chars = sum(len(m["content"]) for m in req.messages)
    else:
        if "prompt" not in body:
            raise bad("prompt is required", "prompt")
        req.prompt = _prompt(body["prompt"])
        chars = len(req.prompt)
    if chars > limits.max_prompt_chars:
        raise bad(f"the prompt is {chars:,} characters; this server accepts at most {limits.max_prompt_chars:,} "
                  "(SPECVIZ_API_MAX_PROMPT_CHARS)", req.prompt_param, "prompt_too_long")
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None \
            and body["max_tokens"] != body["max_completion_tokens"]:
        raise bad(f"max_tokens ({_show(body['max_tokens'])}) and max_completion_tokens "
                  f"({_show(body['max_completion_tokens'])}) disagree: give one of them", "max_tokens")
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(name)
    if max_tokens is None:
        req.max_tokens = limits.default_max_tokens
    else:
        req.max_tokens, req.max_tokens_param = _int(max_tokens, name, 1), name
        if req.max_tokens > limits.max_tokens:
            raise bad(f"{name} is {req.max_tokens}; this server allows at most {limits.max_tokens} "
                      "(SPECVIZ_API_MAX_TOKENS)", name)
    if body.get("temperature") is not None:
        req.temperature = _num(body["temperature"], "temperature", 0.0, 2.0)
        if 0 < req.temperature < 0.01:
            raise bad(f"temperature must be 0 (greedy) or at least 0.01, got {req.temperature:g}", "temperature")
    if body.get("top_p") is not None:
        req.top_p = _num(body["top_p"], "top_p", 0.0, 1.0, lo_open=True)
    if body.get("top_k") is not None:
        req.top_k = _int(body["top_k"], "top_k", 0, what="a whole number (0 = off)")
    if body.get("seed") is not None:
        req.seed = _int(body["seed"], "seed", -2 ** 63, 2 ** 63 - 1)  # OpenAI's int64
    req.stop = _stop(body.get("stop"))
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise bad("stream must be true or false", "stream")
    req.stream = bool(stream)
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or set(options) - {"include_usage", "include_obfuscation"}:
            raise bad("stream_options takes {\"include_usage\": true|false}", "stream_options")
        if not req.stream:
            raise bad("stream_options is only allowed with stream: true", "stream_options")
        if not isinstance(options.get("include_usage", False), bool):
            raise bad("stream_options.include_usage must be true or false", "stream_options.include_usage")
        req.include_usage = options.get("include_usage", False)
    req.speculative = _speculative(body.get("speculative"))
    return req
