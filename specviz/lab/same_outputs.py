"""1. Same outputs? (a) greedy: speculative vs vanilla, token for token, and the top-2 logit margin
where they part; (b) sampled: N real speculative iterations' first tokens against the target's
exact p; (c) break it: the same check on deliberately broken rules (:mod:`specviz.lab.broken`);
(d) numerics as a control: greedy speculative vs vanilla in float32 and in bfloat16."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

import plotly.graph_objects as go
from plotly.subplots import make_subplots
import torch

from ..backends.transformers import CachedLM, early_exit_view
from ..engine import DecodeConfig, Run, speculative_step
from ..exactness import compare
from ..pipeline import Pipeline
from ..sampling import SamplingConfig, logits_to_probs
from ..view.charts import COLORS, layout, token_label
from . import broken
from ..trace import Trace
from .common import Progress, Settings, greedy_cfg, jsonable
from .stats import fit

# a top-2 logit margin below this is within the dtype's rounding of logits of magnitude ~10-30
# (bfloat16 keeps 8 significant bits: steps of 0.06-0.125 there), so a split there is numerics
NEAR_TIE = {"float32": 1e-3, "bfloat16": 0.25, "float16": 0.03}
ALPHA = 1e-3  # the p-value below which the check says "not the target's distribution"
TOP = 8  # tokens shown in the chart (the rest pooled as "other")
BREAK_POSITIONS = 24  # break-it looks at the positions of the greedy answer's first 24 tokens and the one after


def p_text(p: float, digits: int = 0) -> str:
    """A broken rule's p-value with its relation: "= 3e-12", or "< 1e-300" where it underflowed to 0
    (printed as "p = 0e+00", it read like a typo)."""
    return "< 1e-300" if p < 1e-300 else f"= {p:.{digits}e}"


@dataclass
class Greedy:
    dtype: str
    tokens: int
    identical: bool
    index: int | None  # first new token where speculative and vanilla part
    margin: float | None  # vanilla target's top-1 minus top-2 logit there
    acceptance_rate: float | None
    output_ids: list[int] = field(default_factory=list, repr=False)  # vanilla's

    def verdict(self) -> str:
        if self.identical:
            return f"{self.dtype}: identical to vanilla for all {self.tokens} tokens"
        tie = NEAR_TIE.get(self.dtype, 1e-3)
        kind = "a near tie: numerics" if self.margin is not None and self.margin < tie else "NOT a near tie"
        m = "n/a" if self.margin is None else f"{self.margin:.1e}"
        return f"{self.dtype}: parts from vanilla at new token {self.index + 1} (top-2 margin {m}, {kind})"


@dataclass
class Check:
    rule: str
    drafter: str
    samples: int
    tv: float
    chi2: float
    dof: int
    p_value: float
    counts: dict[int, int]  # first tokens seen (the top ones; the rest pooled under -1)
    position: int = 0  # new-token index of the greedy answer the check ran at (0: right after the prompt)
    exact: dict[int, float] = field(default_factory=dict)  # the target's p there (top tokens)
    labels: dict[int, str] = field(default_factory=dict)
    law_tv: float | None = None  # the rule's exact distance from p there (0 for the correct rule)

    @property
    def tested(self) -> bool:
        """Whether a chi-square test ran: none where no token is expected 5 times (its p-value is NaN)."""
        return self.dof > 0 and self.p_value == self.p_value

    @property
    def passed(self) -> bool:
        """No evidence against the target's distribution (an untested check is no evidence either way)."""
        return not self.tested or self.p_value >= ALPHA


@dataclass
class SameOutputsResult:
    pair: str
    prompt: str
    greedy: list[Greedy] = field(default_factory=list)
    temperature: float = 0.0
    real: Check | None = None  # (b) N real speculative iterations
    broken: list[Check] = field(default_factory=list)  # (c) correct rule first, then the broken ones
    break_drafter: str = ""
    variant: str = "raw_q"

    def to_json(self) -> dict:
        return jsonable(self)


def _greedy(pipe: Pipeline, ids, n: int, gamma: int, dtype: str) -> Greedy:
    cfg = greedy_cfg(gamma, n)
    van = Trace.of(pipe.vanilla(ids, cfg))
    spec = Trace.of(pipe.speculative(ids, cfg))
    ex = compare(pipe.target_lm, ids, van.output_ids, spec.output_ids)
    return Greedy(dtype, len(van.output_ids), ex.identical, ex.index, ex.margin, spec.acceptance_rate,
                  van.output_ids)


def _support(p: torch.Tensor) -> dict[int, float]:
    return {int(t): float(p[t]) for t in torch.nonzero(p > 0).flatten().tolist()}


