"""A run as the front ends see it: its events in order and the statistics derived from them, and
the one file format for saved runs.

Built incrementally while a run streams (``add``), or all at once from a saved file. Every
statistic a chart, a summary, the bench or the lab shows is computed here (or in ``theory``)
once, from events alone.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from .events import IterationEvent, SchemaError, StartEvent, SummaryEvent, _show, from_dict, lone_surrogate, to_dict
from .theory import accepted_length_pmf, cost_model

FORMAT_VERSION = 1
MAX_FILE_BYTES = 32 * 1024 * 1024  # a saved run of 512 tokens is ~1 MB


class PositionTally:
    """(kept, examined) per draft position: position i is examined when the rule drew for it."""

    def __init__(self) -> None:
        self.counts: list[list[int]] = []

    def add(self, draws: list, accepted: int, proposed: int = 0) -> None:
        """``draws``: the rule's uniform draw per examined position (None after a rejection). A
        backend that does not report draws (a serving engine) passes [] and the proposal length:
        positions 1..accepted + 1 were examined then."""
        if not draws and proposed:
            draws = [0.0] * min(proposed, accepted + 1)
        for i, d in enumerate(draws):
            if d is None:
                break
            if i == len(self.counts):
                self.counts.append([0, 0])
            self.counts[i][1] += 1
            self.counts[i][0] += int(i < accepted)

    @property
    def examined(self) -> int:
        return sum(n for _, n in self.counts)

    def rows(self) -> list[list[int]]:
        return [list(c) for c in self.counts]


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

    def frozen(self) -> "Trace":
        """A copy that stays as it is while this trace grows (an event is not changed once added)."""
        return Trace(self.start, list(self.iterations), self.summary)

    @classmethod
    def of(cls, events) -> "Trace":
        t = cls()
        for ev in events:
            t.add(ev)
        return t

    def events(self) -> list:
        return [e for e in [self.start, *self.iterations, self.summary] if e is not None]

    @property
    def greedy(self) -> bool:
        return bool(self.start) and float(self.start.sampling.get("temperature", 0) or 0) == 0

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
    def examined(self) -> int:
        return sum(n for _, n in self.by_position())

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / proposed: the share of proposed tokens the target kept."""
        return self.accepted / self.proposed if self.proposed else None

    @property
    def alpha(self) -> float | None:
        """accepted / examined: per-position acceptance, the estimator Leviathan et al.'s law needs
        (proposals after a rejection are never examined, so accepted / proposed underestimates it)."""
        n = self.examined
        return self.accepted / n if n else None

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
    def decode_tokens_per_second(self) -> float:
        ms = self.elapsed_ms - (self.start.prefill_ms if self.start else 0.0)
        return self.tokens / (ms / 1000.0) if ms > 0 else 0.0

    @property
    def output_ids(self) -> list[int]:
        return [t for e in self.iterations for t in e.emitted]

    @property
    def output_text(self) -> str:
        """What the run wrote so far, special tokens and all, exactly as the token view shows it."""
        return "".join(p for e in self.iterations for p in e.emitted_text)

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
        that proposed. The theory is the truncated geometric law at the measured per-position
        acceptance alpha, mixed over each iteration's own proposal length."""
        spec = [e for e in self.iterations if e.proposed]
        if not spec:
            return [], []
        gmax = max(len(e.proposed) for e in spec)
        observed = [0] * (gmax + 1)
        expected = [0.0] * (gmax + 1)
        a = self.alpha or 0.0
        for e in spec:
            observed[e.accepted] += 1
            for k, pk in enumerate(accepted_length_pmf(a, len(e.proposed))):
                expected[k] += pk
        return observed, expected

    def by_position(self) -> list[tuple[int, int]]:
        """(kept, examined) per draft position."""
        tally = PositionTally()
        for e in self.iterations:
            tally.add(e.draws, e.accepted, len(e.proposed))
        return [tuple(x) for x in tally.rows()]

    def verify_ms_by_gamma(self) -> dict[int, float]:
        """Total verify time of the iterations that proposed g tokens, per g."""
        out: dict[int, float] = {}
        for e in self.iterations:
            out[len(e.proposed)] = out.get(len(e.proposed), 0.0) + e.verify_ms
        return out

    def elapsed_at(self, tokens: int) -> float | None:
        """Wall ms (prefill included) until the run had emitted ``tokens`` tokens; None if it never did."""
        for e in self.iterations:
            if e.tokens_total >= tokens:
                return e.elapsed_ms
        return None

    def time_split(self) -> dict[str, float]:
        prefill = self.start.prefill_ms if self.start else 0.0
        draft = sum(e.draft_ms for e in self.iterations)
        verify = sum(e.verify_ms for e in self.iterations)
        other = max(0.0, self.elapsed_ms - prefill - draft - verify)
        return {"prefill": prefill, "draft": draft, "verify": verify, "other": other}


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if not n:
        return 0.0
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def spread(ms: list[float]) -> float | None:
    """max / min - 1 of repeated timings; None for fewer than two (a single run cannot show its noise)."""
    return max(ms) / min(ms) - 1.0 if len(ms) > 1 and min(ms) > 0 else None


