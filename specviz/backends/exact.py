"""Exact by construction (fp32, CPU): a token's logits have the same bits whether the target scores
it alone or inside a verify pass of any length. On by default for float32 CPU models.

Why greedy speculative decoding could part from vanilla decoding at all: a verify pass multiplies
g + 1 rows by every weight matrix, a plain step one row, and the BLAS takes another kernel (and so
another summation order) for 1-3 rows than for 4 or more; attention over several queries runs
another kernel than attention for one. The results differ in the last bits (~1e-7 per layer, up to
~1e-4 in a logit), which flips the argmax where the top two logits are that close. This mode
removes the difference instead of tolerating it ("batch-invariant" kernels):

* every ``Linear`` runs oneDNN's GEMM with its weight prepared once, and few-row passes are padded
  with zero rows (1-3 rows to 4, or to a multiple of 4 where the machine needs it), so every pass
  takes the same kernel and a row's bits depend neither on how many rows share the pass nor on
  where it sits. This is checked on each layer shape at load, at the current thread count: where
  no padding gives it, the mode is not used (``SPECVIZ_EXACT=1`` then refuses to load);
* attention computes every token of a pass in one product per KV head, each token's key span
  padded to a whole block of keys (masked): a row's bits then depend neither on the rows beside it
  nor on how many keys follow its own, so a token's attention is the same in a verify pass as in a
  plain step (checked per head layout at load; where the check fails, one call per token, the call
  a plain step makes). The padding reads the KV cache buffer's spare room, no copy (``kv.py``);
* norms, activations and rotary embeddings already work row by row (Llama-form RMSNorms run as
  torch's one ``rms_norm`` call where that gives the module's own bits: checked at load).

It also makes verify passes cheaper: oneDNN's prepared GEMM takes 4 rows in about the time MKL
takes one (measured on this project's AMD EPYC: a 4-token pass of SmolLM2-135M 54 ms against a
1-token MKL step of 59 ms; 11 tokens 76 ms against 122 ms). Vanilla decoding runs in the same mode,
padded, so it gets the same kernels and the speedup compares like with like.
It covers float32 on a CPU; bf16 and GPU kernels are not covered (see README, What is guaranteed).
``SPECVIZ_EXACT=0`` switches it off (torch's kernels with MKL-packed linears), ``=1`` requires it.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ..errors import SpecvizError
from .kv import room

MAX_ROWS = 32  # passes up to this many rows (a verify pass of gamma <= 31) are row-invariant (checked)
PACK_ROWS = 32  # the row count oneDNN's weight layout is prepared for
ATTENTION = "specviz_exact"
# How few-row passes are padded, tried in order until every layer shape passes the check:
# "min4" pads 1-3 rows to 4 (oneDNN and MKL take a matrix-vector kernel below 4 rows);
# "mult4" pads to a multiple of 4 (MKL with 2 threads splits 5-7 and 9-11 rows otherwise than 4, 8, 12+).
POLICIES = ("min4", "mult4")


def mode() -> str:
    """``SPECVIZ_EXACT``: "auto" (default: on for float32 CPU models where the check passes), "on"
    (required: loading fails where it cannot hold) or "off" (torch's kernels, MKL-packed)."""
    v = os.environ.get("SPECVIZ_EXACT", "auto").strip().lower()
    if v in ("1", "true", "yes", "on"):
        return "on"
    if v in ("0", "false", "no", "off"):
        return "off"
    if v not in ("", "auto"):  # a typo would otherwise run in whichever mode "auto" picks, without a word
        raise SpecvizError(f"SPECVIZ_EXACT must be auto, 1 (on) or 0 (off), got {v!r}")
    return "auto"


def onednn_available() -> bool:
    return hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") \
        and torch.backends.mkldnn.is_available()


def padded_rows(rows: int, policy: str) -> int:
    if rows > MAX_ROWS:
        return rows
    if policy == "mult4":
        return -(-rows // 4) * 4
    return max(rows, 4)


class ExactLinear(torch.nn.Linear):
    """A ``Linear`` whose every row is computed by the same kernel however many rows share the pass:
    passes of up to ``MAX_ROWS`` rows are padded with zero rows as the layer's policy says, and go
    through oneDNN with the weight prepared once (or torch's GEMM where oneDNN is missing)."""

    _svz_dnn: torch.Tensor | None
    _svz_policy: str

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        width = x.shape[-1]
        x2 = x.reshape(-1, width)
        rows = x2.shape[0]
        want = padded_rows(rows, self._svz_policy)
        if want != rows:
            x2 = F.pad(x2, (0, 0, 0, want - rows))  # zero rows
        elif not x2.is_contiguous():
            x2 = x2.contiguous()
        if self._svz_dnn is not None:
            y = torch.ops.mkldnn._linear_pointwise(x2, self._svz_dnn, self.bias, "none", [], "")
        else:
            y = F.linear(x2, self.weight, self.bias)
        if want != rows:
            y = y[:rows]
        return y.view(*x.shape[:-1], y.shape[-1])


# The fewest query rows a product of ``_blocks`` may take, tried in order per head layout: a plain
# step's product has ``heads // kv_heads`` rows (3 for SmolLM2), and MKL's batched GEMM takes
# another kernel for few rows than for many, so a token alone got other bits than inside a pass.
# On an AVX2 AMD EPYC (Zen 3) that was below 4 rows; on an Intel Xeon with AMX, for 128-wide heads,
# below 8 (4-row products failed the check for (32, 8, 128), (8, 8, 128), (32, 32, 128)). Padded
# with zero rows (masked nowhere: their scores are finite), every product takes one kernel.
ROW_FLOORS = (4, 8)


def exact_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                    **kwargs):
    """transformers attention (causal, sequences of equal length: specviz never pads), computed so
    that a token's output has the same bits in a pass of any length (see below)."""
    if kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None:
        raise SpecvizError("the exact mode supports causal attention without position bias or softcap")
    q_len, kv_len = query.shape[2], key.shape[2]
    past = kv_len - q_len
    sliding = getattr(module, "sliding_window", None)
    if q_len > MAX_ROWS:  # a long prefill: not a pass that verify and plain steps share
        gqa = key.shape[1] != query.shape[1]
        if past == 0 and not sliding:  # a fresh prompt: torch's causal kernel skips the masked half
            out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=gqa)
            return out.transpose(1, 2).contiguous(), None
        cols = torch.arange(kv_len, device=query.device)[None, :]
        last = past + torch.arange(q_len, device=query.device)[:, None]
        allowed = cols <= last
        if sliding:
            allowed &= cols > last - sliding
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling, enable_gqa=gqa)
        return out.transpose(1, 2).contiguous(), None
    b, heads, _, d = query.shape
    kv_heads = key.shape[1]
    rows = query_rows(heads, kv_heads, d, query.dtype)
    if rows is not None:
        return _blocks(query, key, value, scaling, past, sliding, rows), None
    return _per_row(query, key, value, scaling, past, sliding), None


