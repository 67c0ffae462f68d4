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