@dataclass
class Speedup:
    """Speculative vs vanilla decoding of the same prompt, measured side by side."""

    speedup: float  # tokens/s ratio, prefill included
    decode_speedup: float  # the same without the (shared) prefill
    alpha: float | None
    tokens_per_iteration: float
    c: float  # draft cost per proposed token / one vanilla step
    v: dict  # verify cost per proposal length / one vanilla step
    predicted: float  # theory's decode speedup from alpha, c, v

    @property
    def implausible(self) -> bool:
        return implausible(max(self.speedup, self.decode_speedup), self.tokens_per_iteration)


def implausible(speedup: float, tokens_per_iteration: float) -> bool:
    """A speedup above what a run's tokens per iteration allow (10% spare): each iteration costs at
    least one target pass and a vanilla step is one pass per token, so only a timing disturbed by
    something else on the machine shows more. The page and the Lab flag it alike."""
    return speedup > 1.1 * tokens_per_iteration


def compare_speed(spec: Trace, vanilla: Trace) -> Speedup:
    step = median([e.verify_ms for e in vanilla.iterations]) or 1e-9
    c, v, predicted = cost_model([len(e.proposed) for e in spec.iterations], spec.verify_ms_by_gamma(),
                                 sum(e.draft_ms for e in spec.iterations), step, spec.alpha)
    van_rate, van_decode = vanilla.tokens_per_second, vanilla.decode_tokens_per_second
    return Speedup(spec.tokens_per_second / van_rate if van_rate else 0.0,
                   spec.decode_tokens_per_second / van_decode if van_decode else 0.0,
                   spec.alpha, spec.tokens / max(1, len(spec.iterations)), c, v, predicted)


# --- the one file format for saved runs --------------------------------------------------------

def runs_to_json(speculative: Trace, vanilla: Trace | None = None, meta: dict | None = None) -> dict:
    return {"specviz": FORMAT_VERSION, "meta": meta or {},
            "speculative": [to_dict(e) for e in speculative.events()],
            "vanilla": [to_dict(e) for e in vanilla.events()] if vanilla else []}


def save_runs(path, speculative: Trace, vanilla: Trace | None = None, meta: dict | None = None) -> None:
    with open(path, "w") as f:
        json.dump(runs_to_json(speculative, vanilla, meta), f)


