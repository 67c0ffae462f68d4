"""How well a pair drafts, without timing noise: greedy iterations over the same answers (fewer =
better; the tokens are the target's greedy answer either way, so they match between drafters).

    python scripts/iteration_counts.py --prompts ../shared/prompts/specbench-dev.jsonl --limit 2
    python scripts/iteration_counts.py --prompts ../shared/prompts/specbench-dev.jsonl --limit 2 --skip 3

Used to compare draft heads and drafting rules before a timed bench: a change of 1-2% in tokens per
iteration is below the timed bench's run-to-run noise but shows here. The drafters' choices read the
cost profile measured at start-up, so counts move by 1-3% between runs unless `--costs` pins it; the ms
columns are one run's and only say where the time went."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.bench import load_prompts  # noqa: E402
from specviz.costs import load_costs  # noqa: E402
from specviz.engine import DecodeConfig  # noqa: E402
from specviz.events import IterationEvent  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.registry import load_registry  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", default=None, help="a pair of models.yaml (default: the registry's default)")
    ap.add_argument("--prompts", required=True, help="a Spec-Bench style .jsonl")
    ap.add_argument("--limit", type=int, default=2, help="prompts per category")
    ap.add_argument("--skip", type=int, default=0, help="leave out the first N of each category")
    ap.add_argument("--categories", default=None, help="comma-separated categories (default: all)")
    ap.add_argument("--gamma", type=int, default=None, help="default: the pair's")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--costs", default=None, help="pin the cost profile ('reference', a JSON list, a saved run): "
                    "the same drafting choices from run to run, so counts compare drafters alone")
    args = ap.parse_args()
    reg = load_registry()
    pipe = build_pipeline(reg, pair=args.pair)
    pipe.warm_up()
    gamma = args.gamma or pipe.gamma
    cfg = DecodeConfig.from_settings(gamma, 0.0, 0, 1.0, args.max_new_tokens, 0, load_costs(args.costs))
    rows = load_prompts(args.prompts, limit=args.limit, skip=args.skip,
                      categories=args.categories.split(",") if args.categories else None)
    its = toks = 0
    draft_ms = verify_ms = 0.0
    for row in rows:
        for ev in pipe.speculative(row["prompt"], cfg):
            if isinstance(ev, IterationEvent):
                its += 1
                toks += len(ev.emitted)
                draft_ms += ev.draft_ms
                verify_ms += ev.verify_ms
    print(f"{pipe.name}: {len(rows)} prompts, {its} iterations, {toks} tokens, {toks / its:.3f} tokens/iteration; "
          f"per token draft {draft_ms / toks:.2f} ms, verify {verify_ms / toks:.2f} ms (one run)")


if __name__ == "__main__":
    main()
