"""From a run's event stream to the frames a page shows, and when.

``live_run`` drives one UI run (speculative decoding, then vanilla decoding of the same prompt)
and yields a ``LiveState`` per event. ``FrameMaker`` turns those states into ``Frame``s: named
updates (status, token view, charts, summary, inspector, output panel, export), throttled so
that the page redraws often (tokens every 0.2 s, charts every 0.35 s) without flooding the
browser. The decoders' own clocks leave out the time the consumer holds the stream, so drawing
never counts as decoding time. A front end maps each frame field to a component; fields that are
None stay as they are. ``Frame.updates()`` lists what changed by name.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterator

from ..engine import DecodeConfig
from ..events import IterationEvent
from ..exactness import Exactness, compare, first_difference
from ..trace import Trace
from . import charts, text, tokens

TOKENS_EVERY_S = 0.2  # token view at most this often (several iterations may arrive in between)
CHARTS_EVERY_S = 0.35  # charts at most this often: >= 2 redraws a second once drawing (~0.1 s) is counted
CHART_NAMES = ("accept", "length", "position", "throughput", "split")


@dataclass
class LiveState:
    phase: str  # "speculative" | "vanilla" | "done"
    spec: Trace = field(default_factory=Trace)
    vanilla: Trace | None = None
    exact: Exactness | None = None
    last: IterationEvent | None = None  # the newest iteration, if this state added one

    def snapshot(self) -> "LiveState":
        """A copy that stays as it is (phase, newest iteration, traces), so a consumer on another
        thread may read it whole after the run has moved on: a Stop's page is drawn from the last
        state the page received while the decoder finishes the step under way, and every panel of it
        (status, summary, charts, export) must count the same iterations."""
        return replace(self, spec=self.spec.frozen(), vanilla=self.vanilla.frozen() if self.vanilla else None)


def live_run(pipe, prompt: str | list[int], cfg: DecodeConfig, chat: bool = True,
             with_vanilla: bool = True) -> Iterator[LiveState]:
    """Speculative decoding of the prompt, then vanilla decoding of it (same settings, same
    hardware), then the greedy exactness check; ``pipe`` is a Pipeline or any backend with its shape."""
    ids = pipe.encode(prompt, chat) if isinstance(prompt, str) else list(prompt)
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
        target = getattr(pipe, "target_lm", None)
        if target is not None and cfg.sampling.greedy:
            state.exact = compare(target, ids, state.vanilla.output_ids, state.spec.output_ids)
        else:
            i = first_difference(state.vanilla.output_ids, state.spec.output_ids)
            state.exact = Exactness(i is None, i)
    state.phase, state.last = "done", None
    yield state.snapshot()


@dataclass
class Frame:
    status: str | None = None  # Markdown, escaped
    tokens: str | None = None  # token view HTML
    output: str | None = None  # plain output panel HTML
    charts: dict[str, Any] | None = None  # chart name -> plotly figure (only those redrawn)
    summary: str | None = None  # Markdown
    iteration: dict | None = None  # the inspector's slider: maximum, value, interactive
    inspector: tuple[str, Any] | None = None  # (HTML, figure)
    export: str | None = None  # path of the saved run
    result: dict | None = None  # structured result (programs calling the app's API get this)
    runs: dict | None = None  # {"spec": Trace, "vanilla": Trace | None}: what the page may inspect later

    def updates(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name == "charts":
                out.update({f"fig_{k}": v for k, v in value.items()})
            elif f.name == "inspector":
                out["inspect_html"], out["inspect_fig"] = value
            else:
                out[f.name] = value
        return out


def inspector_frame(spec: Trace | None, number) -> tuple[str, Any]:
    """The inspector on iteration ``number``, counted from 1 as the page counts (``tokens.number``)."""
    if spec is None or not spec.iterations:
        return tokens.inspector_html(None), charts.inspector_figure(None)
    i = max(0, min(int(number or 1) - 1, len(spec.iterations) - 1))
    e = spec.iterations[i]
    return tokens.inspector_html(e, spec.start.gamma if spec.start is not None else None), charts.inspector_figure(e)


def result_of(spec: Trace, vanilla: Trace | None, exact: Exactness | None, stopped: bool) -> dict:
    """The run as data, for programs (the same numbers the summary shows)."""
    s = spec.summary
    out = {"stopped": stopped, "text": s.text if s else spec.output_text, "tokens": spec.tokens,
           "iterations": len(spec.iterations), "proposed": spec.proposed, "accepted": spec.accepted,
           "acceptance_rate": spec.acceptance_rate, "alpha": spec.alpha,
           "tokens_per_second": spec.tokens_per_second,
           "stop_reason": s.stop_reason if s else "stopped"}
    if vanilla is not None and vanilla.iterations:
        out["vanilla"] = {"text": vanilla.summary.text if vanilla.summary else vanilla.output_text,
                          "tokens": vanilla.tokens, "tokens_per_second": vanilla.tokens_per_second}
        if vanilla.tokens_per_second:
            out["speedup"] = spec.tokens_per_second / vanilla.tokens_per_second
    if exact is not None:
        out["identical"] = exact.identical
    return out


class FrameMaker:
    """Throttled frames from a stream of LiveStates; ``final`` and ``stopped`` for the end.

    ``export``: a callable that saves the runs and returns a path (the front end decides where)."""

    def __init__(self, export: Callable[[Trace, Trace | None], str | None] | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.export = export
        self.clock = clock
        self.rendered: list[str] = []  # each iteration's HTML, made once
        self.last_tokens = self.last_charts = -1e9
        self.latest: LiveState | None = None

    def add(self, state: LiveState) -> Frame | None:
        """The frame to show for this state, or None when it is too soon to redraw."""
        self.latest = state
        if state.last is not None:
            self.rendered.append(tokens.iteration_html(state.last))
        if state.phase == "done":
            return self.final(state)
        now = self.clock()
        frame = Frame()
        if now - self.last_tokens >= TOKENS_EVERY_S:
            self.last_tokens = now
            frame.status = text.running_status(state.spec, state.vanilla, state.phase)
            if state.phase == "speculative":
                frame.tokens = tokens.tokens_html([], self.rendered)
            frame.output = text.output_html(state.spec, state.vanilla)
        if now - self.last_charts >= CHARTS_EVERY_S:
            self.last_charts = now
            figs = {"throughput": charts.throughput_figure(state.spec, state.vanilla)}
            if state.phase == "speculative":
                figs.update(accept=charts.acceptance_figure(state.spec), length=charts.accepted_length_figure(state.spec),
                            position=charts.position_figure(state.spec))
            frame.charts = figs
            frame.runs = {"spec": state.spec, "vanilla": state.vanilla}
        return frame if frame.updates() else None

    def final(self, state: LiveState, stopped: bool = False) -> Frame:
        spec, vanilla = state.spec, state.vanilla
        n = len(spec.iterations)
        last = n - 1 if n else 0
        # the inspector opens on the last iteration that verified a proposal: the very last one is often
        # a lone bonus step (no tokens left to draft for), which has no p and q to show
        shown = next((i for i in range(n - 1, -1, -1) if spec.iterations[i].proposed), last)
        path = self.export(spec, vanilla) if self.export and spec.start is not None else None
        return Frame(
            status=text.final_status(spec, vanilla, stopped, state.exact),
            tokens=tokens.tokens_html(spec.iterations, self.rendered if len(self.rendered) == n else None, done=True),
            output=text.output_html(spec, vanilla),
            charts=dict(zip(CHART_NAMES, charts.all_figures(spec, vanilla))),
            summary=text.summary_markdown(spec, vanilla, state.exact, stopped),
            iteration={"minimum": 1, "maximum": max(2, n), "value": tokens.number(shown), "interactive": n > 1},
            inspector=inspector_frame(spec, tokens.number(shown)), export=path,
            result=result_of(spec, vanilla, state.exact, stopped),
            runs={"spec": spec, "vanilla": vanilla})

    def stopped(self) -> Frame | None:
        """The page after Stop: what ran, summarised (None when nothing ran yet); the run draws it
        as its last frame."""
        if self.latest is None or self.latest.spec.start is None:
            return None
        return self.final(self.latest, stopped=True)


def replayed_settings(spec: Trace) -> str:
    """What a saved run ran with, in a few words (escaped): target, drafter, γ, temperature."""
    start = spec.start
    if start is None:
        return "with settings the file does not say"
    drafter = start.drafter.get("name") or start.drafter.get("kind", "?")  # dicts: from_dict checks them
    temp = "greedy" if spec.greedy else f"temperature {start.sampling.get('temperature')}"
    return text.md(f"{start.target.get('name', '?')} with drafter {drafter}, γ {start.gamma}, {temp}", 300)


REPLAY_BUDGET_BYTES = 8 * 2 ** 20  # token-view HTML a replay sends before its final page, about


def replay_frames(spec: Trace, vanilla: Trace | None, saved: str, frames: int = 40,
                  pause_s: float = 0.05) -> Iterator[Frame]:
    """A saved run replayed without a model: about ``frames`` frames as its iterations appeared
    (sped up), then the page it ended with."""
    maker = FrameMaker()
    n = len(spec.iterations)
    # every frame carries the token view so far, so frames x its size is what the browser receives
    # and re-renders: a long run's ~40 frames were ~20 times its view (a 21 MB file took 88 s);
    # a long run gets fewer frames, about REPLAY_BUDGET_BYTES in all
    maker.rendered = [tokens.iteration_html(e) for e in spec.iterations]
    size = sum(len(h) for h in maker.rendered)
    frames = max(1, min(frames, int(2 * REPLAY_BUDGET_BYTES / max(1, size))))
    step = max(1, n // frames)
    for i in range(0, n, step):
        yield Frame(status=f"► replaying a saved run ({i + 1}/{n} iterations)",
                    tokens=tokens.tokens_html([], maker.rendered[:i + 1]))
        time.sleep(pause_s)
    state = LiveState("done", spec, vanilla)
    if vanilla is not None and vanilla.summary is not None and spec.summary is not None:  # both ran to the end
        i = first_difference(vanilla.output_ids, spec.output_ids)
        state.exact = Exactness(i is None, i)  # the live page's verdict, from the saved tokens
    frame = maker.final(state, stopped=spec.summary is None)
    frame.status = (f"► replayed a saved run ({text.md(saved)}): no model was loaded. It ran "
                    f"{replayed_settings(spec)}; the settings on the left are still yours, not the file's")
    if spec.summary is None:  # a stopped run's file, or one cut short: said here, not only in the Summary tab
        frame.status += (f". The file ends before the run did (it was stopped, or the file was cut short): "
                         f"what is shown covers the {text.plural(n, 'iteration')} it holds")
    yield frame
