"""The CLI contract: pairs, run (--json), check, and one-line errors."""

import json
import math
import os
import subprocess
import sys

import pytest

from specviz.cli import main

from .conftest import ROOT


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_pairs_lists_default_first(capsys, tiny_registry):
    code, out, _ = cli(capsys, "pairs", "--models", str(tiny_registry))
    lines = out.strip().splitlines()
    assert code == 0 and lines[0].split("\t")[0] == "tiny-draft" and "default" in lines[0]
    assert lines[-1].startswith("hub-pair") and "needs the Hub" in lines[-1]


def test_run_json_contract(capsys, tiny_registry):
    code, out, err = cli(capsys, "run", "--models", str(tiny_registry), "--pair", "tiny-draft",
                         "--prompt", "hello", "--max-new-tokens", "20", "--json")
    assert code == 0
    rows = [json.loads(line) for line in out.strip().splitlines()]  # stdout is JSON lines only
    start, iters, summary = rows[0], rows[1:-1], rows[-1]
    assert start["event"] == "start" and start["mode"] == "speculative" and "kernels" in start["target"]
    assert all(r["event"] == "iteration" for r in iters) and summary["event"] == "summary"
    for r in iters:
        assert {"proposed", "accepted", "emitted", "draft_ms", "verify_ms"} <= set(r)
        assert isinstance(r["accepted"], int) and isinstance(r["proposed"], list)
    assert summary["output_ids"] == [t for r in iters for t in r["emitted"]]
    assert {"text", "acceptance_rate", "tokens_per_second"} <= set(summary)


def test_a_run_json_file_pins_the_cost_profile(capsys, tiny_registry, tmp_path):
    """`--costs FILE` takes the JSON lines of `run --json` (its start line records the profile the
    run measured): a second run given that file plans with the very same profile."""
    base = ["run", "--models", str(tiny_registry), "--pair", "tiny-lookup", "--prompt", "abc abc abc",
            "--max-new-tokens", "12", "--json"]
    code, out, _ = cli(capsys, *base)
    first = json.loads(out.splitlines()[0])
    assert code == 0 and first["costs"]["v"]
    saved = tmp_path / "run.jsonl"
    saved.write_text(out)
    code, out, _ = cli(capsys, *base, "--costs", str(saved))
    assert code == 0 and json.loads(out.splitlines()[0])["costs"]["v"] == first["costs"]["v"]


@pytest.mark.parametrize("content, needle", [
    (b'{"speculative": 5}', "records no cost profile"), (b'{"costs": "abc"}', "records no cost profile"),
    (b'{"event": "start", "costs": 5}', "records no cost profile"), (b"\xff\xfe\x00", "not UTF-8"),
    (b"[true, 2]", "a cost profile is a list"), (b"[1e308]", "a cost profile is a list"),
    (b"[" * 100_000 + b"]" * 100_000, "nests too deeply")])
def test_a_costs_file_that_is_no_profile_is_one_clear_line(tmp_path, content, needle):
    from specviz.costs import load_costs
    from specviz.errors import SpecvizError

    f = tmp_path / "c.json"
    f.write_bytes(content)
    with pytest.raises(SpecvizError, match=needle) as e:
        load_costs(str(f))
    assert str(e.value).startswith("--costs")


def test_a_mistyped_exact_mode_is_refused_not_read_as_auto(monkeypatch):
    from specviz.backends import exact
    from specviz.errors import SpecvizError

    for said, mode in (("1", "on"), ("off", "off"), ("", "auto"), ("AUTO", "auto")):
        monkeypatch.setenv("SPECVIZ_EXACT", said)
        assert exact.mode() == mode
    monkeypatch.setenv("SPECVIZ_EXACT", "maybe")
    with pytest.raises(SpecvizError, match="SPECVIZ_EXACT must be auto, 1 .on. or 0 .off., got 'maybe'"):
        exact.mode()


def test_run_vanilla_matches_speculative_greedy(capsys, tiny_registry):
    outs = []
    for extra in ([], ["--vanilla"], ["--draft", "early-exit:2"], ["--draft", "lookup:2"]):
        code, out, _ = cli(capsys, "run", "--models", str(tiny_registry), "--pair", "tiny-draft",
                           "--prompt", "abc abc", "--max-new-tokens", "25", "--json", *extra)
        assert code == 0
        outs.append(json.loads(out.strip().splitlines()[-1])["output_ids"])
        start = json.loads(out.splitlines()[0])
        # a plain run's start named the pair's draft model, which it never ran
        assert (start["draft"] == {}) == (extra == ["--vanilla"]), (extra, start["draft"])
    assert all(o == outs[0] for o in outs)


