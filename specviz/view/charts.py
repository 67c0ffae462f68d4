"""Plotly figures of a run, from its trace alone.  Small on purpose (template "none", few
points), since a streaming page receives each figure whole every time it is redrawn."""

from __future__ import annotations

import html

import plotly.graph_objects as go

from ..events import IterationEvent
from ..trace import Trace, compare_speed
from .tokens import number, one_hot

COLORS = {"accepted": "#2e9e5b", "rejected": "#d64545", "resample": "#e08a1e", "bonus": "#3b7dd8",
          "spec": "#7b4fd1", "vanilla": "#8a8a8a", "theory": "#c0392b", "draft": "#e0b41e",
          "verify": "#3b7dd8", "prefill": "#9db7e0", "other": "#c9c9c9",
          # p and q apart from the token colours (blue was the bonus token's, orange the resampled one's): the
          # target's p in cyan, the draft's q in slate (the residual r, after a refusal, keeps the resampled orange)
          "p": "#0891b2", "q": "#64748b"}


def token_label(text: str, limit: int = 32) -> str:
    """A token as a chart label: quoted (whitespace shows), at most ``limit`` characters, and escaped.
    Plotly reads a subset of HTML in labels (<a href>, <b>, <br>...): a saved run's token text must not
    put a link or markup into the page's charts."""
    shown = repr(text)  # writes direction controls (\u202e) and other invisibles as escapes
    if len(shown) > limit:
        shown = shown[:limit - 1] + "…"
    return html.escape(shown, quote=False)


def layout(fig: go.Figure, title: str, x: str, y: str, height: int = 260) -> go.Figure:
    fig.update_layout(template="none", height=height,
                      title={"text": title, "font": {"size": 14}, "x": 0, "xanchor": "left", "xref": "paper"},
                      margin={"l": 78, "r": 12, "t": 36, "b": 84}, xaxis_title=x, yaxis_title=y,
                      legend={"orientation": "h", "y": 0, "x": 0, "yanchor": "bottom", "yref": "container"},
                      font={"size": 11, "color": "#767676"},  # grey with 4.5:1 contrast on white, ~4:1 on a dark page
                      paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)")
    grid = {"gridcolor": "rgba(140,140,140,0.3)", "zerolinecolor": "rgba(140,140,140,0.5)",
            "linecolor": "rgba(140,140,140,0.6)"}
    # automargin: room for tick labels and the axis title is made from the plot, not taken from the
    # legend's (with the "none" template a narrow page printed the x title over the ticks and the
    # legend's rows over both)
    fig.update_xaxes(**grid, automargin=True)
    fig.update_yaxes(**grid, automargin=True)
    return fig


def whole_ticks(fig: go.Figure, n: int) -> None:
    """A count axis of few values ticks at whole numbers: left alone, plotly ticked one or two bars at
    -0.5, 0, 0.5, 1, 1.5 (gamma 1)."""
    if n <= 12:
        fig.update_xaxes(tickmode="linear", tick0=0, dtick=1)


def acceptance_figure(trace: Trace) -> go.Figure:
    xs, ys, running = trace.acceptance_series()
    xs = [number(x) for x in xs]
    fig = go.Figure()
    fig.add_bar(x=xs, y=ys, name="kept / proposed", marker_color=COLORS["accepted"], opacity=0.8)
    fig.add_scatter(x=xs, y=running, name="running acceptance rate", mode="lines",
                    line={"color": COLORS["spec"], "width": 2})
    fig.update_yaxes(range=[0, 1.05])
    return layout(fig, "Acceptance per iteration", "iteration", "fraction kept")


def accepted_length_figure(trace: Trace) -> go.Figure:
    observed, expected = trace.accepted_length_counts()
    ks = list(range(len(observed)))
    fig = go.Figure()
    fig.add_bar(x=ks, y=observed, name="measured", marker_color=COLORS["accepted"])
    a = trace.alpha
    fig.add_scatter(x=ks, y=expected, mode="lines+markers", name=f"theory (α = {a:.2f})" if a is not None else "theory",
                    line={"color": COLORS["theory"], "dash": "dot"})
    whole_ticks(fig, len(ks))
    return layout(fig, "Accepted length per iteration", "draft tokens kept (k)", "iterations")


