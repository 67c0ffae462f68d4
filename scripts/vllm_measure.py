"""vLLM with speculation against vLLM without, on a few prompts (greedy): tokens/s, acceptance,
start-up time.  Usage: python scripts/vllm_measure.py [--dtype bfloat16] [--gamma 4]
[--prompts ../shared/prompts/specbench-dev.jsonl --limit 1] [--max-new-tokens 128]"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.backends.vllm import VLLMBackend, peer_run  # noqa: E402
from specviz.engine import DecodeConfig  # noqa: E402

BUILTIN = {
    "copy": "Repeat this paragraph exactly: The quick brown fox jumps over the lazy dog. The dog was not "
            "amused, and it barked at the fox until the sun went down. Then the fox ran into the forest.",
    "story": "Write a short story about a robot who learns to paint.",
}

ap = argparse.ArgumentParser()
ap.add_argument("--pair")
ap.add_argument("--gamma", type=int)
ap.add_argument("--dtype", default="float32")
ap.add_argument("--prompts", help="a Spec-Bench style .jsonl: adds its first prompt of each category")
ap.add_argument("--categories", nargs="+", default=["summarization", "rag", "translation"])
ap.add_argument("--max-new-tokens", type=int, default=128)
args = ap.parse_args()
prompts = dict(BUILTIN)
if args.prompts:
    for line in Path(args.prompts).read_text().splitlines():
        row = json.loads(line)
        if row["category"] in args.categories and row["category"] not in prompts:
            prompts[row["category"]] = row["turns"][0]
t0 = time.perf_counter()
be = VLLMBackend.launch(args.pair, args.gamma, args.dtype, progress=lambda m: print(m, file=sys.stderr))
print(f"start-up: {time.perf_counter() - t0:.0f} s for both servers + warm-up "
      f"({', '.join(f'{s.startup_s:.0f} s' for s in be.servers)} each); dtype {args.dtype}, k={be.gamma}")
cfg = DecodeConfig(gamma=be.gamma, max_new_tokens=args.max_new_tokens)
print(f"{'prompt':14} {'tokens':>6} {'steps':>5} {'accept':>7} {'tok/step':>8} {'vanilla t/s':>11} "
      f"{'spec t/s':>8} {'speedup':>7} identical")
try:
    for name, prompt in prompts.items():
        r = peer_run(be, be.encode(prompt), cfg)
        n = r["new_tokens"]
        acc = f"{r['accepted'] / r['proposed']:.0%}" if r["proposed"] else "n/a"
        print(f"{name:14} {n:6d} {r['steps']:5d} {acc:>7} {n / r['steps']:8.2f} "
              f"{len(r['vanilla_ids']) / r['vanilla_ms'] * 1000:11.1f} {n / r['spec_ms'] * 1000:8.1f} "
              f"{r['vanilla_ms'] / r['spec_ms']:6.2f}x {r['identical']}", flush=True)
finally:
    be.close()