def test_run_human_output(capsys, tiny_registry):
    code, out, err = cli(capsys, "run", "--models", str(tiny_registry), "--target", "tiny-target",
                         "--draft", "tiny-draft", "--prompt", "hi", "--max-new-tokens", "8",
                         "--temperature", "1", "--top-k", "5", "--seed", "3")
    assert code == 0 and "#0" in err and "tokens/s" in err


def test_check_json(capsys, tiny_registry):
    code, out, _ = cli(capsys, "check", "--models", str(tiny_registry), "--pair", "tiny-draft",
                       "--prompt", "ab ab a", "--samples", "300", "--json", "--no-chat")
    res = json.loads(out)
    assert code == 0 and 0 <= res["tv"] <= 1 and 0 <= res["p_value"] <= 1
    # the two distributions: every sampled token and the target's likeliest, with the rest as one entry
    rows, others = res["tokens"], res["others"]
    assert sum(r["count"] for r in rows) + others["count"] == 300 and others["count"] == 0
    assert sum(r["p"] for r in rows) + others["p"] == pytest.approx(1.0)
    assert [r["p"] for r in rows] == sorted((r["p"] for r in rows), reverse=True)
    assert all(r["freq"] == r["count"] / 300 and isinstance(r["text"], str) for r in rows)
    tv = 0.5 * (sum(abs(r["p"] - r["freq"]) for r in rows) + others["p"])  # the TV the check printed
    assert tv == pytest.approx(res["tv"], abs=1e-6)  # the target p sums to 1 within float32


@pytest.mark.parametrize("argv,needle", [
    (["run", "--pair", "nope", "--prompt", "x"], "unknown pair"),
    (["run", "--target", "nope", "--prompt", "x"], "unknown model"),
    (["run", "--pair", "tiny-mismatch", "--prompt", "x"], "tokenizers"),
    (["run", "--pair", "tiny-draft", "--prompt", "x", "--gamma", "0"], "gamma"),
    (["run", "--pair", "tiny-draft", "--prompt", "x", "--gamma", "32"], "gamma must be a whole number between 1 and 31"),
    (["run", "--pair", "tiny-draft", "--prompt", "x", "--seed", "9" * 23], "seed must be a whole number between 0 and"),
    (["lab", "gamma_sweep", "--pair", "tiny-draft", "--prompt", "x", "--gammas", "3", "1000"], "between 1 and 31"),
    (["run", "--pair", "tiny-draft", "--prompt", "x", "--temperature", "-1"], "temperature"),
    (["run", "--pair", "tiny-draft", "--prompt", "x", "--top-p", "2"], "top-p"),
    (["run", "--pair", "tiny-draft", "--prompt", "   "], "empty"),
    (["run", "--pair", "tiny-draft", "--prompt", "y" * 700, "--no-chat"], "context"),
    (["run", "--pair", "tiny-draft", "--prompt", "x", "--max-new-tokens", "0"], "max new tokens"),
    (["run", "--pair", "tiny-draft", "--prompt", "x", "--device", "cuda"], "cuda"),
    (["check", "--pair", "tiny-draft", "--prompt", "x", "--samples", "2"], "samples"),
    (["check", "--pair", "tiny-draft", "--prompt", "x", "--samples", "9" * 20], "--samples must be from 10 to"),
    (["run", "--pair", "tiny-draft", "--prompt", "x", "--exact", "--dtype", "bfloat16"], "--exact holds for float32"),
])
def test_errors_are_one_clear_line(capsys, tiny_registry, argv, needle):
    code, out, err = cli(capsys, *argv[:1], "--models", str(tiny_registry), *argv[1:])
    if needle == "cuda" and code == 0:
        pytest.skip("a CUDA device is present")
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err


