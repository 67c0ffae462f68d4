"""What better drafting could still buy: replay the target's own greedy answers against drafting
policies, offline, and price each iteration with the measured cost profile.

Greedy acceptance is "keep while the draft equals the target's answer", so once the answers are
known (one vanilla run per prompt) every policy can be replayed exactly, without running the
target again: an iteration keeps the longest path of its draft (a chain, or a tree of chains)
that the answer confirms, then one more token. Each iteration costs v[rows] (rows = drafted
tokens + 1) in plain steps; tokens / cost is the decode-only speedup with no per-iteration
overhead, prefill left out (so it is above what the bench measures). The union policies use
the drafter's priors only. Policies:

  chain        the default pair's drafter as it runs (cost-aware lookup + datastore, one chain)
  union        the context match and the datastore match verified together as a tree
  union+rec    the same plus Token Recycling's top successors of the last token as other first tokens

The recycling table is harvested from the target's top-k at the positions already decoded.

    python scripts/draft_replay.py --limit 1 --nodes 7
"""

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.bench import load_prompts  # noqa: E402
from specviz.engine import DecodeConfig  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.registry import load_registry  # noqa: E402


def add_chain(tree: list[tuple[int, int]], tokens: list[int], nodes: int) -> None:
    """Add a chain below the root, sharing nodes with an existing branch where tokens agree."""
    node = -1
    for t in tokens:
        kids = [i for i, (x, parent) in enumerate(tree) if parent == node and x == t]
        if kids:
            node = kids[0]
            continue
        if len(tree) >= nodes:
            return
        tree.append((t, node))
        node = len(tree) - 1


def kept(tree: list[tuple[int, int]], answer: list[int]) -> int:
    node, k = -1, 0
    for t in answer:
        kids = [i for i, (x, parent) in enumerate(tree) if parent == node and x == t]
        if not kids:
            break
        node, k = kids[0], k + 1
    return k


def policy(name: str, drafter, ids: list[int], room: int, table: dict, nodes: int, gamma: int):
    if room <= 0:
        return []
    if name == "chain":
        tokens = drafter.propose(ids, min(gamma, room), None, None).tokens
        return [(t, i - 1) for i, t in enumerate(tokens)]
    found = drafter.candidates(ids, min(gamma, room))
    found.sort(key=lambda c: -drafter.value(c[0], len(c[1]))[1])
    tree: list[tuple[int, int]] = []
    for i, (key, tokens, _) in enumerate(found):
        g = drafter.value(key, len(tokens))[0]
        add_chain(tree, tokens[: max(4, g) if i == 0 else 3], nodes)
    if name == "union+rec" and ids[-1] in table:
        for t in table[ids[-1]][:2]:
            add_chain(tree, [int(t)], nodes)
    return tree


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default=str(Path(__file__).resolve().parents[2] / "shared/prompts/specbench-dev.jsonl"))
    ap.add_argument("--limit", type=int, default=1)
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--nodes", type=int, default=7, help="most drafted tokens in a tree")
    args = ap.parse_args()
    pipe = build_pipeline(load_registry(), pair="smollm2-135m-lookup")
    pipe.warm_up(16)
    v = pipe.target_lm.cost_profile(17, pipe.encode("Warm up, please. " * 20))
    print("cost profile v[g] (g + 1 rows over 1):", " ".join(f"{x:.2f}" for x in v))
    cfg = DecodeConfig(gamma=pipe.gamma, max_new_tokens=args.max_new_tokens)
    cases = []
    for row in load_prompts(args.prompts, args.limit, skip=args.skip):
        ids = pipe.encode(row["prompt"])
        answer = list(pipe.vanilla(ids, cfg))[-1].output_ids
        with torch.inference_mode():
            logits = pipe.target.model(torch.tensor([ids + answer])).logits[0]
        top = torch.topk(logits, 4, -1).indices.tolist()
        cases.append((row["category"], ids, answer, top))
    print(f"{'policy':10} {'median':>7} {'total':>7} {'tok/iter':>8}")
    for name in ("chain", "union", "union+rec"):
        ratios, tokens, cost, iters = [], 0, 0.0, 0
        for _, ids, answer, top in cases:
            drafter = pipe.drafter
            drafter.costs = v
            drafter.reset(ids)
            table: dict = {}
            pos, spent = 0, 0.0
            while pos < len(answer):
                ctx = ids + answer[:pos]
                tree = policy(name, drafter, ctx, len(answer) - pos - 1, table, args.nodes, pipe.gamma)
                k = kept(tree, answer[pos:])
                if name == "chain":
                    drafter.observe(len(tree), k)  # it learns as it would in a run
                step = min(k + 1, len(answer) - pos)
                for j in range(len(ctx) - 1, len(ctx) + step - 1):  # the rows this pass computed
                    table[(ids + answer)[j]] = top[j]
                spent += v[min(len(tree), len(v) - 1)]
                pos += step
                iters += 1
            ratios.append(len(answer) / spent)
            tokens += len(answer)
            cost += spent
        print(f"{name:10} {statistics.median(ratios):6.2f}x {tokens / cost:6.2f}x {tokens / iters:8.2f}")


if __name__ == "__main__":
    main()
