"""Tiny models with real architectures and a real (character-level) tokenizer, built in code.

Tests, the GPU check script and offline demos use them: no download, no weights on disk, and
the same loading and decoding code paths as the real models.
"""

from __future__ import annotations

import string

import torch

SPECIALS = ["<pad>", "<s>", "</s>"]
CHARS = list(string.ascii_letters + string.digits + " .,;:!?'\"-()\n")


def tiny_tokenizer(reverse: bool = False):
    """A character-level tokenizer; ``reverse=True`` numbers the characters the other way round
    (same size, different ids: a tokenizer a draft must not be paired with)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = CHARS[::-1] if reverse else CHARS
    vocab = {t: i for i, t in enumerate(SPECIALS + chars)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<s>",
                                  eos_token="</s>")
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant:{% endif %}")
    return tok


def tiny_llama(seed: int = 0, layers: int = 4, hidden: int = 64, vocab_size: int | None = None,
               sharpness: float = 1.0, dtype: torch.dtype = torch.float32):
    """A random LlamaForCausalLM over the tiny tokenizer's vocabulary.

    ``sharpness`` scales the output layer: larger gives peakier distributions (more agreement
    between two random models under greedy decoding is not expected either way).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    n_vocab = vocab_size or len(SPECIALS) + len(CHARS)
    cfg = LlamaConfig(vocab_size=n_vocab, hidden_size=hidden, intermediate_size=hidden * 2,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    return model.to(dtype).eval()


def save_tiny(folder, seed: int = 0, reverse_tokenizer: bool = False, **kwargs) -> str:
    """Save a tiny model and its tokenizer to ``folder`` (the layout of a Hub repository)."""
    tiny_llama(seed=seed, **kwargs).save_pretrained(folder)
    tiny_tokenizer(reverse_tokenizer).save_pretrained(folder)
    return str(folder)


def synthetic_tokenizer(vocab_size: int):
    """A tokenizer with ``vocab_size`` made-up tokens ("<17>"...), for models built from a config at
    realistic sizes (random weights) where only ids, shapes and timings matter."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"<{i}>": i for i in range(vocab_size)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<0>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<0>", eos_token="<2>", bos_token="<1>")


def llama_from_config(hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
                      vocab_size: int = 49152, seed: int = 0, dtype=torch.float32, device="cpu"):
    """A randomly initialised Llama at a realistic size (e.g. SmolLM2-1.7B's shapes)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=8192, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype)
    return model.eval()
