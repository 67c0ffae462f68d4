"""Loading models and tokenizers (device, dtype, a cache across runs) and assembling a pair."""

from __future__ import annotations

import contextlib
import io
import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from .datastore import load_datastore
from .drafters import Drafter, EarlyExitDrafter, ModelDrafter, PromptLookupDrafter
from .engine import DecodeConfig, encode_prompt, speculative_decode, vanilla_decode
from .errors import SpecvizError
from .kernels import enable_cpu_gqa, pack_linears
from .lm import CachedLM
from .registry import ModelSpec, PairSpec, Registry, Source

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def pick_device(device: str = "auto") -> torch.device:
    if device in (None, "", "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecvizError("device cuda was asked for, but no CUDA GPU is available")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise SpecvizError("device mps was asked for, but it is not available")
    if device not in ("cpu", "mps") and not device.startswith("cuda"):
        raise SpecvizError(f"unknown device {device!r} (use auto, cpu, cuda or mps)")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype in (None, "", "auto"):
        return torch.float32 if device.type == "cpu" else (torch.bfloat16 if device.type == "cuda" else torch.float16)
    if dtype not in DTYPES:
        raise SpecvizError(f"unknown dtype {dtype!r} (use auto, float32, bfloat16 or float16)")
    return DTYPES[dtype]


@dataclass
class Loaded:
    name: str
    model: torch.nn.Module
    tokenizer: object
    source: str
    device: torch.device
    dtype: torch.dtype
    kernels: str = "torch"  # "mkl-packed" when specviz.kernels packed the CPU linears at load

    def info(self) -> dict:
        n = sum(p.numel() for p in self.model.parameters())
        return {"name": self.name, "source": self.source, "device": str(self.device),
                "dtype": str(self.dtype).replace("torch.", ""), "parameters": n,
                "kernels": self.kernels}


_CACHE: dict[tuple, Loaded] = {}
_MAX_CACHED = 3
_LOCK = threading.Lock()  # one load at a time: a start-up preload and a first click share it


def _quiet():
    """GGUF dequantisation prints progress bars and warnings; keep the CLI's output clean."""
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return stack


def load_model(spec: ModelSpec, device: str = "auto", dtype: str = "auto", quiet: bool = True) -> Loaded:
    """Load (or reuse) a model and its tokenizer."""
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    src = spec.pick_source()
    key = (spec.name, src, str(dev), str(dt))
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
        loaded = _load_source(spec.name, src, dev, dt, quiet)
        if len(_CACHE) >= _MAX_CACHED:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = loaded
        return loaded


def is_loaded(spec: ModelSpec, device: str = "auto", dtype: str = "auto") -> bool:
    dev = pick_device(device)
    src = spec.offline_source() or spec.pick_source()
    return (spec.name, src, str(dev), str(pick_dtype(dtype, dev))) in _CACHE


def _load_source(name: str, src: Source, dev: torch.device, dt: torch.dtype, quiet: bool) -> Loaded:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolved = src.resolve()
    folder, gguf = resolved if resolved else (src.ref, None)
    kwargs = {"gguf_file": gguf} if gguf else {}
    try:
        with (_quiet() if quiet else contextlib.nullcontext()):
            tok = AutoTokenizer.from_pretrained(folder, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dt, **kwargs)
    except (OSError, ValueError, ImportError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SpecvizError(f"could not load model {name!r} from {src.describe()}: {first}") from None
    model = model.to(dev).eval()
    packed = pack_linears(model)
    if dev.type == "cpu":
        enable_cpu_gqa()
    return Loaded(name, model, tok, src.describe(), dev, dt, "mkl-packed" if packed else "torch")


def check_tokenizers(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """A draft model must share the target's tokenizer: the same vocabulary, id for id."""
    if target_tok is draft_tok:
        return
    tv, dv = target_tok.get_vocab(), draft_tok.get_vocab()
    if tv != dv:
        only_t = len(set(tv.items()) - set(dv.items()))
        only_d = len(set(dv.items()) - set(tv.items()))
        raise SpecvizError(
            f"tokenizers of {target_name!r} and {draft_name!r} differ ({only_t} entries only in the "
            f"target's, {only_d} only in the draft's); a draft must share the target's tokenizer")


@dataclass
class Pipeline:
    """A loaded target, its drafter and tokenizer: what the UI, CLI and bench drive."""

    name: str
    target: Loaded
    drafter: Drafter
    gamma: int
    draft: Loaded | None = None
    target_lm: CachedLM = field(init=False)

    def __post_init__(self) -> None:
        self.target_lm = CachedLM(self.target.model, len(self.target.tokenizer))

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def info(self) -> dict:
        d = {"target": self.target.info(), "draft": self.draft.info() if self.draft else {}}
        if not self.draft:
            d["draft"] = {"name": self.drafter.name, "device": str(self.target.device),
                          "dtype": str(self.target.dtype).replace("torch.", ""), "source": "the target's weights"
                          if self.drafter.kind == "early_exit" else "the prompt and output so far"}
        return d

    def warm_up(self, max_gamma: int | None = None) -> None:
        """Measure the verify costs a cost-aware drafter needs now, not during the first run."""
        if getattr(self.drafter, "wants_costs", False):
            self.target_lm.verify_costs((max_gamma or self.gamma) + 1, self.encode("Warm up, please."))

    def encode(self, prompt: str, chat: bool = True) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, chat)

    def speculative(self, prompt: str | list[int], cfg: DecodeConfig, chat: bool = True) -> Iterator:
        ids = prompt if isinstance(prompt, list) else self.encode(prompt, chat)
        return speculative_decode(self.target_lm, self.drafter, self.tokenizer, ids, cfg, self.info())

    def vanilla(self, prompt: str | list[int], cfg: DecodeConfig, chat: bool = True) -> Iterator:
        ids = prompt if isinstance(prompt, list) else self.encode(prompt, chat)
        return vanilla_decode(self.target_lm, self.tokenizer, ids, cfg, self.info())


def make_drafter(drafter: dict, target: Loaded, draft: Loaded | None) -> Drafter:
    kind = drafter.get("kind")
    vocab = len(target.tokenizer)
    if kind == "prompt_lookup":
        store = None
        if drafter.get("datastore"):
            store = load_datastore(drafter["datastore"])
            made_for = store.meta.get("vocab_size")
            if made_for is not None and made_for != vocab:
                raise SpecvizError(f"datastore {drafter['datastore']} was built for a vocabulary of "
                                   f"{made_for} tokens; {target.name} has {vocab}")
        return PromptLookupDrafter(int(drafter.get("max_ngram", 4)), int(drafter.get("min_ngram", 1)),
                                   bool(drafter.get("adaptive", True)), datastore=store)
    if kind == "early_exit":
        return EarlyExitDrafter(target.model, int(drafter.get("layers", 8)), vocab)
    if kind == "model":
        assert draft is not None
        return ModelDrafter(draft.model, f"draft {draft.name}", vocab)
    raise SpecvizError(f"unknown drafter kind {kind!r}")


def parse_drafter(text: str, registry: Registry) -> dict:
    """CLI/UI shorthand: 'lookup', 'lookup:N' (max n-gram), 'early-exit:L', or a model name."""
    head, _, arg = text.partition(":")
    if head in ("lookup", "prompt-lookup", "prompt_lookup"):
        return {"kind": "prompt_lookup", "max_ngram": int(arg) if arg else 4}
    if head in ("early-exit", "early_exit"):
        try:
            return {"kind": "early_exit", "layers": int(arg) if arg else 8}
        except ValueError:
            raise SpecvizError(f"early-exit layers must be a whole number, got {arg!r}") from None
    registry.model(text)
    return {"kind": "model", "model": text}


def build_pipeline(registry: Registry, pair: str | None = None, target: str | None = None,
                   drafter: str | dict | None = None, device: str = "auto", dtype: str = "auto",
                   gamma: int | None = None, progress: Callable[[str], None] | None = None) -> Pipeline:
    """Assemble a pair by name, or a target and a drafter named directly."""
    say = progress or (lambda msg: None)
    if pair and target:
        raise SpecvizError("give either a pair or a target (with a drafter), not both")
    if target:
        spec = PairSpec(f"{target}+{drafter or 'lookup'}", target,
                        drafter if isinstance(drafter, dict) else parse_drafter(drafter or "lookup", registry),
                        gamma or 4)
        registry.model(target)
    else:
        spec = registry.pair(pair or registry.default())
        if drafter:
            spec = PairSpec(spec.name, spec.target, drafter if isinstance(drafter, dict)
                            else parse_drafter(drafter, registry), spec.gamma, spec.description)
    say(f"loading target {spec.target}")
    tgt = load_model(registry.model(spec.target), device, dtype)
    drf = None
    if spec.draft_model:
        say(f"loading draft {spec.draft_model}")
        drf = load_model(registry.model(spec.draft_model), device, dtype)
        check_tokenizers(tgt.tokenizer, drf.tokenizer, spec.target, spec.draft_model)
    return Pipeline(spec.name, tgt, make_drafter(spec.drafter, tgt, drf), gamma or spec.gamma, drf)
