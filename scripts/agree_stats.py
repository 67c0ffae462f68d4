"""Does the draft head's first token, agreeing or not with lookup's match, say how much of the match
will be kept?  Greedy answers of the default pair to prompts the benchmark does not use (every
category's prompts after the first --skip), then, at every position of every answer: lookup's
candidates (context and datastore), the head's first token there (from the target's hidden state
of one teacher-forced pass over prompt + answer), and how much of each the answer confirms.

Prints, per kind of match and per agreement (the match's first token is the head's top token,
or not), the chance the first token is kept (a1) and a further one after a kept one (ac); the
head's own first-token accuracy per band of its top probability, with a context match that agrees,
one that differs, or none.

    python scripts/agree_stats.py --prompts ../shared/prompts/specbench-dev.jsonl --skip 3

The signal is strong (docs/MEASUREMENTS.md, 2026-12-02). Keying the estimates by it alone drafted the
same number of iterations within 0.2%; since 2026-12-03 the head drafter also proposes a prompt/output
match that starts with the head's token instead of the head's chain, and with that it pays
(scripts/agreement_stats.py measures the relation where the drafter decides, against its estimates).
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lookup_stats import kept_prefix  # noqa: E402

from specviz.bench import load_prompts  # noqa: E402
from specviz.drafters.head import HeadDrafter, band  # noqa: E402
from specviz.engine import DecodeConfig  # noqa: E402
from specviz.events import SummaryEvent  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.registry import load_registry  # noqa: E402
from specviz.sampling import SamplingConfig  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--skip", type=int, default=3, help="leave the first N prompts of each category out")
    ap.add_argument("--limit", type=int, default=3, help="prompts per category after those")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=10)
    args = ap.parse_args()
    pipe = build_pipeline(load_registry(), None, device="cpu", dtype="float32")
    pipe.warm_up()
    d = pipe.drafter
    if not isinstance(d, HeadDrafter) or not d.lookup:
        sys.exit("the default pair must be a head drafter with lookup beside it")
    greedy = SamplingConfig()
    cfg = DecodeConfig(gamma=pipe.gamma, max_new_tokens=args.max_new_tokens)
    match = defaultdict(lambda: [0, 0, 0, 0])  # (key, agree) -> first kept, seen, further kept, seen
    head = defaultdict(lambda: [0, 0])  # (band, lookup agrees?) -> kept, seen
    for row in load_prompts(args.prompts, limit=args.limit, skip=args.skip):
        ids = pipe.encode(row["prompt"])
        out = [e for e in pipe.speculative(ids, cfg) if isinstance(e, SummaryEvent)][0].output_ids
        seq = ids + out
        pipe.target_lm.reset()
        with torch.inference_mode():
            pipe.target_lm.feed(seq, keep_logits=1)
        states = d.tap.last[0].clone()
        d.reset(ids)
        for t in range(len(out) - 1):
            context = seq[: len(ids) + t]
            truth = out[t: t + args.gamma]
            with torch.inference_mode():
                _, soft, _, top = d.step(states[len(context) - 2], context[-1], greedy)
            arg = int(d.vocab[int(soft.argmax())])
            found = d.candidates(context, args.gamma)
            for key, tokens, _ in found:
                k = kept_prefix(tokens, truth)
                if key[0] == "store":
                    key = ("store", min(key[1], 4), key[2])
                s = match[(key, tokens[0] == arg)]
                s[0] += k >= 1
                s[1] += 1
                if k >= 1:
                    s[2] += k - 1
                    s[3] += min(k, len(tokens) - 1)
            ctx = [tokens[0] for key, tokens, _ in found if key[0] == "context"]
            h = head[(band(top), None if not ctx else ctx[0] == arg)]
            h[0] += arg == truth[0]
            h[1] += 1
    print("| match | head agrees | seen | first kept (a1) | further kept (ac) |\n|---|---|---|---|---|")
    for (key, agree) in sorted(match, key=str):
        f, n, c, m = match[(key, agree)]
        print(f"| {' '.join(map(str, key))} | {agree} | {n} | {f / n:.2f} | {c / max(1, m):.2f} |")
    print("\n| head band | context match agrees | seen | first kept |\n|---|---|---|---|")
    for (b, agree) in sorted(head, key=str):
        k, n = head[(b, agree)]
        print(f"| {b} | {agree} | {n} | {k / n:.2f} |")


if __name__ == "__main__":
    main()