def test_subprocess_errors_have_no_traceback(tiny_registry):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for argv in (["run", "--models", str(tiny_registry), "--pair", "tiny-draft", "--prompt", "x", "--gamma", "0"],
                 ["run", "--models", str(tiny_registry), "--prompt", "x", "--bogus"]):
        r = subprocess.run([sys.executable, "-m", "specviz", *argv], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_package_never_imports_gradio():
    code = ("import sys, pkgutil, importlib, specviz\n"
            "for m in pkgutil.iter_modules(specviz.__path__):\n"
            "    if m.name != '__main__':\n"
            "        importlib.import_module('specviz.' + m.name)\n"
            "assert 'gradio' not in sys.modules, 'specviz imported gradio'\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_check_says_when_there_are_too_few_samples_for_a_chi_square():
    from specviz.check import CheckResult, chi_square

    exact = {t: 0.01 for t in range(100)}  # no token expected 5 times in 20 draws: one pooled bin
    stat, dof, p = chi_square({3: 20}, exact, 20)
    assert dof == 0 and math.isnan(p)  # not "p = 1.000", a pass that tested nothing
    res = CheckResult(20, exact, {3: 20}, 0.99, stat, dof, p, 0.5).to_dict()
    assert res["p_value"] is None and res["chi2"] is None and json.dumps(res)
    stat, dof, p = chi_square({0: 60, 1: 40}, {0: 0.5, 1: 0.5}, 100)  # two bins: a real test
    assert dof == 1 and 0 < p < 0.1


def test_check_puts_its_tv_beside_what_sampling_noise_gives():
    """A TV distance over a whole vocabulary from a few hundred samples is far from 0 even for a
    perfect sampler: the check prints what exact draws give at the same size, which grows with the
    spread of the distribution and shrinks with more samples."""
    from specviz.check import tv_of_exact_draws

    flat = {t: 1 / 1000 for t in range(1000)}
    assert tv_of_exact_draws({7: 1.0}, 300) == 0.0
    assert 0.4 < tv_of_exact_draws(flat, 300) < 0.9  # 300 draws over 1,000 equal tokens
    assert tv_of_exact_draws(flat, 3000) < tv_of_exact_draws(flat, 300)
    assert tv_of_exact_draws({0: 0.5, 1: 0.5}, 300) < 0.1


def test_check_at_greedy_says_why_there_is_no_test(capsys, tiny_registry):
    code, out, _ = cli(capsys, "check", "--models", str(tiny_registry), "--pair", "tiny-draft",
                       "--prompt", "ab ab a", "--samples", "20", "--no-chat", "--top-k", "1", "--temperature", "1")
    assert code == 0 and "one token all its mass" in out and "raise --samples" not in out


def test_run_lines_give_no_ratio_to_tokens_the_rule_never_examined():
    """After a refusal the remaining proposals are discarded unexamined; the run line printed a
    ratio for them anyway (' friend':--(min(1,p/q)=1.00))."""
    from types import SimpleNamespace

    from specviz.cli import _fmt_iteration

    ev = SimpleNamespace(index=3, proposed=[1, 2, 3], proposed_text=["a", "b", "c"], accept_prob=[1.0, 0.25, 1.0],
                         accepted=1, correction=SimpleNamespace(kind="resample", text="x"), draft_ms=1.0, verify_ms=2.0)
    line = _fmt_iteration(ev)
    assert "'a':ok(min(1,p/q)=1.00)" in line and "'b':NO(min(1,p/q)=0.25)" in line
    assert "'c':--(unchecked)" in line and line.count("min(1,p/q)") == 2


@pytest.mark.parametrize("extra,needle", [
    (["--temperature", "-1"], "temperature"), (["--top-k", "-3"], "top-k"), (["--prompt", " "], "empty"),
    (["--top-p", "0"], "top-p"), (["--max-new-tokens", "0"], "max new tokens"),
])
def test_bad_settings_are_refused_before_any_model_loads(capsys, tiny_registry, monkeypatch, extra, needle):
    """A newcomer's --temperature -1 or empty prompt was refused only after the model loaded (~20 s)."""
    import specviz.cli as cli_module

    monkeypatch.setattr(cli_module, "_pipeline", lambda args: pytest.fail("loaded a model for a bad setting"))
    for cmd in ("run", "check"):
        argv = [cmd, "--models", str(tiny_registry), "--pair", "tiny-draft", "--prompt", "x", *extra]
        if cmd == "check" and needle == "max new tokens":
            continue  # check draws one token: it has no --max-new-tokens
        code, _, err = cli(capsys, *argv)
        assert code == 2 and needle in err, (cmd, err)
