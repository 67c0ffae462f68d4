"""The exact mode: a token's logits have the same bits whether scored alone or inside a verify pass
of any length (fp32, CPU), so greedy speculative decoding equals vanilla decoding by construction."""

import copy

import pytest
import torch

from specviz.backends import exact
from specviz.backends.transformers import CachedLM
from specviz.engine import DecodeConfig, speculative_decode, vanilla_decode
from specviz.drafters import PromptLookupDrafter
from specviz.errors import SpecvizError
from specviz.exactness import Exactness, differing_rows
from tests.fixtures.tiny import tiny_llama, tiny_tokenizer

CONTEXTS = (5, 56, 120, 400)  # 56 and 120: passes that cross a padded key block (exact.BLOCK = 64)


def twin_of(model: torch.nn.Module, exact_mode: bool) -> torch.nn.Module:
    """A separate copy of a loaded model (its own config: the mode sets the attention there), in
    the exact mode or with torch's own kernels."""
    config = copy.deepcopy(model.config)
    config._attn_implementation = "sdpa"
    twin = type(model)(config)
    twin.load_state_dict(model.state_dict())
    twin.eval()
    if exact_mode:
        exact.enable(twin)
    return twin


def test_tiny_model_logits_are_bit_identical_for_every_pass_length():
    model = tiny_llama(seed=3, layers=3, hidden=64)
    assert exact.enable(model) == 3 * 7 + 1 and exact.is_exact(model)
    lm = CachedLM(model)
    seq = [int(t) for t in torch.randint(3, model.config.vocab_size, (420,), generator=torch.Generator().manual_seed(0))]
    for ctx in CONTEXTS:
        assert differing_rows(lm, seq, ctx) == [], ctx


def test_the_per_row_attention_is_bit_identical_too(monkeypatch):
    """Where the batched form's load-time check fails, attention runs one call per token."""
    model = tiny_llama(seed=4, layers=2, hidden=64)
    exact.enable(model)
    monkeypatch.setattr(exact, "query_rows", lambda *a, **k: None)  # the check failed
    lm = CachedLM(model)
    seq = [int(t) for t in torch.randint(3, model.config.vocab_size, (160,), generator=torch.Generator().manual_seed(2))]
    for ctx in (5, 56, 120):
        assert differing_rows(lm, seq, ctx) == [], ctx


def test_the_batched_attention_check_can_fail(monkeypatch):
    """The load-time check compares real bits: an attention whose rows depend on the pass fails it."""
    real = exact._blocks
    monkeypatch.setattr(exact, "_batched_ok", {})  # a fresh verdict, thrown away after the test

    def noisy(query, *args):
        return real(query, *args) + 1e-3 * query.shape[2]  # a row's value moves with the number of rows
    monkeypatch.setattr(exact, "_blocks", noisy)
    assert not exact.batched_attention_holds(9, 3, 64)


@pytest.mark.parametrize("heads, kv_heads, d", [(9, 3, 64), (14, 2, 64), (8, 8, 64), (32, 8, 128)])
def test_the_batched_attention_holds_on_this_machine_for_common_head_layouts(heads, kv_heads, d, monkeypatch):
    """A plain step's product has ``heads // kv_heads`` query rows (3 for SmolLM2, 1 without grouped
    heads); padded to one of ``ROW_FLOORS`` it takes the kernel a verify pass takes (8 rows for
    128-wide heads on an Intel Xeon with AMX, where 4 gave other bits). Without the
    padding MKL's batched GEMM on an AVX2 CPU gave those rows other bits, the check failed and every
    pass ran one attention call per token (still exact, ~10% slower at 8-11 tokens)."""
    monkeypatch.setattr(exact, "_batched_ok", {})
    assert exact.batched_attention_holds(heads, kv_heads, d)


