"""Llama-form decoder layers in fewer operations (part of the exact mode: float32 on a CPU).

A small model's decode step on a CPU is mostly not arithmetic: SmolLM2-135M's 30 layers make ~13
module calls and ~70 tensor operations each from Python, and the weights themselves are only half
of a step's time. For the layer classes listed in ``LEAN`` (Llama, Qwen2: same structure), the
exact mode gives each layer one forward that makes the same computation with less of that:

* q, k and v in one product (their weights side by side, one oneDNN-prepared matrix), gate and up
  in one, each output a view of the product;
* the rotary embedding applied to q and k in one go (they lie side by side in that product);
* the norms as torch's one ``rms_norm`` call (``exact.fuse_norms``: only where that gives the
  module's own bits), the attention and the linears called directly, not through module calls.

Each row still goes through the same kernels in a plain step as in a verify pass (the joined
products are padded and checked for row invariance like every other linear), so the exact mode's
guarantee is unchanged. A joined product may round otherwise than the separate ones (on this
project's Intel Xeon it gave the same bits: the tiny models' logits were identical, and SmolLM2's
greedy answers to 6 dev prompts too). Installed only where a layer has the expected parts, and
kept only where the model's logits on a test sequence match the stock layers' within
``TOLERANCE`` (``install``); ``exact.disable`` restores the stock classes, ``SPECVIZ_LEAN=0``
keeps them. Measured (Intel Xeon, 2 threads, SmolLM2-135M, 6 dev prompts x 3 rounds alternated in
one process, with the attention's fused scale and mask): vanilla 1.27x and speculative 1.20x
faster per token, the same outputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .exact import ExactLinear, _fused_rms_forward, exact_attention

LEAN = ("LlamaDecoderLayer", "Qwen2DecoderLayer")  # classes whose forward ``_forward`` reproduces
TOLERANCE = 1e-3  # max |logit difference| against the stock layers on the test sequence


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _forward(self, hidden_states: torch.Tensor, attention_mask=None, position_embeddings=None, position_ids=None,
             cache=None, use_cache=False, **kwargs) -> torch.Tensor:
    attn, mlp = self.self_attn, self.mlp
    n1, n2 = self.input_layernorm, self.post_attention_layernorm
    b, n = hidden_states.shape[:2]
    d, hq, hk = attn.head_dim, self._svz_heads, self._svz_kv_heads
    x = _fused_rms_forward(n1, hidden_states)  # the form fuse_norms checked for these norms
    qkv = ExactLinear.forward(self._svz_qkv, x)
    qk = qkv[..., : (hq + hk) * d].view(b, n, hq + hk, d).transpose(1, 2)  # (b, heads + kv heads, n, d)
    cos, sin = position_embeddings
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    qk = qk * cos + _rotate_half(qk) * sin  # the stock rotary's arithmetic, q and k at once
    q, k = qk[:, :hq], qk[:, hq:]
    v = qkv[..., (hq + hk) * d:].view(b, n, hk, d).transpose(1, 2)
    if cache is not None:
        k, v = cache.update(k, v, attn.layer_idx, kwargs=kwargs)
    out, _ = exact_attention(attn, q, k, v, attention_mask, scaling=attn.scaling)
    h = hidden_states + ExactLinear.forward(attn.o_proj, out.reshape(b, n, -1))
    x = _fused_rms_forward(n2, h)
    g, u = ExactLinear.forward(self._svz_gate_up, x).chunk(2, -1)
    return h + ExactLinear.forward(mlp.down_proj, F.silu(g) * u)


def _joined(parts: list[torch.nn.Linear]) -> torch.nn.Linear | None:
    """One Linear whose weight is the parts' side by side (None where their biases disagree)."""
    biases = [p.bias for p in parts]
    if any(b is None for b in biases) and not all(b is None for b in biases):
        return None
    w = torch.cat([p.weight.detach() for p in parts])
    out = torch.nn.Linear(w.shape[1], w.shape[0], bias=biases[0] is not None)
    out.weight = torch.nn.Parameter(w, requires_grad=False)
    if biases[0] is not None:
        out.bias = torch.nn.Parameter(torch.cat([b.detach() for b in biases]), requires_grad=False)
    return out


