"""What every experiment shares: its settings, its progress records, and running a drafter
against vanilla decoding on the loaded target (measured, never estimated)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Iterator

from ..drafters import Drafter
from ..engine import MAX_GAMMA, MAX_SEED, DecodeConfig, _whole, check_prompt
from ..pipeline import Pipeline
from ..sampling import SamplingConfig
from ..trace import Speedup, Trace, compare_speed, implausible, spread


REPEATS = 3  # timed runs of each thing an experiment times, as the bench's --repeats
MAX_REPEATS = 10
MAX_SAMPLES = 10_000  # real speculative iterations: ~2 hours on a 2-core CPU
MAX_BREAK_SAMPLES = 1_000_000  # draws per broken rule (cheap: multinomial draws)
NOISY = 0.20  # repeats that disagree by more than this (max / min - 1) are flagged, as in the bench
TIE = 0.05  # measured speedups closer than this to the best are not told apart: repeated experiments differ more


@dataclass
class Settings:
    """What the page or the command line chose. ``None`` lets each experiment pick a default
    sized to finish in well under 90 s on a 2-core CPU."""

    prompt: str
    chat: bool = True
    seed: int = 0
    gamma: int | None = None  # the pair's when None
    temperature: float = 0.0  # for runs; the distribution checks use ``check_temperature`` when this is 0
    check_temperature: float = 0.7
    max_new_tokens: int | None = None
    samples: int | None = None  # distribution check: real speculative iterations
    break_samples: int | None = None  # break-it: draws per rule variant
    variant: str | None = None  # break-it variant shown in the figure (all are tested)
    gammas: list[int] | None = None
    depths: list[int] | None = None
    batches: list[int] | None = None
    lengths: list[int] | None = None
    dtype_control: bool = True  # same_outputs: also load a bfloat16 copy of the target
    repeats: int | None = None  # timed runs of each drafter and of vanilla, alternated (REPEATS when None)

    def __post_init__(self) -> None:
        """The prompt, temperature, gammas and seed checked before an experiment spends a minute on
        vanilla decoding (the engine checks the rest at its first run)."""
        check_prompt(self.prompt)
        SamplingConfig(temperature=self.temperature)  # the engine's own checks of a temperature
        if self.max_new_tokens is not None:
            self.max_new_tokens = _whole(self.max_new_tokens, "max new tokens", 1)
        if self.gamma is not None:
            self.gamma = _whole(self.gamma, "gamma", 1, MAX_GAMMA)
        if self.gammas is not None:
            self.gammas = [_whole(g, "gamma", 1, MAX_GAMMA) for g in self.gammas]
        if self.seed is not None:
            self.seed = _whole(self.seed, "seed", 0, MAX_SEED)
        if self.repeats is not None:
            self.repeats = _whole(self.repeats, "repeats", 1, MAX_REPEATS)
        if self.samples is not None:
            self.samples = _whole(self.samples, "samples (real speculative iterations)", 10, MAX_SAMPLES)
        if self.break_samples is not None:
            self.break_samples = _whole(self.break_samples, "break-it draws per rule", 100, MAX_BREAK_SAMPLES)
        if self.depths is not None:
            self.depths = [_whole(d, "early-exit depth", 1) for d in self.depths]
        for name in ("batches", "lengths"):
            if getattr(self, name) is not None:
                setattr(self, name, [_whole(x, "length" if name == "lengths" else "batch size", 1, 4096)
                                     for x in getattr(self, name)])

    @property
    def rounds(self) -> int:
        return self.repeats or REPEATS

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Progress:
    """A step of an experiment: ``done`` of ``total`` units, what is happening, and (when the
    chart can already grow) the partial result."""

    done: int
    total: int
    message: str
    partial: object | None = None
    event: str = "progress"

    @property
    def fraction(self) -> float:
        return min(1.0, self.done / self.total) if self.total else 0.0

    def to_json(self) -> dict:
        return {"event": self.event, "done": self.done, "total": self.total, "message": self.message}


def jsonable(obj):
    """A result dataclass as plain JSON values (NaN/inf become None)."""
    if is_dataclass(obj):
        obj = asdict(obj)
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    return obj


def greedy_cfg(gamma: int, max_new_tokens: int, seed: int = 0, temperature: float = 0.0) -> DecodeConfig:
    return DecodeConfig(gamma=gamma, max_new_tokens=max_new_tokens,
                        sampling=SamplingConfig(temperature=temperature), seed=seed)


def with_drafter(pipe: Pipeline, drafter: Drafter) -> Pipeline:
    """The same loaded target (and its cost profile) with another drafter."""
    return Pipeline(pipe.name, pipe.target, drafter, pipe.gamma, pipe.draft)


def fixed_length(drafter: Drafter) -> Drafter:
    """A drafter that proposes as many tokens as asked (where it can): each drafter's ``fixed()``.
    Prompt lookup drops its cost-aware length choice; the draft head and Token Recycling chain their
    own drafts alone, with no stopping rule; model and early-exit drafters already do."""
    return drafter.fixed()


# drafters on one chart, told apart by marker symbol and shade (with a legend entry each)
DRAFT_SYMBOLS = ["circle", "square", "diamond", "triangle-up", "cross", "triangle-down", "star", "x"]
DRAFT_SHADES = ["#1b7a3a", "#2ca25f", "#66c2a4", "#238b8b", "#41ae76", "#99d8c9", "#006d2c", "#74c476"]


def draft_marker(i: int, edge: str = "#222") -> dict:
    """The i-th drafter's marker: its own symbol and shade, and a size that shrinks with i, so drafters
    measured at the same spot nest inside each other instead of the last one hiding the rest."""
    return {"color": DRAFT_SHADES[i % len(DRAFT_SHADES)], "symbol": DRAFT_SYMBOLS[i % len(DRAFT_SYMBOLS)],
            "size": max(9, 17 - 2 * i), "line": {"color": edge, "width": 1}}


@dataclass
class Measured:
    """One drafter on the prompt against vanilla decoding: what the bench measures, for one prompt."""

    label: str
    gamma: int
    tokens: int
    iterations: int
    tokens_per_iteration: float
    alpha: float | None  # accepted / examined (per-position acceptance)
    acceptance_rate: float | None  # accepted / proposed
    by_position: list[list[int]]
    c: float  # draft cost per proposed token, in vanilla steps
    v: dict  # verify cost per proposal length, in vanilla steps
    speedup: float  # tokens/s ratio, prefill included
    decode_speedup: float  # without the prefill
    predicted: float  # theory's decode speedup from this run's alpha, c, v
    output_ids: list[int] = field(default_factory=list, repr=False)
    repeats: int = 1  # timed runs behind the numbers: the fastest of each side is compared
    spread: float | None = None  # max / min - 1 over the speculative repeats (None: one run)
    baseline_spread: float | None = None  # the same over the vanilla runs it is compared with

    @property
    def noisy(self) -> bool:
        return self.spread is not None and self.spread > NOISY

    @property
    def implausible(self) -> bool:
        """Faster than its tokens per iteration allow: each iteration costs at least one target pass,
        so only a timing disturbed by something else can show more (a lone run on a busy machine
        once showed 1.98x at 1.00 tokens per iteration)."""
        return implausible(self.speedup, self.tokens_per_iteration)


# what each number in a Measured means: written into every exported result beside the numbers
GLOSSARY = {
    "label": "which drafter (or gamma) was measured",
    "gamma": "the most draft tokens asked for per iteration",
    "tokens": "new tokens generated",
    "iterations": "speculative iterations (one target pass each)",
    "tokens_per_iteration": "tokens / iterations (vLLM's mean acceptance length)",
    "alpha": "per-position acceptance: kept / examined draft tokens (the alpha of Leviathan et al.)",
    "acceptance_rate": "kept / proposed draft tokens (those after a rejection are proposed but never examined)",
    "by_position": "[kept, examined] per draft position 1, 2, ...",
    "c": "draft time per proposed token, in plain target steps",
    "v": "verify time of a pass of g + 1 tokens, in plain target steps, by g",
    "speedup": "vanilla time / speculative time for the same tokens, prefill included (fastest run of each)",
    "decode_speedup": "the same without the prefill",
    "predicted": "Leviathan et al.'s decode speedup from this run's alpha, c and v",
    "output_ids": "the generated token ids (identical to vanilla's in greedy decoding)",
    "repeats": "timed runs of this drafter (and of its vanilla baseline), taken in turns; the fastest is used",
    "spread": "max / min - 1 of this drafter's run times: above 0.2 the machine was busy (null: one run, "
              "which cannot show its noise)",
    "baseline_spread": "the same for the vanilla runs it is compared with",
}


class Fastest:
    """Repeated runs of one thing: the fastest kept, the others' times for the spread. A neighbour's
    burst slows a run and never speeds one up, and the first run of a shape pays for allocating
    and packing: the minimum is the run's own cost."""

    def __init__(self) -> None:
        self.runs: list[Trace] = []

    def add(self, trace: Trace) -> None:
        self.runs.append(trace)

    @property
    def best(self) -> Trace:
        return min(self.runs, key=lambda t: t.elapsed_ms)

    @property
    def spread(self) -> float | None:
        """max / min - 1 of the runs' times; None for a single run (nothing to compare it with)."""
        return spread([t.elapsed_ms for t in self.runs])

    def at(self, tokens: int) -> float | None:
        """The fastest time to the ``tokens``-th new token over the runs (shorter outputs are prefixes)."""
        ms = [m for m in (t.elapsed_at(tokens) for t in self.runs) if m]
        return min(ms) if ms else None


