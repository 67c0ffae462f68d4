"""The target's own weights at lower precision as a draft model (self-speculation): a separate
copy with its own KV cache and a real q; greedy output still equals vanilla decoding."""

import pytest
import torch

from specviz.backends.transformers import CachedLM
from specviz.drafters import SelfDraftDrafter, parse_drafter
from specviz.drafters.quantized import lower_precision_copy
from specviz.engine import DecodeConfig, encode_prompt, speculative_decode, vanilla_decode
from specviz.errors import SpecvizError
from tests.test_engine import PROMPTS


@pytest.mark.parametrize("precision", ["int8", "bfloat16"])
def test_copy_is_separate_and_lower_precision(precision, target_model):
    copy = lower_precision_copy(target_model, precision)
    assert copy is not target_model
    assert next(target_model.parameters()).dtype == torch.float32  # the target is untouched
    if precision == "bfloat16":
        assert next(copy.parameters()).dtype == torch.bfloat16
    else:
        assert any("quantized" in type(m).__module__ for m in copy.modules())
    x = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        a, b = target_model(x).logits.float(), copy(x).logits.float()
    assert not torch.equal(a, b) and torch.allclose(a, b, atol=0.5 * float(a.abs().max()))


@pytest.mark.parametrize("precision", ["int8", "bfloat16"])
def test_greedy_identical_to_vanilla(precision, target_model, tok):
    target = CachedLM(target_model, len(tok))
    kept = 0
    for prompt in PROMPTS[:3]:
        ids = encode_prompt(tok, prompt, True)
        cfg = DecodeConfig(gamma=3, max_new_tokens=30)
        expected = list(vanilla_decode(target, tok, ids, cfg))[-1].output_ids
        summary = list(speculative_decode(target, SelfDraftDrafter(target_model, precision, len(tok)), tok, ids, cfg))[-1]
        assert summary.output_ids == expected, prompt
        kept += summary.accepted
    assert kept > 0  # the copy agrees with its original often


def test_shorthand():
    assert parse_drafter("self:int8", []) == {"kind": "self_quantized", "precision": "int8"}
    assert parse_drafter("self:bf16", []) == {"kind": "self_quantized", "precision": "bfloat16"}
    with pytest.raises(SpecvizError, match="precision"):
        parse_drafter("self:int4", [])


def test_the_pipeline_says_the_self_drafts_precision_not_the_targets(tiny_registry):
    """The summary read "drafter the target in bfloat16 on cpu (float32)": the draft's dtype was the
    target's. A self-draft reports its copy's precision; a drafter without weights of its own the target's."""
    from specviz.pipeline import build_pipeline
    from specviz.registry import load_registry

    reg = load_registry(tiny_registry)
    info = build_pipeline(reg, target="tiny-target", drafter="self:bf16").info()
    assert info["draft"]["dtype"] == "bfloat16" and info["target"]["dtype"] == "float32"
    assert build_pipeline(reg, pair="tiny-lookup").info()["draft"]["dtype"] == "float32"