def _check(rule: str, drafter: str, counts: dict[int, int], exact: dict[int, float], position: int,
           tokenizer) -> Check:
    f = fit(counts, exact)
    top = sorted(exact, key=exact.get, reverse=True)[:TOP]
    shown = {t: counts.get(t, 0) for t in top}
    shown[-1] = f.samples - sum(shown.values())
    return Check(rule, drafter, f.samples, f.tv, f.chi2, f.dof, f.p_value, shown, position,
                 {t: exact[t] for t in top}, {t: tokenizer.decode([t]) for t in top})


def _real_check(pipe: Pipeline, ids, cfg: DecodeConfig, samples: int) -> Iterator:
    """N real speculative iterations from the prefilled prompt (the cache rolled back between)."""
    run = Run("speculative", pipe.target_lm, pipe.tokenizer, ids,
              DecodeConfig(cfg.gamma, cfg.gamma + 1, cfg.sampling, cfg.seed), pipe.drafter)
    run.use_cost_profile()
    run.start()
    counts: dict[int, int] = {}
    for i in range(samples):
        run.rewind()
        t = speculative_step(run, cfg.gamma).emitted[0]
        counts[t] = counts.get(t, 0) + 1
        if (i + 1) % 25 == 0 or i + 1 == samples:
            yield i + 1, counts


