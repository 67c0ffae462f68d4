"""specviz's drafting against transformers' prompt lookup in units of pass cost, free of timing noise.

For each prompt: specviz's greedy speculative run gives the answer and its own passes; transformers'
prompt lookup (``PromptLookupCandidateGenerator``'s rule as the bench's peer runs it: the first match,
left to right, of the last 2 then 1 tokens, up to 10 tokens after it) is replayed over the same
answer. Each side's pass over g proposals costs v(g) of a plain step (the pinned cost profile), so
tokens / sum of v(g) is how far each drafter takes a step's worth of target time, before anything an
iteration pays outside its pass (drafting, bookkeeping, events). The bench's speedups include that.

    python scripts/peer_units.py --prompts ../shared/prompts/specbench-dev.jsonl --limit 3 \\
        --costs '[1.0, 1.0, 1.0, 1.0, 1.03, 1.06, 1.14, 1.15, 1.19, 1.21, 1.24]'
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from count_args import counting_parser  # noqa: E402

from specviz.bench import load_prompts  # noqa: E402
from specviz.costs import load_costs  # noqa: E402
from specviz.engine import DecodeConfig  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.registry import load_registry  # noqa: E402
from specviz.trace import Trace  # noqa: E402


def prompt_lookup(seq: list[int], num_tokens: int = 10, max_ngram: int = 2) -> list[int]:
    """transformers' prompt-lookup candidates for ``seq``: for n = max_ngram..1, the first window
    (left to right) equal to the last n tokens that has a token after it, and up to ``num_tokens``
    tokens from there."""
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        tail = seq[-n:]
        for i in range(len(seq) - n + 1):
            if seq[i:i + n] == tail and i + n < len(seq):
                return seq[i + n:i + n + num_tokens]
    return []


def replay(prompt: list[int], answer: list[int], gamma: int) -> list[tuple[int, int]]:
    """(proposed, emitted) per iteration of prompt lookup decoding ``answer`` greedily after ``prompt``."""
    out, done = [], 0
    while done < len(answer):
        room = len(answer) - done
        cand = prompt_lookup(prompt + answer[:done], gamma)[: max(0, room - 1)]
        k = 0
        while k < len(cand) and cand[k] == answer[done + k]:
            k += 1
        out.append((len(cand), k + 1))
        done += k + 1
    return out


def units(passes: list[tuple[int, int]], v: tuple[float, ...]) -> tuple[int, float]:
    """(tokens, summed pass cost in plain steps) of (proposed, emitted) passes."""
    return sum(e for _, e in passes), sum(v[min(g, len(v) - 1)] for g, _ in passes)


def main() -> None:
    ap = counting_parser(__doc__, limit=3)
    ap.add_argument("--pair", default=None, help="a pair of models.yaml (default: the registry's default)")
    ap.add_argument("--gamma", type=int, default=None, help="proposals at most, both sides (default: the pair's; "
                    "the bench gives transformers the pair's gamma too)")
    args = ap.parse_args()
    pipe = build_pipeline(load_registry(), pair=args.pair)
    v = load_costs(args.costs)
    gamma = args.gamma or pipe.gamma
    cfg = DecodeConfig.from_settings(gamma, 0.0, 0, 1.0, args.max_new_tokens, 0, v)
    per_cat: dict[str, list[float]] = {}
    print(f"| category | n | specviz tok / iter | specviz tok / unit | prompt lookup tok / iter | "
          f"prompt lookup tok / unit | ratio |\n|---|---|---|---|---|---|---|")
    rows = load_prompts(args.prompts, limit=args.limit, skip=args.skip)
    for row in rows:
        ids = pipe.encode(row["prompt"])
        tr = Trace.of(pipe.speculative(ids, cfg))
        ours = [(len(e.proposed), len(e.emitted)) for e in tr.iterations]
        peer = replay(ids, tr.output_ids, gamma)
        acc = per_cat.setdefault(row["category"], [0, 0, 0.0, 0, 0, 0.0, 0])
        for i, (tok, cost, n) in enumerate([(*units(ours, v), len(ours)), (*units(peer, v), len(peer))]):
            acc[3 * i] += tok
            acc[3 * i + 1] += cost
            acc[3 * i + 2] += n
        acc[6] += 1
    total = [0.0] * 7
    for cat, a in list(per_cat.items()) + [("overall", None)]:
        if a is None:
            a = total
        else:
            total = [x + y for x, y in zip(total, a)]
        ours, peer = a[0] / a[1], a[3] / a[4]
        print(f"| {cat} | {int(a[6])} | {a[0] / a[2]:.2f} | {ours:.2f} | {a[3] / a[5]:.2f} | {peer:.2f} | {ours / peer:.2f}x |")
    print(f"\n(tok / unit = tokens over the summed v(g) of the passes: v = {list(v)}; the same greedy answers; "
          f"{pipe.name}, gamma {gamma})")


if __name__ == "__main__":
    main()
