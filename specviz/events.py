"""The records the engine yields: one ``StartEvent``, one ``IterationEvent`` per iteration
(per token for vanilla decoding), one ``SummaryEvent``.  The UI, the CLI and the benchmark all
read these; nothing downstream recomputes what the engine already knew.

Every event serialises to a JSON-ready dict with an ``"event"`` field and back. ``from_dict``
validates what it reads (types, lengths, bounded sizes) field by field, since a run file may come
from anyone: a damaged or hand-edited file gets a message that names the field, never a crash.

The texts of tokens (``proposed_text``, ``emitted_text``, ``target_top``, a correction's ``text``
and ``top``) may be left to be decoded on first read (``Later``): a front end that shows them
pays for them, a bench or a program that reads only ids and numbers does not.
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Callable

from .costs import check_profile
from .errors import SpecvizError


class Later:
    """Fields filled in on first read: ``cls.later(fill, **now)`` makes the record with the fields
    in ``now``; the first read of any other field calls ``fill()`` once for the dict of the rest.

    Decoding a token's text is a tokenizer call per piece (~1 ms an iteration of 2-10 tokens and
    their top alternatives, on a 2-core CPU, against a ~50 ms target pass); nothing in decoding
    itself needs them; nor the target's raw probabilities the inspector shows (``RawStats`` in the
    engine computes them for several iterations at once). Equality, ``asdict``, copies and pickles
    all see every field (they read them, or ``__getstate__`` fills them first)."""

    @classmethod
    def later(cls, fill: Callable[[], dict], **now):
        obj = cls.__new__(cls)
        obj.__dict__.update(now, _later=fill)
        return obj

    def _fill(self) -> bool:
        fill = self.__dict__.pop("_later", None)
        if fill is not None:
            self.__dict__.update(fill())
        return fill is not None

    def __getattr__(self, name: str):  # only reached for a field not yet filled
        if not name.startswith("__") and self._fill():
            return getattr(self, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self) -> dict:
        self._fill()
        return dict(self.__dict__)


@dataclass
class StartEvent:
    mode: str  # "speculative" | "vanilla"
    drafter: dict
    sampling: dict
    gamma: int
    max_new_tokens: int
    seed: int | None
    prompt_ids: list[int]
    prompt_text: str
    target: dict = field(default_factory=dict)  # name, device, dtype
    draft: dict = field(default_factory=dict)
    prefill_ms: float = 0.0
    costs: dict = field(default_factory=dict)  # the cost profile a cost-aware drafter used: source, v
    event: str = "start"


CORRECTION_KINDS = ("resample", "bonus", "sample")  # how the target drew its own token


@dataclass
class Correction(Later):
    """The token the target itself contributes to an iteration."""

    token: int
    text: str
    kind: str  # "resample" (after a rejection) | "bonus" (all accepted) | "sample" (plain step)
    p: float  # its probability under the distribution it was drawn from
    top: list[list]  # that distribution's top tokens: [id, text, prob]


@dataclass
class IterationEvent(Later):
    index: int
    drafter: str
    gamma: int  # proposals asked for this iteration (after adaptation)
    reason: str  # why that many
    proposed: list[int]
    proposed_text: list[str]
    q: list[float]  # q(x_i): draft probability of each proposal (processed; 1.0 for lookup)
    p: list[float]  # p(x_i): target probability of each proposal (processed)
    q_raw: list[float]  # softmax (T=1) probabilities, unprocessed: context for greedy runs
    p_raw: list[float]
    accept_prob: list[float]  # min(1, p/q)
    draws: list[float | None]  # the uniform draw of each examined proposal
    accepted: int
    correction: Correction
    target_top: list[list[list]]  # per examined position (accepted + 1): top target tokens [id, text, p_raw]
    emitted: list[int]
    emitted_text: list[str]
    draft_ms: float
    verify_ms: float
    tokens_total: int  # generated so far (after this iteration)
    proposed_total: int
    accepted_total: int
    elapsed_ms: float  # since the start of the run (prefill included)
    event: str = "iteration"

    @property
    def rejected(self) -> bool:
        return self.correction.kind == "resample"


@dataclass
class SummaryEvent:
    mode: str
    output_ids: list[int]
    text: str
    new_tokens: int
    iterations: int
    proposed: int
    accepted: int
    examined: int  # proposals the rule looked at (those after a rejection never are)
    acceptance_rate: float | None  # accepted / proposed: the share of proposed tokens kept
    alpha: float | None  # accepted / examined: per-position acceptance, the a of Leviathan et al.
    tokens_per_iteration: float  # emitted tokens per iteration (vLLM's "mean acceptance length")
    tokens_per_second: float  # new tokens / wall time (prefill included)
    wall_ms: float  # the run's own time: excludes consumer_ms
    prefill_ms: float
    draft_ms: float
    verify_ms: float
    stop_reason: str  # "eos" | "max_new_tokens" | "context" | "stopped"
    accepted_by_position: list[list[int]] = field(default_factory=list)  # [[kept, examined], ...]
    consumer_ms: float = 0.0  # time the consumer (a UI rendering each event) held the stream
    server_metrics: dict = field(default_factory=dict)  # a serving engine's own per-request numbers (vLLM)
    event: str = "summary"


Event = StartEvent | IterationEvent | SummaryEvent
_TYPES = {"start": StartEvent, "iteration": IterationEvent, "summary": SummaryEvent}


def to_dict(ev: Event) -> dict:
    return asdict(ev)


# ---- reading events back, from a file anyone may have written -------------------------------

MAX_LIST = 100_000  # longest list a field may hold (a run of 100k tokens is far beyond any front end)
MAX_STR = 20_000  # longest string (a prompt's text can be long; a token's is short)
MAX_TOKEN_TEXT = 512  # longest token text (the longest in common vocabularies are runs of ~100-250 spaces or dashes)


class SchemaError(ValueError):
    """A saved event does not have the shape specviz writes; the message names the field."""


def _check(value, hint, where: str):
    """``value`` as the type ``hint`` says, or SchemaError naming ``where``."""
    origin = typing.get_origin(hint)
    if hint is typing.Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for option in typing.get_args(hint):
            try:
                return _check(value, option, where)
            except SchemaError as e:
                errors.append(str(e))
        raise SchemaError(errors[0] if errors else f"{where}: unexpected value")
    if hint is type(None):
        if value is not None:
            raise SchemaError(f"{where}: expected null, got {type(value).__name__}")
        return None
    if hint is bool:
        if not isinstance(value, bool):
            raise SchemaError(f"{where}: expected true or false, got {type(value).__name__}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(f"{where}: expected a whole number, got {_show(value)}")
        if abs(value) > 2 ** 53:
            raise SchemaError(f"{where}: {_show(value)} is out of range (at most 2^53 in size)")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SchemaError(f"{where}: expected a number, got {_show(value)}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise SchemaError(f"{where}: expected text, got {_show(value)}")
        if len(value) > MAX_STR:
            raise SchemaError(f"{where}: text longer than {MAX_STR:,} characters")
        if lone_surrogate(value) is not None:
            raise SchemaError(f"{where}: text that is not valid Unicode (a lone surrogate such as \\ud800)")
        return value
    if hint is dict or origin is dict:
        if not isinstance(value, dict):
            raise SchemaError(f"{where}: expected an object, got {_show(value)}")
        if len(value) > 64:
            raise SchemaError(f"{where}: more than 64 entries")
        return {_check(k, str, f"{where} (a key)"): _plain(v, f"{where}.{k}", 3) for k, v in value.items()}
    if hint is list or origin is list:
        if not isinstance(value, list):
            raise SchemaError(f"{where}: expected a list, got {_show(value)}")
        if len(value) > MAX_LIST:
            raise SchemaError(f"{where}: more than {MAX_LIST:,} items")
        (item,) = typing.get_args(hint) or (typing.Any,)
        return [_check(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if hint is Correction:
        return _build(Correction, value, where)
    raise SchemaError(f"{where}: unsupported field type {hint!r}")  # pragma: no cover - our own types


def _plain(value, where: str, depth: int):
    """A small JSON value (for free-form dicts like ``target``): scalars, short lists, shallow dicts."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):  # was read as null: a NaN temperature showed the run as greedy
            raise SchemaError(f"{where}: {_show(value)} is not a number")
        return value
    if isinstance(value, str):
        return _check(value, str, where)
    if depth > 0 and isinstance(value, list) and len(value) <= 4096:
        return [_plain(v, f"{where}[{i}]", depth - 1) for i, v in enumerate(value)]
    if depth > 0 and isinstance(value, dict) and len(value) <= 64:
        return {_check(k, str, f"{where} (a key)"): _plain(v, f"{where}.{k}", depth - 1) for k, v in value.items()}
    raise SchemaError(f"{where}: unexpected value {_show(value)}")