def test_wide_heads_are_bit_identical_for_every_pass_length():
    """128-wide heads, four query heads to a KV head (the layout of Llama-3-8B's attention, scaled
    down): a plain step's product has 4 rows, which on some CPUs takes another GEMM kernel than 8 or
    more; the row floor found at load (``exact.query_rows``) keeps every pass on one kernel."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=97, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                      max_position_embeddings=512, tie_word_embeddings=False)
    torch.manual_seed(5)
    model = LlamaForCausalLM(cfg).eval()
    exact.enable(model)
    assert exact.query_rows(8, 2, 128) in exact.ROW_FLOORS
    lm = CachedLM(model)
    seq = [int(t) for t in torch.randint(3, 97, (160,), generator=torch.Generator().manual_seed(6))]
    for ctx in (5, 56, 120):
        assert differing_rows(lm, seq, ctx) == [], ctx


def test_tiny_greedy_speculative_equals_vanilla_in_the_exact_mode():
    model = tiny_llama(seed=1, layers=2, sharpness=8.0)
    exact.enable(model)
    tok = tiny_tokenizer()
    lm = CachedLM(model, len(tok))
    prompt = tok("abc abc abc abc abd abc abc")["input_ids"]
    cfg = DecodeConfig(gamma=5, max_new_tokens=40)
    spec = list(speculative_decode(lm, PromptLookupDrafter(3, adaptive=False), tok, prompt, cfg))[-1]
    plain = list(vanilla_decode(lm, tok, prompt, cfg))[-1]
    assert spec.proposed > 0 and spec.output_ids == plain.output_ids


def tiny_qwen2(seed: int = 0, layers: int = 2, hidden: int = 64):
    """A random Qwen2 model: the Llama form with biases on q, k and v."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=120, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:  # non-zero biases, so joining them is tested
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_()
    return model


@pytest.mark.parametrize("make", [lambda: tiny_llama(seed=5, layers=3, hidden=64), lambda: tiny_qwen2(seed=6)],
                         ids=["llama", "qwen2"])
def test_lean_layers_compute_what_the_stock_layers_compute(make, monkeypatch):
    """The lean decoder layers (q|k|v and gate|up joined, one rotary for q and k, direct calls) are
    installed on Llama-form layers, give the stock layers' logits, and keep every row's bits the
    same in a pass of any length."""
    model = make()
    monkeypatch.setenv("SPECVIZ_LEAN", "0")
    stock = twin_of(model, exact_mode=True)
    monkeypatch.delenv("SPECVIZ_LEAN")
    exact.enable(model)
    layers = model.model.layers
    assert model._svz_lean == len(layers) and getattr(stock, "_svz_lean", 0) == 0
    assert all(type(layer).__name__.startswith("Lean") for layer in layers)
    assert not any(type(layer).__name__.startswith("Lean") for layer in stock.model.layers)
    ids = torch.randint(3, model.config.vocab_size, (1, 90), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, stock(ids).logits, rtol=1e-5, atol=1e-5)
    seq = [int(t) for t in ids[0]]
    for ctx in (5, 56):
        assert differing_rows(CachedLM(model), seq, ctx, max_rows=12) == [], ctx
    # the separate projections' weights are views of the joined ones: no second copy is kept
    attn = layers[0].self_attn
    assert attn.k_proj.weight.untyped_storage().data_ptr() == layers[0]._svz_qkv.weight.untyped_storage().data_ptr()


def test_lean_layers_are_left_out_where_they_do_not_fit_or_fail_their_check(monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    from specviz.backends import lean

    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, hidden_act="gelu")
    gelu = LlamaForCausalLM(cfg).eval()
    exact.enable(gelu)  # another activation than SiLU: the stock layers stay, the mode still holds
    assert exact.is_exact(gelu) and gelu._svz_lean == 0
    real_forward = lean._forward

    def wrong(self, hidden_states, *args, **kwargs):
        return real_forward(self, hidden_states, *args, **kwargs) + 1.0
    monkeypatch.setattr(lean, "_forward", wrong)
    monkeypatch.setattr(lean, "_LEAN_CLASSES", {})
    model = tiny_llama(seed=7, layers=2)
    exact.enable(model)  # the install check compares logits with the stock layers': this fails it
    assert exact.is_exact(model) and model._svz_lean == 0
    assert not any(type(layer).__name__.startswith("Lean") for layer in model.model.layers)


