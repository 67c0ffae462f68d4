"""models.yaml validation, availability ordering, loading through the Hub-folder path, tokenizer checks."""

import pytest

from specviz.errors import SpecvizError
from specviz.backends.transformers import check_tokenizers, pick_device, pick_dtype
from specviz.drafters import parse_drafter
from specviz.pipeline import build_pipeline
from specviz.registry import load_registry, parse
from tests.fixtures.tiny import tiny_tokenizer

GOOD = {
    "models": {"a": {"sources": [{"hub": "x/a"}]}, "b": {"sources": [{"hub": "x/b"}]}},
    "pairs": {"p": {"target": "a", "drafter": {"kind": "model", "model": "b"}, "gamma": 3}},
}


def bad(**changes):
    import copy

    data = copy.deepcopy(GOOD)
    for path, value in changes.items():
        node = data
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return data


@pytest.mark.parametrize("data,needle", [
    ("not a mapping", "mapping"),
    (bad(models__a={"sources": []}), "sources"),
    (bad(models__a={"sources": [{"ftp": "x"}]}), "package, local or hub"),
    (bad(pairs__p__target="zzz"), "unknown target"),
    (bad(pairs__p__drafter={"kind": "magic"}), "drafter kind"),
    (bad(pairs__p__drafter={"kind": "model", "model": "zzz"}), "unknown draft model"),
    (bad(pairs__p__drafter={"kind": "early_exit"}), "layers"),
    (bad(pairs__p__gamma=0), "gamma"),
    (bad(pairs__p__gamma=99), "gamma must be a whole number from 1 to 31, got 99"),
    (bad(pairs__p__gamma=True), "gamma"),
    (bad(pairs={}), "no pairs"),
    ({**GOOD, "default_pair": "nope"}, "default_pair"),
])
def test_invalid_registry_is_refused(data, needle):
    with pytest.raises(SpecvizError, match=needle):
        parse(data)


def test_real_registry_parses_and_orders_pairs():
    reg = load_registry()
    rows = reg.ordered_pairs()
    assert rows[0][0].name == reg.default()
    flags = [offline for _, offline in rows[1:]]
    assert flags == sorted(flags, reverse=True)  # offline pairs before Hub-only pairs
    assert reg.default() == "smollm2-135m-head"
    assert "smollm2-135m-lookup" in reg.pairs
    assert "smollm2-135m-early-exit" in reg.pairs


def test_missing_or_broken_registry_file(tmp_path):
    with pytest.raises(SpecvizError, match="not found"):
        load_registry(tmp_path / "none.yaml")
    f = tmp_path / "m.yaml"
    f.write_text("models: [unclosed")
    with pytest.raises(SpecvizError, match="YAML"):
        load_registry(f)
    f.write_bytes(b"\x00\xff\xfe binary")
    with pytest.raises(SpecvizError, match="not UTF-8 text"):
        load_registry(f)
    with pytest.raises(SpecvizError, match="is a folder"):
        load_registry(tmp_path)
    f.write_text("")  # an empty file, or one with no pairs: the message names the file it read, not models.yaml
    with pytest.raises(SpecvizError, match=f"{f} must be a mapping"):
        load_registry(f)
    f.write_text("models: {}\npairs: {p: {target: a}}\n")
    with pytest.raises(SpecvizError, match=f"^{f}: pair 'p': unknown target"):
        load_registry(f)


def test_tiny_registry_loads_through_folder_path(tiny_registry):
    reg = load_registry(tiny_registry)
    assert [p.name for p, off in reg.ordered_pairs() if off][0] == "tiny-draft"
    assert reg.ordered_pairs()[-1][0].name == "hub-pair"
    pipe = build_pipeline(reg, pair="tiny-draft", device="cpu")
    assert pipe.draft is not None and pipe.drafter.kind == "model"
    info = pipe.info()
    assert info["target"]["device"] == "cpu" and info["target"]["dtype"] == "float32"
    # loaded once, reused across runs
    again = build_pipeline(reg, pair="tiny-lookup", device="cpu")
    assert again.target.model is pipe.target.model
    ee = build_pipeline(reg, pair="tiny-early-exit", device="cpu")
    assert ee.drafter.kind == "early_exit" and ee.info()["draft"]["source"] == "the target's weights"


def test_target_and_drafter_named_directly(tiny_registry):
    reg = load_registry(tiny_registry)
    pipe = build_pipeline(reg, target="tiny-target", drafter="tiny-draft", device="cpu", gamma=2)
    assert pipe.gamma == 2 and pipe.draft.name == "tiny-draft"
    pipe = build_pipeline(reg, target="tiny-target", drafter="early-exit:1", device="cpu")
    assert pipe.drafter.layers == 1
    with pytest.raises(SpecvizError, match="either a pair or a target"):
        build_pipeline(reg, pair="tiny-draft", target="tiny-target")


