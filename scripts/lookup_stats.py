"""How often is a lookup proposal kept?  Greedy answers to prompts the benchmark does not use
(every category's prompts after the first --skip; the benchmark's `--limit 3` uses the first 3),
then, at every position of every answer, what each source of the lookup drafter would propose and
how much of it the target's own answer confirms.  Prints, per kind of match, the chance the first
token is kept (a1) and the chance a further token is kept after a kept one (ac): the priors of the
adaptive drafter in specviz/drafters.py.

    python scripts/lookup_stats.py --skip 3 --max-new-tokens 128

With the default pair the datastore is searched too (assets/datastore-smollm2-135m.npz).
"""

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.engine import DecodeConfig  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.registry import load_registry  # noqa: E402


def kept_prefix(proposal: list[int], truth: list[int]) -> int:
    k = 0
    for a, b in zip(proposal, truth):
        if a != b:
            break
        k += 1
    return k


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default=str(Path(__file__).resolve().parents[2] / "shared/prompts/specbench-dev.jsonl"))
    ap.add_argument("--skip", type=int, default=3, help="leave the first N prompts of each category out")
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=10)
    ap.add_argument("--pair", default="smollm2-135m-lookup")
    args = ap.parse_args()
    rows, seen = [], defaultdict(int)
    for line in Path(args.prompts).read_text().splitlines():
        r = json.loads(line)
        seen[r["category"]] += 1
        if args.skip < seen[r["category"]] <= args.skip + args.per_category:
            rows.append(r)
    pipe = build_pipeline(load_registry(), pair=args.pair, device="cpu")
    pipe.warm_up()
    drafter = pipe.drafter
    cfg = DecodeConfig(gamma=pipe.gamma, max_new_tokens=args.max_new_tokens)
    stats = defaultdict(lambda: [0, 0, 0, 0])  # kind -> first kept, first seen, cont kept, cont seen
    for r in rows:
        ids = pipe.encode(r["turns"][0])
        out = list(pipe.speculative(ids, cfg))[-1].output_ids
        for t in range(len(out) - 1):
            truth = out[t: t + args.gamma]
            for key, tokens, _ in drafter.candidates(ids + out[:t], args.gamma):
                k = kept_prefix(tokens, truth)
                s = stats[key]
                s[0] += k >= 1
                s[1] += 1
                if k >= 1:
                    s[2] += k - 1
                    s[3] += min(k, len(tokens) - 1)
    print(f"{len(rows)} prompts (categories' prompts {args.skip + 1}..{args.skip + args.per_category}), "
          f"{args.max_new_tokens} new tokens, proposals up to {args.gamma}")
    print("| match | seen | first kept (a1) | further kept (ac) |\n|---|---|---|---|")
    for key in sorted(stats, key=str):
        f, n, c, m = stats[key]
        print(f"| {' '.join(map(str, key))} | {n} | {f / n:.2f} | {c / max(1, m):.2f} |")


if __name__ == "__main__":
    main()
