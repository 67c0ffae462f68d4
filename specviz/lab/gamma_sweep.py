"""2. Is higher gamma better? A sweep of fixed gamma on the prompt (and the pair's own policy as
one more point): measured tokens per iteration, per-position acceptance and speedup over vanilla,
against Leviathan et al.'s curve from the measured alpha, draft cost c and verify cost v(g)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterator

import plotly.graph_objects as go

from ..pipeline import Pipeline
from ..theory import expected_tokens, predicted_speedup
from ..view.charts import COLORS, layout
from ..trace import Trace
from .common import (TIE, Fastest, Measured, Progress, Settings, fixed_length, greedy_cfg, jsonable, measured,
                     noise_note, rounds, ties, with_drafter)

TOLERANCE = 0.15  # "the theory is within 15% of the measurement"


@dataclass
class SweepResult:
    pair: str
    drafter: str
    max_new_tokens: int
    runs: list[Measured] = field(default_factory=list)  # fixed gamma, in order
    policy: Measured | None = None  # the pair's own drafter (adaptive for prompt lookup)
    alpha: float | None = None  # pooled over the fixed-gamma runs: accepted / examined
    c: float = 0.0  # pooled draft cost per proposed token, in vanilla steps
    v: list[float] = field(default_factory=list)  # v[g]: a pass of g + 1 tokens / a 1-token pass (measured)
    theory: dict[int, float] = field(default_factory=dict)  # predicted speedup at each gamma (pooled alpha)
    theory_tokens: dict[int, float] = field(default_factory=dict)  # expected tokens per iteration
    repeats: int = 1  # timed runs of each gamma, the baseline and the policy, alternated; the fastest compared
    complete: bool = False  # every run done (a stopped or still running sweep shows what it has)

    def to_json(self) -> dict:
        return jsonable(self)

    def best(self) -> tuple[Measured | None, int | None]:
        m = max(self.runs, key=lambda r: r.decode_speedup, default=None)
        g = max(self.theory, key=self.theory.get, default=None)
        return m, g

    def close_to_best(self) -> list[int]:
        """Gammas whose measured speedup is within ``TIE`` of the best one's: not told apart here."""
        return ties([(r.gamma, r.decode_speedup) for r in self.runs])[1]

    def within(self) -> list[tuple[int, float, float]]:
        """(gamma, measured, predicted from the run's own alpha, c and proposal lengths) per run."""
        return [(r.gamma, r.decode_speedup, r.predicted) for r in self.runs]


def _pool(res: SweepResult) -> None:
    kept = sum(k for r in res.runs for k, _ in r.by_position)
    seen = sum(n for r in res.runs for _, n in r.by_position)
    res.alpha = kept / seen if seen else None
    weights = [(r.c, sum(n for _, n in r.by_position)) for r in res.runs]
    total = sum(w for _, w in weights)
    res.c = sum(c * w for c, w in weights) / total if total else 0.0
    res.theory, res.theory_tokens = {}, {}  # rebuilt from the runs as they stand
    if res.alpha is not None and res.v:
        for r in res.runs:
            g = r.gamma
            vg = res.v[min(g, len(res.v) - 1)]
            res.theory[g] = predicted_speedup(res.alpha, g, res.c, vg)
            res.theory_tokens[g] = expected_tokens(res.alpha, g)


