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
    with pytest.raises(SpecvizError, match="no category 'nope' there; its categories are coding, .*writing"):
        load_prompts(prompt_file, categories=["nope"])  # a misspelt category is named, with the real ones
    with pytest.raises(SpecvizError, match=r"--skip 9 leaves none"):
        load_prompts(prompt_file, skip=9)
    with pytest.raises(SpecvizError, match="not found"):
        load_prompts(prompt_file.parent / "missing.jsonl")
    with pytest.raises(SpecvizError, match="is a folder"):
        load_prompts(prompt_file.parent)
    with pytest.raises(SpecvizError, match="no prompts selected from /dev/null"):  # it exists: empty, not missing
        load_prompts("/dev/null")
    bad = prompt_file.parent / "bad.jsonl"
    bad.write_text('{"category": "x"}\n')
    with pytest.raises(SpecvizError, match="turns"):
        load_prompts(bad)
    bad.write_text('{"turns": ["a"]}\n{"turns": ["b"\n')  # a cut line: said "expected a JSON object with 'turns'"
    with pytest.raises(SpecvizError, match=r"bad.jsonl:2: not valid JSON \(.* at column \d+\)"):
        load_prompts(bad)
    for turns in ('"hello"', '[5]', '[]'):  # a string ran its first letter; a number said "empty prompt"
        bad.write_text('{"turns": %s}\n' % turns)
        with pytest.raises(SpecvizError, match="'turns' list of strings"):
            load_prompts(bad)
    for kw in ({"skip": -1}, {"limit": -1}):
        with pytest.raises(SpecvizError, match=">= 0"):
            load_prompts(prompt_file, **kw)
    bad.write_text('{"turns": ["a"]}\n{"turns": ["  \\n"]}\n')  # said "the prompt is empty", nowhere, after a load
    with pytest.raises(SpecvizError, match=r"bad.jsonl:2: the first turn is empty"):
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
    assert overall["peer_speedup_total"] is not None and overall["peer_baseline"] > 0  # transformers ran too
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
    assert row.peer_baseline is None and row.peer_speedup_total is None  # no transformers runs
    rs = [r(100.0, 50.0), r(300.0, 100.0)]
    for x, (plain, assisted) in zip(rs, [(110.0, 100.0), (330.0, 200.0)]):
        x.hf_plain_ms, x.hf_assisted_ms = plain, assisted
    row = aggregate("c", rs)
    assert row.peer_baseline == pytest.approx(440 / 400)  # transformers' plain generate() over our vanilla
    assert row.peer_speedup_total == pytest.approx(440 / 300)


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


