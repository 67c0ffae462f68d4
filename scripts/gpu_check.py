"""GPU readiness check: the engine on CUDA (bf16) with models built from a config at realistic
sizes (random weights: they measure speed and correctness, not acceptance).

For each pair it reports tokens/s of vanilla and speculative decoding, the draft/verify split
(synchronised timings) and whether greedy output matched vanilla (with the top-2 logit margin
where it did not: bf16 near ties are numerics, not bugs).  Runs on a CPU too (--small) so the
script itself is tested where no GPU is lent.

    python scripts/gpu_check.py                 # on a CUDA machine
    python scripts/gpu_check.py --small --device cpu
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.drafters import ModelDrafter, PromptLookupDrafter  # noqa: E402
from specviz.engine import DecodeConfig, speculative_decode, vanilla_decode  # noqa: E402
from specviz.exactness import compare  # noqa: E402
from specviz.backends.transformers import CachedLM  # noqa: E402
from tests.fixtures.tiny import llama_from_config, synthetic_tokenizer  # noqa: E402
from specviz.trace import Trace  # noqa: E402

SIZES = {  # SmolLM2 shapes
    "1.7b": dict(hidden=2048, layers=24, heads=32, kv_heads=32, intermediate=8192),
    "360m": dict(hidden=960, layers=32, heads=15, kv_heads=5, intermediate=2560),
    "135m": dict(hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536),
    "small": dict(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=256),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--small", action="store_true", help="tiny shapes (a quick run on a CPU)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    vocab = 4096 if args.small else 49152
    tok = synthetic_tokenizer(vocab)
    t0 = time.time()
    tgt_size, drf_size = ("small", "small") if args.small else ("1.7b", "135m")
    target = llama_from_config(**SIZES[tgt_size], vocab_size=vocab, seed=0, dtype=dtype, device=args.device)
    draft = llama_from_config(**SIZES[drf_size], vocab_size=vocab, seed=1, dtype=dtype, device=args.device)
    print(f"built {tgt_size} target and {drf_size} draft on {args.device} {args.dtype} in {time.time() - t0:.1f} s")
    g = torch.Generator().manual_seed(0)
    base = torch.randint(10, vocab, (48,), generator=g).tolist()
    prompt = base + base[:16] + base[:24]  # some repetition, so prompt lookup has matches
    cfg = DecodeConfig(gamma=args.gamma, max_new_tokens=args.max_new_tokens)
    lm = CachedLM(target)
    list(vanilla_decode(lm, tok, prompt, DecodeConfig(max_new_tokens=4)))  # warm-up
    results = []
    van = Trace.of(vanilla_decode(lm, tok, prompt, cfg))
    for name, drafter in [("draft model", ModelDrafter(draft)), ("self-draft (acceptance 1)", ModelDrafter(target)),
                          ("prompt lookup", PromptLookupDrafter())]:
        list(speculative_decode(lm, drafter, tok, prompt, DecodeConfig(gamma=args.gamma, max_new_tokens=4)))
        spec = Trace.of(speculative_decode(lm, drafter, tok, prompt, cfg))
        cmp = compare(lm, prompt, van.output_ids, spec.output_ids)
        split = spec.time_split()
        row = {"drafter": name, "vanilla_tps": van.tokens_per_second, "spec_tps": spec.tokens_per_second,
               "speedup": spec.tokens_per_second / van.tokens_per_second, "acceptance": spec.acceptance_rate,
               "tokens_per_iteration": spec.tokens / len(spec.iterations), "draft_ms": split["draft"],
               "verify_ms": split["verify"], "other_ms": split["other"], "vanilla_step_ms":
               sum(e.verify_ms for e in van.iterations) / len(van.iterations), "identical": cmp.identical,
               "divergence": "" if cmp.identical else cmp.describe()}
        results.append(row)
        print(json.dumps(row))
    print("\n| drafter | vanilla tok/s | spec tok/s | speedup | accept | tok/iter | draft ms | verify ms | identical |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        print(f"| {r['drafter']} | {r['vanilla_tps']:.1f} | {r['spec_tps']:.1f} | {r['speedup']:.2f}x | {acc} | "
              f"{r['tokens_per_iteration']:.2f} | {r['draft_ms']:.0f} | {r['verify_ms']:.0f} | "
              f"{'yes' if r['identical'] else r['divergence']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