def _blocks(query, key, value, scaling, past: int, sliding: int | None, min_rows: int) -> torch.Tensor:
    """Every token of the pass in one product. The query heads that share a KV head are rows of one
    product with that KV head's keys (head h reads KV head h // rep): no copy of K and V per query
    head. Each token attends to a key span padded to a whole number of BLOCK keys, the padding and
    the keys after its own masked: a row's bits then depend neither on the rows beside it nor on how
    many keys follow its own, so a verify pass computes each token as a plain step does. Tokens
    whose spans round to different lengths (a pass crossing a BLOCK boundary) go in separate
    products, each of at least ``min_rows`` query rows (zero rows added: see ROW_FLOORS). (Without
    the padding the softmax's and the value product's sums change their order with the key count;
    the score product is the same for any number of rows: checked at load.)"""
    b, heads, q_len, d = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    rep = heads // kv_heads
    scale = scaling if scaling is not None else d ** -0.5
    outs = []
    for a, z, span, bias in _plan(past, q_len, sliding, rep, min_rows):
        q = query[:, :, a:z].reshape(b * kv_heads, rep * (z - a), d)
        rows = q.shape[1]
        if rows < bias.shape[0]:  # a few-row product, padded with zero rows (see ROW_FLOORS)
            q = F.pad(q, (0, 0, 0, bias.shape[0] - rows))
        k, v = key[:, :, :span], value[:, :, :span]
        if span > kv_len:  # keys past the cache, masked: the cache buffer's room (no copy), else zeros
            k, v = room(key, span), room(value, span)
            if k is None or v is None:
                k, v = F.pad(key, (0, 0, 0, span - kv_len)), F.pad(value, (0, 0, 0, span - kv_len))
        # scores scaled and masked in the product's epilogue (the mask adds 0 or -inf: the room's
        # contents are finite, zeros or old keys), then one value product
        p = torch.baddbmm(bias.to(q.dtype), q, k.reshape(b * kv_heads, span, d).transpose(-1, -2), alpha=scale).softmax(-1)
        o = torch.bmm(p, v.reshape(b * kv_heads, span, d))
        outs.append(o[:, :rows].reshape(b, heads, z - a, d))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, 2)
    return out.transpose(1, 2).contiguous()


