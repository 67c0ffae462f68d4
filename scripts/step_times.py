"""Where a speculative iteration's time goes, timed inside real runs (greedy, the default pair):
the target's pass (prefills included), the drafter and its head steps, lookup, verification, the
KV crop, per iteration. One run per prompt and no repeats: it says where the time went, not a
speedup (the bench measures that). The cost profile is pinned so that the drafting choices match
from run to run.

    python scripts/step_times.py --prompts ../shared/prompts/specbench-dev.jsonl --limit 1
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import specviz.engine as engine  # noqa: E402
from specviz.bench import load_prompts  # noqa: E402
from specviz.costs import load_costs  # noqa: E402
from specviz.drafters import head  # noqa: E402
from specviz.events import IterationEvent, StartEvent  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.registry import load_registry  # noqa: E402

SECONDS: dict[str, float] = collections.defaultdict(float)
CALLS: collections.Counter = collections.Counter()


def timed(owner, name: str, label: str) -> None:
    """Replace ``owner.name`` with a wrapper that adds its time to ``label``."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            SECONDS[label] += time.perf_counter() - t
            CALLS[label] += 1

    setattr(owner, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", default=None)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--limit", type=int, default=1)
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    pipe = build_pipeline(load_registry(), pair=args.pair)
    pipe.warm_up()
    timed(pipe.target_lm, "feed", "target pass (feed)")
    timed(pipe.target_lm, "rollback", "KV crop")
    timed(engine, "verify_logits", "verification")
    timed(engine.RawStats, "_compute", "raw probabilities (after the clock)")
    timed(type(pipe.drafter), "propose", "drafting (all)")
    if isinstance(pipe.drafter, head.HeadDrafter):
        timed(head.HeadDrafter, "step", "  head steps")
    if hasattr(pipe.drafter, "candidates"):
        timed(type(pipe.drafter), "candidates", "  lookup + datastore")
    cfg = engine.DecodeConfig.from_settings(pipe.gamma, 0.0, 0, 1.0, args.max_new_tokens, 0, load_costs("reference"))
    wall = prefill = 0.0
    its = toks = 0
    for row in load_prompts(args.prompts, limit=args.limit, skip=args.skip):
        for ev in pipe.speculative(row["prompt"], cfg):
            if isinstance(ev, StartEvent):
                prefill += ev.prefill_ms
            elif isinstance(ev, IterationEvent):
                its += 1
                toks += len(ev.emitted)
            else:
                wall += ev.wall_ms
    print(f"{pipe.name}: {its} iterations, {toks} tokens; per iteration {wall / its:.2f} ms on the run's clock, "
          f"of which the prefill's share {prefill / its:.2f} ms")
    for label, s in SECONDS.items():
        print(f"  {label:38s} {s / its * 1e3:7.3f} ms/iteration  ({CALLS[label]} calls, {s / CALLS[label] * 1e3:.3f} ms each)")


if __name__ == "__main__":
    main()
