"""The bench command and the adaptive prompt-lookup policy it measures."""

import json

import pytest

from specviz.bench import aggregate, load_prompts
from specviz.cli import main
from specviz.drafters import PromptLookupDrafter
from specviz.errors import SpecvizError


@pytest.fixture()
def prompt_file(tmp_path):
    rows = [{"question_id": i, "category": cat, "turns": [text, "second turn is ignored"]}
            for i, (cat, text) in enumerate([("copy", "abc abc abc abc"), ("copy", "xy xy xy"),
                                              ("writing", "hello there"), ("writing", "one two one two"),
                                              ("coding", "def f(): return f()")])]
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_load_prompts_limit_skip_categories(prompt_file):
    assert len(load_prompts(prompt_file)) == 5
    assert [r["id"] for r in load_prompts(prompt_file, limit=1)] == [0, 2, 4]
    assert [r["id"] for r in load_prompts(prompt_file, limit=1, skip=1)] == [1, 3]
    assert [r["category"] for r in load_prompts(prompt_file, categories=["mt_bench"])] == ["writing", "writing", "coding"]
    with pytest.raises(SpecvizError, match="no prompts"):
        load_prompts(prompt_file, categories=["nope"])
    with pytest.raises(SpecvizError, match="not found"):
        load_prompts(prompt_file.parent / "missing.jsonl")
    bad = prompt_file.parent / "bad.jsonl"
    bad.write_text('{"category": "x"}\n')
    with pytest.raises(SpecvizError, match="turns"):
        load_prompts(bad)


def test_bench_runs_end_to_end_with_peer(capsys, tiny_registry, prompt_file):
    code = main(["bench", "--models", str(tiny_registry), "--pair", "tiny-lookup", "--prompts", str(prompt_file),
                 "--max-new-tokens", "16", "--gamma", "3", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["configs"][0]["gamma"] == 3
    rows = {r["name"]: r for r in out["configs"][0]["rows"]}
    assert {"copy", "writing", "coding", "mt_bench (pooled)", "overall"} <= set(rows)
    overall = rows["overall"]
    assert overall["n"] == 5 and overall["identical"] == "5/5"
    assert overall["peer_speedup_total"] is not None  # transformers' prompt lookup ran too
    prompts = out["configs"][0]["prompts"]
    assert all(p["hf_assisted_identical"] for p in prompts)


def test_bench_table_prints(capsys, tiny_registry, prompt_file):
    code = main(["bench", "--models", str(tiny_registry), "--pair", "tiny-draft", "--prompts", str(prompt_file),
                 "--limit", "1", "--max-new-tokens", "8", "--no-peer", "--temperature", "0", "1"])
    out = capsys.readouterr().out
    assert code == 0 and out.count("| overall") == 2 and "n/a (sampled)" in out


def test_aggregate_ratios():
    from specviz.bench import PromptResult

    def r(van, spec):
        return PromptResult(1, "c", 4, 0.0, 10, van, spec, van, spec, 8, 4, 6, 5, True, "", [2] * 5, {2: spec},
                            0.0, van / 10)

    row = aggregate("c", [r(100.0, 50.0), r(100.0, 100.0), r(300.0, 100.0)])
    assert row.speedup_total == pytest.approx(500 / 250)
    assert row.speedup_median == pytest.approx(2.0)
    assert row.acceptance == pytest.approx(0.5)


def test_lookup_proposes_nothing_when_nothing_pays():
    d = PromptLookupDrafter(max_ngram=2)
    ids = [5, 6, 7, 8, 5, 6]
    d.costs = [1.0] + [10.0] * 10  # verifying anything costs 10 steps
    p = d.propose(ids, 4, None, None)
    assert p.tokens == [] and "plain step" in p.reason
    d.costs = [1.0] * 11  # free verification: propose all that the match offers
    p = d.propose(ids, 4, None, None)
    assert p.tokens == [7, 8, 5, 6] and "2-gram" in p.reason
    assert d.propose([1, 2, 3], 4, None, None).tokens == []  # no match at all


def test_lookup_learns_from_rejections():
    d = PromptLookupDrafter(max_ngram=1)
    d.costs = [1.0, 1.15, 1.25, 1.6, 1.7, 1.8]
    ids = [1, 2, 3, 1]
    assert d.propose(ids, 4, None, None).tokens  # the prior says a 1-gram might pay
    for _ in range(20):
        d.observe(1, 0)  # ... but every proposal is refused
    assert d.estimates(("context", 1))[0] < 0.1
    assert d.propose(ids, 4, None, None).tokens == []


def test_lookup_vote_prefers_common_continuation():
    d = PromptLookupDrafter(max_ngram=1, adaptive=False)
    ids = [9, 1, 9, 1, 9, 2, 9]  # after 9: "1" twice, "2" once (most recent)
    assert d.find(ids, 1) == ([1], 1)
    assert PromptLookupDrafter(max_ngram=1, adaptive=False, vote=False).find(ids, 1) == ([2], 1)