def rounds(n: int, names: list) -> Iterator[tuple[int, object]]:
    """(round, name) for ``n`` rounds over ``names``, every other round in reverse: what runs early in
    one round runs late in the next, so a slow stretch of the machine falls on all of them alike."""
    for r in range(n):
        for name in (names if r % 2 == 0 else names[::-1]):
            yield r, name


def measured(label: str, gamma: int, spec: Fastest, vanilla: Fastest) -> Measured:
    """The fastest speculative run against the fastest vanilla run."""
    best = spec.best
    s: Speedup = compare_speed(best, vanilla.best)
    return Measured(label, gamma, best.tokens, len(best.iterations), s.tokens_per_iteration, best.alpha,
                    best.acceptance_rate, [list(r) for r in best.by_position()], s.c,
                    {int(k): v for k, v in s.v.items()}, s.speedup, s.decode_speedup, s.predicted, best.output_ids,
                    len(spec.runs), spec.spread, vanilla.spread)


def ties(scores: list[tuple[object, float]]) -> tuple[object | None, list]:
    """The best-scoring name and the others within ``TIE`` of it, best first: on a shared CPU the
    same experiment run twice swaps winners that close (2.06x against 2.03x, then 1.95x against 1.99x)."""
    if not scores:
        return None, []
    ranked = sorted(scores, key=lambda t: -t[1])
    top, best = ranked[0]
    return top, [name for name, v in ranked[1:] if best > 0 and v >= best * (1 - TIE)]


def noise_note(drafts: list[Measured]) -> str:
    """A sentence naming the measurements to doubt, or "" when none is."""
    noisy = [d.label for d in drafts if d.noisy]
    baseline = max((d.baseline_spread for d in drafts if d.baseline_spread is not None), default=0.0)
    odd = [d.label for d in drafts if d.implausible]
    parts = []
    if drafts and all(d.spread is None for d in drafts):
        parts.append("each was timed once, so nothing shows whether the machine was busy (repeats 3 can)")
    if baseline > NOISY:
        parts.append(f"vanilla decoding's repeats (the baseline) disagreed by {baseline:.0%}")
    if noisy:
        who = "every drafter's repeats" if len(noisy) == len(drafts) > 1 else f"the repeats of {', '.join(noisy)}"
        parts.append(f"{who} disagreed by more than {NOISY:.0%}")
    if odd:
        parts.append(f"{', '.join(odd)} measured faster than its tokens per iteration allow")
    if not parts:
        return ""
    return ("Timing noise: " + "; ".join(parts) + " (another process was likely busy; each number is the fastest "
            "run, but run it again, or with more repeats, before relying on it).")
