"""3. When not to use it. (a) batch size: the measured cost of one target pass over B sequences x
(gamma + 1) tokens against B x 1, and the speedup the measured alpha would give at each B
(predicted from measured costs); (b) short outputs: measured speedup against max new tokens,
prefill included; (c) poor drafts: early exit at several depths, acceptance, cost and speedup,
with the "below ~1.5 tokens per iteration it does not pay" rule checked."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterator

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from transformers import DynamicCache

from ..backends.base import Timer
from ..drafters import kind
from ..backends.transformers import check_exit_layers
from ..pipeline import Pipeline
from ..theory import predicted_speedup
from ..view.charts import COLORS, layout
from ..trace import Trace
from .common import (Fastest, Measured, Progress, Settings, draft_marker, greedy_cfg, jsonable,
                     measured, noise_note, rounds, with_drafter)

RULE = 1.5  # tokens per iteration below which explainers say speculation does not pay


@dataclass
class BatchPoint:
    batch: int
    one_ms: float  # B x 1 token
    verify_ms: float  # B x (gamma + 1) tokens
    v: float  # verify_ms / one_ms
    predicted: float  # expected tokens / (gamma c + v) at the measured alpha


@dataclass
class WhenNotResult:
    pair: str
    device: str = "cpu"
    gamma: int = 0
    alpha: float | None = None
    c: float = 0.0
    batches: list[BatchPoint] = field(default_factory=list)
    lengths: list[tuple[int, float | None]] = field(default_factory=list)  # (max new tokens, measured speedup)
    drafts: list[Measured] = field(default_factory=list)
    repeats: int = 1  # timed runs behind (b) and (c), alternated; the fastest of each is compared

    def to_json(self) -> dict:
        return jsonable(self)

    def rule_agrees(self) -> list[bool]:
        """Per draft: does "below 1.5 tokens per iteration it does not pay" match the measurement?"""
        return [(d.tokens_per_iteration < RULE) == (d.speedup < 1.0) for d in self.drafts]


@torch.inference_mode()
def batch_cost(model: torch.nn.Module, context: list[int], batch: int, tokens: int, reps: int = 5) -> tuple[float, float]:
    """Fastest ms of one forward pass over (batch, 1) and (batch, tokens) after a shared context.

    Each shape runs once untimed (its first call allocates), then the two alternate ``reps`` times
    and each keeps its minimum: a neighbour's burst slows one timing, never speeds one up, and
    alternating spreads a slow stretch over both. (A median of three, each shape timed in one block,
    once drew v = 0.7 at B = 2: more tokens "cheaper" than fewer, a spike in the predicted speedup.)"""
    device = next(model.parameters()).device
    ctx = torch.tensor([context] * batch, device=device)
    cache = DynamicCache(config=model.config)
    cache.activate_past_recording()  # as the backend does: keeps sliding-window layers croppable
    model(input_ids=ctx, cache=cache, use_cache=True, logits_to_keep=1)
    steps = {n: torch.tensor([context[-n:] if len(context) >= n else (context * n)[:n]] * batch, device=device)
             for n in (1, tokens)}
    times: dict[int, list[float]] = {1: [], tokens: []}
    for rep in range(reps + 1):
        for n, step in steps.items():
            with Timer(device) as t:
                model(input_ids=step, cache=cache, use_cache=True, logits_to_keep=n)
            cache.crop(-n)
            if rep:  # the first round warms both shapes up
                times[n].append(t.ms)
    return min(times[1]), min(times[tokens])


def run(pipe: Pipeline, s: Settings, load: Callable[..., Pipeline] | None = None) -> Iterator:
    ids = pipe.encode(s.prompt, s.chat)
    batches = s.batches or [1, 2, 4, 8, 16, 32]
    slow_draft = getattr(pipe.drafter, "lm", None) is not None  # a model draft: 128 tokens take too long on a CPU
    lengths = s.lengths or ([8, 16, 32, 64] if slow_draft else [8, 16, 32, 64, 128])
    layers = len(pipe.target.model.get_decoder().layers)
    depths = s.depths or sorted({max(1, layers * f // 10) for f in (2, 5, 8)})
    for d in depths:  # before any minute is measured
        check_exit_layers(d, layers)
    R = s.rounds
    res = WhenNotResult(pipe.name, pipe.target.device.type, repeats=R)
    total = 2 * R + len(batches) + (1 + len(depths)) * R
    done = 0
    # (b) speculative and vanilla runs to the longest length, alternated R times; shorter outputs are
    # their prefixes, each length timed by its fastest run
    n = max(lengths)
    cfg = greedy_cfg(s.gamma or pipe.gamma, n, s.seed, s.temperature)
    sides = {"vanilla": pipe.vanilla, "speculative": pipe.speculative}
    long = {side: Fastest() for side in sides}
    for r, side in rounds(R, list(sides)):
        yield Progress(done, total, f"(b) {side} decoding of up to {n} tokens (run {r + 1} of {R})",
                       res if res.lengths else None)
        long[side].add(Trace.of(sides[side](ids, cfg)))
        done += 1
        if len(long["vanilla"].runs) == len(long["speculative"].runs):
            res.lengths = []
            for L in lengths:
                a, b = long["speculative"].at(L), long["vanilla"].at(L)
                res.lengths.append((L, b / a if a and b else None))
    m = measured("pair's drafter", cfg.gamma, long["speculative"], long["vanilla"])
    res.alpha, res.c = m.alpha, m.c
    best = long["speculative"].best
    proposing = [len(e.proposed) for e in best.iterations if e.proposed]
    res.gamma = max(1, round(sum(proposing) / len(proposing))) if proposing else cfg.gamma
    res.drafts = [m]
    # (a) batch cost at the measured alpha and mean proposal length
    for B in batches:
        yield Progress(done, total, f"(a) batch {B}: {B} x 1 vs {B} x {res.gamma + 1} tokens", res)
        one, ver = batch_cost(pipe.target.model, ids, B, res.gamma + 1)
        v = max(1.0, ver / one)  # a pass over more tokens does the same work and more: below 1 is noise
        res.batches.append(BatchPoint(B, one, ver, v, predicted_speedup(res.alpha or 0.0, res.gamma, res.c, v)))
        done += 1
    # (c) poor drafts: early exit at several depths against a shorter vanilla run, all alternated R times
    short = s.max_new_tokens or 32
    g = 3
    jobs = {"vanilla": ("vanilla decoding", partial(pipe.vanilla, ids, greedy_cfg(1, short, s.seed, s.temperature)))}
    for L in depths:
        exit_l = with_drafter(pipe, kind("early_exit").build({"kind": "early_exit", "layers": L}, pipe.target, None))
        jobs[L] = (f"early exit at layer {L} of {layers}",
                   partial(exit_l.speculative, ids, greedy_cfg(g, short, s.seed, s.temperature)))
    runs = {name: Fastest() for name in jobs}
    for r, name in rounds(R, list(jobs)):
        what, job = jobs[name]
        yield Progress(done, total, f"(c) {what} (run {r + 1} of {R})", res)
        runs[name].add(Trace.of(job()))
        done += 1
        res.drafts = [m] + [measured(f"exit {d}/{layers}", g, runs[d], runs["vanilla"]) for d in depths if runs[d].runs]
    yield Progress(total, total, "done", res)
    yield res


def figure(res: WhenNotResult) -> go.Figure:
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09, subplot_titles=(
        f"(a) batch size (predicted, γ = {res.gamma})" if res.gamma else "(a) batch size (predicted)",
        "(b) output length (measured)", "(c) draft quality (measured)"))
    if res.batches:
        bs = [b.batch for b in res.batches]
        fig.add_scatter(x=bs, y=[b.predicted for b in res.batches], mode="lines+markers", name="predicted speedup",
                        line={"color": COLORS["theory"]}, row=1, col=1)
        fig.add_scatter(x=bs, y=[b.v for b in res.batches], mode="lines+markers", name="verify cost v (× a B×1 pass)",
                        line={"color": COLORS["verify"], "dash": "dot"}, row=1, col=1)
        fig.update_xaxes(type="log", row=1, col=1, title_text="batch size B", tickvals=bs)
    pts = [(L, s) for L, s in res.lengths if s is not None]
    fig.add_scatter(x=[L for L, _ in pts], y=[s for _, s in pts], mode="lines+markers", name="speedup by length",
                    line={"color": COLORS["spec"]}, row=1, col=2)
    fig.update_xaxes(type="log", row=1, col=2, title_text="max new tokens", tickvals=[L for L, _ in pts])
    if res.drafts:
        # one legend entry per drafter, told apart by symbol and shade: neighbouring points' text
        # labels printed over each other (early exits at nearby depths land close together)
        for i, d in enumerate(res.drafts):
            fig.add_scatter(x=[d.tokens_per_iteration], y=[d.speedup], mode="markers", name=f"(c) {html.escape(d.label)}",
                            marker=draft_marker(i, edge="white"),
                            hovertemplate=f"{html.escape(d.label)}: %{{x:.2f}} tokens/iteration, %{{y:.2f}}x<extra></extra>",
                            cliponaxis=False, row=1, col=3)
        fig.add_vline(x=RULE, line={"dash": "dash", "color": COLORS["rejected"], "width": 1}, row=1, col=3)
        xs = [d.tokens_per_iteration for d in res.drafts] + [RULE]
        fig.update_xaxes(title_text="tokens / iteration", row=1, col=3, range=[min(xs) - 0.15, max(xs) + 0.25])
    for col in (1, 2, 3):
        fig.add_hline(y=1.0, line={"color": "rgba(140,140,140,0.7)", "width": 1}, row=1, col=col)
    fig.update_annotations(font_size=12)
    fig = layout(fig, "When speculation stops paying", "", "speedup (×)", height=340)
    fig.update_layout(margin={"t": 64}, title={"y": 0.98})
    fig.update_layout(xaxis_title="batch size B")
    # panel (a) also draws the verify cost v, a ratio of pass times: its axis is not speedup alone
    fig.update_yaxes(title_text="speedup, or cost v (×)" if res.batches else "speedup (×)", row=1, col=1)
    return fig


def takeaway(res: WhenNotResult) -> str:
    lines = []
    if res.batches:
        b1, bn = res.batches[0], res.batches[-1]
        turn = next((b.batch for b in res.batches if b.predicted < 1.0), None)
        lines.append(f"(a) Verifying {res.gamma + 1} tokens costs {b1.v:.2f}x a 1-token pass at batch 1 and "
                     f"{bn.v:.2f}x at batch {bn.batch} on this {res.device}; at the measured α = "
                     f"{(res.alpha or 0):.2f} the predicted speedup goes from {b1.predicted:.2f}x to {bn.predicted:.2f}x"
                     + (f" and falls below 1 from batch {turn}." if turn else ".")
                     + " (Predicted from measured costs; a GPU shows the memory-bound to compute-bound turn later.)")
    pts = [(L, s) for L, s in res.lengths if s is not None]
    if pts:
        short = [L for L, s in res.lengths if s is None]
        lines.append("(b) Measured speedup, prefill included: " + ", ".join(f"{s:.2f}x at {L}" for L, s in pts)
                     + " tokens" + (f" (the fastest of {res.repeats} alternated runs each)" if res.repeats > 1 else "")
                     + (f"; the answer ended before {short[0]} tokens, so longer outputs are not measured."
                        if short else "."))
    if res.drafts:
        agree = res.rule_agrees()
        parts = ", ".join(f"{d.label}: {d.tokens_per_iteration:.2f} tok/it, c = {d.c:.2f}, {d.speedup:.2f}x"
                          for d in res.drafts)
        lines.append(f"(c) {parts}. The 'below {RULE} tokens per iteration it does not pay' rule matches "
                     f"{sum(agree)} of {len(agree)} drafters here" + (
                         "" if all(agree) else " (it ignores the draft's cost c: a costly draft needs more, a free one less)")
                     + ".")
        lines.append(noise_note(res.drafts))
    return " ".join(line for line in lines if line)