def test_bench_repeats_interleave_and_record_spread(capsys, tiny_registry, prompt_file):
    code = main(["bench", "--models", str(tiny_registry), "--pair", "tiny-lookup", "--prompts", str(prompt_file),
                 "--limit", "1", "--max-new-tokens", "8", "--gamma", "3", "--repeats", "3",
                 "--compare", "tiny-draft", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["repeats"] == 3 and out["compare"] == ["tiny-draft"]
    m = out["machine"]
    assert m["torch"] and m["torch_threads"] >= 1 and m["cpu"] and "load_average_end" in m
    assert out["dtype"] == "torch.float32"
    pairs = [c["pair"] for c in out["configs"]]
    assert pairs == ["tiny-lookup", "tiny-draft"]
    for c in out["configs"]:
        for p in c["prompts"]:
            assert len(p["vanilla_runs_ms"]) == 3 and len(p["spec_runs_ms"]) == 3
            assert p["vanilla_ms"] == min(p["vanilla_runs_ms"]) and p["spec_ms"] == min(p["spec_runs_ms"])
            assert p["spread"] >= 0 and p["noisy"] == (p["spread"] > 0.2)
            assert p["identical"] and p["stable_output"]
        overall = c["rows"][-1]
        assert overall["name"] == "overall" and overall["identical"] == "3/3"
        assert overall["ratio_low"] <= overall["speedup_median"] <= overall["ratio_high"]
    # both pairs were measured against the same vanilla runs
    a, b = (c["prompts"] for c in out["configs"])
    assert [p["vanilla_runs_ms"] for p in a] == [p["vanilla_runs_ms"] for p in b]


def test_one_repeat_claims_no_spread(capsys, tiny_registry, prompt_file):
    """With one repeat nothing shows how noisy a run was: spread and noisy read "-" (null in JSON), not
    0% and 0, and the footnote says why."""
    args = ["bench", "--models", str(tiny_registry), "--pair", "tiny-lookup", "--prompts", str(prompt_file),
            "--limit", "1", "--max-new-tokens", "8", "--repeats", "1", "--no-peer"]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows, prompts = out["configs"][0]["rows"], out["configs"][0]["prompts"]
    assert all(p["spread"] is None and p["noisy"] is False for p in prompts)
    assert all(r["spread"] is None and r["noisy"] is None for r in rows)
    assert main(args) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    cols = [c.strip() for c in next(line for line in lines if line.startswith("| category")).split("|")]
    cells = [c.strip() for c in next(line for line in lines if line.startswith("| overall")).split("|")]
    assert cells[cols.index("spread")] == "-" and cells[cols.index("noisy")] == "-"
    assert "a single run cannot show its noise" in text


def test_compared_pairs_run_at_their_own_gamma(capsys, tiny_registry, prompt_file):
    """Without --gamma each pair runs at its registry gamma (tiny-lookup 5, tiny-draft 4); the
    model draft really proposes at most 4 tokens an iteration."""
    code = main(["bench", "--models", str(tiny_registry), "--pair", "tiny-lookup", "--prompts", str(prompt_file),
                 "--limit", "1", "--max-new-tokens", "12", "--repeats", "1", "--no-peer",
                 "--compare", "tiny-draft", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    lookup, draft = out["configs"]
    assert (lookup["gamma"], draft["gamma"]) == (5, 4)
    assert {p["gamma"] for p in draft["prompts"]} == {4}
    assert max(g for p in draft["prompts"] for g in p["gammas"]) == 4


def test_bench_flags_noisy_prompts():
    from specviz.bench import PromptResult

    def r(van_runs, spec_runs):
        return PromptResult(1, "c", 4, 0.0, 10, min(van_runs), min(spec_runs), min(van_runs), min(spec_runs), 8, 4, 6, 5, True, "", [2] * 5,
                            {2: 1.0}, 0.0, 1.0, vanilla_runs_ms=van_runs, spec_runs_ms=spec_runs,
                            spread=max(max(van_runs) / min(van_runs), max(spec_runs) / min(spec_runs)) - 1)

    quiet, loud = r([100, 105, 110], [50, 52, 51]), r([100, 300, 110], [50, 52, 51])
    assert not quiet.noisy and loud.noisy
    row = aggregate("c", [quiet, loud])
    assert row.noisy == 1 and row.speedup_total == pytest.approx(2.0)


def test_bench_rejects_bad_settings_before_loading_a_model(capsys, tiny_registry, prompt_file, tmp_path, monkeypatch):
    """Each was refused only after the model's load (~25 s on the default pair, minutes on a busy box),
    and --max-new-tokens 0 printed its error glued to the progress bar's line."""
    import specviz.cli

    monkeypatch.setattr(specviz.cli, "_pipeline", lambda *a: pytest.fail("loaded a model first"))
    base = ["bench", "--models", str(tiny_registry), "--pair", "tiny-lookup", "--prompts", str(prompt_file),
            "--limit", "1", "--max-new-tokens", "4", "--no-peer"]
    for flags, needle in ((["--repeats", "0"], "--repeats must be >= 1"),
                          (["--max-new-tokens", "0"], "max new tokens must be"),
                          (["--gamma", "3", "0"], "gamma"),
                          (["--temperature", "-1"], "temperature"),
                          (["--compare", "nope"], "unknown pair 'nope'"),
                          (["--costs", "[0]"], "cost profile"),
                          (["--seed", "-5"], "seed must be"),
                          (["--vllm-method", "suffix"], "give --peer-vllm too"),
                          (["--progress", str(tmp_path / "no" / "such" / "p.jsonl")], "--progress: cannot write")):
        assert main(base + flags) == 2, flags
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1 and "Traceback" not in err, (flags, err)


def test_a_prompt_file_is_read_as_utf8_or_refused_naming_its_line(tmp_path):
    good = tmp_path / "bom.jsonl"
    good.write_bytes(b'\xef\xbb\xbf{"category": "qa", "turns": ["caf\xc3\xa9"]}\n')  # a BOM, as some editors write
    assert load_prompts(good)[0]["prompt"] == "caf\u00e9"
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"category": "qa", "turns": ["hi"]}\n{"category": "qa", "turns": ["caf\xe9"]}\n')
    with pytest.raises(SpecvizError, match=r"latin1.jsonl:2: not UTF-8"):
        load_prompts(bad)


def test_a_prompt_too_long_for_the_model_is_refused_before_any_is_measured(capsys, tiny_registry, tmp_path,
                                                                           monkeypatch):
    import specviz.bench

    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"category": "qa", "turns": ["Name a colour."]}) + "\n"
                 + json.dumps({"category": "rag", "turns": ["word " * 2000]}) + "\n")
    monkeypatch.setattr(specviz.bench, "run_prompt", lambda *a, **k: pytest.fail("measured a prompt first"))
    code = main(["bench", "--models", str(tiny_registry), "--pair", "tiny-lookup", "--prompts", str(f),
                 "--max-new-tokens", "4", "--repeats", "1", "--no-peer"])
    err = capsys.readouterr().err
    assert code == 2 and "prompt 2 (rag) is" in err and "context" in err and err.count("\n") == 1


def test_bench_progress_file_gets_a_line_per_prompt_as_measured(capsys, tiny_registry, prompt_file, tmp_path):
    """--progress appends each prompt's result as a JSON line when it is measured (a stopped bench
    keeps them), the same numbers as the final JSON's per-prompt results."""
    path = tmp_path / "progress.jsonl"
    code = main(["bench", "--models", str(tiny_registry), "--pair", "tiny-lookup", "--prompts", str(prompt_file),
                 "--limit", "1", "--max-new-tokens", "8", "--gamma", "3", "--repeats", "2",
                 "--progress", str(path), "--json"])
    out = json.loads(capsys.readouterr().out)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert code == 0 and len(lines) == 3
    final = out["configs"][0]["prompts"]
    assert [x["id"] for x in lines] == [p["id"] for p in final]
    for x, p in zip(lines, final):
        assert x["pair"] == "tiny-lookup" and x["gamma"] == 3
        assert x["vanilla_runs_ms"] == p["vanilla_runs_ms"] and x["spec_ms"] == p["spec_ms"]
        assert x["hf_assisted_ms"] == p["hf_assisted_ms"] and x["noisy"] == p["noisy"]
    assert main(["bench", "--models", str(tiny_registry), "--pair", "tiny-lookup", "--prompts", str(prompt_file),
                 "--limit", "1", "--max-new-tokens", "4", "--no-peer",
                 "--progress", str(tmp_path / "no" / "such" / "dir.jsonl")]) == 2
    assert "--progress" in capsys.readouterr().err
