"""python -m specviz bench: speculative vs vanilla (ours) vs transformers' own assisted
generation, per prompt back to back in one process, on a prompt set like specbench-dev.jsonl.

Reported per category and overall: acceptance rate, tokens per iteration, tokens/s of each,
speedups over vanilla (median of per-prompt paired ratios, and total-time ratio), the share of
greedy outputs identical to vanilla, and the speedup theory predicts from the measured a, c, v.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .backends.base import Timer
from .engine import DecodeConfig
from .errors import SpecvizError
from .exactness import compare
from .pipeline import Pipeline
from .sampling import SamplingConfig
from .theory import cost_model
from .trace import Trace, median

MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


def load_prompts(path: str | Path, limit: int | None = None, categories: list[str] | None = None,
                 skip: int = 0) -> list[dict]:
    """First turns of a Spec-Bench style .jsonl: at most ``limit`` per category after leaving out
    the first ``skip`` of each (so settings can be tuned on prompts a benchmark does not use)."""
    path = Path(path)
    if not path.is_file():
        raise SpecvizError(f"prompt file not found: {path}")
    rows, per_cat = [], {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt = row["turns"][0]
            cat = str(row.get("category", "all"))
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise SpecvizError(f"{path}:{n}: expected a JSON object with a 'turns' list") from None
        if categories and cat not in categories and not ("mt_bench" in categories and cat in MT_BENCH):
            continue
        per_cat[cat] = per_cat.get(cat, 0) + 1
        if per_cat[cat] <= skip or (limit is not None and per_cat[cat] > skip + limit):
            continue
        rows.append({"id": row.get("question_id", n), "category": cat, "prompt": prompt})
    if not rows:
        raise SpecvizError(f"no prompts selected from {path}")
    return rows


@dataclass
class PromptResult:
    id: object
    category: str
    gamma: int
    temperature: float
    new_tokens: int
    vanilla_ms: float
    spec_ms: float
    vanilla_decode_ms: float
    spec_decode_ms: float
    proposed: int
    accepted: int
    examined: int
    iterations: int
    identical: bool | None
    divergence: str
    gammas: list[int] = field(repr=False, default_factory=list)
    verify_ms_by_gamma: dict = field(repr=False, default_factory=dict)
    draft_ms: float = 0.0
    step_ms: float = 0.0  # median vanilla step
    hf_plain_ms: float | None = None
    hf_assisted_ms: float | None = None
    hf_tokens: int | None = None
    hf_assisted_identical: bool | None = None


def _hf_generate(pipe: Pipeline, ids: list[int], cfg: DecodeConfig, extra: dict) -> tuple[float, list[int]]:
    model = pipe.target.model
    x = torch.tensor([ids], device=pipe.target.device)
    s = cfg.sampling
    kw = dict(max_new_tokens=cfg.max_new_tokens, do_sample=not s.greedy, pad_token_id=pipe.tokenizer.eos_token_id)
    if not s.greedy:
        kw.update(temperature=s.temperature, top_k=s.top_k or None, top_p=s.top_p)
        torch.manual_seed(cfg.seed or 0)
    else:
        kw.update(temperature=None, top_k=None, top_p=None)
    kw.update(extra)
    with torch.inference_mode(), Timer(pipe.target.device) as t:
        out = model.generate(x, attention_mask=torch.ones_like(x), **kw)
    return t.ms, out[0, len(ids):].tolist()


def run_prompt(pipe: Pipeline, row: dict, gamma: int, temperature: float, max_new_tokens: int, seed: int,
               peer: bool, chat: bool = True, costs: tuple | None = None) -> PromptResult:
    cfg = DecodeConfig(gamma=gamma, max_new_tokens=max_new_tokens, sampling=SamplingConfig(temperature), seed=seed,
                       costs=costs)
    ids = pipe.encode(row["prompt"], chat)
    van = Trace.of(pipe.vanilla(ids, cfg))
    spec = Trace.of(pipe.speculative(ids, cfg))
    greedy = cfg.sampling.greedy
    identical, divergence = None, ""
    if greedy:
        cmp = compare(pipe.target_lm, ids, van.output_ids, spec.output_ids)
        identical, divergence = cmp.identical, "" if cmp.identical else cmp.describe()
    res = PromptResult(
        row["id"], row["category"], gamma, temperature, spec.tokens, van.summary.wall_ms, spec.summary.wall_ms,
        van.summary.wall_ms - van.summary.prefill_ms, spec.summary.wall_ms - spec.summary.prefill_ms,
        spec.proposed, spec.accepted, spec.examined, len(spec.iterations), identical, divergence,
        [len(e.proposed) for e in spec.iterations], spec.verify_ms_by_gamma(),
        sum(e.draft_ms for e in spec.iterations), median([e.verify_ms for e in van.iterations]))
    extra = pipe.peer_kwargs(gamma) if peer else None
    if extra is not None:
        res.hf_plain_ms, plain_ids = _hf_generate(pipe, ids, cfg, {})
        res.hf_assisted_ms, hf_ids = _hf_generate(pipe, ids, cfg, extra)
        res.hf_tokens = len(hf_ids)
        res.hf_assisted_identical = hf_ids == plain_ids if greedy else None
    return res


@dataclass
class Row:
    name: str
    n: int
    acceptance: float | None
    tokens_per_iteration: float
    vanilla_tps: float
    spec_tps: float
    speedup_median: float
    speedup_total: float
    peer_speedup_median: float | None
    peer_speedup_total: float | None
    identical: str
    predicted: float
    decode_speedup: float
    cost_model: float  # measured tokens / (draft + verify time in vanilla steps): where the time should go


def aggregate(name: str, rs: list[PromptResult]) -> Row:
    tokens = sum(r.new_tokens for r in rs)
    prop, acc, seen = sum(r.proposed for r in rs), sum(r.accepted for r in rs), sum(r.examined for r in rs)
    a = acc / prop if prop else None
    van_ms, spec_ms = sum(r.vanilla_ms for r in rs), sum(r.spec_ms for r in rs)
    peers = [r for r in rs if r.hf_assisted_ms]
    # theory: one vanilla step as the unit; v per proposal length, c per proposed token
    step = median([r.step_ms for r in rs]) or 1e-9
    ms_by_g: dict[int, float] = {}
    gammas: list[int] = []
    for r in rs:
        gammas += r.gammas
        for g, ms in r.verify_ms_by_gamma.items():
            ms_by_g[int(g)] = ms_by_g.get(int(g), 0.0) + ms
    c, v, predicted = cost_model(gammas, ms_by_g, sum(r.draft_ms for r in rs), step, acc / seen if seen else None)
    spent = sum(sum(r.verify_ms_by_gamma.values()) + r.draft_ms for r in rs) / step
    greedy = [r for r in rs if r.identical is not None]
    return Row(
        name, len(rs), a, tokens / max(1, sum(r.iterations for r in rs)),
        tokens / (van_ms / 1000), tokens / (spec_ms / 1000),
        median([r.vanilla_ms / r.spec_ms for r in rs]), van_ms / spec_ms,
        median([r.hf_plain_ms / r.hf_assisted_ms for r in peers]) if peers else None,
        (sum(r.hf_plain_ms for r in peers) / sum(r.hf_assisted_ms for r in peers)) if peers else None,
        f"{sum(r.identical for r in greedy)}/{len(greedy)}" if greedy else "n/a (sampled)",
        predicted, sum(r.vanilla_decode_ms for r in rs) / sum(r.spec_decode_ms for r in rs),
        tokens / spent if spent else 0.0)


def table(rows: list[Row]) -> str:
    head = ("category", "n", "accept", "tok/iter", "van tok/s", "spec tok/s", "speedup med", "speedup tot",
            "peer med", "peer tot", "identical", "decode x", "theory x", "cost x")
    lines = []
    for r in rows:
        f = lambda x, p="{:.2f}": "-" if x is None else p.format(x)  # noqa: E731
        lines.append((r.name, str(r.n), f(r.acceptance, "{:.1%}"), f(r.tokens_per_iteration), f(r.vanilla_tps, "{:.1f}"),
                      f(r.spec_tps, "{:.1f}"), f(r.speedup_median, "{:.2f}x"), f(r.speedup_total, "{:.2f}x"),
                      f(r.peer_speedup_median, "{:.2f}x"), f(r.peer_speedup_total, "{:.2f}x"), r.identical,
                      f(r.decode_speedup, "{:.2f}x"), f(r.predicted, "{:.2f}x"), f(r.cost_model, "{:.2f}x")))
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(head)]
    fmt = lambda cells: "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([fmt(head), sep] + [fmt(l) for l in lines])


def summarize(results: list[PromptResult]) -> list[Row]:
    cats = sorted({r.category for r in results}, key=lambda c: (c in MT_BENCH, c))
    rows = [aggregate(c, [r for r in results if r.category == c]) for c in cats]
    mt = [r for r in results if r.category in MT_BENCH]
    if mt and len({r.category for r in mt}) > 1:
        rows.append(aggregate("mt_bench (pooled)", mt))
    rows.append(aggregate("overall", results))
    return rows


def main(args, prompts: list[dict], pipe: Pipeline, costs: tuple | None = None) -> int:
    gammas = args.gamma or [pipe.gamma]
    for g in gammas:
        if g < 1:
            raise SpecvizError(f"gamma must be >= 1, got {g}")
    for t in args.temperature:
        SamplingConfig(t)
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    # warm up both paths (first calls allocate and pick kernels)
    warm = DecodeConfig(gamma=gammas[0], max_new_tokens=8)
    list(pipe.vanilla(prompts[0]["prompt"], warm))
    list(pipe.speculative(prompts[0]["prompt"], warm))
    out = {"pair": pipe.name, "prompts": str(args.prompts), "max_new_tokens": args.max_new_tokens,
           "device": str(pipe.target.device), "dtype": str(pipe.target.dtype), "configs": []}
    jobs = [(g, t) for g in gammas for t in args.temperature]
    bar = tqdm(total=len(jobs) * len(prompts), file=sys.stderr, desc="bench", disable=tqdm is None) if tqdm else None
    t0 = time.time()
    for g, t in jobs:
        results = []
        for row in prompts:
            results.append(run_prompt(pipe, row, g, t, args.max_new_tokens, args.seed, not args.no_peer,
                                      chat=not args.no_chat, costs=costs))
            if bar:
                bar.update(1)
        rows = summarize(results)
        out["configs"].append({"gamma": g, "temperature": t, "rows": [asdict(r) for r in rows],
                               "prompts": [asdict(r) for r in results]})
        if not args.json:
            if bar:
                bar.clear()
            print(f"\n## {pipe.name}: gamma {g}, temperature {t}, {args.max_new_tokens} new tokens, "
                  f"{len(prompts)} prompts, {pipe.target.device} {str(pipe.target.dtype).replace('torch.', '')}")
            print(table(rows))
            bad = [r for r in results if r.identical is False]
            for r in bad:
                print(f"  prompt {r.id} ({r.category}): {r.divergence}")
    if bar:
        bar.close()
    if args.json:
        print(json.dumps(out))
    else:
        print(f"\n(speedup = vanilla time / speculative time, same prompt, back to back; med = median of "
              f"per-prompt ratios, tot = total-time ratio; peer = transformers generate() with the same drafter "
              f"over plain generate(); decode x = without the shared prefill; theory x = Leviathan et al.'s "
              f"prediction from the measured per-position acceptance alpha, c, v (i.i.d. acceptance); cost x = measured tokens per iteration "
              f"over the measured draft + verify time, in vanilla steps. {time.time() - t0:.0f} s)")
    return 0