def lone_surrogate(text: str) -> int | None:
    """Where ``text`` holds half a character (JSON's "\\ud800"), which cannot be sent as UTF-8 nor
    tokenized, or None: one in a replayed run broke the visitor's page until it was reloaded (the
    server fails sending the update), one in a prompt failed in the tokenizer."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def _show(value) -> str:
    text = repr(value)
    return (text[:40] + "...") if len(text) > 40 else text


def _build(cls, data, where: str):
    if not isinstance(data, dict):
        raise SchemaError(f"{where}: expected an object, got {_show(data)}")
    hints = typing.get_type_hints(cls)
    out = {}
    for f in fields(cls):
        if f.name not in data:
            if f.default is not MISSING or f.default_factory is not MISSING:
                continue
            raise SchemaError(f"{where}: missing field {f.name!r}")
        out[f.name] = _check(data[f.name], hints[f.name], f"{where}.{f.name}")
    return cls(**out)


def from_dict(d: dict, where: str = "event") -> Event:
    """An event from its dict, validated; raises SchemaError saying which field is wrong."""
    if not isinstance(d, dict):
        raise SchemaError(f"{where}: expected an object, got {_show(d)}")
    kind = d.get("event")
    if kind not in _TYPES:
        raise SchemaError(f"{where}: not a specviz event (event = {_show(kind)})")
    ev = _build(_TYPES[kind], d, f"{where} ({kind})")
    _check_ranges(ev, where)
    if isinstance(ev, IterationEvent):
        n = len(ev.proposed)
        if len(ev.proposed_text) != n:
            raise SchemaError(f"{where}.proposed_text: {len(ev.proposed_text)} items for {n} proposals")
        rule = ("q", "p", "accept_prob", "draws")  # all or none: a backend that does not know them has none
        for name in rule + ("q_raw", "p_raw"):
            if len(getattr(ev, name)) not in (0, n):
                raise SchemaError(f"{where}.{name}: {len(getattr(ev, name))} items for {n} proposals")
        if n and len({len(getattr(ev, name)) for name in rule}) > 1:
            raise SchemaError(f"{where}: q, p, accept_prob and draws are given for some proposals' rule, not all "
                              f"({', '.join(f'{name} {len(getattr(ev, name))}' for name in rule)} for {n})")
        if not 0 <= ev.accepted <= n or len(ev.emitted_text) != len(ev.emitted):
            raise SchemaError(f"{where}: accepted/emitted do not match the proposals")
        if ev.correction.kind not in CORRECTION_KINDS:
            raise SchemaError(f"{where}.correction.kind: {_show(ev.correction.kind)} is not one of "
                              f"{', '.join(CORRECTION_KINDS)}")
        _check_rule(ev, n, where)
    return ev


def _check_rule(ev: IterationEvent, n: int, where: str) -> None:
    """What the views state must be what the rule did: each examined proposal kept exactly when its
    draw u < min(1, p/q), the kind of the target's token following from the count kept, and the
    emitted tokens the kept proposals then that token (cut at EOS or the limit). A crafted file showed
    "u = 0.990 (< min(1, p/q) = 0.1)" on a kept token, and one text in the token view, another in the
    output."""
    k = ev.accepted
    kind = "sample" if n == 0 else "bonus" if k == n else "resample"
    if ev.correction.kind != kind:
        raise SchemaError(f"{where}.correction.kind: {ev.correction.kind} after {k} of {n} proposals kept; the "
                          f"rule gives {kind}")
    if ev.draws:
        for i in range(min(k + 1, n)):
            u, a = ev.draws[i], ev.accept_prob[i]
            if u is None or (u < a) != (i < k):
                said = "kept" if i < k else "refused"
                raise SchemaError(f"{where}.draws[{i}]: u = {_show(u)} and min(1, p/q) = {a:g}, yet proposal "
                                  f"{i + 1} was {said}: the rule keeps it exactly when u < min(1, p/q)")
    whole = ev.proposed[:k] + [ev.correction.token]
    if ev.emitted != whole[:len(ev.emitted)]:
        raise SchemaError(f"{where}.emitted: not the {k} kept proposals then the target's own token")
    same = min(k, len(ev.emitted))
    if ev.emitted_text[:same] != ev.proposed_text[:same]:
        raise SchemaError(f"{where}.emitted_text: the kept proposals' text differs from proposed_text")


# A number may have the right type and still be no probability or time at all; views draw bars and
# write percentages from these, so a file that claims q = 1e300 or a -5 ms pass is refused here.
PROB_SLACK = 1e-4  # float32 softmax may round a certain token's probability to just above 1
MAX_MS = 1e9  # ~11 days: longer than any run; beyond it a time is a made-up number
_PROBS = ("q", "p", "q_raw", "p_raw", "accept_prob")
_TIMES = ("prefill_ms", "draft_ms", "verify_ms", "elapsed_ms", "wall_ms", "consumer_ms")


def _prob(x, where: str) -> None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not -PROB_SLACK <= x <= 1 + PROB_SLACK:
        raise SchemaError(f"{where}: {_show(x)} is not a probability (one from 0 to 1)")


def _top_probs(top, where: str) -> None:
    """``[[id, text, prob], ...]``: the prob of each alternative."""
    for i, entry in enumerate(top):
        if (not isinstance(entry, list) or len(entry) != 3 or isinstance(entry[0], bool)
                or not isinstance(entry[0], int) or not isinstance(entry[1], str)):
            raise SchemaError(f"{where}[{i}]: expected [id, text, probability]")
        _check(entry[1], str, f"{where}[{i}][1]")
        _prob(entry[2], f"{where}[{i}][2]")


def _check_ranges(ev: Event, where: str) -> None:
    if isinstance(ev, IterationEvent):  # a token's text is short; a crafted 3,000-character one made the page 6,000 px tall
        texts = [("proposed_text", t) for t in ev.proposed_text] + [("emitted_text", t) for t in ev.emitted_text]
        texts += [("correction.text", ev.correction.text)]
        texts += [("target_top", e[1]) for pos in ev.target_top for e in pos if isinstance(e, list) and len(e) == 3]
        texts += [("correction.top", e[1]) for e in ev.correction.top if isinstance(e, list) and len(e) == 3]
        for name, t in texts:
            if isinstance(t, str) and len(t) > MAX_TOKEN_TEXT:
                raise SchemaError(f"{where}.{name}: a token's text of {len(t):,} characters (a token's is at most "
                                  f"{MAX_TOKEN_TEXT})")
    for name in _TIMES:
        t = getattr(ev, name, None)
        if t is not None and not 0 <= t <= MAX_MS:
            raise SchemaError(f"{where}.{name}: {_show(t)} is not a time in milliseconds (0 to {MAX_MS:.0e})")
    if isinstance(ev, StartEvent):  # views read the temperature as a number (greedy or not)
        if not 0 <= ev.gamma <= 1024 or ev.max_new_tokens < 1:
            raise SchemaError(f"{where}: gamma {ev.gamma} or max_new_tokens {ev.max_new_tokens} is out of range")
        v = ev.costs.get("v") if ev.costs else None
        if v is not None:
            try:
                check_profile(v, f"{where}.costs.v")
            except SpecvizError as e:
                raise SchemaError(str(e)) from None
        for key, lo, hi in (("temperature", 0, 1e6), ("top_p", 0, 1), ("top_k", 0, 2 ** 31)):
            x = ev.sampling.get(key)
            if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float)) or not lo <= x <= hi):
                raise SchemaError(f"{where}.sampling.{key}: {_show(x)} is not a {key} (a number from {lo} to {hi:g})")
    if isinstance(ev, IterationEvent):
        for name in _PROBS:
            for i, x in enumerate(getattr(ev, name)):
                _prob(x, f"{where}.{name}[{i}]")
        for i, u in enumerate(ev.draws):
            if u is not None and not 0 <= u <= 1:
                raise SchemaError(f"{where}.draws[{i}]: {_show(u)} is not a uniform draw (one from 0 to 1)")
        _prob(ev.correction.p, f"{where}.correction.p")
        _top_probs(ev.correction.top, f"{where}.correction.top")
        for j, top in enumerate(ev.target_top):
            _top_probs(top, f"{where}.target_top[{j}]")
    elif isinstance(ev, SummaryEvent):
        for name in ("acceptance_rate", "alpha"):
            x = getattr(ev, name)
            if x is not None:
                _prob(x, f"{where}.{name}")
        if not 0 <= ev.tokens_per_second <= MAX_MS:
            raise SchemaError(f"{where}.tokens_per_second: {_show(ev.tokens_per_second)} is out of range")
