"""A run as the front ends see it: its events in order and the statistics derived from them.

Built incrementally while a run streams (``add``), or all at once from a saved file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .events import IterationEvent, StartEvent, SummaryEvent, from_dict, to_dict
from .theory import accepted_length_pmf

FORMAT_VERSION = 1


@dataclass
class Trace:
    start: StartEvent | None = None
    iterations: list[IterationEvent] = field(default_factory=list)
    summary: SummaryEvent | None = None

    def add(self, ev) -> None:
        if isinstance(ev, StartEvent):
            self.start = ev
        elif isinstance(ev, IterationEvent):
            self.iterations.append(ev)
        elif isinstance(ev, SummaryEvent):
            self.summary = ev

    @classmethod
    def of(cls, events) -> "Trace":
        t = cls()
        for ev in events:
            t.add(ev)
        return t

    def events(self) -> list:
        return [e for e in [self.start, *self.iterations, self.summary] if e is not None]

    # --- running totals -------------------------------------------------------------------
    @property
    def tokens(self) -> int:
        return self.iterations[-1].tokens_total if self.iterations else 0

    @property
    def proposed(self) -> int:
        return self.iterations[-1].proposed_total if self.iterations else 0

    @property
    def accepted(self) -> int:
        return self.iterations[-1].accepted_total if self.iterations else 0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None

    @property
    def elapsed_ms(self) -> float:
        if self.summary:
            return self.summary.wall_ms
        return self.iterations[-1].elapsed_ms if self.iterations else 0.0

    @property
    def tokens_per_second(self) -> float:
        ms = self.elapsed_ms
        return self.tokens / (ms / 1000.0) if ms > 0 else 0.0

    @property
    def output_ids(self) -> list[int]:
        return [t for e in self.iterations for t in e.emitted]

    def text(self) -> str:
        return self.summary.text if self.summary else "".join(p for e in self.iterations for p in e.emitted_text)

    # --- statistics for the charts ------------------------------------------------------------
    def acceptance_series(self) -> tuple[list[int], list[float], list[float]]:
        """(iteration index, kept fraction, running acceptance rate) for iterations that proposed."""
        xs, ys, run = [], [], []
        for e in self.iterations:
            if e.proposed:
                xs.append(e.index)
                ys.append(e.accepted / len(e.proposed))
                run.append(e.accepted_total / e.proposed_total)
        return xs, ys, run

    def accepted_length_counts(self) -> tuple[list[int], list[float]]:
        """Observed and theoretical counts of k kept proposals, k = 0..max gamma, over iterations
        that proposed.  The theory is the truncated geometric law at the measured acceptance rate,
        mixed over each iteration's own proposal length."""
        spec = [e for e in self.iterations if e.proposed]
        if not spec:
            return [], []
        gmax = max(len(e.proposed) for e in spec)
        observed = [0] * (gmax + 1)
        expected = [0.0] * (gmax + 1)
        a = self.acceptance_rate or 0.0
        for e in spec:
            observed[e.accepted] += 1
            for k, pk in enumerate(accepted_length_pmf(a, len(e.proposed))):
                expected[k] += pk
        return observed, expected

    def by_position(self) -> list[tuple[int, int]]:
        """(kept, examined) per draft position."""
        out: list[list[int]] = []
        for e in self.iterations:
            for i, d in enumerate(e.draws):
                if d is None:
                    break
                if i == len(out):
                    out.append([0, 0])
                out[i][1] += 1
                out[i][0] += int(i < e.accepted)
        return [tuple(x) for x in out]

    def verify_ms_by_gamma(self) -> dict[int, float]:
        """Total verify time of the iterations that proposed g tokens, per g."""
        out: dict[int, float] = {}
        for e in self.iterations:
            out[len(e.proposed)] = out.get(len(e.proposed), 0.0) + e.verify_ms
        return out

    def time_split(self) -> dict[str, float]:
        prefill = self.start.prefill_ms if self.start else 0.0
        draft = sum(e.draft_ms for e in self.iterations)
        verify = sum(e.verify_ms for e in self.iterations)
        other = max(0.0, self.elapsed_ms - prefill - draft - verify)
        return {"prefill": prefill, "draft": draft, "verify": verify, "other": other}

    # --- files ------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"events": [to_dict(e) for e in self.events()]}


def save_runs(path, speculative: Trace, vanilla: Trace | None = None, meta: dict | None = None) -> None:
    data = {"specviz": FORMAT_VERSION, "meta": meta or {}, "speculative": speculative.to_json()["events"],
            "vanilla": vanilla.to_json()["events"] if vanilla else []}
    with open(path, "w") as f:
        json.dump(data, f)


def load_runs(path) -> tuple[Trace, Trace | None, dict]:
    """Read a saved run; raises ValueError with a clear message on anything else."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not a specviz run file: {e}") from None
    if not isinstance(data, dict) or "speculative" not in data:
        raise ValueError("not a specviz run file (no 'speculative' events)")
    try:
        spec = Trace.of(from_dict(d) for d in data["speculative"])
        van = Trace.of(from_dict(d) for d in data.get("vanilla") or [])
    except (TypeError, KeyError, ValueError) as e:
        raise ValueError(f"the run file is damaged: {e}") from None
    if spec.start is None:
        raise ValueError("the run file has no start event")
    return spec, (van if van.start else None), data.get("meta", {})


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if not n:
        return 0.0
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


@dataclass
class Comparison:
    """Speculative vs vanilla decoding of the same prompt, measured side by side."""

    speedup: float  # tokens/s ratio, prefill included
    decode_speedup: float  # the same without the (shared) prefill
    acceptance_rate: float | None
    tokens_per_iteration: float
    c: float  # draft cost per proposed token / one vanilla step
    v: dict  # verify cost per proposal length / one vanilla step
    predicted: float  # theory's decode speedup from a, c, v


def compare_runs(spec: Trace, vanilla: Trace) -> Comparison:
    from .theory import measured_costs, predicted_speedup_mixed

    step = median([e.verify_ms for e in vanilla.iterations]) or 1e-9
    gammas = [len(e.proposed) for e in spec.iterations]
    c, v = measured_costs(gammas, spec.verify_ms_by_gamma(), sum(e.draft_ms for e in spec.iterations), step)
    a = spec.acceptance_rate
    predicted = predicted_speedup_mixed(a or 0.0, gammas, c, v) if gammas else 0.0

    def decode_rate(t: Trace) -> float:
        ms = t.elapsed_ms - (t.start.prefill_ms if t.start else 0.0)
        return t.tokens / (ms / 1000.0) if ms > 0 else 0.0

    van_rate = vanilla.tokens_per_second
    return Comparison(spec.tokens_per_second / van_rate if van_rate else 0.0,
                      decode_rate(spec) / decode_rate(vanilla) if decode_rate(vanilla) else 0.0,
                      a, spec.tokens / max(1, len(spec.iterations)), c, v, predicted)