def fits(layer: torch.nn.Module) -> bool:
    """Whether a decoder layer has the parts ``_forward`` uses, in the Llama form."""
    if type(layer).__name__ not in LEAN:
        return False
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    norms = [getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None)]
    if attn is None or mlp is None or not all("_svz_base" in type(m).__dict__ for m in norms if m is not None) \
            or any(m is None for m in norms):
        return False  # the norms must be the checked rms_norm form
    names = ("q_proj", "k_proj", "v_proj", "o_proj")
    if not all(isinstance(getattr(attn, a, None), ExactLinear) for a in names):
        return False
    if not all(isinstance(getattr(mlp, a, None), ExactLinear) for a in ("gate_proj", "up_proj", "down_proj")):
        return False
    act = getattr(mlp, "act_fn", None)
    if not callable(act) or getattr(mlp.down_proj, "bias", None) is not None:
        return False
    x = torch.linspace(-8, 8, 97)
    if not torch.equal(act(x), F.silu(x)):  # SiLU, whatever its class
        return False
    d = getattr(attn, "head_dim", None)
    return isinstance(d, int) and attn.q_proj.out_features % d == 0 and attn.k_proj.out_features == attn.v_proj.out_features


def candidates(model: torch.nn.Module) -> list[tuple[torch.nn.Module, torch.nn.Linear, torch.nn.Linear]]:
    """(layer, joined q|k|v, joined gate|up) for each layer that fits."""
    inner = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    out = []
    for layer in getattr(inner, "layers", []):
        if not fits(layer):
            continue
        a, m = layer.self_attn, layer.mlp
        qkv, gu = _joined([a.q_proj, a.k_proj, a.v_proj]), _joined([m.gate_proj, m.up_proj])
        if qkv is not None and gu is not None:
            out.append((layer, qkv, gu))
    return out


_LEAN_CLASSES: dict[type, type] = {}


def install(model: torch.nn.Module, plan: list, vocab_size: int) -> int:
    """Give the layers of ``plan`` (from ``candidates``, joined linears already prepared as exact
    ones) the lean forward; kept only if the logits of a test sequence match the stock layers'."""
    if not plan:
        return 0
    ids = torch.tensor([[1, 17, 4, 250, 31, 7, 99, 3]]) % max(vocab_size, 1)
    with torch.inference_mode():
        stock = model(input_ids=ids, use_cache=False).logits
        for layer, qkv, gu in plan:
            cls = type(layer)
            if cls not in _LEAN_CLASSES:
                _LEAN_CLASSES[cls] = type("Lean" + cls.__name__, (cls,), {"forward": _forward, "_svz_base": cls})
            object.__setattr__(layer, "_svz_qkv", qkv)  # plain attributes: not submodules or parameters
            object.__setattr__(layer, "_svz_gate_up", gu)
            object.__setattr__(layer, "_svz_heads", layer.self_attn.q_proj.out_features // layer.self_attn.head_dim)
            object.__setattr__(layer, "_svz_kv_heads", layer.self_attn.k_proj.out_features // layer.self_attn.head_dim)
            layer.__class__ = _LEAN_CLASSES[cls]
        lean = model(input_ids=ids, use_cache=False).logits
    if not torch.isfinite(lean).all() or float((lean - stock).abs().max()) > TOLERANCE:
        uninstall(model)
        return 0
    return len(plan)


def uninstall(model: torch.nn.Module) -> None:
    for module in model.modules():
        if type(module) in _LEAN_CLASSES.values():
            module.__class__ = type(module)._svz_base
            for attr in ("_svz_qkv", "_svz_gate_up", "_svz_heads", "_svz_kv_heads"):
                module.__dict__.pop(attr, None)