def _per_row(query, key, value, scaling, past: int, sliding: int | None) -> torch.Tensor:
    """One call per token against the keys up to its own position: the call a plain step makes for
    that token (row-invariant by construction; where the batched form's check fails)."""
    b, heads, q_len, d = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    grouped = query.transpose(1, 2).reshape(b, q_len, kv_heads, heads // kv_heads, d)
    rows = []
    for j in range(q_len):
        end = past + j + 1
        start = max(0, end - sliding) if sliding else 0
        k, v = (key, value) if start == 0 and end == kv_len else (key[:, :, start:end], value[:, :, start:end])
        rows.append(F.scaled_dot_product_attention(grouped[:, j], k, v, scale=scaling))
    out = torch.stack(rows, 1) if q_len > 1 else rows[0].unsqueeze(1)
    return out.reshape(b, q_len, heads, d)


_batched_ok: dict[tuple, int | None] = {}  # layout -> the row floor under which it holds (None: none)


def batched_attention_holds(heads: int, kv_heads: int, d: int, dtype=torch.float32) -> bool:
    """Whether ``_blocks`` gives a token the same bits in passes of 1..12 tokens as alone, for this
    head layout, dtype and thread count on this machine's kernels, under one of ``ROW_FLOORS``
    (checked once, on random data, across block boundaries); where it does not, attention runs per
    row."""
    return query_rows(heads, kv_heads, d, dtype) is not None


@torch.inference_mode()
def query_rows(heads: int, kv_heads: int, d: int, dtype=torch.float32) -> int | None:
    """The fewest query rows ``_blocks``' products must have for this layout to hold (the first of
    ``ROW_FLOORS`` that passes the check), or None where none does."""
    key = (heads, kv_heads, d, dtype, torch.get_num_threads())
    if key not in _batched_ok:
        _batched_ok[key] = None
        for floor in ROW_FLOORS:
            gen = torch.Generator().manual_seed(1)
            if all(_same_bits_alone(heads, kv_heads, d, dtype, past, gen, floor) for past in (20, 60, 250)):
                _batched_ok[key] = floor
                break
    return _batched_ok[key]


def _same_bits_alone(heads: int, kv_heads: int, d: int, dtype, past: int, gen, min_rows: int, rows: int = 12) -> bool:
    """Passes of 2..rows tokens after ``past`` give each token the bits it gets alone (random data)."""
    q = torch.randn(1, heads, rows, d, generator=gen, dtype=dtype)
    k, v = (torch.randn(1, kv_heads, past + rows, d, generator=gen, dtype=dtype) for _ in range(2))
    alone = [_blocks(q[:, :, j:j + 1], k[:, :, :past + j + 1], v[:, :, :past + j + 1], None, past + j, None,
                     min_rows)[:, 0] for j in range(rows)]
    for n in range(2, rows + 1):
        full = _blocks(q[:, :, :n], k[:, :, :past + n], v[:, :, :past + n], None, past, None, min_rows)
        if not all(torch.equal(full[:, j], alone[j]) for j in range(n)):
            return False
    return True


BLOCK = 64  # the key spans attention is padded to (a multiple of the float32 vector width)
_plans: dict = {}


def _plan(past: int, q_len: int, sliding: int | None, rep: int, min_rows: int) -> list:
    """The products of one pass (the same for every layer, kept for the next layers): for each run
    of tokens whose key spans round to the same length, (first row, end row, padded span, the mask
    added to its scores: -inf on the keys a row must not see, 0 elsewhere; rows in the products'
    order, query head-major, padded to ``min_rows`` rows)."""
    key = (past, q_len, sliding, rep, min_rows)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    spans = [-(-(past + j + 1) // BLOCK) * BLOCK for j in range(q_len)]
    plan, a = [], 0
    while a < q_len:
        z = a
        while z < q_len and spans[z] == spans[a]:
            z += 1
        cols = torch.arange(spans[a])[None, :]
        end = past + torch.arange(a, z)[:, None] + 1  # the keys a row sees: [start, end)
        masked = cols >= end
        if sliding:
            masked |= cols < end - sliding
        bias = torch.zeros(masked.shape).masked_fill_(masked, float("-inf")).repeat(rep, 1)
        if bias.shape[0] < min_rows:  # the padding rows see every key (their scores are finite)
            bias = F.pad(bias, (0, 0, 0, min_rows - bias.shape[0]))
        plan.append((a, z, spans[a], bias))
        a = z
    if len(_plans) > 64:
        _plans.clear()
    _plans[key] = plan
    return plan


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, exact_attention)


@torch.inference_mode()
def _row_invariant(layer: ExactLinear, gen: torch.Generator) -> bool:
    """Whether a row's bits depend neither on how many rows share the pass nor on where it sits."""
    x = torch.randn(MAX_ROWS, layer.in_features, generator=gen, dtype=layer.weight.dtype)
    full = layer(x)
    for rows in range(1, MAX_ROWS):
        if not torch.equal(layer(x[:rows]), full[:rows]):
            return False
    for j in range(MAX_ROWS):  # a plain step puts its token first
        if not torch.equal(layer(x[j:j + 1])[0], full[j]):
            return False
    return True


_FUSED_NORMS: dict[type, type] = {}


def _fused_rms_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    return torch.rms_norm(hidden_states, self.weight.shape, self.weight, self.variance_epsilon)


@torch.inference_mode()
def fuse_norms(model: torch.nn.Module, gen: torch.Generator) -> int:
    """RMSNorms of the Llama form (``weight * x * rsqrt(mean(x^2) + eps)``) as torch's one
    ``rms_norm`` call instead of six tensor operations from Python (61 norms a pass on SmolLM2):
    only where that gives the same bits as the module's own forward on random rows, so the model's
    numbers do not change (Gemma's ``1 + weight`` form fails the check and is left as it is)."""
    fused = 0
    for module in model.modules():
        cls = type(module)
        if not cls.__name__.endswith("RMSNorm") or "_svz_base" in cls.__dict__:
            continue
        w, eps = getattr(module, "weight", None), getattr(module, "variance_epsilon", None)
        if not isinstance(w, torch.Tensor) or w.dim() != 1 or not isinstance(eps, float):
            continue
        x = torch.randn(2, 7, w.shape[0], generator=gen, dtype=w.dtype)
        want = cls.forward(module, x)  # the class's own forward, without the module's hooks
        if not torch.equal(_fused_rms_forward(module, x), want):
            continue
        if cls not in _FUSED_NORMS:
            _FUSED_NORMS[cls] = type(cls.__name__, (cls,), {"forward": _fused_rms_forward, "_svz_base": cls})
        module.__class__ = _FUSED_NORMS[cls]
        fused += 1
    return fused


def _prepare(module: torch.nn.Linear, dnn: bool, gen: torch.Generator, policy_of: dict) -> bool:
    """Make ``module`` an ``ExactLinear``: its weight prepared for oneDNN, the first padding policy
    under which its rows are row-invariant (one check per weight shape). False where none is."""
    module.__class__ = ExactLinear
    w = module.weight.detach()
    module._svz_dnn = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS) if dnn else None
    shape = tuple(w.shape)
    if shape not in policy_of:
        policy_of[shape] = None
        for policy in POLICIES:
            module._svz_policy = policy
            if _row_invariant(module, gen):
                policy_of[shape] = policy
                break
    if policy_of[shape] is None:
        return False
    module._svz_policy = policy_of[shape]
    module._svz_threads = torch.get_num_threads()  # what the check ran at (check_threads compares)
    return True


def _text_config(model: torch.nn.Module):
    """The language model's own config (a multimodal model nests it)."""
    return model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config


def _lean_layers(model: torch.nn.Module, dnn: bool, gen: torch.Generator, policy_of: dict) -> int:
    """The lean decoder layers (``lean.py``) where they fit and pass their check; the joined
    products replace the separate ones, whose weights become views of the joined weights (no copy
    kept) and which are no longer called."""
    from . import lean

    if os.environ.get("SPECVIZ_LEAN", "1").strip().lower() in ("0", "false", "no", "off"):
        return 0
    plan = [(layer, qkv, gu) for layer, qkv, gu in lean.candidates(model)
            if _prepare(qkv, dnn, gen, policy_of) and _prepare(gu, dnn, gen, policy_of)]
    done = lean.install(model, plan, int(getattr(_text_config(model), "vocab_size", 0) or 0))
    if done:
        for layer, qkv, gu in plan:
            for joined, owner, parts in ((qkv, layer.self_attn, ("q_proj", "k_proj", "v_proj")),
                                         (gu, layer.mlp, ("gate_proj", "up_proj"))):
                row = 0
                for name in parts:
                    part = getattr(owner, name)
                    rows = part.weight.shape[0]
                    part.weight = torch.nn.Parameter(joined.weight[row:row + rows], requires_grad=False)
                    if part.bias is not None:
                        part.bias = torch.nn.Parameter(joined.bias[row:row + rows], requires_grad=False)
                    part._svz_dnn = None  # the joined product runs instead
                    part._svz_idle = True
                    row += rows
    return done


def enable(model: torch.nn.Module) -> int:
    """Switch a float32 CPU model to the exact mode in place; returns how many linears it covers.

    Raises SpecvizError where the mode cannot hold (not float32 on a CPU, or no padding policy gives
    row-invariant layers with this machine's kernels); the model is then left as it was."""
    p = next(model.parameters(), None)
    if p is None or p.device.type != "cpu" or p.dtype != torch.float32:
        raise SpecvizError("the exact mode is for float32 models on a CPU")
    from .cpu_kernels import unpack_linears

    unpack_linears(model)
    dnn = onednn_available()
    gen = torch.Generator().manual_seed(0)
    policy_of: dict[tuple, str | None] = {}
    layers = [m for m in model.modules() if type(m) is torch.nn.Linear or isinstance(m, ExactLinear)]
    for module in layers:
        if not _prepare(module, dnn, gen, policy_of):
            disable(model)
            raise SpecvizError(f"the exact mode cannot hold here: this machine's GEMM gives a {tuple(module.weight.shape)} "
                               "layer's rows other bits depending on the rows beside them")
    text = _text_config(model)
    heads = int(getattr(text, "num_attention_heads", 0) or 0)
    if heads:  # decide the attention form now, outside any run's clock
        kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
        d = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        model._svz_attention = "batched" if batched_attention_holds(heads, kv_heads, d, p.dtype) else "per row"
    model._svz_norms = fuse_norms(model, gen)
    _register()
    model._svz_attn_before = model.config._attn_implementation
    model.set_attn_implementation(ATTENTION)
    model._svz_exact = True
    model._svz_lean = _lean_layers(model, dnn, gen, policy_of)
    return len(layers)


def disable(model: torch.nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, ExactLinear):
            module.__class__ = torch.nn.Linear
            for attr in ("_svz_dnn", "_svz_policy", "_svz_threads", "_svz_idle"):
                module.__dict__.pop(attr, None)
    from . import lean

    lean.uninstall(model)
    for module in model.modules():
        base = type(module).__dict__.get("_svz_base")
        if base is not None:
            module.__class__ = base
    model.__dict__.pop("_svz_attention", None)
    model.__dict__.pop("_svz_norms", None)
    model.__dict__.pop("_svz_lean", None)
    if getattr(model, "_svz_exact", False):
        model.set_attn_implementation(getattr(model, "_svz_attn_before", None) or "sdpa")
        model._svz_exact = False


def is_exact(model: torch.nn.Module) -> bool:
    return bool(getattr(model, "_svz_exact", False))


@torch.inference_mode()
def check_threads(model: torch.nn.Module) -> int:
    """The row-invariance check again, at this thread's thread count, for each layer last checked at
    another (the model loaded in another thread: the app loads on its decode thread, so this is a
    safety net). Which padding keeps a layer's rows invariant can depend on how its product is split
    across threads, so where a layer's policy fails, the others are tried, as a load would, and the
    one that holds is set on every layer of that shape. Attention's check is already per thread count
    (``query_rows``). Raises SpecvizError where none holds, at every run: rather no run than one that
    is not exact and says it is. Returns how many checks ran (0 when all were done at this count)."""
    if not is_exact(model):
        return 0
    n = torch.get_num_threads()
    layers = [m for m in model.modules() if isinstance(m, ExactLinear) and not m.__dict__.get("_svz_idle")]
    layers += [getattr(m, a) for m in model.modules() for a in ("_svz_qkv", "_svz_gate_up") if hasattr(m, a)]
    stale: dict[tuple, list] = {}  # (shape, oneDNN or not) -> its layers not checked at this count
    for layer in layers:
        if layer.__dict__.get("_svz_threads") != n:
            stale.setdefault((tuple(layer.weight.shape), layer._svz_dnn is None), []).append(layer)
    gen, checks = torch.Generator().manual_seed(0), 0
    for (shape, _), group in stale.items():
        first, before = group[0], group[0]._svz_policy
        holds = None
        for policy in (before,) + tuple(p for p in POLICIES if p != before):
            first._svz_policy = policy
            checks += 1
            if _row_invariant(first, gen):
                holds = policy
                break
        if holds is None:
            first._svz_policy = before
            raise SpecvizError(f"the exact mode's checks ran with {first.__dict__.get('_svz_threads')} threads when this "
                               f"model loaded, and no padding keeps a {shape} layer's rows invariant with {n}, the "
                               "thread count it would decode with: load it on the thread that decodes, or set "
                               "SPECVIZ_EXACT=0")
        for layer in group:
            layer._svz_policy, layer._svz_threads = holds, n
    return checks

