"""4. What does the draft have to cost? Predicted speedup over acceptance alpha and draft cost c
(at this hardware's measured verify cost v, each cell at its best gamma), with every drafter
measured on this prompt placed on the map."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterator

import plotly.graph_objects as go

from ..drafters import kind
from ..backends.transformers import check_exit_layers
from ..pipeline import Pipeline
from ..theory import best_gamma
from ..view.charts import layout
from ..trace import Trace
from .common import (TIE, Fastest, Measured, Progress, Settings, draft_marker, greedy_cfg, jsonable,
                     measured, noise_note, rounds, ties, with_drafter)

ALPHAS = [i / 20 for i in range(20)] + [0.975, 0.99]  # 0 .. 0.99: the map reaches the axis's end
COSTS = [i / 20 for i in range(21)]  # 0 .. 1


@dataclass
class CostMapResult:
    pair: str
    v: list[float] = field(default_factory=list)
    alphas: list[float] = field(default_factory=lambda: list(ALPHAS))
    costs: list[float] = field(default_factory=lambda: list(COSTS))
    speedup: list[list[float]] = field(default_factory=list)  # [cost][alpha] at the best gamma
    best: list[list[int]] = field(default_factory=list)
    drafters: list[Measured] = field(default_factory=list)
    repeats: int = 1  # timed runs of each drafter and the baseline, alternated; the fastest compared

    def to_json(self) -> dict:
        return jsonable(self)


def own_label(pipe: Pipeline) -> str | None:
    """The pair's own drafter's marker on the map (its ``label()``), or None where another marker
    measures it already (plain lookup; early exit, whose depths are swept). The head's pair was once
    labelled "lookup + datastore" (its drafter has a datastore too), and the map named that the winner."""
    k = pipe.drafter.describe().get("kind")
    if k == "early_exit" or (k == "prompt_lookup" and getattr(pipe.drafter, "datastore", None) is None):
        return None
    return pipe.drafter.label()


def _drafter_specs(pipe: Pipeline, depths: list[int]) -> list[tuple[str, dict, int]]:
    specs = [("lookup", {"kind": "prompt_lookup", "max_ngram": 4}, 10)]
    own = own_label(pipe)
    if own is not None:
        specs.append((own, None, pipe.gamma))  # the pair's own drafter, as the pair runs it
    specs += [(f"early exit {L}", {"kind": "early_exit", "layers": L}, 3) for L in depths]
    return specs


def run(pipe: Pipeline, s: Settings, load: Callable[..., Pipeline] | None = None) -> Iterator:
    ids = pipe.encode(s.prompt, s.chat)
    layers = len(pipe.target.model.get_decoder().layers)
    depths = s.depths or sorted({max(1, layers * f // 10) for f in (3, 6, 9)})
    for d in depths:  # before any minute is measured
        check_exit_layers(d, layers)
    n = s.max_new_tokens or 32
    R = s.rounds
    res = CostMapResult(pipe.name, repeats=R)
    specs = _drafter_specs(pipe, depths)
    jobs = {"vanilla": (f"vanilla decoding of {n} tokens (the baseline)",
                        partial(pipe.vanilla, ids, greedy_cfg(1, n, s.seed, s.temperature)))}
    for i, (label, spec, gamma) in enumerate(specs):
        p = pipe if spec is None else with_drafter(pipe, kind(spec["kind"]).build(spec, pipe.target, None))
        jobs[i] = (f"measuring {label}", partial(p.speculative, ids, greedy_cfg(gamma, n, s.seed, s.temperature)))
    runs = {name: Fastest() for name in jobs}
    total = 1 + len(jobs) * R
    yield Progress(0, total, "this hardware's verify cost v(g)")
    res.v = pipe.target_lm.cost_profile(17, ids)
    for c in res.costs:
        row = [best_gamma(a, c, res.v, 16) for a in res.alphas]
        res.speedup.append([sp for _, sp in row])
        res.best.append([g for g, _ in row])
    done = 1
    for r, name in rounds(R, list(jobs)):
        what, job = jobs[name]
        yield Progress(done, total, f"{what} (run {r + 1} of {R})", res)
        runs[name].add(Trace.of(job()))
        done += 1
        res.drafters = [measured(label, gamma, runs[j], runs["vanilla"])
                        for j, (label, _, gamma) in enumerate(specs) if runs[j].runs and runs["vanilla"].runs]
    yield Progress(total, total, "done", res)
    yield res


def figure(res: CostMapResult) -> go.Figure:
    fig = go.Figure()
    if res.speedup:
        fig.add_contour(x=res.alphas, y=res.costs, z=res.speedup, colorscale="RdBu", zmid=1.0, zmin=0, zmax=3,
                        contours={"start": 0.5, "end": 3, "size": 0.25, "showlabels": True,
                                  "labelfont": {"size": 9, "color": "#222", "shadow": "auto"}},
                        colorbar={"title": {"text": "×", "side": "top"}, "thickness": 10}, name="predicted",
                        hovertemplate="α %{x:.2f}, c %{y:.2f}: %{z:.2f}x<extra></extra>", opacity=0.75)
    # one legend entry per drafter, told apart by symbol and shade: labels printed on the map covered
    # each other and the points beside them (drafters measured close together are the common case)
    for i, d in enumerate(d for d in res.drafters if d.alpha is not None):
        label = html.escape(d.label)
        fig.add_scatter(x=[d.alpha], y=[min(d.c, 1.1)], mode="markers", name=f"{label}: {d.speedup:.2f}x measured",
                        marker=draft_marker(i),
                        hovertemplate=f"{label}: α %{{x:.2f}}, c %{{y:.2f}}, {d.speedup:.2f}x measured<extra></extra>",
                        cliponaxis=False)
    fig.update_xaxes(range=[0, 1])
    fig.update_yaxes(range=[-0.04, 1.15])
    return layout(fig, "Predicted speedup by α and c (best γ per cell, this CPU's v)", "α (per-position acceptance)",
                   "c (draft step / target step)", height=380)


def takeaway(res: CostMapResult) -> str:
    if not res.drafters:
        return "No drafter measured."
    lines = []
    for d in res.drafters:
        a = "n/a" if d.alpha is None else f"{d.alpha:.2f}"
        lines.append(f"{d.label}: α = {a}, c = {d.c:.2f}, measured {d.speedup:.2f}x (predicted {d.predicted:.2f}x)")
    # the break-even acceptance for a free draft and for a draft at half a target step
    def breakeven(c_index: int) -> float | None:
        row = res.speedup[c_index]
        return next((a for a, sp in zip(res.alphas, row) if sp > 1.0), None)
    free, half = breakeven(0), breakeven(len(res.costs) // 2)
    need = (f"On this CPU a free draft pays from α ≈ {free:.2f}" if free is not None else "Even a free draft does not pay")
    need += (f", a draft at half a target step only from α ≈ {half:.2f}." if half is not None
             else "; a draft at half a target step never does.")
    tail = (f" (each the fastest of {res.repeats} runs, the drafters and the vanilla baseline taking turns)"
            if res.repeats > 1 else "")
    best, close = ties([(d.label, d.speedup) for d in res.drafters])
    verdict = f"Best: {best}" + (f", with {' and '.join(close)} within {TIE:.0%} (a tie at this machine's noise)"
                                 if close else "") + "."
    return " ".join(x for x in (f"{need} Measured here{tail}: " + "; ".join(lines) + ". " + verdict,
                                noise_note(res.drafters)) if x)
