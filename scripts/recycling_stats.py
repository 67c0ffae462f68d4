"""How often is a recycled token kept?  Greedy answers to prompts the benchmark does not use
(every category's prompts after the first --skip), then, at every position, the chain Token
Recycling would draft from the successors harvested so far (each position's top-5 from the
vanilla run's own events: what a verify pass would have stored) and how much of it the answer
confirms. Prints the chance a recycled token is kept after a kept one, per band of its harvested
probability: the priors of specviz/drafters/recycling.py. Also compares what each source alone
would keep (lookup + datastore, recycled chain) at the same positions.

    python scripts/recycling_stats.py --skip 3 --per-category 1 --max-new-tokens 128
"""

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from specviz.bench import load_prompts  # noqa: E402
from specviz.drafters.recycling import BANDS, RecyclingDrafter, band  # noqa: E402
from specviz.engine import DecodeConfig  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.registry import load_registry  # noqa: E402
from specviz.trace import Trace  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lookup_stats import kept_prefix  # noqa: E402  (the same measure as the lookup priors)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default=str(Path(__file__).resolve().parents[2] / "shared/prompts/specbench-dev.jsonl"))
    ap.add_argument("--skip", type=int, default=3)
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=8)
    args = ap.parse_args()
    pipe = build_pipeline(load_registry(), pair="smollm2-135m-recycling", device="cpu", dtype="float32")
    d: RecyclingDrafter = pipe.drafter
    V = d.vocab_size
    rows = load_prompts(args.prompts, args.per_category, None, args.skip)
    by_band = defaultdict(lambda: [0, 0])  # band -> [kept, examined] (after a kept token or first)
    first_band = defaultdict(lambda: [0, 0])
    totals = defaultdict(lambda: [0, 0, 0])  # source -> [positions with a draft, first kept, tokens kept]
    for row in rows:
        ids = pipe.encode(row["prompt"])
        tr = Trace.of(pipe.vanilla(ids, DecodeConfig(max_new_tokens=args.max_new_tokens)))
        out = tr.output_ids
        d.reset(ids)
        seq = list(ids)
        for i, ev in enumerate(tr.iterations):
            truth = out[i:i + args.gamma]
            toks, ps = d.chain(seq, args.gamma)
            if toks:
                k = kept_prefix(toks, truth)
                totals["recycled"][0] += 1
                totals["recycled"][1] += k >= 1
                totals["recycled"][2] += k
                first_band[band(ps[0])][1] += 1
                first_band[band(ps[0])][0] += k >= 1
                for j in range(min(k + 1, len(toks))):
                    by_band[band(ps[j])][1] += 1
                    by_band[band(ps[j])][0] += j < k
            for key, lt, _ in d.candidates(seq, args.gamma):
                k = kept_prefix(lt, truth)
                src = key[0]
                totals[src][0] += 1
                totals[src][1] += k >= 1
                totals[src][2] += k
            # harvest this position's top-5 as a verify pass would (a one-row "logits")
            top = ev.target_top[0]
            logits = torch.full((1, V), -1e9)
            for tok, _, p in top:
                logits[0, tok] = float(torch.log(torch.tensor(max(p, 1e-12))))
            d.harvest(seq, logits)
            # softmax over the top-5 alone overstates p: store the real probabilities
            d.prob[seq[-1], : len(top)] = [p for _, _, p in top]
            if len(seq) > 1 and (seq[-2], seq[-1]) in d.pair_succ:
                d.pair_succ[(seq[-2], seq[-1])] = (top[0][0], top[0][2])
            seq.append(out[i])
        print(f"{row['category']}: {len(out)} tokens", file=sys.stderr, flush=True)
    print("band (p from)  keep-after-kept  examined   first-token keep  examined")
    for b, lo in enumerate(BANDS):
        k, n = by_band[b]
        fk, fn = first_band[b]
        print(f"{lo:>12.1f}  {k / n if n else 0:>15.2f}  {n:>8}   {fk / fn if fn else 0:>16.2f}  {fn:>8}")
    for src, (n, first, kept) in totals.items():
        print(f"{src}: drafts at {n} positions, first kept {first / max(n, 1):.2f}, tokens kept per draft {kept / max(n, 1):.2f}")
    print(json.dumps({"by_band": {BANDS[b]: v for b, v in by_band.items()}}))


if __name__ == "__main__":
    main()
