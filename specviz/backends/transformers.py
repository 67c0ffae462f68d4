"""The transformers backend: a causal LM plus its KV cache behind the :class:`~specviz.backends.base.Target`
verbs, and loading models and tokenizers (device, dtype, a cache across runs).

Invariant kept by the engine: the cache holds the first ``cached`` tokens of the running
sequence; ``feed`` appends tokens and returns their logits; ``rollback`` crops rejected
positions off the end (no recomputation of the prefix).
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from itertools import cycle, islice
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from ..errors import SpecvizError
from ..costs import fit_profile
from ..trace import median, spread
from .base import Timer
from . import exact
from .kv import roomy
from .cpu_kernels import enable_cpu_gqa, pack_linears

if TYPE_CHECKING:  # pragma: no cover
    from ..registry import ModelSpec, Source

_COSTS: dict[tuple, list[float]] = {}
PROFILE_CONTEXT = 200  # tokens of context the cost profile is measured after
PROFILE_ROUNDS = 5  # timed passes per length (the fastest counts: see costs.fit_profile)
PROFILE_ATTEMPTS = 3  # the whole measurement again while its repeats disagree by more than PROFILE_NOISE
PROFILE_NOISE = 0.3  # median over lengths of max / min - 1 of the rounds


def model_eos_ids(model: torch.nn.Module, tokenizer=None) -> set[int]:
    """End-of-sequence ids from the tokenizer and the model's generation/config settings."""
    ids: set[int] = set()
    for src in (getattr(tokenizer, "eos_token_id", None),
                getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                getattr(getattr(model, "config", None), "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(i) for i in src)
    return ids


class CachedLM:
    """A transformers causal LM and its KV cache: the transformers implementation of ``Target``
    (drafters that run a model use it too)."""

    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None, eos: set[int] | None = None,
                 info: dict | None = None):
        self.model = model
        self.config = model.config
        self.device = next(model.parameters()).device
        head = model.get_output_embeddings()  # a quantized head has no weight tensor, only out_features
        out_features = getattr(head, "out_features", None) or head.weight.shape[0]
        # slice logits to the vocabulary shared with the tokenizer / the other model
        self.vocab_size = min(vocab_size or out_features, out_features)
        self._eos = set(eos) if eos is not None else model_eos_ids(model)
        self._info = dict(info or {})
        self.cache: DynamicCache | None = None
        self.cached = 0

    @property
    def context_length(self) -> int:
        text_cfg = getattr(self.config, "get_text_config", lambda: self.config)()
        return int(getattr(text_cfg, "max_position_embeddings", 0) or 1 << 30)

    @property
    def eos_ids(self) -> set[int]:
        return self._eos

    def describe(self) -> dict:
        return dict(self._info) or {"device": str(self.device),
                                    "dtype": str(next(self.model.parameters()).dtype).replace("torch.", "")}

    def timer(self) -> Timer:
        return Timer(self.device)

    def reset(self) -> None:
        exact.check_threads(self.model)  # a model loaded in another thread: checked at this one's count
        self.cache = DynamicCache(config=self.config)
        self.cache.activate_past_recording()  # sliding-window layers must stay croppable
        roomy(self.cache)  # appends in place, no torch.cat copy of the whole cache per step
        self.cached = 0

    @torch.inference_mode()
    def feed(self, tokens: list[int], keep_logits: int | None = None) -> torch.Tensor:
        """Append ``tokens`` to the cache; return float32 CPU logits of the last ``keep_logits``
        positions (all by default) as (n, vocab)."""
        if self.cache is None:
            self.reset()
        n = len(tokens)
        keep = n if keep_logits is None else keep_logits
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, cache=self.cache, use_cache=True, logits_to_keep=keep)
        self.cached += n
        return out.logits[0, -keep:, : self.vocab_size].float().cpu()

    def cost_profile(self, max_tokens: int, context: list[int]) -> list[float]:
        """v[g]: the time of one forward pass over g + 1 tokens relative to a 1-token pass, for
        g = 0..max_tokens - 1, measured on this model and device (once per process, then reused).

        Cost-aware drafters use it to propose only what pays on this hardware. Leaves the cache empty."""
        key = (id(self.model), str(self.device))
        known = _COSTS.get(key, [])
        if len(known) >= max_tokens:
            return known[:max_tokens]
        # a context of the length answers run at (a pass's attention grows with it), from the given ids
        n_ctx = max(1, min(PROFILE_CONTEXT, self.context_length - max_tokens - 1))
        ctx = list(islice(cycle(list(context[:n_ctx]) or [0]), n_ctx))
        self.reset()
        self.feed(ctx, keep_logits=1)
        probe = list(islice(cycle(ctx), max_tokens))
        best = None  # (noise, timings) of the quietest attempt
        for _ in range(PROFILE_ATTEMPTS):
            ms: list[list[float]] = [[] for _ in range(max_tokens)]
            for _ in range(PROFILE_ROUNDS):
                for n in range(1, max_tokens + 1):
                    with Timer(self.device) as t:
                        self.feed(probe[:n])
                    self.rollback(len(ctx))
                    ms[n - 1].append(t.ms)
            noise = median([s for s in map(spread, ms) if s is not None])
            if best is None or noise < best[0]:
                best = (noise, ms)
            if noise <= PROFILE_NOISE:
                break  # a quiet machine: one attempt (a busy one measured a flat 1.0 for every length)
        costs = fit_profile(best[1])
        _COSTS[key] = costs
        self.reset()
        return costs

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` cached positions."""
        drop = self.cached - length
        if drop > 0:
            self.cache.crop(-drop)
            self.cached = length


def check_exit_layers(layers: int, total: int) -> None:
    """An early exit after ``layers`` of a target's ``total`` decoder layers: 1 to total - 1."""
    if not 1 <= layers < total:
        raise SpecvizError(f"early-exit layers must be between 1 and {total - 1}, got {layers}")


def early_exit_view(model: torch.nn.Module, layers: int) -> torch.nn.Module:
    """The target's first ``layers`` decoder layers + its final norm + its head, sharing weights.

    No extra parameters: a shallow structural copy whose layer list is truncated.
    """
    inner = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    total = len(inner.layers)
    check_exit_layers(layers, total)
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    for key in ("layer_types",):
        if getattr(config, key, None) is not None:
            setattr(config, key, list(getattr(config, key))[:layers])
    view_inner = copy.copy(inner)
    view_inner._modules = dict(inner._modules)
    view_inner.layers = torch.nn.ModuleList(list(inner.layers)[:layers])
    view_inner.config = config
    view = copy.copy(model)
    view._modules = dict(model._modules)
    for name, child in model._modules.items():
        if child is inner:
            view._modules[name] = view_inner
    view.config = config
    return view


# ---- loading ---------------------------------------------------------------------------------

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
    kernels: str = "torch"  # "mkl-packed" when cpu_kernels packed the CPU linears at load, "exact" in the exact mode
    fallback: str | None = None  # why the registry's first choice of source failed, where it did

    def info(self) -> dict:
        n = sum(p.numel() for p in self.model.parameters())
        return {"name": self.name, "source": self.source, "device": str(self.device),
                "dtype": str(self.dtype).replace("torch.", ""), "parameters": n,
                "kernels": self.kernels,
                **({"fallback": self.fallback} if self.fallback else {}),
                **({"attention": self.model._svz_attention} if hasattr(self.model, "_svz_attention") else {}),
                **({"lean_layers": self.model._svz_lean} if getattr(self.model, "_svz_lean", 0) else {})}


_CACHE: dict[tuple, Loaded] = {}
_MAX_CACHED = 3
_LOCK = threading.Lock()  # one load at a time: a start-up preload and a first click share it


def _quiet():
    """GGUF dequantisation prints progress bars and warnings; keep the CLI's output clean."""
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return stack


def load_model(spec: "ModelSpec", device: str = "auto", dtype: str = "auto", quiet: bool = True) -> Loaded:
    """Load (or reuse) a model and its tokenizer."""
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    src = spec.pick_source()
    key = (spec.name, src, str(dev), str(dt), exact.mode())
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
        try:
            loaded = _load_source(spec.name, src, dev, dt, quiet)
        except SpecvizError as first:  # a Hub source that failed: the next Hub source, if any
            loaded = None
            for alt in spec.sources[spec.sources.index(src) + 1:]:
                if src.kind != "hub" or alt.kind != "hub":
                    continue
                try:
                    loaded = _load_source(spec.name, alt, dev, dt, quiet)
                except SpecvizError:
                    continue
                logging.getLogger("specviz").warning("%s; loaded %s instead", first, alt.describe())
                loaded.fallback = str(first)
                break
            if loaded is None:
                raise
        if len(_CACHE) >= _MAX_CACHED:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = loaded
        return loaded


def is_loaded(spec: "ModelSpec", device: str = "auto", dtype: str = "auto") -> bool:
    dev = pick_device(device)
    src = spec.offline_source() or spec.pick_source()
    return (spec.name, src, str(dev), str(pick_dtype(dtype, dev)), exact.mode()) in _CACHE


_HUB_CHECK: dict[str, tuple[float, bool]] = {}


def hub_reachable(host: str = "huggingface.co") -> bool:
    """Whether the Hub can be reached at all: False at once when offline (HF_HUB_OFFLINE, or the
    name does not resolve), instead of a download that retries for most of a minute. Only a name
    lookup, remembered for a minute."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    now = time.monotonic()
    known = _HUB_CHECK.get(host)
    if known and now - known[0] < 60:
        return known[1]
    try:
        socket.getaddrinfo(host, 443)
        ok = True
    except OSError:
        ok = False
    _HUB_CHECK[host] = (now, ok)
    return ok


def _load_source(name: str, src: "Source", dev: torch.device, dt: torch.dtype, quiet: bool) -> Loaded:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolved = src.resolve()
    folder, gguf = resolved if resolved else (src.ref, None)
    if resolved is None and src.kind == "hub" and not hub_reachable():
        raise SpecvizError(f"could not load model {name!r}: it is only on the Hugging Face Hub ({src.ref}), "
                           "which this machine cannot reach (offline); pick a pair or model not tagged "
                           "\"needs the Hub\" (`python -m specviz pairs` lists them; the page's menus tag them too)")
    if src.kind == "hub" and src.gguf:
        folder, gguf = _hub_gguf(name, src, resolved)
    kwargs = {"gguf_file": gguf} if gguf else {}
    if src.kind == "hub" and src.revision and not gguf:
        kwargs["revision"] = src.revision
    try:
        with (_quiet() if quiet else contextlib.nullcontext()):
            tok = AutoTokenizer.from_pretrained(folder, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dt, **kwargs)
    except (OSError, ValueError, ImportError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SpecvizError(f"could not load model {name!r} from {src.describe()}: {first}") from None
    model = model.to(dev).eval()
    kernels = cpu_kernels(model, name)
    return Loaded(name, model, tok, src.describe(), dev, dt, kernels)


_VERIFIED: dict[tuple, bool] = {}  # (path, size, mtime) -> the file matched its sha256


def _hub_gguf(name: str, src: "Source", resolved) -> tuple[str, str]:
    """A GGUF file from the Hub: the cached copy, else downloaded (at the source's revision), then
    checked against the source's sha256; returns (its folder, its name) to load as a local GGUF."""
    if resolved:
        path = os.path.join(*resolved)
    else:
        try:
            from huggingface_hub import hf_hub_download

            path = hf_hub_download(src.ref, src.gguf, revision=src.revision)
        except Exception as e:  # network, a missing repo or file: one line, the next source may serve
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SpecvizError(f"could not download {src.gguf} for model {name!r} from {src.describe()}: {first}") from None
    if src.sha256:
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
        if key not in _VERIFIED:
            import hashlib

            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    digest.update(block)
            _VERIFIED[key] = digest.hexdigest() == src.sha256
        if not _VERIFIED[key]:
            raise SpecvizError(f"could not load model {name!r}: {path} does not have the SHA-256 models.yaml "
                               f"pins for {src.describe()} ({src.sha256[:12]}...)")
    return os.path.dirname(path), os.path.basename(path)


def cpu_kernels(model: torch.nn.Module, name: str = "model") -> str:
    """Pick the kernels of a loaded model: the exact mode (row-invariant, specviz.backends.exact) for
    float32 CPU models unless ``SPECVIZ_EXACT=0``; else MKL-packed linears (or torch's own)."""
    p = next(model.parameters())
    wanted = exact.mode()
    if wanted == "on" or (wanted == "auto" and p.device.type == "cpu" and p.dtype == torch.float32
                          and os.environ.get("SPECVIZ_PACKED", "1") != "0"):
        try:
            exact.enable(model)
            return "exact"
        except SpecvizError as e:
            if wanted == "on":
                raise SpecvizError(f"could not load model {name!r} in the exact mode: {e}") from None
    packed = pack_linears(model)
    if p.device.type == "cpu":
        enable_cpu_gqa()
    return "mkl-packed" if packed else "torch"


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