def test_mismatched_tokenizers_are_refused(tiny_registry):
    reg = load_registry(tiny_registry)
    with pytest.raises(SpecvizError, match="tokenizers .* differ"):
        build_pipeline(reg, pair="tiny-mismatch", device="cpu")
    with pytest.raises(SpecvizError, match="differ"):
        check_tokenizers(tiny_tokenizer(), tiny_tokenizer(reverse=True), "a", "b")
    check_tokenizers(tiny_tokenizer(), tiny_tokenizer(), "a", "b")  # same vocabulary: fine


def test_unknown_names(tiny_registry):
    reg = load_registry(tiny_registry)
    with pytest.raises(SpecvizError, match="unknown pair 'nope'"):
        build_pipeline(reg, pair="nope")
    with pytest.raises(SpecvizError, match="unknown model 'nope'"):
        build_pipeline(reg, target="nope")
    with pytest.raises(SpecvizError, match="unknown drafter 'nope'"):
        parse_drafter("nope", list(reg.models))
    with pytest.raises(SpecvizError, match="early-exit layers"):
        parse_drafter("early-exit:x", list(reg.models))
    with pytest.raises(SpecvizError, match="early-exit layers must be between"):
        build_pipeline(reg, target="tiny-target", drafter="early-exit:9", device="cpu")


def test_unavailable_model_fails_cleanly(tiny_registry):
    reg = load_registry(tiny_registry)
    with pytest.raises(SpecvizError, match="could not load model 'hub-only'"):
        build_pipeline(reg, pair="hub-pair", device="cpu")


def test_device_and_dtype_choice():
    assert pick_device("cpu").type == "cpu"
    assert str(pick_dtype("auto", pick_device("cpu"))) == "torch.float32"
    assert str(pick_dtype("bf16", pick_device("cpu"))) == "torch.bfloat16"
    with pytest.raises(SpecvizError, match="dtype"):
        pick_dtype("int3", pick_device("cpu"))
    with pytest.raises(SpecvizError, match="device"):
        pick_device("tpu")


def test_a_named_drafter_runs_at_its_pairs_gamma_in_the_cli_as_in_the_api(tiny_registry):
    """Without --gamma, `run --target T --draft D` and `run --draft D` took 4 and the pair's γ (the head
    pair's 10 for early-exit:6), where the API gives a named drafter the γ of models.yaml's pair with it."""
    from specviz.api.generate import plan
    from specviz.api.requests import GenRequest, Speculative
    from specviz.pipeline import resolve_pair

    reg = load_registry(tiny_registry)
    cases = {"early-exit:2": 3, "lookup": 5, "lookup:2": 5, "tiny-draft": 4, "recycling": 4}  # recycling: no pair,
    for name, gamma in cases.items():  # so the recommended (default) pair's γ
        assert resolve_pair(reg, target="tiny-target", drafter=name).gamma == gamma, name
        assert resolve_pair(reg, pair="tiny-lookup", drafter=name).gamma == gamma, name
        req = GenRequest(kind="completion", model="tiny-target", prompt="x", speculative=Speculative(name))
        assert plan(reg, req).gamma == gamma, name
    assert resolve_pair(reg, target="tiny-target", drafter="early-exit:2", gamma=7).gamma == 7
    assert resolve_pair(reg, pair="tiny-early-exit").gamma == 3


def test_pairs_say_what_they_lack(tmp_path):
    """A copy of models.yaml elsewhere lacks the assets its paths name: those pairs read "unavailable",
    not "offline", and the default moves to a pair that runs; a model with no source at all is not
    "needs the Hub"."""
    import shutil

    from specviz.registry import DEFAULT_REGISTRY

    copy = tmp_path / "m.yaml"
    shutil.copy(DEFAULT_REGISTRY, copy)
    reg = load_registry(copy)
    head = reg.pairs["smollm2-135m-head"]
    assert reg.availability(head).startswith("unavailable:") and "draft-head" in reg.availability(head)
    assert not reg.offline(head) and reg.default() != "smollm2-135m-head"
    if reg.offline(reg.pairs["smollm2-135m-early-exit"]):  # the packaged weights are installed here
        assert reg.availability(reg.pairs["smollm2-135m-early-exit"]) == "offline"
    assert reg.availability(reg.pairs["qwen2.5-7b-draft-0.5b"]) == "needs the Hub"
    from specviz.view.menus import pair_choices

    shown = dict((value, label) for label, value in pair_choices(reg))
    assert shown["smollm2-135m-head"].endswith("(unavailable here)")
    assert shown["qwen2.5-7b-draft-0.5b"].endswith("(needs the Hub)")
    lost = tmp_path / "lost.yaml"
    lost.write_text("models:\n  a: {sources: [{local: /no/such/folder}]}\n"
                    "pairs:\n  p: {target: a, drafter: {kind: prompt_lookup}}\n")
    reg = load_registry(lost)
    assert reg.availability(reg.pairs["p"]) == "unavailable: no source of a exists"
