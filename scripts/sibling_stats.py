"""What a depth-1 sibling row would buy: one more token per pass that is verified as an alternative
to the first proposal, not after it (a two-leaf tree), on the default pair, greedy.

The alternative is the head's second choice where the head drafts, and the head's first choice where
lookup drafts and the head disagrees with the match (both read from the head's first step, which
runs every iteration anyway: no extra drafting). It is kept where the first proposal is refused and
the target's token there is the alternative: one more token (the alternative, then the target's
token after it from the sibling's own row) instead of the correction alone. Its row in the linear
layers costs v(g + 1) - v(g) of a plain step for g proposals: nothing while the pass stays within
the rows the exact kernels pad to (4), a few percent beyond; its attention costs more than that
counts (a product of its own per layer: 6-12% of a pass, scripts/sibling_cost.py). Counted on the same greedy answers, with the cost
profile pinned, so free of timing noise; nothing is built (a sibling needs its own position and a
key span without its siblings in the exact attention, and a KV fix-up when it wins; what that attention
costs inside a real pass: scripts/sibling_cost.py).

    python scripts/sibling_stats.py --prompts ../shared/prompts/specbench-dev.jsonl --limit 3 \\
        --costs '[1.0, 1.0, 1.0, 1.0, 1.025, 1.054, 1.111, 1.132, 1.179, 1.192, 1.221, 1.249]'
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from count_args import counting_parser  # noqa: E402

from specviz.bench import load_prompts  # noqa: E402
from specviz.costs import load_costs  # noqa: E402
from specviz.drafters.head import HeadDrafter  # noqa: E402
from specviz.engine import DecodeConfig  # noqa: E402
from specviz.events import IterationEvent  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.registry import load_registry  # noqa: E402


def main() -> None:
    ap = counting_parser(__doc__, limit=1)
    args = ap.parse_args()
    pipe = build_pipeline(load_registry())
    if not isinstance(pipe.drafter, HeadDrafter):
        sys.exit("the default pair must draft with a head")
    v = load_costs(args.costs)

    def cost(g: int) -> float:
        return v[min(g, len(v) - 1)]

    firsts: list[dict] = []  # per propose: the head's top two tokens at its first step, and who drafted
    step, propose = HeadDrafter.step, HeadDrafter.propose
    seen: dict = {}

    def step_seen(self, h, x, sampling):
        out = step(self, h, x, sampling)
        if "top" not in seen:
            top = out[1].topk(2)
            seen["top"] = [int(self.vocab[int(i)]) for i in top.indices]
            seen["p"] = [float(p) for p in top.values]
        return out

    def propose_seen(self, ids, max_tokens, sampling, generator):
        seen.clear()
        prop = propose(self, ids, max_tokens, sampling, generator)
        firsts.append(dict(seen, head=bool(self._bands)))
        return prop

    HeadDrafter.step, HeadDrafter.propose = step_seen, propose_seen
    cfg = DecodeConfig(gamma=pipe.gamma, max_new_tokens=args.max_new_tokens, costs=v)
    tokens, units, iterations = 0, 0.0, 0
    rows = []  # (who, g, the alternative's head probability, kept, added cost)
    for row in load_prompts(args.prompts, limit=args.limit, skip=args.skip):
        firsts.clear()
        its = [e for e in pipe.speculative(row["prompt"], cfg) if isinstance(e, IterationEvent)]
        for first, e in zip(firsts, its):
            g = len(e.proposed)
            iterations, tokens, units = iterations + 1, tokens + len(e.emitted), units + cost(g)
            if "top" not in first:
                continue  # no head state this iteration
            if first["head"]:
                who, alt, p = "head's 2nd choice", first["top"][1], first["p"][1]
            else:
                who, alt, p = "head's 1st choice beside lookup", first["top"][0], first["p"][0]
                if e.proposed and alt == e.proposed[0]:
                    continue
            kept = e.accepted == 0 and e.emitted[0] == alt
            rows.append((who, g, p, kept, cost(g + 1) - cost(g)))
    base = tokens / units
    print(f"{iterations} iterations, {tokens} tokens, {units:.1f} units (summed v(g)): {base:.3f} tokens a unit\n")
    print("| siblings | passes with one | kept | units added | tokens a unit | change |\n|---|---|---|---|---|---|")
    policies = [("where the pass stays within 4 rows", lambda who, g, p: g + 2 <= 4),
                ("in every pass", lambda who, g, p: True),
                ("within 4 rows, or its probability >= 0.1", lambda who, g, p: g + 2 <= 4 or p >= 0.1),
                ("the head's 2nd choice only", lambda who, g, p: who.endswith("2nd choice"))]
    for name, ok in policies:
        sel = [r for r in rows if ok(r[0], r[1], r[2])]
        kept, added = sum(r[3] for r in sel), sum(r[4] for r in sel)
        r = (tokens + kept) / (units + added)
        print(f"| {name} | {len(sel)} | {kept} | {added:.1f} | {r:.3f} | {100 * (r / base - 1):+.1f}% |")
    for who in sorted({r[0] for r in rows}):
        sel = [r for r in rows if r[0] == who]
        print(f"\n{who}: offered in {len(sel)} passes, kept in {sum(r[3] for r in sel)}")


if __name__ == "__main__":
    main()
