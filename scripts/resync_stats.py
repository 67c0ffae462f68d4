"""Would lookup past a substitution pay? Counted on the default pair's greedy answers, before building it.

Where the target writes a token in place of the one a copy had next (an edited number, a changed
word in a copied sentence), plain lookup loses the copy: the last n-gram now ends in the new token.
A "resync" candidate takes the n tokens before the last one (n = 4..2, longest first), their most
recent earlier occurrence followed by a different token, and proposes what came after that token.
For each iteration of specviz's real greedy run this counts where such a candidate exists, how
often its first token would have been kept, and what an oracle that took it only where it beats the
iteration's own tokens would add (an upper bound: a real drafter must choose before the pass),
overall and right after a lookup copy was cut short.

    python scripts/resync_stats.py --prompts ../shared/prompts/specbench-dev.jsonl --limit 3 \\
        --costs '[1.0, 1.0, 1.0, 1.0, 1.025, 1.054, 1.111, 1.132, 1.179, 1.192, 1.221, 1.249]'
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from count_args import counting_parser  # noqa: E402
from lookup_stats import kept_prefix  # noqa: E402

from specviz.bench import load_prompts  # noqa: E402
from specviz.costs import load_costs  # noqa: E402
from specviz.engine import DecodeConfig  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.registry import load_registry  # noqa: E402
from specviz.trace import Trace  # noqa: E402


def resync(seq: list[int], gamma: int, max_n: int = 4) -> list[int]:
    """The continuation past a substitution of ``seq``'s last token, or []."""
    end = len(seq) - 1  # the n-gram ends before the last token
    for n in range(min(max_n, end - 1), 1, -1):
        tail = seq[end - n:end]
        for j in range(end - 1, n - 1, -1):  # j: the token that followed an earlier occurrence
            if seq[j - n:j] == tail and seq[j] != seq[-1] and j + 1 < len(seq):
                return seq[j + 1:j + 1 + gamma]
    return []


def main() -> None:
    ap = counting_parser(__doc__, limit=3)
    args = ap.parse_args()
    pipe = build_pipeline(load_registry())
    cfg = DecodeConfig.from_settings(pipe.gamma, 0.0, 0, 1.0, args.max_new_tokens, 0, load_costs(args.costs))
    tokens = iterations = 0
    seen = {"any": [0, 0, 0], "after a cut copy": [0, 0, 0]}  # offered, first kept, oracle tokens added
    per_cat: dict[str, list[int]] = {}
    for row in load_prompts(args.prompts, limit=args.limit, skip=args.skip):
        ids = pipe.encode(row["prompt"])
        tr = Trace.of(pipe.speculative(ids, cfg))
        answer, done, prev = tr.output_ids, 0, None
        cat = per_cat.setdefault(row["category"], [0, 0])
        for e in tr.iterations:
            got = len(e.emitted)
            cand = resync(ids + answer[:done], pipe.gamma)
            if cand:
                k = kept_prefix(cand, answer[done:])
                gain = max(0, k + 1 - got)
                cut = prev is not None and "gram match" in prev.reason and len(prev.emitted) <= len(prev.proposed)
                for key in ("any", "after a cut copy") if cut else ("any",):
                    s = seen[key]
                    s[0], s[1], s[2] = s[0] + 1, s[1] + (k >= 1), s[2] + gain
                cat[1] += gain
            done += got
            prev = e
        tokens += len(answer)
        iterations += len(tr.iterations)
        cat[0] += len(answer)
    print(f"{iterations} iterations, {tokens} tokens\n\n| where | offered | first token kept | oracle tokens added |\n|---|---|---|---|")
    for key, (off, k1, gain) in seen.items():
        print(f"| {key} | {off} | {k1} ({k1 / max(off, 1):.0%}) | {gain} ({gain / tokens:+.1%}) |")
    print("\n| category | oracle tokens added |\n|---|---|")
    for c, (tok, gain) in per_cat.items():
        print(f"| {c} | {gain / tok:+.1%} |")


if __name__ == "__main__":
    main()
