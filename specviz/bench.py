"""python -m specviz bench: speculative vs vanilla (ours) vs transformers' own assisted
generation, per prompt back to back in one process, on a prompt set like specbench-dev.jsonl.

Noise: a shared machine slows single runs by 2x and more. Each prompt is therefore run
``repeats`` times, the runs of one prompt interleaved (vanilla, speculative, ... in a rotating
order), and each timing is the per-prompt **minimum** (the run least disturbed; the median is
kept too). A prompt whose repeats disagree by more than ``NOISY`` (max / min - 1) is flagged.
``--compare PAIR ...`` runs other pairs over the same target in the same rotation, so a new
drafter and the old one are measured under the same conditions against the same vanilla runs.

Reported per category and overall: acceptance rate, tokens per iteration, tokens/s of each,
speedups over vanilla (median of per-prompt paired ratios, and total-time ratio of the minima),
the spread, the share of greedy outputs identical to vanilla, and the speedup theory predicts
from the measured a, c, v. The JSON records the machine (CPU, threads, versions, load).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from .backends.base import Timer
from .engine import DecodeConfig, check_fits
from .errors import SpecvizError
from .exactness import compare
from .pipeline import Pipeline
from .sampling import SamplingConfig
from .theory import cost_model
from .trace import Trace, median, spread

NOISY = 0.20  # repeats of one prompt that disagree by more than this are flagged
MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}


def load_prompts(path: str | Path, limit: int | None = None, categories: list[str] | None = None,
                 skip: int = 0) -> list[dict]:
    """First turns of a Spec-Bench style .jsonl: at most ``limit`` per category after leaving out
    the first ``skip`` of each (so settings can be tuned on prompts a benchmark does not use)."""
    if skip < 0 or (limit is not None and limit < 0):
        raise SpecvizError(f"--skip and --limit must be >= 0, got {skip} and {limit}")
    path = Path(path)
    if not path.exists():
        raise SpecvizError(f"prompt file not found: {path}")
    if path.is_dir():
        raise SpecvizError(f"{path} is a folder, not a prompt file (.jsonl)")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte order mark, as some editors write, is read past
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise SpecvizError(f"{path}:{line}: not UTF-8 text (byte {e.start}); save the prompt file as UTF-8") from None
    except OSError as e:
        raise SpecvizError(f"cannot read the prompt file {path}: {e.strerror or e}") from None
    rows, per_cat, seen = [], {}, set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecvizError(f"{path}:{n}: not valid JSON ({e.msg} at column {e.colno}); each line must be one "
                               "object such as {\"category\": \"qa\", \"turns\": [\"the prompt\"]}") from None
        try:
            turns = row["turns"]
            if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
                raise TypeError  # a string's first letter, or a number, is no prompt
            prompt = turns[0]
            cat = str(row.get("category", "all"))
        except (KeyError, IndexError, TypeError, AttributeError):
            raise SpecvizError(f"{path}:{n}: expected a JSON object with a 'turns' list of strings") from None
        if not prompt.strip():  # said where it is, not as "the prompt is empty" after the model's load
            raise SpecvizError(f"{path}:{n}: the first turn is empty")
        seen.add(cat)
        if categories and cat not in categories and not ("mt_bench" in categories and cat in MT_BENCH):
            continue
        per_cat[cat] = per_cat.get(cat, 0) + 1
        if per_cat[cat] <= skip or (limit is not None and per_cat[cat] > skip + limit):
            continue
        rows.append({"id": row.get("question_id", n), "category": cat, "prompt": prompt})
    if not rows:
        unknown = [c for c in categories or [] if c not in seen and not (c == "mt_bench" and seen & set(MT_BENCH))]
        why = (f": no category {', '.join(map(repr, unknown))} there; its categories are {', '.join(sorted(seen))}"
               if unknown else f" (--skip {skip} leaves none)" if skip else "")
        raise SpecvizError(f"no prompts selected from {path}{why}")
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
    vllm_plain_ms: float | None = None  # vLLM without speculation (minimum of the repeats)
    vllm_spec_ms: float | None = None  # vLLM with its speculation
    vllm_identical: bool | None = None  # vLLM's speculative output == vLLM's plain output (greedy)
    vllm_same_as_ours: bool | None = None  # vLLM's plain output == specviz's vanilla output (other kernels)
    vanilla_runs_ms: list[float] = field(default_factory=list)  # every repeat, in order
    spec_runs_ms: list[float] = field(default_factory=list)
    vanilla_median_ms: float | None = None
    spec_median_ms: float | None = None
    spread: float | None = None  # max / min - 1 over the repeats, the worse of vanilla and speculative
    # (None with one repeat: a single run cannot show how noisy it was)
    stable_output: bool = True  # every speculative repeat gave the same tokens

    @property
    def noisy(self) -> bool:
        return self.spread is not None and self.spread > NOISY


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
               peer: bool, chat: bool = True, costs: tuple | None = None, repeats: int = 1,
               others: list[Pipeline] | None = None, vllm=None, own_gamma: bool = False) -> list[PromptResult]:
    """One prompt, ``repeats`` rounds; each round runs vanilla, every pipeline's speculative
    decoding (and transformers' plain and assisted generate) once, starting one later each round
    so that no decoder always goes first. One result per pipeline (``pipe`` first, then ``others``),
    all against the same vanilla runs. ``own_gamma``: each of ``others`` runs at its own pair's
    gamma (a self-draft pair tuned for gamma 3 is not measured at the lookup pair's 10)."""
    cfg = DecodeConfig(gamma=gamma, max_new_tokens=max_new_tokens, sampling=SamplingConfig(temperature), seed=seed,
                       costs=costs)
    pipes = [pipe] + list(others or [])
    cfgs = [cfg] + [replace(cfg, gamma=p.gamma) if own_gamma else cfg for p in pipes[1:]]
    ids = pipe.encode(row["prompt"], chat)
    extra = pipe.peer_kwargs(gamma) if peer else None
    jobs: list[tuple[str, object]] = [("vanilla", None)] + [("spec", i) for i in range(len(pipes))]
    if extra is not None:
        jobs += [("hf_plain", None), ("hf_assisted", None)]
    if vllm is not None:
        jobs += [("vllm", None)]
    ms: dict = {}
    traces: dict = {}
    hf_ids: dict = {}
    for r in range(max(1, repeats)):
        order = jobs[r % len(jobs):] + jobs[: r % len(jobs)]
        for job in order:
            what, i = job
            if what == "vanilla":
                tr = Trace.of(pipe.vanilla(ids, cfg))
                ms.setdefault(job, []).append(tr.summary.wall_ms)
                traces.setdefault(job, []).append(tr)
            elif what == "spec":
                tr = Trace.of(pipes[i].speculative(ids, cfgs[i]))
                ms.setdefault(job, []).append(tr.summary.wall_ms)
                traces.setdefault(job, []).append(tr)
            elif what == "vllm":
                from .backends.vllm import peer_run

                out = peer_run(vllm, ids, cfg)
                ms.setdefault(("vllm_spec", None), []).append(out["spec_ms"])
                ms.setdefault(("vllm_plain", None), []).append(out["vanilla_ms"])
                hf_ids["vllm"] = out
            else:
                t, out_ids = _hf_generate(pipe, ids, cfg, extra if what == "hf_assisted" else {})
                ms.setdefault(job, []).append(t)
                hf_ids[what] = out_ids
    greedy = cfg.sampling.greedy
    van_ms = ms[("vanilla", None)]
    van = traces[("vanilla", None)][van_ms.index(min(van_ms))]
    results = []
    for i, p in enumerate(pipes):
        runs = ms[("spec", i)]
        spec = traces[("spec", i)][runs.index(min(runs))]
        identical, divergence = None, ""
        if greedy:
            cmp = compare(p.target_lm, ids, van.output_ids, spec.output_ids)
            identical, divergence = cmp.identical, "" if cmp.identical else cmp.describe()
        res = PromptResult(
            row["id"], row["category"], cfgs[i].gamma, temperature, spec.tokens, min(van_ms), min(runs),
            min(van_ms) - van.summary.prefill_ms, min(runs) - spec.summary.prefill_ms,
            spec.proposed, spec.accepted, spec.examined, len(spec.iterations), identical, divergence,
            [len(e.proposed) for e in spec.iterations], spec.verify_ms_by_gamma(),
            sum(e.draft_ms for e in spec.iterations), median([e.verify_ms for e in van.iterations]),
            vanilla_runs_ms=list(van_ms), spec_runs_ms=list(runs), vanilla_median_ms=median(van_ms),
            spec_median_ms=median(runs), spread=None if spread(van_ms) is None else max(spread(van_ms), spread(runs)),
            stable_output=len({tuple(t.output_ids) for t in traces[("spec", i)]}) == 1)
        if extra is not None:
            res.hf_plain_ms, res.hf_assisted_ms = min(ms[("hf_plain", None)]), min(ms[("hf_assisted", None)])
            res.hf_tokens = len(hf_ids["hf_assisted"])
            res.hf_assisted_identical = hf_ids["hf_assisted"] == hf_ids["hf_plain"] if greedy else None
        if vllm is not None:
            out = hf_ids["vllm"]
            res.vllm_plain_ms, res.vllm_spec_ms = min(ms[("vllm_plain", None)]), min(ms[("vllm_spec", None)])
            res.vllm_identical = out["identical"]
            res.vllm_same_as_ours = out["vanilla_ids"] == van.output_ids if greedy else None
        results.append(res)
    return results


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
    vllm_speedup_median: float | None
    vllm_speedup_total: float | None
    vllm_identical: str
    identical: str
    predicted: float
    decode_speedup: float
    cost_model: float  # measured tokens / (draft + verify time in vanilla steps): where the time should go
    speedup_median_of_medians: float = 0.0  # the same ratios from each prompt's median run
    spread: float | None = None  # median over prompts of max / min - 1 of the repeats (None: one repeat)
    noisy: int | None = 0  # prompts whose repeats disagree by more than NOISY (None: one repeat)
    ratio_low: float = 0.0  # the lowest and highest per-prompt ratio
    ratio_high: float = 0.0
    peer_baseline: float | None = None  # transformers' plain generate() time over specviz's vanilla time (totals)


def aggregate(name: str, rs: list[PromptResult]) -> Row:
    spreads = [r.spread for r in rs if r.spread is not None]  # none with one repeat: no noise to tell
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
    on_vllm = [r for r in rs if r.vllm_spec_ms]
    vllm_greedy = [r for r in on_vllm if r.vllm_identical is not None]
    return Row(
        name, len(rs), a, tokens / max(1, sum(r.iterations for r in rs)),
        tokens / (van_ms / 1000), tokens / (spec_ms / 1000),
        median([r.vanilla_ms / r.spec_ms for r in rs]), van_ms / spec_ms,
        median([r.hf_plain_ms / r.hf_assisted_ms for r in peers]) if peers else None,
        (sum(r.hf_plain_ms for r in peers) / sum(r.hf_assisted_ms for r in peers)) if peers else None,
        median([r.vllm_plain_ms / r.vllm_spec_ms for r in on_vllm]) if on_vllm else None,
        (sum(r.vllm_plain_ms for r in on_vllm) / sum(r.vllm_spec_ms for r in on_vllm)) if on_vllm else None,
        (f"{sum(r.vllm_identical for r in vllm_greedy)}/{len(vllm_greedy)}, "
         f"{sum(bool(r.vllm_same_as_ours) for r in vllm_greedy)}/{len(vllm_greedy)}") if vllm_greedy else "-",
        f"{sum(r.identical for r in greedy)}/{len(greedy)}" if greedy else "n/a (sampled)",
        predicted, sum(r.vanilla_decode_ms for r in rs) / sum(r.spec_decode_ms for r in rs),
        tokens / spent if spent else 0.0,
        median([(r.vanilla_median_ms or r.vanilla_ms) / (r.spec_median_ms or r.spec_ms) for r in rs]),
        *((median(spreads), sum(r.noisy for r in rs)) if spreads else (None, None)),
        min(r.vanilla_ms / r.spec_ms for r in rs), max(r.vanilla_ms / r.spec_ms for r in rs),
        (sum(r.hf_plain_ms for r in peers) / sum(r.vanilla_ms for r in peers)) if peers else None)


def table(rows: list[Row]) -> str:
    head = ("category", "n", "accept", "tok/iter", "van tok/s", "spec tok/s", "speedup med", "speedup tot",
            "range", "spread", "noisy", "peer med", "peer tot", "peer base", "identical", "decode x", "theory x", "cost x",
            "vllm med", "vllm tot", "vllm same")
    lines = []
    for r in rows:
        f = lambda x, p="{:.2f}": "-" if x is None else p.format(x)  # noqa: E731
        lines.append((r.name, str(r.n), f(r.acceptance, "{:.1%}"), f(r.tokens_per_iteration), f(r.vanilla_tps, "{:.1f}"),
                      f(r.spec_tps, "{:.1f}"), f(r.speedup_median, "{:.2f}x"), f(r.speedup_total, "{:.2f}x"),
                      f"{r.ratio_low:.2f}-{r.ratio_high:.2f}", f(r.spread, "{:.0%}"), "-" if r.spread is None else str(r.noisy),
                      f(r.peer_speedup_median, "{:.2f}x"), f(r.peer_speedup_total, "{:.2f}x"),
                      f(r.peer_baseline, "{:.2f}x"), r.identical,
                      f(r.decode_speedup, "{:.2f}x"), f(r.predicted, "{:.2f}x"), f(r.cost_model, "{:.2f}x"),
                      f(r.vllm_speedup_median, "{:.2f}x"), f(r.vllm_speedup_total, "{:.2f}x"), r.vllm_identical))
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


def _record(r: PromptResult) -> dict:
    """One prompt's result as the JSON output and ``--progress`` write it."""
    return dict(asdict(r), noisy=r.noisy)


def _append(path: str, records: list[dict]) -> None:
    """Append JSON lines to ``path`` (opened per prompt: what is measured is on disk at once)."""
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(x) + "\n" for x in records)
    except OSError as e:
        raise SpecvizError(f"--progress: cannot write {path}: {e.strerror or e}") from None


def machine() -> dict:
    """What the numbers were measured on: CPU, threads, versions, and how busy the machine was."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import transformers

    load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "platform": platform.platform(), "load_average": load}


def check_settings(args) -> None:
    """Refuse what needs no model, before ``main``'s caller loads one (~20 s on a CPU), so that
    ``--repeats 0`` or an unwritable ``--progress`` is one line at once, not after the load."""
    for g in args.gamma or []:
        DecodeConfig(gamma=g)
    DecodeConfig(max_new_tokens=args.max_new_tokens)
    for t in args.temperature:
        SamplingConfig(t)
    DecodeConfig(seed=getattr(args, "seed", 0))
    repeats = getattr(args, "repeats", 1)
    if repeats < 1:
        raise SpecvizError(f"--repeats must be >= 1, got {repeats}")
    if getattr(args, "progress", None):
        _append(args.progress, [])  # unwritable: say so now, not after the first prompt


def main(args, prompts: list[dict], pipe: Pipeline, costs: tuple | None = None,
         others: list[Pipeline] | None = None, vllm=None) -> int:
    """The bench, on settings ``check_settings`` passed."""
    gammas = args.gamma or [pipe.gamma]
    repeats = getattr(args, "repeats", 1)
    progress = getattr(args, "progress", None)
    others = list(others or [])
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    # every prompt encoded and checked before any is measured: one too long for the model, found only
    # when its turn came, would end the bench after minutes with no table
    for row in prompts:
        where = f"{args.prompts}: prompt {row['id']} ({row['category']})"
        try:
            ids = pipe.encode(row["prompt"], not args.no_chat)
        except SpecvizError as e:
            raise SpecvizError(f"{where}: {e}") from None
        try:
            check_fits(ids, pipe.target_lm.context_length)
        except SpecvizError as e:
            raise SpecvizError(f"{where} is too long: {e}") from None
    # warm up every path (first calls allocate and pick kernels)
    warm = DecodeConfig(gamma=gammas[0], max_new_tokens=8)
    list(pipe.vanilla(prompts[0]["prompt"], warm))
    for p in [pipe] + others:
        list(p.speculative(prompts[0]["prompt"], warm))
    out = {"pair": pipe.name, "compare": [p.name for p in others], "prompts": str(args.prompts),
           "max_new_tokens": args.max_new_tokens, "repeats": repeats, "device": str(pipe.target.device),
           "dtype": str(pipe.target.dtype), "kernels": pipe.target.kernels,
           "machine": machine(), "configs": []}
    if vllm is not None:
        out["vllm"] = vllm.info()["draft"]
    jobs = [(g, t) for g in gammas for t in args.temperature]
    bar = tqdm(total=len(jobs) * len(prompts), file=sys.stderr, desc="bench", disable=tqdm is None) if tqdm else None
    t0 = time.time()
    try:
        for g, t in jobs:
            results: list[list[PromptResult]] = []
            for row in prompts:
                results.append(run_prompt(pipe, row, g, t, args.max_new_tokens, args.seed, not args.no_peer,
                                          chat=not args.no_chat, costs=costs, repeats=repeats, others=others,
                                          vllm=vllm, own_gamma=not args.gamma))
                if progress:
                    _append(progress, [dict(pair=p.name, **_record(r))
                                       for p, r in zip([pipe] + others, results[-1])])
                if bar:
                    bar.update(1)
                    r = results[-1][0]
                    bar.set_postfix_str(f"{r.category} {r.id}: {r.vanilla_ms / r.spec_ms:.2f}x"
                                        + (f", transformers {r.hf_plain_ms / r.hf_assisted_ms:.2f}x" if r.hf_assisted_ms else ""))
            for i, p in enumerate([pipe] + others):
                mine = [r[i] for r in results]
                rows = summarize(mine)
                pg = mine[0].gamma  # what run_prompt ran this pair at
                out["configs"].append({"pair": p.name, "gamma": pg, "temperature": t, "rows": [asdict(r) for r in rows],
                                       "prompts": [_record(r) for r in mine]})
                if not args.json:
                    if bar:
                        bar.clear()
                    print(f"\n## {p.name}: gamma {pg}, temperature {t}, {args.max_new_tokens} new tokens, "
                          f"{len(prompts)} prompt{'s' * (len(prompts) != 1)} x {repeats} repeat{'s' * (repeats != 1)}, {pipe.target.device} "
                          f"{str(pipe.target.dtype).replace('torch.', '')}, kernels: {pipe.target.kernels}")
                    print(table(rows))
                    for r in mine:
                        if r.identical is False:
                            print(f"  prompt {r.id} ({r.category}): {r.divergence}")
                        if not r.stable_output:
                            print(f"  prompt {r.id} ({r.category}): speculative repeats gave different outputs")
                    noisy = [r for r in mine if r.noisy]
                    if noisy:
                        print(f"  noisy (repeats differ by > {NOISY:.0%}): " + ", ".join(
                            f"{r.id} ({r.spread:.0%})" for r in noisy))
    except BaseException:
        if bar:  # its line cleared: an error reads as the one line it is, not glued to the bar
            bar.leave = False
            bar.close()
        raise
    out["machine"]["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    if bar:
        bar.close()
    if args.json:
        print(json.dumps(out))
    else:
        m = out["machine"]
        print(f"\n(speedup = vanilla time / speculative time, same prompt, interleaved; each time is the minimum "
              f"of {repeats} repeats; med = median of per-prompt ratios, tot = total-time ratio of the minima, "
              f"range = lowest-highest per-prompt ratio; spread = median over prompts of max/min - 1 of the repeats, "
              f"noisy = prompts whose repeats differ by > {NOISY:.0%}"
              f"{' (- with one repeat: a single run cannot show its noise; --repeats 3 can)' if repeats < 2 else ''}; peer = transformers generate() with the same "
              f"drafter over plain generate(), peer base = plain generate()'s "
              f"time over specviz vanilla's (totals; above 1, transformers' speedup is taken over a slower baseline); "
              f"vllm med/tot = vLLM with its speculation"
              f"{' (' + out['vllm']['source'] + ')' if vllm is not None else ''} over vLLM without (same "
              f"prompts, same box; vllm same = vLLM speculative == vLLM plain, vLLM plain == specviz vanilla); decode x = without the shared prefill; theory x = Leviathan et al.'s "
              f"prediction from the measured per-position acceptance alpha, c, v (i.i.d. acceptance); cost x = "
              f"measured tokens per iteration over the measured draft + verify time, in vanilla steps. "
              f"{m['cpu']}, {m['torch_threads']} threads, torch {m['torch']}, load {m['load_average']} -> "
              f"{m['load_average_end']}. {time.time() - t0:.0f} s)")
    return 0
