"""GPU check: the engine on CUDA with models built from a config at realistic sizes (random
weights: they measure speed and correctness, not acceptance).

For each target size and each drafter (a draft model, the target drafting for itself, prompt
lookup, Token Recycling beside lookup, early exit, an untrained draft head beside lookup, and, for
a float32 target, its own weights in bfloat16) it reports tokens/s of vanilla and speculative
decoding (the median of ``--repeats`` interleaved runs, with their spread), the draft/verify split
and whether greedy output matched vanilla (with the top-2 logit margin where it did not: bf16 near
ties are numerics, not bugs). ``--rows`` also probes row invariance: whether a token's logits have
the same bits when the target scores it alone as inside a pass of 2..16 rows, in the run's dtype
and in float32 (what the exact mode guarantees on a CPU; here it is measured, not assumed).
Runs on a CPU too (--small), so the script itself is tested where no GPU is lent.

    python scripts/gpu_check.py --rows --json gpu.json      # on a CUDA machine
    python scripts/gpu_check.py --small --device cpu --dtype float32 --rows
"""

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.backends import exact  # noqa: E402
from specviz.trace import spread  # noqa: E402
from specviz.backends.transformers import CachedLM  # noqa: E402
from specviz.drafters import ModelDrafter, PromptLookupDrafter  # noqa: E402
from specviz.drafters.early_exit import EarlyExitDrafter  # noqa: E402
from specviz.drafters.head import DraftHead, HeadDrafter  # noqa: E402
from specviz.drafters.quantized import SelfDraftDrafter  # noqa: E402
from specviz.drafters.recycling import RecyclingDrafter  # noqa: E402
from specviz.engine import DecodeConfig, speculative_decode, vanilla_decode  # noqa: E402
from specviz.exactness import compare, differing_rows  # noqa: E402
from specviz.trace import Trace  # noqa: E402
from tests.fixtures.tiny import llama_from_config, synthetic_tokenizer  # noqa: E402

SIZES = {  # SmolLM2 shapes
    "1.7b": dict(hidden=2048, layers=24, heads=32, kv_heads=32, intermediate=8192),
    "360m": dict(hidden=960, layers=32, heads=15, kv_heads=5, intermediate=2560),
    "135m": dict(hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536),
    "small": dict(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=256),
    "tiny": dict(hidden=64, layers=3, heads=4, kv_heads=2, intermediate=128),
}
DRAFT_FOR = {"1.7b": "135m", "360m": "135m", "small": "tiny"}  # a draft model where SmolLM2 has a smaller one


ROWS = ("model", "self", "lookup", "recycling", "early_exit", "head", "self_bf16")