def run(pipe: Pipeline, s: Settings, load: Callable[..., Pipeline] | None = None) -> Iterator:
    ids = pipe.encode(s.prompt, s.chat)
    q_drafter = getattr(pipe.drafter, "lm", None) is not None
    # sized so that every gamma, the baseline and the pair's policy, each timed REPEATS times, finish in
    # about a minute on a 2-core CPU
    gammas = s.gammas or ([1, 2, 3, 4, 6, 8] if q_drafter else [1, 2, 3, 4, 5, 6, 8, 10, 12, 16])
    n = s.max_new_tokens or (24 if q_drafter else 40)
    R = s.rounds
    sweep = fixed_length(pipe.drafter)  # the pair's drafter without a length choice of its own
    res = SweepResult(pipe.name, sweep.name, n, repeats=R)
    policy_gamma = s.gamma or pipe.gamma
    fixed = with_drafter(pipe, sweep)
    jobs = {"vanilla": (f"vanilla decoding of {n} tokens (the baseline)",
                        partial(pipe.vanilla, ids, greedy_cfg(1, n, s.seed, s.temperature)))}
    jobs.update({g: (f"gamma = {g}", partial(fixed.speculative, ids, greedy_cfg(g, n, s.seed, s.temperature)))
                 for g in gammas})
    jobs["policy"] = (f"the pair's own drafter at gamma {policy_gamma}",
                      partial(pipe.speculative, ids, greedy_cfg(policy_gamma, n, s.seed, s.temperature)))
    runs = {name: Fastest() for name in jobs}
    total = 1 + len(jobs) * R
    yield Progress(0, total, "this hardware's verify cost v(g)")
    res.v = pipe.target_lm.cost_profile(max(gammas) + 1, ids)
    done = 1
    for r, name in rounds(R, list(jobs)):
        what, job = jobs[name]
        yield Progress(done, total, f"{what} (run {r + 1} of {R})", res if res.runs else None)
        runs[name].add(Trace.of(job()))
        done += 1
        if runs["vanilla"].runs:  # every measurement against the fastest baseline so far
            res.runs = [measured(f"gamma {g}", g, runs[g], runs["vanilla"]) for g in gammas if runs[g].runs]
            if runs["policy"].runs:
                res.policy = measured(f"{pipe.drafter.name} (gamma {policy_gamma})", policy_gamma, runs["policy"],
                                      runs["vanilla"])
            _pool(res)
    res.complete = True
    yield Progress(total, total, "done", res)
    yield res


def figure(res: SweepResult) -> go.Figure:
    fig = go.Figure()
    gs = [r.gamma for r in res.runs]
    fig.add_scatter(x=gs, y=[r.decode_speedup for r in res.runs], mode="lines+markers", name="measured speedup",
                    line={"color": COLORS["spec"], "width": 2})
    fig.add_scatter(x=gs, y=[r.predicted for r in res.runs], mode="markers", name="theory, each run's α and lengths",
                    marker={"color": COLORS["theory"], "symbol": "x", "size": 8})
    if res.theory:
        fig.add_scatter(x=list(res.theory), y=list(res.theory.values()), mode="lines",
                        name=f"theory, pooled α = {res.alpha:.2f}, c = {res.c:.3f}, measured v(γ)",
                        line={"color": COLORS["theory"], "dash": "dot"})
    fig.add_scatter(x=gs, y=[r.tokens_per_iteration for r in res.runs], mode="lines+markers",
                    name="tokens per iteration", yaxis="y2", line={"color": COLORS["accepted"], "width": 1})
    if res.policy is not None:
        fig.add_scatter(x=[res.policy.gamma], y=[res.policy.decode_speedup], mode="markers",
                        name=f"pair's own policy ({res.policy.decode_speedup:.2f}x)",
                        marker={"color": COLORS["bonus"], "size": 11, "symbol": "star"})
    best, g_theory = res.best()
    if best is not None:
        fig.add_vline(x=best.gamma, line={"color": COLORS["spec"], "dash": "dash", "width": 1},
                      annotation_text=f"fastest: γ {best.gamma}", annotation_position="top")
    fig.add_hline(y=1.0, line={"color": "rgba(140,140,140,0.7)", "width": 1})
    # one scale for both: tokens per iteration bounds the speedup (each iteration costs at least one pass), and
    # scaled on its own the line sat below speedups it bounds
    fig.update_layout(yaxis2={"overlaying": "y", "side": "right", "title": "tokens / iteration", "showgrid": False,
                              "tickformat": ".2f", "matches": "y"})  # ticks follow the left grid: 1.5823 read as noise
    title = "Speedup over vanilla by γ"
    if not res.complete:
        title += " (incomplete: not every γ has all its runs)"
    elif best is not None and g_theory is not None:
        close = res.close_to_best()
        title += f": best measured γ = {best.gamma}" + (
            f" (γ = {', '.join(map(str, sorted(close)))} within {TIE:.0%})" if close else "") + f", predicted γ = {g_theory}"
    fig = layout(fig, title, "γ (draft tokens per iteration, fixed)", "decode speedup (×)", height=320)
    fig.update_layout(margin={"r": 56})  # room for the right axis (tokens per iteration)
    return fig


