"""A speed switch off against on, in one process (README: Kernels; docs/MEASUREMENTS.md).

Loads the pair twice, once with the switch's environment variable at 0 and once at 1, then decodes
each prompt vanilla and speculatively on both, alternating which goes first, for several rounds;
prints per-prompt minima (ms per generated token) and whether every output is the same. Switches:
``SPECVIZ_LEAN`` (the exact mode's lean decoder layers against the stock ones) and
``SPECVIZ_HEAD_INT8`` (the draft head's int8 products against float16).

    python scripts/switch_ab.py --prompts ../shared/prompts/specbench-dev.jsonl --limit 1 --rounds 3
    python scripts/switch_ab.py --prompts ../shared/prompts/specbench-dev.jsonl --count 4 --rounds 2  # ~5 min
    python scripts/switch_ab.py --switch SPECVIZ_HEAD_INT8 --prompts ../shared/prompts/specbench-dev.jsonl --count 6
"""
from __future__ import annotations

import argparse
import os
import statistics as st
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.backends import transformers as tb  # noqa: E402
from specviz.bench import load_prompts  # noqa: E402
from specviz.drafters import head as head_module  # noqa: E402
from specviz.engine import DecodeConfig  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.registry import load_registry  # noqa: E402
from specviz.trace import Trace  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default=None)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--limit", type=int, default=1, help="prompts per category")
    ap.add_argument("--count", type=int, default=None, help="only the first N of those prompts")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--switch", default="SPECVIZ_LEAN", choices=("SPECVIZ_LEAN", "SPECVIZ_HEAD_INT8"))
    args = ap.parse_args()
    reg = load_registry()
    pipes = {}
    for name, flag in (("off", "0"), ("on", "1")):
        os.environ[args.switch] = flag
        tb._CACHE.clear()  # a second, separate load
        head_module._INT8_OK = None  # the int8 kernel's check reads the switch once
        pipes[name] = build_pipeline(reg, args.pair, device="cpu", dtype="float32")
        pipes[name].warm_up()
    os.environ.pop(args.switch)
    layers = {k: p.info()["target"].get("lean_layers", 0) for k, p in pipes.items()}
    rows = load_prompts(args.prompts, limit=args.limit)[: args.count]
    times: dict = {}
    outputs: dict = {}
    for rnd in range(args.rounds):
        for n, row in enumerate(rows):
            order = ("off", "on") if (rnd + n) % 2 == 0 else ("on", "off")
            for name in order:
                pipe = pipes[name]
                cfg = DecodeConfig(gamma=pipe.gamma, max_new_tokens=args.max_new_tokens)
                for kind in (("vanilla", "speculative") if rnd % 2 == 0 else ("speculative", "vanilla")):
                    run = pipe.vanilla if kind == "vanilla" else pipe.speculative
                    s = Trace.of(run(row["prompt"], cfg)).summary
                    times.setdefault((name, kind), {}).setdefault(n, []).append(s.wall_ms / max(s.new_tokens, 1))
                    outputs[(name, kind, n)] = s.output_ids
        print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr)
    print(f"{len(rows)} prompts x {args.rounds} rounds, {pipes['on'].name}, {args.switch} 0 / 1, lean layers: {layers}; "
          "ms per generated token, per-prompt minimum over rounds")
    print(f"| {args.switch} | vanilla ms/tok (median) | speculative ms/tok (median) | median ratio | ratio of totals | identical |")
    print("|---|---|---|---|---|---|")
    for name in ("off", "on"):
        van = [min(v) for v in times[(name, "vanilla")].values()]
        spec = [min(v) for v in times[(name, "speculative")].values()]
        same = sum(outputs[(name, "vanilla", n)] == outputs[(name, "speculative", n)] for n in range(len(rows)))
        print(f"| {name} | {st.median(van):.1f} | {st.median(spec):.1f} | {st.median(a / b for a, b in zip(van, spec)):.2f}x "
              f"| {sum(van) / sum(spec):.2f}x | {same}/{len(rows)} |")
    for kind in ("vanilla", "speculative"):
        gain = [min(times[("off", kind)][n]) / min(times[("on", kind)][n]) for n in range(len(rows))]
        print(f"on over off, {kind}: {st.median(gain):.3f}x faster per token (median per prompt)")
    same = sum(outputs[("off", "vanilla", n)] == outputs[("on", "vanilla", n)] for n in range(len(rows)))
    print(f"vanilla off == vanilla on: {same}/{len(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
