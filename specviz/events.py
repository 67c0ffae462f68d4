"""The records the engine yields: one ``StartEvent``, one ``IterationEvent`` per iteration
(per token for vanilla decoding), one ``SummaryEvent``.  The UI, the CLI and the benchmark all
read these; nothing downstream recomputes what the engine already knew.

Every event serialises to a JSON-ready dict with an ``"event"`` field and back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Iterable


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
    event: str = "start"


@dataclass
class Correction:
    """The token the target itself contributes to an iteration."""

    token: int
    text: str
    kind: str  # "resample" (after a rejection) | "bonus" (all accepted) | "sample" (plain step)
    p: float  # its probability under the distribution it was drawn from
    top: list[list]  # that distribution's top tokens: [id, text, prob]


@dataclass
class IterationEvent:
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
    acceptance_rate: float | None  # accepted / proposed
    mean_accepted: float  # accepted proposals per iteration
    tokens_per_iteration: float  # emitted tokens per iteration (vLLM's "mean acceptance length")
    tokens_per_second: float  # new tokens / wall time (prefill included)
    decode_tokens_per_second: float  # new tokens / (wall time - prefill)
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


def from_dict(d: dict) -> Event:
    kind = d.get("event")
    if kind not in _TYPES:
        raise ValueError(f"not a specviz event: {kind!r}")
    cls = _TYPES[kind]
    names = {f.name for f in fields(cls)}
    data = {k: v for k, v in d.items() if k in names}
    if cls is IterationEvent:
        data["correction"] = Correction(**data["correction"])
    return cls(**data)


def dumps(events: Iterable[Event]) -> str:
    return json.dumps([to_dict(e) for e in events])


def loads(text: str) -> list[Event]:
    raw: Any = json.loads(text)
    if isinstance(raw, dict):
        raw = raw.get("events", [])
    if not isinstance(raw, list):
        raise ValueError("expected a list of events")
    return [from_dict(d) for d in raw]