def runs_from_json(data) -> tuple[Trace, Trace | None, dict]:
    """Saved runs from parsed JSON, validated; ValueError (SchemaError) says what is wrong."""
    if not isinstance(data, dict) or "speculative" not in data:
        raise SchemaError("not a specviz run file (no 'speculative' events)")
    if data.get("specviz", FORMAT_VERSION) != FORMAT_VERSION:
        raise SchemaError(f"run file format {data.get('specviz')!r}; this specviz reads {FORMAT_VERSION}")
    meta = data.get("meta") or {}
    if not isinstance(meta, dict):
        raise SchemaError("meta: expected an object")
    meta = {str(k): v for k, v in meta.items() if isinstance(v, (str, int, float, bool)) and len(str(v)) <= 200
            and lone_surrogate(str(k)) is None and lone_surrogate(str(v)) is None}  # a lone surrogate cannot reach a page
    traces = []
    for part in ("speculative", "vanilla"):
        raw = data.get(part) or []
        if not isinstance(raw, list):
            raise SchemaError(f"{part}: expected a list of events")
        trace = Trace()
        for i, d in enumerate(raw):
            ev = from_dict(d, f"{part}[{i}]")
            if (ev.event == "start") != (i == 0) or (ev.event == "summary" and i != len(raw) - 1):
                raise SchemaError(f"{part}[{i}]: a run is one start event, its iterations, then one summary")
            trace.add(ev)
        _check_running_totals(trace, part)
        if trace.start is not None and trace.tokens > trace.start.max_new_tokens:
            raise SchemaError(f"{part}: its iterations emit {trace.tokens} tokens, more than the "
                              f"{trace.start.max_new_tokens} its start event allows")
        if trace.summary is not None:
            last = trace.iterations[-1].elapsed_ms if trace.iterations else 0.0
            if trace.summary.wall_ms < last - 1e-6:  # the speedup and tokens/s read the summary's time
                raise SchemaError(f"{part}: the summary's wall_ms ({trace.summary.wall_ms:g}) is earlier than its last "
                                  f"iteration's elapsed_ms ({last:g}); a run's time only moves forward")
            emitted = sum(len(e.emitted) for e in trace.iterations)
            if trace.summary.new_tokens != emitted or len(trace.summary.output_ids) != emitted:
                raise SchemaError(f"{part}: the summary counts {trace.summary.new_tokens} new tokens "
                                  f"({len(trace.summary.output_ids)} output ids), the iterations emit {emitted}")
        traces.append(trace)
    spec, van = traces
    if spec.start is None:
        raise SchemaError("the run file has no start event")
    return spec, (van if van.start else None), meta


def _check_running_totals(trace: Trace, part: str) -> None:
    """Each iteration's running totals are the sums of the iterations so far, and its clock only moves
    forward: the summary, the throughput chart and the speedup read them (a file claiming 10^12 tokens
    in its last iteration showed a speedup of millions; a clock that went back, a negative one)."""
    tokens = proposed = accepted = 0
    clock = 0.0
    for i, e in enumerate(trace.iterations, start=1):  # the file's list: the start event, then these
        tokens, proposed, accepted = tokens + len(e.emitted), proposed + len(e.proposed), accepted + e.accepted
        where = f"{part}[{i}]"
        if e.index != i - 1:  # the inspector finds an iteration by its index: another one showed under its name
            raise SchemaError(f"{where}.index: {_show(e.index)}, but it is iteration {i - 1} of the run (counted from 0)")
        for name, total in (("tokens_total", tokens), ("proposed_total", proposed), ("accepted_total", accepted)):
            if getattr(e, name) != total:
                raise SchemaError(f"{where}.{name}: {_show(getattr(e, name))} is not the running total "
                                  f"of the iterations so far ({total})")
        if e.elapsed_ms < clock:
            raise SchemaError(f"{where}.elapsed_ms: {e.elapsed_ms:g} is earlier than the step before it "
                              f"({clock:g}); a run's clock only moves forward")
        clock = e.elapsed_ms


def load_runs(path) -> tuple[Trace, Trace | None, dict]:
    """Read a saved run; raises ValueError with a clear message on anything else."""
    try:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            raise ValueError(f"the file is larger than {MAX_FILE_BYTES // 2**20} MB; not a specviz run")
        if os.path.getsize(path) == 0:
            raise ValueError("the file is empty; a run file is the JSON the page's export saves")
        with open(path, encoding="utf-8-sig") as f:  # a byte-order mark (some editors add one) is no error
            data = json.load(f)
    except UnicodeDecodeError:
        raise ValueError("not a specviz run file: it is not UTF-8 text (a run file is JSON)") from None
    except json.JSONDecodeError as e:  # the parser's words alone ("Expecting value: line 1 column 1") say little
        raise ValueError(f"not a specviz run file: it is not valid JSON ({e.msg.lower()} at line {e.lineno}, "
                         f"column {e.colno}); a run file is the JSON the page's export saves") from None
    except RecursionError:
        raise ValueError("not a specviz run file: its JSON is nested too deeply") from None
    except ValueError as e:  # Python's own limit on a number's digits (4,300): no run holds such a number
        if "digits" not in str(e):
            raise
        raise ValueError("not a specviz run file: it holds a number with thousands of digits") from None
    except OSError as e:
        raise ValueError(f"not a specviz run file: {e}") from None
    return runs_from_json(data)
