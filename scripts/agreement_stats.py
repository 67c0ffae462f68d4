"""How often each source's first token is kept, by whether the draft head and lookup agree on it.

Greedy runs of the head pair (prompt lookup + datastore beside the draft head) on prompts the
benchmark does not use (every category's prompts after the first --skip; the benchmark's `--limit 3`
uses the first 3). At every iteration where the head has a state, the head's most likely first
token is compared with the first token of each lookup match (prompt/output and datastore), and
each is checked against the target's own greedy answer. Prints, per kind of match and relation,
how often its first token was kept against the estimate the drafter had without the relation, and
the same for the head: the factors behind ``PromptLookupDrafter.RELATIONS`` and
``HeadDrafter.HEAD_RELATIONS``.

    python scripts/agreement_stats.py --prompts ../shared/prompts/specbench-dev.jsonl --skip 3

Measured so before the drafter used the relations (31 answers, pinned costs): a prompt/output match the head agrees
with kept 82% (estimated 54%), one it differs from 34% (40%); a datastore match 56% (22%) and 5.5%
(18%); the head's first token 62% (59%) where a match agrees, 21% (32%) where a prompt/output match
differs, 27% (37%) where only datastore matches differ.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.bench import load_prompts  # noqa: E402
from specviz.costs import load_costs  # noqa: E402
from specviz.drafters import head as head_module  # noqa: E402
from specviz.engine import DecodeConfig  # noqa: E402
from specviz.events import StartEvent, SummaryEvent  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.registry import load_registry  # noqa: E402

# the cost profile measured on this project's Intel Xeon (2 threads), pinned so runs compare
XEON = "[1.0, 1.0, 1.0, 1.0, 1.03, 1.06, 1.14, 1.15, 1.19, 1.21, 1.24]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", default="smollm2-135m-head")
    ap.add_argument("--prompts", required=True, help="a Spec-Bench style .jsonl")
    ap.add_argument("--limit", type=int, default=3, help="prompts per category")
    ap.add_argument("--skip", type=int, default=3, help="leave out the first N of each category")
    ap.add_argument("--costs", default=XEON, help="the cost profile ('reference', a JSON list, a saved run)")
    args = ap.parse_args()
    pipe = build_pipeline(load_registry(), pair=args.pair)
    drafter = pipe.drafter
    if not isinstance(drafter, head_module.HeadDrafter) or not drafter.lookup:
        sys.exit(f"{args.pair}: a draft head beside lookup is needed")
    records: list[dict] = []
    propose = type(drafter).propose

    def watched(self, ids, max_tokens, sampling, generator):
        """What the drafter knew before choosing: each match and its estimate without the relation,
        the head's most likely first token and its estimate."""
        found, first, head_a1 = [], None, None
        if max_tokens > 0:
            for key, toks, _ in self.candidates(ids, max_tokens):
                found.append((key, toks, self.estimates(key)[0]))
            h = self.state(ids)
            if h is not None:
                _, soft, _, top = self.step(h, ids[-1], sampling)
                first = int(self.vocab[int(soft.argmax())])
                head_a1 = self.keep_chance(head_module.band(top), True)
        records.append({"pos": len(ids), "found": found, "first": first, "head_a1": head_a1})
        return propose(self, ids, max_tokens, sampling, generator)

    type(drafter).propose = watched
    cfg = DecodeConfig.from_settings(pipe.gamma, 0.0, 0, 1.0, 128, 0, load_costs(args.costs))
    lookup = defaultdict(lambda: [0, 0, 0.0])  # (kind, relation) -> kept, seen, sum of estimates
    head = defaultdict(lambda: [0, 0, 0.0])
    for row in load_prompts(args.prompts, limit=args.limit, skip=args.skip):
        records.clear()
        for ev in pipe.speculative(row["prompt"], cfg):
            if isinstance(ev, StartEvent):
                prompt = list(ev.prompt_ids)
            elif isinstance(ev, SummaryEvent):
                seq = prompt + list(ev.output_ids)
        for r in records:
            if r["pos"] >= len(seq):
                continue
            truth, first, found = seq[r["pos"]], r["first"], r["found"]
            for key, toks, a1 in found:
                rel = "alone" if first is None else "agree" if toks[0] == first else "differ"
                s = lookup[(key[0], rel)]
                s[0] += toks[0] == truth
                s[1] += 1
                s[2] += a1
            if first is not None:
                rel = drafter.relation(first, found) or "alone"  # the drafter's own rule
                s = head[rel]
                s[0] += first == truth
                s[1] += 1
                s[2] += r["head_a1"]
    for name, table in (("lookup", lookup), ("head", head)):
        for key, (kept, seen, est) in sorted(table.items()):
            print(f"{name:6} {' '.join(key) if isinstance(key, tuple) else key:24} n={seen:5d} kept {kept / seen:.3f} "
                  f"estimated {est / seen:.3f} ratio {kept / max(est, 1e-9):.2f}")


if __name__ == "__main__":
    main()