def test_norms_are_fused_only_where_the_bits_stay_the_same():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    class OffsetRMSNorm(LlamaRMSNorm):  # the (1 + weight) form: torch's rms_norm does not compute it
        def forward(self, x):
            return super().forward(x) + x * 0.01

    holder = torch.nn.ModuleDict({"plain": LlamaRMSNorm(48, 1e-5), "offset": OffsetRMSNorm(48, 1e-5)})
    with torch.no_grad():
        holder["plain"].weight.normal_()
    x = torch.randn(3, 5, 48)
    want = holder["plain"](x)
    assert exact.fuse_norms(holder, torch.Generator().manual_seed(0)) == 1
    assert type(holder["plain"]).__dict__.get("_svz_base") is LlamaRMSNorm and type(holder["offset"]) is OffsetRMSNorm
    assert torch.equal(holder["plain"](x), want)


def test_the_mode_refuses_what_it_cannot_hold():
    with pytest.raises(SpecvizError, match="float32"):
        exact.enable(tiny_llama(seed=0, layers=1, dtype=torch.bfloat16))


def test_disable_restores_the_plain_model():
    model = tiny_llama(seed=0, layers=1)
    exact.enable(model)
    exact.disable(model)
    assert not exact.is_exact(model) and model.config._attn_implementation == "sdpa"
    assert not any(isinstance(m, exact.ExactLinear) for m in model.modules())
    assert not any("_svz_base" in type(m).__dict__ for m in model.modules())  # stock layers and norms again


def test_loading_in_the_exact_mode_says_so(tiny_registry, monkeypatch):
    from specviz.pipeline import build_pipeline
    from specviz.registry import load_registry

    monkeypatch.setenv("SPECVIZ_EXACT", "1")
    pipe = build_pipeline(load_registry(tiny_registry), pair="tiny-lookup", device="cpu", dtype="float32")
    assert pipe.target.kernels == "exact" and exact.is_exact(pipe.target.model)
    assert pipe.info()["target"]["kernels"] == "exact"
    monkeypatch.setenv("SPECVIZ_EXACT", "0")
    plain = build_pipeline(load_registry(tiny_registry), pair="tiny-lookup", device="cpu", dtype="float32")
    assert plain.target.model is not pipe.target.model and not exact.is_exact(plain.target.model)


def test_real_model_logits_are_bit_identical_for_1_to_16_rows(real_pipeline_factory):
    """The issue's test: SmolLM2-135M, fp32, passes of 1..16 tokens at three context lengths."""
    pipe = real_pipeline_factory("smollm2-135m-lookup")
    assert pipe.target.kernels == "exact"  # the default for float32 on a CPU
    seq = pipe.encode("The quick brown fox jumps over the lazy dog. " * 60, chat=False)
    assert len(seq) > max(CONTEXTS) + 16
    for ctx in CONTEXTS:
        assert differing_rows(pipe.target_lm, seq, ctx) == [], ctx
    # control: the same weights on torch's own kernels do differ (this test can fail)
    plain = CachedLM(twin_of(pipe.target.model, exact_mode=False))
    assert differing_rows(plain, seq, CONTEXTS[1])


def test_a_divergence_on_exact_kernels_is_called_a_bug():
    from specviz.exactness import Exactness

    assert "near tie" in Exactness(False, 3, 1, 2, 1e-6).describe()
    assert "BUG" in Exactness(False, 3, 1, 2, 1e-6, exact_kernels=True).describe()


@pytest.mark.parametrize("heads,kv_heads,sliding,kv_len", [(9, 3, None, 19), (4, 2, None, 19), (4, 4, None, 19),
                                                           (6, 2, 5, 19), (9, 3, None, 70), (6, 2, 40, 133)])