def takeaway(res: SweepResult) -> str:
    if not res.runs:
        return "No run finished."
    best, g_theory = res.best()
    tpi = [r.tokens_per_iteration for r in res.runs]
    rises = all(b >= a - 0.05 for a, b in zip(tpi, tpi[1:]))
    lo, hi = res.runs[0], res.runs[-1]
    close = res.close_to_best()
    tie = (f", with γ = {', '.join(map(str, sorted(close)))} within {TIE:.0%} of it (closer than the same "
           f"experiment run twice agrees: a tie)" if close else "")
    lines = [f"{res.drafter[:1].upper()}{res.drafter[1:]}, proposing γ tokens in every iteration where it can: "
             f"over {res.max_new_tokens} new tokens, tokens per iteration went from {lo.tokens_per_iteration:.2f} "
             f"at γ = {lo.gamma} to {hi.tokens_per_iteration:.2f} at γ = {hi.gamma} "
             f"({'never falling by more than 0.05' if rises else 'not monotone: acceptance here is not i.i.d.'}); "
             f"the speedup peaked at γ = {best.gamma} ({best.decode_speedup:.2f}x){tie} and was "
             f"{hi.decode_speedup:.2f}x at γ = {hi.gamma}: more drafts cost more verify"
             f"{' and draft' if res.c > 0.05 else ''} time."]
    if best.decode_speedup < 1.0:
        lines.append(f"Every γ was slower than vanilla decoding here (the best {best.decode_speedup:.2f}x): on this "
                     f"hardware this drafter costs more than the target passes it saves.")
    if res.alpha is not None:
        lines.append(f"Theory from the pooled α = {res.alpha:.2f}, c = {res.c:.3f} and this CPU's v(γ) "
                     f"(v({hi.gamma}) = {res.v[min(hi.gamma, len(res.v) - 1)]:.2f}) puts the best γ at {g_theory}.")
    off = [(g, m, p) for g, m, p in res.within() if m > 0 and abs(p - m) / m > TOLERANCE]
    n = len(res.runs)
    if not off:
        lines.append(f"Each run's prediction (its own α, c, v and proposal lengths) is within "
                     f"{TOLERANCE:.0%} of the measured speedup at all {n} values of γ.")
    else:
        worst = max(off, key=lambda t: abs(t[2] - t[1]) / t[1])
        lines.append(f"Each run's prediction is within {TOLERANCE:.0%} at {n - len(off)} of {n} values of γ; the "
                     f"worst is γ = {worst[0]} (measured {worst[1]:.2f}x, predicted {worst[2]:.2f}x): "
                     f"acceptance comes in bursts (the i.i.d. law assumes none) and timings on a shared CPU swing.")
    if res.policy is not None:
        lines.append(f"The pair's own policy: {res.policy.decode_speedup:.2f}x with "
                     f"{res.policy.tokens_per_iteration:.2f} tokens per iteration.")
    if res.repeats > 1:
        lines.append(f"Each point is the fastest of {res.repeats} runs: every γ, the policy and the vanilla baseline "
                     f"take turns, round after round.")
    lines.append(noise_note(res.runs + ([res.policy] if res.policy is not None else [])))
    return " ".join(line for line in lines if line)
