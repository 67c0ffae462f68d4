"""How often is an n-gram proposal kept?  Greedy runs with fixed-length prompt lookup on prompts
the benchmark does not use (by default: every category's prompts after the first --skip), printing
the first-token acceptance per match length n and the continuation acceptance.  These numbers set
the priors of the adaptive prompt-lookup drafter (specviz/drafters.py).

    python scripts/lookup_stats.py --skip 5 --per-category 2 --max-new-tokens 96
"""

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.drafters import PromptLookupDrafter  # noqa: E402
from specviz.engine import DecodeConfig, speculative_decode  # noqa: E402
from specviz.loading import build_pipeline  # noqa: E402
from specviz.registry import load_registry  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default=str(Path(__file__).resolve().parents[2] / "shared/prompts/specbench-dev.jsonl"))
    ap.add_argument("--skip", type=int, default=5, help="leave the first N prompts of each category out")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--gamma", type=int, default=8)
    args = ap.parse_args()
    rows, seen = [], defaultdict(int)
    for line in Path(args.prompts).read_text().splitlines():
        r = json.loads(line)
        seen[r["category"]] += 1
        if args.skip < seen[r["category"]] <= args.skip + args.per_category:
            rows.append(r)
    pipe = build_pipeline(load_registry(), pair="smollm2-135m-lookup", device="cpu")
    first = defaultdict(lambda: [0, 0])  # n -> kept, examined
    cont = [0, 0]
    by_pos = defaultdict(lambda: [0, 0])
    for r in rows:
        drafter = PromptLookupDrafter(max_ngram=4, adaptive=False)
        ids = pipe.encode(r["turns"][0])
        cfg = DecodeConfig(gamma=args.gamma, max_new_tokens=args.max_new_tokens)
        for ev in speculative_decode(pipe.target_lm, drafter, pipe.tokenizer, ids, cfg):
            if ev.event != "iteration" or not ev.proposed:
                continue
            n = int(ev.reason.split("-gram")[0])
            g, k = len(ev.proposed), ev.accepted
            first[n][1] += 1
            first[n][0] += k >= 1
            if k >= 1:
                cont[1] += min(k, g - 1)
                cont[0] += k - 1
            for i in range(min(k + 1, g)):
                by_pos[i + 1][1] += 1
                by_pos[i + 1][0] += i < k
    print(f"{len(rows)} prompts, gamma {args.gamma}, {args.max_new_tokens} new tokens")
    for n in sorted(first):
        k, m = first[n]
        print(f"first token of a {n}-gram match kept: {k}/{m} = {k / m:.3f}")
    print(f"a further token kept after a kept one: {cont[0]}/{cont[1]} = {cont[0] / max(1, cont[1]):.3f}")
    print("by position:", ", ".join(f"{p}: {k}/{m}" for p, (k, m) in sorted(by_pos.items())))


if __name__ == "__main__":
    main()
