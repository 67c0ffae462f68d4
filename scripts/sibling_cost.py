"""What a depth-1 sibling row would cost in the exact mode, timed inside real passes of the default
target (the counting half is ``scripts/sibling_stats.py``; nothing here is built into the engine).

A sibling s is an alternative to the first proposal d1: same position, so its key must sit where d1's
sits for its attention to sum in the order a plain step's does (else its bits, its KV and so every
later token could differ from vanilla decoding). In one pass that slot holds d1's key for the chain's
rows, so the sibling needs, per layer, its own attention product with s's key and value written into
d1's slot for the product and d1's put back afterwards. This script times exactly that on a pass of
[x, d1, d2] + s (4 rows: what the exact kernels pad 3 rows to anyway, so the linear layers cost
nothing more) against the plain 3-row pass, paired and alternated, median of ``--rounds``, at
several context lengths; and checks that the sibling's logits then have the bits of a plain step.

    python scripts/sibling_cost.py --rounds 40
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from transformers import AttentionInterface  # noqa: E402

from specviz.backends import exact, lean  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.registry import load_registry  # noqa: E402

SIBLING = {"on": False}


def with_sibling(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kw):
    """The last row is a sibling of the pass's second row (same position): the chain's rows as usual,
    then the sibling's own product over the keys up to its parent with its key in the child's slot."""
    if not SIBLING["on"] or query.shape[2] < 3:
        return exact.exact_attention(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kw)
    q_len, kv_len = query.shape[2], key.shape[2]
    past = kv_len - q_len  # x at past, d1 at past + 1, ..., the sibling at kv_len - 1
    main, _ = exact.exact_attention(module, query[:, :, :-1], key[:, :, :-1], value[:, :, :-1], attention_mask,
                                    dropout, scaling, is_causal, **kw)
    slot = past + 1
    k1, v1 = key[:, :, slot].clone(), value[:, :, slot].clone()
    key[:, :, slot], value[:, :, slot] = key[:, :, -1], value[:, :, -1]
    b, heads, _, d = query.shape
    rows = exact.query_rows(heads, key.shape[1], d, query.dtype)
    sib = exact._blocks(query[:, :, -1:], key[:, :, :slot + 1], value[:, :, :slot + 1], scaling, slot,
                        getattr(module, "sliding_window", None), rows)
    key[:, :, slot], value[:, :, slot] = k1, v1
    return torch.cat([main, sib], 1), None


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--contexts", type=int, nargs="+", default=[150, 400, 900])
    args = ap.parse_args()
    pipe = build_pipeline(load_registry())
    lm, model = pipe.target_lm, pipe.target.model
    if not exact.is_exact(model) or getattr(model, "_svz_attention", "") != "batched":
        sys.exit("needs the exact mode with batched attention (the default on a float32 CPU)")
    AttentionInterface.register(exact.ATTENTION, with_sibling)
    lean.exact_attention = with_sibling  # the lean layers call it directly
    ids = pipe.tokenizer("The quick brown fox jumps over the lazy dog. " * 200)["input_ids"]
    x, d1, d2, s = ids[10:14]
    print(f"{pipe.name}: a 3-row pass [x, d1, d2] against the same + a sibling s of d1 (4 rows), ms, "
          f"median of {args.rounds} paired rounds")
    for n in args.contexts:
        lm.reset()
        lm.feed(ids[:n], keep_logits=1)
        plain, sib = [], []
        for r in range(args.rounds):
            for on in ((False, True) if r % 2 else (True, False)):
                SIBLING["on"] = on
                toks = [x, d1, d2] + ([s] if on else [])
                pos = torch.tensor([[n, n + 1, n + 2] + ([n + 1] if on else [])])
                t = time.perf_counter()
                out = model(input_ids=torch.tensor([toks]), cache=lm.cache, use_cache=True, position_ids=pos)
                (sib if on else plain).append((time.perf_counter() - t) * 1e3)
                lm.cache.crop(-len(toks))
        got = out.logits[0, -1]
        SIBLING["on"] = False
        alone = model(input_ids=torch.tensor([[x, s]]), cache=lm.cache, use_cache=True).logits[0, -1]
        lm.cache.crop(-2)
        p, w = statistics.median(plain), statistics.median(sib)
        print(f"  context {n:4d}: plain {p:6.2f}  with sibling {w:6.2f}  (+{w - p:.2f} ms, +{(w / p - 1) * 100:.1f}%); "
              f"the sibling's logits {'have' if torch.equal(got, alone) else 'do NOT have'} a plain step's bits")


if __name__ == "__main__":
    main()