def test_exact_attention_computes_what_torch_attention_computes(heads, kv_heads, sliding, kv_len):
    """With the query heads that share a KV head grouped, key spans padded to whole blocks and a pass
    crossing a block boundary split (kv_len 70, 133): the same result as one masked attention call
    over every query (each query head reads its own KV head)."""
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(heads + kv_heads)
    q_len, d = 7 if kv_len < 100 else 12, 16
    query = torch.randn(2, heads, q_len, d, generator=gen)
    key, value = (torch.randn(2, kv_heads, kv_len, d, generator=gen) for _ in range(2))
    module = type("Attn", (), {"sliding_window": sliding})()
    got, _ = exact.exact_attention(module, query, key, value, None, scaling=0.3)
    per_row = exact._per_row(query, key, value, 0.3, kv_len - q_len, sliding)
    torch.testing.assert_close(got, per_row, rtol=1e-5, atol=1e-5)
    cols = torch.arange(kv_len)[None, :]
    last = kv_len - q_len + torch.arange(q_len)[:, None]
    allowed = (cols <= last) & ((cols > last - sliding) if sliding else True)
    want = F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=0.3,
                                          enable_gqa=heads != kv_heads).transpose(1, 2)
    assert got.shape == (2, q_len, heads, d)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # a wrong head-to-KV-head mapping would not be close: reading KV heads in another order differs
    if kv_heads > 1:
        swapped, _ = exact.exact_attention(module, query, key.flip(1), value.flip(1), None, scaling=0.3)
        assert not torch.allclose(swapped, want, atol=1e-3)