def drafters(size: str, target, args, vocab: int, dtype) -> list:
    """(label, drafter, gamma) rows for one target: those of ``--drafters`` that apply here."""
    want, rows = args.drafters.split(","), []
    layers = SIZES[size]["layers"]
    if "model" in want and size in DRAFT_FOR:
        draft = llama_from_config(**SIZES[DRAFT_FOR[size]], vocab_size=vocab, seed=1, dtype=dtype, device=args.device)
        rows.append((f"draft model ({DRAFT_FOR[size]})", ModelDrafter(draft), args.gamma))
    if "self" in want:
        rows.append(("self-draft (acceptance 1)", ModelDrafter(target), args.gamma))
    if "lookup" in want:
        rows.append(("prompt lookup", PromptLookupDrafter(), args.lookup_gamma))
    if "recycling" in want:
        rows.append(("token recycling + lookup", RecyclingDrafter(vocab), args.lookup_gamma))
    if "early_exit" in want:
        rows.append((f"early exit ({layers // 3} of {layers} layers)", EarlyExitDrafter(target, layers // 3), args.gamma))
    if "head" in want:  # an untrained head (random weights: its cost, not its acceptance), SmolLM2's 6,144 ids
        torch.manual_seed(2)
        head = DraftHead(SIZES[size]["hidden"], SIZES[size]["intermediate"]).eval()
        ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(2))[: min(6144, vocab // 2)]
        rows.append(("draft head (untrained) + lookup", HeadDrafter(target, head, ids, vocab), args.lookup_gamma))
    if "self_bf16" in want and dtype == torch.float32:
        rows.append(("the target in bfloat16", SelfDraftDrafter(target, "bfloat16"), args.gamma))
    return rows


def bench_target(size: str, args, tok, vocab: int, dtype, prompt: list[int]) -> list[dict]:
    t0 = time.time()
    target = llama_from_config(**SIZES[size], vocab_size=vocab, seed=0, dtype=dtype, device=args.device)
    lm = CachedLM(target)
    rows = drafters(size, target, args, vocab, dtype)
    print(f"built the {size} target and its drafters on {args.device} {args.dtype} in {time.time() - t0:.1f} s",
          flush=True)
    cfgs = {g: DecodeConfig(gamma=g, max_new_tokens=args.max_new_tokens) for g in {g for _, _, g in rows}}
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens)
    # warm-up at full length (the cost profile, and every pass and cache shape the timed runs meet)
    list(vanilla_decode(lm, tok, prompt, cfg))
    for _, d, g in rows:
        list(speculative_decode(lm, d, tok, prompt, cfgs[g]))
    van_tps, spec = [], {label: [] for label, _, _ in rows}
    van = None
    for _ in range(args.repeats):  # interleaved: a slow moment hits every row alike
        van = Trace.of(vanilla_decode(lm, tok, prompt, cfg))
        van_tps.append(van.tokens_per_second)
        for label, d, g in rows:
            spec[label].append(Trace.of(speculative_decode(lm, d, tok, prompt, cfgs[g])))
    results = []
    for label, d, g in rows:
        runs = spec[label]
        tps = [t.tokens_per_second for t in runs]
        last = runs[-1]
        cmp = compare(lm, prompt, van.output_ids, last.output_ids)
        split = last.time_split()
        row = {"target": size, "drafter": label, "gamma": g, "dtype": args.dtype,
               "vanilla_tps": statistics.median(van_tps), "spec_tps": statistics.median(tps),
               "speedup": statistics.median(tps) / statistics.median(van_tps),
               "spread": max((x for x in (spread(tps), spread(van_tps)) if x is not None), default=None), "vanilla_runs_tps": van_tps, "spec_runs_tps": tps,
               "acceptance": last.acceptance_rate,
               "tokens_per_iteration": last.tokens / max(1, len(last.iterations)),
               "draft_ms": split["draft"], "verify_ms": split["verify"], "other_ms": split["other"],
               "vanilla_step_ms": sum(e.verify_ms for e in van.iterations) / max(1, len(van.iterations)),
               "identical": cmp.identical and all(t.output_ids == last.output_ids for t in runs),
               "divergence": "" if cmp.identical else cmp.describe()}
        results.append(row)
        print(json.dumps(row), flush=True)
    del lm, target, rows
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return results


def rows_probe(size: str, args, vocab: int, dtype_name: str, exact_mode: bool = False, contexts=(5, 120, 500),
               max_rows: int = 16) -> list[dict]:
    """Row invariance (``exactness.differing_rows``): after the same context, are a pass's logits
    over r = 1..max_rows tokens the same bits as those tokens fed one at a time? With the
    largest difference and how many of the pass's argmaxes moved. ``exact_mode`` (float32 on a
    CPU) switches the project's exact mode on first: it must give 16/16."""
    dtype = getattr(torch, dtype_name)
    model = llama_from_config(**SIZES[size], vocab_size=vocab, seed=0, dtype=dtype, device=args.device)
    if exact_mode:
        exact.enable(model)
        dtype_name += " (exact mode)"
    lm = CachedLM(model)
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(10, vocab, (max(contexts) + max_rows,), generator=g).tolist()
    out = []
    for ctx in contexts:
        bad = differing_rows(lm, seq, ctx, max_rows)
        row = {"target": size, "dtype": dtype_name, "context": ctx, "rows": f"1..{max_rows}",
               "bit_identical": f"{max_rows - len(bad)}/{max_rows}",
               "max_abs_diff": max((d for _, d, _ in bad), default=0.0),
               "argmax_moved": next((m for r, _, m in bad if r == max_rows), 0)}  # in the longest pass
        out.append(row)
        print(json.dumps(row), flush=True)
    del lm, model
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--small", action="store_true", help="tiny shapes (a quick run on a CPU)")
    ap.add_argument("--targets", help="comma-separated target sizes (default 1.7b,135m; small with --small)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=5, help="for the model drafters")
    ap.add_argument("--lookup-gamma", type=int, default=10, help="for prompt lookup and recycling")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--drafters", default="model,self,lookup,recycling,early_exit,head,self_bf16",
                    help=f"comma-separated rows, of {', '.join(ROWS)} (self_bf16: float32 targets only)")
    ap.add_argument("--rows", action="store_true", help="also probe row invariance (run dtype and float32)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    vocab = 4096 if args.small else 49152
    targets = (args.targets or ("small" if args.small else "1.7b,135m")).split(",")
    tok = synthetic_tokenizer(vocab)
    g = torch.Generator().manual_seed(0)
    base = torch.randint(10, vocab, (96,), generator=g).tolist()
    prompt = base + base[:24] + base[40:72]  # some repetition, so lookup has matches
    import transformers

    machine = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor(),
               "torch": torch.__version__, "transformers": transformers.__version__, "dtype": args.dtype,
               "prompt_tokens": len(prompt), "max_new_tokens": args.max_new_tokens, "repeats": args.repeats}
    print(json.dumps(machine), flush=True)
    results, probes = [], []
    for size in targets:
        results += bench_target(size, args, tok, vocab, dtype, prompt)
        if args.json:
            Path(args.json).write_text(json.dumps({"machine": machine, "runs": results}, indent=1))
    if args.rows:
        for dt in dict.fromkeys([args.dtype, "float32"]):
            probes += rows_probe(targets[0], args, vocab, dt)
        if args.device == "cpu":  # the mode the CPU runs in by default, as the probe's own check
            probes += rows_probe(targets[0], args, vocab, "float32", exact_mode=True)
    print(f"\n{machine['device']}, torch {machine['torch']}, {args.dtype}, {len(prompt)}-token prompt, "
          f"{args.max_new_tokens} new tokens, median of {args.repeats} interleaved runs")
    print("\n| target | drafter | gamma | vanilla tok/s | spec tok/s | speedup | spread | accept | tok/iter | "
          "draft ms | verify ms | identical |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        print(f"| {r['target']} | {r['drafter']} | {r['gamma']} | {r['vanilla_tps']:.1f} | {r['spec_tps']:.1f} | "
              f"{r['speedup']:.2f}x | {'-' if r['spread'] is None else format(r['spread'], '.0%')} | {acc} | {r['tokens_per_iteration']:.2f} | "
              f"{r['draft_ms']:.0f} | {r['verify_ms']:.0f} | {'yes' if r['identical'] else r['divergence']} |")
    if probes:
        print("\n| target | dtype | context | pass lengths | bit-identical to one at a time | max abs diff | "
              "argmax moved (of 16) |")
        print("|---|---|---|---|---|---|---|")
        for p in probes:
            print(f"| {p['target']} | {p['dtype']} | {p['context']} | {p['rows']} | {p['bit_identical']} | "
                  f"{p['max_abs_diff']:.2e} | {p['argmax_moved']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "runs": results, "rows": probes}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