def position_figure(trace: Trace) -> go.Figure:
    rows = trace.by_position()
    fig = go.Figure()
    fig.add_bar(x=[i + 1 for i in range(len(rows))], y=[k / n if n else 0 for k, n in rows],
                text=[f"{k}/{n}" for k, n in rows], textposition="outside", marker_color=COLORS["spec"],
                constraintext="none", cliponaxis=False,  # plotly shrinks a label it thinks has no room
                name="kept / examined")
    fig.update_yaxes(range=[0, 1.2])
    # room beside the first and last bars for their labels ("13/28" is wider than a bar of nine)
    fig.update_xaxes(range=[0.2, len(rows) + 0.8])
    whole_ticks(fig, len(rows))
    return layout(fig, "Acceptance by draft position", "position in the proposal", "kept / examined")


def throughput_figure(spec: Trace, vanilla: Trace | None) -> go.Figure:
    fig = go.Figure()
    for name, tr, color in (("speculative", spec, COLORS["spec"]), ("vanilla", vanilla, COLORS["vanilla"])):
        if tr is None or tr.start is None:
            continue
        xs = [0.0, tr.start.prefill_ms] + [e.elapsed_ms for e in tr.iterations]
        ys = [0, 0] + [e.tokens_total for e in tr.iterations]
        fig.add_scatter(x=[x / 1000 for x in xs], y=ys, mode="lines", name=f"{name} ({tr.tokens_per_second:.1f} tok/s)",
                        line={"color": color, "width": 2, "shape": "hv"})
    title = "Tokens over time"
    if vanilla is not None and vanilla.summary and spec.summary and vanilla.tokens_per_second > 0:
        title += f": speedup {spec.tokens_per_second / vanilla.tokens_per_second:.2f}x"
        if compare_speed(spec, vanilla).implausible:
            title += " (timing noise: see Summary)"
    return layout(fig, title, "seconds", "tokens generated")


def time_split_figure(spec: Trace, vanilla: Trace | None) -> go.Figure:
    fig = go.Figure()
    runs = [("speculative", spec)] + ([("vanilla", vanilla)] if vanilla is not None and vanilla.start else [])
    names = {"verify": "verify (target passes)"}  # said in the legend: a title that long was cut on a phone
    for part in ("prefill", "draft", "verify", "other"):
        fig.add_bar(y=[n for n, _ in runs], x=[tr.time_split()[part] / 1000 for _, tr in runs],
                    name=names.get(part, part), orientation="h", marker_color=COLORS[part])
    fig.update_layout(barmode="stack")
    return layout(fig, "Where the time went", "seconds", "", height=200)


def inspector_figure(e: IterationEvent | None) -> go.Figure:
    fig = go.Figure()
    if e is not None and e.proposed and len(e.p) == len(e.q) == len(e.proposed):
        labels = [f"{i + 1}: {token_label(t)}" for i, t in enumerate(e.proposed_text)]
        fig.add_bar(x=labels, y=e.q, name="q (draft)", marker_color=COLORS["q"])
        fig.add_bar(x=labels, y=e.p, name="p (target)", marker_color=COLORS["p"])
        if all(x in (0.0, 1.0) for x in e.p):  # greedy: p and q are one-hot; show the softmax too
            # hatched, not faded: a faded slate bar all but vanished on the dark page
            fig.add_bar(x=labels, y=e.q_raw, name="q softmax T=1", marker_color=COLORS["q"], opacity=0.8,
                        marker_pattern_shape="/")
            fig.add_bar(x=labels, y=e.p_raw, name="p softmax T=1", marker_color=COLORS["p"], opacity=0.8,
                        marker_pattern_shape="/")
        c = e.correction
        if c.kind == "resample" and c.top and not one_hot(e):
            # the step a class most needs to see: after the refusal the target draws from the residual
            r = c.top  # the same tokens the inspector lists under the table
            fig.add_bar(x=[f"r: {token_label(t)}" for _, t, _ in r], y=[pr for _, _, pr in r], marker_color=COLORS["resample"],
                        name=f"r = norm(max(0, p − q)) at position {e.accepted + 1}, its top tokens")
        fig.update_layout(barmode="group")
    elif e is not None:
        labels = [token_label(t) for _, t, _ in e.correction.top]
        fig.add_bar(x=labels, y=[p for _, _, p in e.correction.top], name="p (target)", marker_color=COLORS["p"])
    fig.update_yaxes(range=[0, 1.05])
    shows_r = any(str(t.name).startswith("r = ") for t in fig.data)
    return layout(fig, "p and q of each proposal" + (", and r after the refusal" if shows_r else ""), "",
                  "probability", height=240)


def all_figures(spec: Trace, vanilla: Trace | None) -> tuple[go.Figure, ...]:
    return (acceptance_figure(spec), accepted_length_figure(spec), position_figure(spec),
            throughput_figure(spec, vanilla), time_split_figure(spec, vanilla))