@pytest.mark.parametrize("past,sliding", [(0, None), (0, 9), (5, None)])
def test_a_long_prefill_attends_causally(past, sliding):
    """Passes longer than MAX_ROWS (a prompt's prefill) take torch's kernel: its causal form for a
    fresh prompt (it skips the masked half: ~15% off a 900-token prefill here), an explicit mask
    where keys are already cached or a sliding window applies. Each equals attention written out."""
    gen = torch.Generator().manual_seed(past + (sliding or 0))
    heads, kv_heads, q_len, d = 6, 2, exact.MAX_ROWS + 8, 16
    kv_len = past + q_len
    query = torch.randn(1, heads, q_len, d, generator=gen)
    key, value = (torch.randn(1, kv_heads, kv_len, d, generator=gen) for _ in range(2))
    module = type("Attn", (), {"sliding_window": sliding})()
    got, _ = exact.exact_attention(module, query, key, value, None, scaling=0.25)
    rep = heads // kv_heads
    k, v = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
    scores = (query @ k.transpose(-1, -2)) * 0.25
    cols = torch.arange(kv_len)[None, :]
    last = past + torch.arange(q_len)[:, None]
    allowed = (cols <= last) & ((cols > last - sliding) if sliding else True)
    want = (scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v).transpose(1, 2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_gpu_check_script_runs_its_drafters_and_its_row_probe_on_a_cpu(tmp_path):
    """scripts/gpu_check.py is run on a lent GPU only; here its --small form must give every drafter's
    row with greedy output identical to vanilla, and its row probe must find the exact mode
    row-invariant (16/16) and torch's own kernels not (so the probe can tell the two apart)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "gpu.json"
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, str(root / "scripts" / "gpu_check.py"), "--small", "--device", "cpu",
                    "--dtype", "float32", "--rows", "--repeats", "1", "--max-new-tokens", "24", "--json", str(out)],
                   check=True, capture_output=True, timeout=300)
    data = json.loads(out.read_text())
    labels = [r["drafter"] for r in data["runs"]]
    assert len(labels) == 7 and any("recycling" in x for x in labels) and any("early exit" in x for x in labels)
    assert any("draft head" in x for x in labels) and any("bfloat16" in x for x in labels)
    assert all(r["identical"] and r["vanilla_tps"] > 0 and r["spec_tps"] > 0 for r in data["runs"])
    exact_rows = [p for p in data["rows"] if "exact mode" in p["dtype"]]
    plain_rows = [p for p in data["rows"] if "exact mode" not in p["dtype"]]
    assert exact_rows and all(p["bit_identical"] == "16/16" and p["max_abs_diff"] == 0 for p in exact_rows)
    assert plain_rows and all(p["bit_identical"] != "16/16" for p in plain_rows)


def test_a_near_tie_is_judged_by_the_targets_dtype():
    """A margin of one bfloat16 step at a logit of ~3 (0.0156) is numerics in bfloat16, a bug's
    signature in float32; a margin of 1.0 is a bug's in both."""
    assert "NOT a near tie" in Exactness(False, 3, 1, 2, 0.0156).describe()
    assert "a near tie (numerics)" in Exactness(False, 3, 1, 2, 0.0156, dtype="bfloat16").describe()
    assert "NOT a near tie" in Exactness(False, 3, 1, 2, 1.0, dtype="bfloat16").describe()


def test_a_model_checked_at_another_thread_count_is_checked_again_where_it_decodes(monkeypatch):
    """The exact mode's row-invariance checks run at load, at the loading thread's thread count; a
    model loaded in a one-thread thread and decoded on another count is checked again when a run
    starts there (a safety net: the app loads on its decode thread), once per layer shape, not again
    for an early-exit view sharing its layers; greedy decoding still equals vanilla. Where the load's
    padding fails there, another that holds is taken; where none holds, every run refuses (never a
    quiet fallback to kernels that are not exact)."""
    import threading

    from specviz.drafters import EarlyExitDrafter
    from specviz.mainthread import _default_threads, _set_default_threads

    model, tok = tiny_llama(seed=5, layers=4, hidden=64), tiny_tokenizer()
    others = _default_threads()

    def load_with_one_thread():
        torch.set_num_threads(1)
        exact.enable(model)
    t = threading.Thread(target=load_with_one_thread)
    t.start()
    t.join()
    _set_default_threads(others)
    layers = [m for m in model.modules() if isinstance(m, exact.ExactLinear)]
    assert layers and {m._svz_threads for m in layers} == {1}
    n = torch.get_num_threads()
    if n == 1:  # a one-core runner: make the load's count another one
        for m in layers + [getattr(x, a) for x in model.modules() for a in ("_svz_qkv", "_svz_gate_up") if hasattr(x, a)]:
            m._svz_threads = 7
    checks = []
    real = exact._row_invariant
    monkeypatch.setattr(exact, "_row_invariant", lambda layer, gen: checks.append(layer.weight.shape) or real(layer, gen))
    lm = CachedLM(model, len(tok))
    ids = [int(t) for t in tok("a b c a b c a b", add_special_tokens=False)["input_ids"]]
    cfg = DecodeConfig(gamma=4, max_new_tokens=24)
    spec = list(speculative_decode(lm, EarlyExitDrafter(model, 2, len(tok)), tok, ids, cfg))[-1].output_ids
    shapes = {tuple(m.weight.shape) for m in layers if not m.__dict__.get("_svz_idle")}
    assert 0 < len(checks) <= len(shapes) + 2  # once per shape (and per joined product), the view adds none
    assert {m._svz_threads for m in layers if not m.__dict__.get("_svz_idle")} == {n}
    assert spec == list(vanilla_decode(lm, tok, ids, cfg))[-1].output_ids
    assert exact.check_threads(model) == 0  # checked at this count now: nothing to do

    def loaded_elsewhere():
        for m in layers + [getattr(x, a) for x in model.modules() for a in ("_svz_qkv", "_svz_gate_up") if hasattr(x, a)]:
            m._svz_threads = 7

    # where the load's padding fails at this count and another holds, the other is taken, as a load would
    loaded_elsewhere()
    monkeypatch.setattr(exact, "_row_invariant", lambda layer, gen: layer._svz_policy == "mult4" and real(layer, gen))
    assert list(vanilla_decode(lm, tok, ids, cfg))[-1].output_ids == spec
    assert {m._svz_policy for m in layers if not m.__dict__.get("_svz_idle")} == {"mult4"}
    assert list(speculative_decode(lm, EarlyExitDrafter(model, 2, len(tok)), tok, ids, cfg))[-1].output_ids == spec

    loaded_elsewhere()  # and where none holds, every run refuses, the model left as it was
    monkeypatch.setattr(exact, "_row_invariant", lambda layer, gen: False)
    for _ in range(2):
        with pytest.raises(SpecvizError, match="load it on the thread that decodes"):
            list(vanilla_decode(lm, tok, ids, cfg))
    assert exact.is_exact(model) and all(isinstance(m, exact.ExactLinear) for m in layers)
    assert {m._svz_policy for m in layers if not m.__dict__.get("_svz_idle")} == {"mult4"}
