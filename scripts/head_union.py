"""What verifying the head's chain and lookup's match together (a two-branch tree) would buy.

The default pair proposes one of the two each iteration. This runs it greedily as it is and, at
every iteration, also asks the drafter for the head's chain alone and for lookup's match alone
(the real drafter's state, the real context); once the answer is known it counts how many tokens
each would have had kept. Greedy acceptance is "keep while the draft equals the target's answer",
so the counts are exact for the trajectory taken. Prints tokens an iteration for the choice made,
each source alone and their union (the longer of the two kept), and the rows a pass would verify.
The verify pass's cost per extra row is what decides whether a tree pays (docs/MEASUREMENTS.md).

It also counts a chain, not a tree: when the head drafted, lookup's best paying match for the context
with the head's tokens appended (what followed the same n-gram earlier, or in the datastore), as a
tail verified in the same pass: the tokens it would add (only after a fully kept chain) and its rows.

    python scripts/head_union.py --prompts ../shared/prompts/specbench-dev.jsonl --limit 1
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lookup_stats import kept_prefix as kept  # noqa: E402

from specviz.bench import load_prompts  # noqa: E402
from specviz.costs import load_costs  # noqa: E402
from specviz.drafters.head import HeadDrafter  # noqa: E402
from specviz.drafters.lookup import PromptLookupDrafter  # noqa: E402
from specviz.engine import DecodeConfig  # noqa: E402
from specviz.events import SummaryEvent  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.registry import load_registry  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--limit", type=int, default=1)
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--costs", default="reference", help="the cost profile the drafter reads (default: pinned)")
    args = ap.parse_args()
    pipe = build_pipeline(load_registry(), None, device="cpu", dtype="float32")
    pipe.warm_up()
    if not isinstance(pipe.drafter, HeadDrafter) or not pipe.drafter.lookup:
        sys.exit("the default pair must be a head drafter with lookup beside it")
    record: list[tuple[list[int], list[int], list[int], list[int], list[int]]] = []
    propose = HeadDrafter.propose

    def recording(self, ids, max_tokens, sampling, generator):
        self.lookup = False
        head = propose(self, ids, max_tokens, sampling, generator).tokens
        self.lookup = True
        self.state = lambda ids: None  # no head state: lookup's match alone
        match = propose(self, ids, max_tokens, sampling, generator).tokens
        del self.state
        real = propose(self, ids, max_tokens, sampling, generator)  # last, so the drafter's state is the run's
        tail: list[int] = []
        if self._bands and len(real.tokens) < max_tokens:  # the head drafted: lookup after its chain
            last = self._last  # lookup's own choice (the best paying match), leaving the run's state as it was
            tail = PromptLookupDrafter.propose(self, list(ids) + real.tokens, max_tokens - len(real.tokens),
                                               sampling, generator).tokens
            self._last = last
        record.append((list(ids), head, match, real.tokens, tail))
        return real

    HeadDrafter.propose = recording
    cfg = DecodeConfig(gamma=pipe.gamma, max_new_tokens=args.max_new_tokens, costs=load_costs(args.costs))
    n = Counter()
    for row in load_prompts(args.prompts, limit=args.limit, skip=args.skip):
        record.clear()
        summary = [e for e in pipe.speculative(row["prompt"], cfg) if isinstance(e, SummaryEvent)][0]
        start = len(record[0][0])
        for ids, head, match, real, tail in record:
            answer = summary.output_ids[len(ids) - start:]
            h, m, r = kept(head, answer), kept(match, answer), kept(real, answer)
            n["iterations"] += 1
            n["chosen"] += r + 1
            n["head"] += h + 1
            n["lookup"] += m + 1
            n["union"] += max(h, m) + 1
            n["rows chosen"] += len(real) + 1
            n["rows union"] += len(head) + len(match) + 1
            if tail:
                n["tails"] += 1
                n["tail rows"] += len(tail)
                if r == len(real):
                    n["tail kept"] += kept(tail, answer[len(real):])
    it = n["iterations"]
    print(f"{it} iterations; tokens an iteration: chosen {n['chosen'] / it:.3f}, head alone {n['head'] / it:.3f}, "
          f"lookup alone {n['lookup'] / it:.3f}, both verified together {n['union'] / it:.3f} "
          f"({100 * (n['union'] / n['chosen'] - 1):+.1f}%); rows a pass: chosen {n['rows chosen'] / it:.2f}, "
          f"together {n['rows union'] / it:.2f}")
    print(f"lookup after the head's chain: a tail in {n['tails']} iterations, +{n['tail kept'] / it:.3f} tokens "
          f"an iteration ({100 * n['tail kept'] / n['chosen']:+.1f}%) for +{n['tail rows'] / it:.2f} rows a pass")


if __name__ == "__main__":
    main()