def _draft_model(pipe: Pipeline) -> tuple[torch.nn.Module, str]:
    """A drafter with a real q for the break-it check: the pair's own, or the target's first 3/4."""
    lm = getattr(pipe.drafter, "lm", None)
    if lm is not None:
        return lm.model, pipe.drafter.name
    layers = len((pipe.target.model.get_decoder()).layers)
    depth = max(1, (3 * layers) // 4)
    # the pair's drafter may have a q (the head's softmax) but no model to read the whole answer in
    # one pass, or only a one-hot q (lookup): the target's first layers stand in for it, and say so
    return early_exit_view(pipe.target.model, depth), (f"early exit @ layer {depth}, standing in for the pair's "
                                                       "drafter (this check reads the answer with a draft model)")


def run(pipe: Pipeline, s: Settings, load: Callable[..., Pipeline] | None = None) -> Iterator:
    ids = pipe.encode(s.prompt, s.chat)
    gamma = s.gamma or pipe.gamma
    n_tokens = s.max_new_tokens or 48
    samples = s.samples or (100 if getattr(pipe.drafter, "lm", None) is not None else 200)  # < 90 s on a CPU
    n_break = s.break_samples or 2000
    res = SameOutputsResult(pipe.name, s.prompt, variant=s.variant or "raw_q")
    # one step each: (a), every 25 iterations of (b) and its last, each rule of (c), and (d)
    total = 1 + -(-samples // 25) + len(broken.VARIANTS) + (1 if s.dtype_control and load else 0)
    done = 0
    yield Progress(done, total, "(a) greedy: speculative and vanilla decoding in float32")
    res.greedy.append(_greedy(pipe, ids, n_tokens, gamma, str(pipe.target.dtype).replace("torch.", "")))
    done += 1
    # (b) the target's exact first-token distribution, then N real iterations from the prompt
    res.temperature = s.temperature if s.temperature > 0 else s.check_temperature
    sampling = SamplingConfig(temperature=res.temperature)
    answer = res.greedy[0].output_ids[:BREAK_POSITIONS]
    lm = pipe.target_lm
    lm.reset()
    P = logits_to_probs(lm.feed(ids + answer, keep_logits=len(answer) + 1), sampling)
    cfg = DecodeConfig(gamma=gamma, max_new_tokens=gamma + 1, sampling=sampling, seed=s.seed)
    yield Progress(done, total, f"(b) {samples} real speculative iterations at temperature {res.temperature:g}")
    exact = _support(P[0])
    for k, counts in _real_check(pipe, ids, cfg, samples):
        res.real = _check("correct (real iterations)", pipe.drafter.name, counts, exact, 0, pipe.tokenizer)
        done += 1
        yield Progress(done, total, f"(b) {k}/{samples} iterations: TV {res.real.tv:.3f}, "
                                    f"p-value {res.real.p_value:.3f}", res)
    # (c) the rule alone, correct and broken, on the real p and q of the greedy answer's positions;
    #     each broken rule is tested where it moves the first token's distribution most
    model, res.break_drafter = _draft_model(pipe)
    qlogits = CachedLM(model, lm.vocab_size).feed(ids + answer, keep_logits=len(answer) + 1)
    Q, Q_raw = logits_to_probs(qlogits, sampling), qlogits.softmax(-1)
    shown_at = broken.where_it_shows(res.variant, P, Q, Q_raw)[0] if res.variant in broken.BROKEN else 0
    for i, rule in enumerate(broken.VARIANTS):
        j, dist = (shown_at, 0.0) if rule == "correct" else broken.where_it_shows(rule, P, Q, Q_raw)
        counts = broken.draw_counts(rule, P[j], Q[j], Q_raw[j], n_break, s.seed + 1000 + i)
        c = _check(rule, res.break_drafter, counts, _support(P[j]), j, pipe.tokenizer)
        c.law_tv = dist
        res.broken.append(c)
        done += 1
        yield Progress(done, total, f"(c) {rule} at new token {j + 1}: p-value {p_text(c.p_value, 1)}", res)
    # (d) the same greedy comparison in bfloat16 (a second copy of the target)
    if s.dtype_control and load is not None:
        yield Progress(done, total, "(d) loading a bfloat16 copy of the target and decoding in it")
        bf = load(dtype="bfloat16")
        yield Progress(done, total, "(d) greedy: speculative and vanilla decoding in bfloat16")  # Stop can end it here
        res.greedy.append(_greedy(bf, bf.encode(s.prompt, s.chat), n_tokens, gamma, "bfloat16"))
        done += 1
    yield Progress(total, total, "done", res)
    yield res


def _bars(fig, check: Check, col: int, name: str, color: str, with_exact: bool) -> None:
    top = list(check.exact)
    labels = [token_label(check.labels.get(t, str(t))) for t in top] + ["other"]
    n = max(1, check.samples)
    if with_exact:
        exact = [check.exact[t] for t in top]
        fig.add_bar(x=labels, y=exact + [max(0.0, 1 - sum(exact))], name="target p (exact)",
                    marker_color=COLORS["p"], showlegend=col == 1, row=1, col=col)
    fig.add_bar(x=labels, y=[check.counts.get(t, 0) / n for t in top] + [check.counts.get(-1, 0) / n],
                name=name, marker_color=color, row=1, col=col)


def figure(res: SameOutputsResult) -> go.Figure:
    chosen = next((c for c in res.broken if c.rule == res.variant), None)
    control = next((c for c in res.broken if c.rule == "correct"), None)
    left = "(b) real iterations, first new token"
    right = f"(c) the rule alone at new token {chosen.position + 1}" if chosen else "(c) break it"
    fig = make_subplots(rows=1, cols=2, subplot_titles=(left, right), horizontal_spacing=0.1)
    if res.real is not None:
        _bars(fig, res.real, 1, f"speculative ({res.real.samples} iterations, p-value {res.real.p_value:.2f})",
              COLORS["spec"], True)  # speculative's colour, not the green of a kept token
    if chosen is not None:
        if control is not None and control.position == chosen.position:
            _bars(fig, control, 2, f"correct rule (p-value {control.p_value:.2f})", "#b09ae6", True)  # speculative's, lighter
        _bars(fig, chosen, 2, f"{chosen.rule} (p {p_text(chosen.p_value)})", COLORS["rejected"], False)
    fig.update_layout(barmode="group")
    fig.update_annotations(font_size=12)
    return layout(fig, f"Sampled vs the target's exact p (T = {res.temperature:g})", "", "frequency", height=330)


def takeaway(res: SameOutputsResult) -> str:
    lines = []
    for g in res.greedy:
        lines.append(f"Greedy, {g.verdict()}.")
    if res.real is not None:
        r = res.real
        if not r.tested:
            verdict = ("no chi-square test: at this temperature the target spreads its mass so thin that no "
                       "token is expected 5 times in these samples, so they can neither confirm nor refute it "
                       "(a lower temperature tests it)")
            test = "no p-value"
        else:
            verdict = "consistent with the target's distribution" if r.passed else "NOT the target's distribution"
            test = f"chi-square p-value {r.p_value:.3f}"
        lines.append(f"Sampled (T = {res.temperature:g}), {r.samples} real speculative iterations with "
                     f"{r.drafter}: TV distance {r.tv:.3f}, {test}: {verdict}.")
    if res.broken:
        caught = [c for c in res.broken if c.rule != "correct" and c.tested and not c.passed]
        missed = [c.rule + (f" (TV {c.law_tv:.3f} from p at most)" if c.law_tv is not None else "") for c in res.broken
                  if c.rule != "correct" and (c.passed or not c.tested)]
        ok = next((c for c in res.broken if c.rule == "correct"), None)
        parts = ", ".join(f"{c.rule} p {p_text(c.p_value)}" for c in caught)
        positions = min(BREAK_POSITIONS, len(res.greedy[0].output_ids)) + 1 if res.greedy else BREAK_POSITIONS + 1
        lines.append(f"Break it ({res.broken[0].samples} draws per rule on the real p and q of {res.break_drafter}, "
                     f"each broken rule where it shows most among the first {positions} new tokens): "
                     f"the correct rule {'passes' if ok and ok.passed else 'FAILS'} (p-value {ok.p_value:.2f}); "
                     f"the check catches {len(caught)} of {len(caught) + len(missed)} broken rules ({parts})"
                     + (f"; it misses {', '.join(missed)}: on this prompt's first {positions} new tokens that "
                        "bug moves p by too little to see in these draws" if missed else "") + ".")
    return "\n\n".join(lines)
