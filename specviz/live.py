"""One UI run: speculative decoding of a prompt, then (optionally) vanilla decoding of the same
prompt with the same settings on the same hardware, as a stream of states a front end renders.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterator

from .engine import DecodeConfig
from .events import IterationEvent
from .exactness import Comparison as Exactness, compare
from .loading import Pipeline
from .trace import Comparison, Trace, compare_runs


@dataclass
class LiveState:
    phase: str  # "speculative" | "vanilla" | "done"
    spec: Trace = field(default_factory=Trace)
    vanilla: Trace | None = None
    comparison: Comparison | None = None
    exact: Exactness | None = None
    last: IterationEvent | None = None  # the newest iteration, if this state added one

    def snapshot(self) -> "LiveState":
        """A copy whose phase and newest iteration stay put (the traces only ever grow), so a
        consumer on another thread may read it after the run has moved on."""
        return replace(self)


def live_run(pipe: Pipeline, prompt: str, cfg: DecodeConfig, chat: bool = True,
             with_vanilla: bool = True) -> Iterator[LiveState]:
    ids = pipe.encode(prompt, chat)
    state = LiveState("speculative")
    for ev in pipe.speculative(ids, cfg):
        state.spec.add(ev)
        state.last = ev if isinstance(ev, IterationEvent) else None
        yield state.snapshot()
    if with_vanilla:
        state.phase, state.vanilla, state.last = "vanilla", Trace(), None
        for ev in pipe.vanilla(ids, cfg):
            state.vanilla.add(ev)
            yield state.snapshot()
        state.comparison = compare_runs(state.spec, state.vanilla)
        state.exact = compare(pipe.target_lm, ids, state.vanilla.output_ids, state.spec.output_ids)
    state.phase, state.last = "done", None
    yield state.snapshot()
