"""The OpenAI-compatible API, served beside the page by the real app on a loopback port and
called with the official ``openai`` client, unchanged: chat and completions, streamed or not, with
and without ``speculative``; greedy text and usage equal plain decoding's; every bad request gets
an OpenAI-shaped error and the server keeps serving; auth; the page and the API share one queue."""

import json
import re
import socket
import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")

import app as app_module  # noqa: E402
from specviz.api.generate import TextStream  # noqa: E402
from specviz.api.snippets import request_body, snippets  # noqa: E402
from specviz.engine import DecodeConfig  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.sampling import SamplingConfig  # noqa: E402
from specviz.registry import load_registry  # noqa: E402

PROMPT = "abc abc abc"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_reg(tiny_registry):
    return load_registry(tiny_registry)


@pytest.fixture(scope="module")
def server(tiny_reg):
    """The app as `python app.py` serves it (page + API, one process), on the tiny registry."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(app_module, "REGISTRY", tiny_reg)
        mp.delenv("SPECVIZ_API_KEY", raising=False)
        demo = app_module.build_demo()
        port = free_port()
        demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                    **app_module.launch_kwargs())
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            demo.close()


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120)


def plain(reg, prompt=PROMPT, chat=True, max_new=24, pair=None):
    """What plain decoding gives for the prompt: text, completion tokens, prompt tokens."""
    pipe = build_pipeline(reg, pair=pair or reg.default(), device=app_module.DEVICE, dtype=app_module.DTYPE)
    ids = pipe.encode(prompt, chat=chat)
    *_, summary = pipe.vanilla(ids, DecodeConfig(max_new_tokens=max_new))
    return summary.text, summary.new_tokens, len(ids)


def call(client, kind, stream, speculative, max_tokens=24, prompt=PROMPT, model="tiny-target", **kw):
    """One request; returns (text, usage, finish_reason) however it was delivered."""
    extra = {"speculative": speculative} if speculative is not None else None
    if kind == "chat":
        args = dict(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                    temperature=0, extra_body=extra, **kw)
        create = client.chat.completions.create
    else:
        args = dict(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, extra_body=extra, **kw)
        create = client.completions.create
    if not stream:
        r = create(**args)
        c = r.choices[0]
        return (c.message.content if kind == "chat" else c.text), r.usage, c.finish_reason
    pieces, usage, finish = [], None, None
    for chunk in create(stream=True, stream_options={"include_usage": True}, **args):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            piece = c.delta.content if kind == "chat" else c.text
            pieces.append(piece or "")
            finish = c.finish_reason or finish
    return "".join(pieces), usage, finish


def test_models_lists_targets_and_their_drafters(client):
    models = {m.id: m for m in client.models.list().data}
    assert {"tiny-target", "tiny-draft", "hub-only"} <= set(models)
    spec = models["tiny-target"].speculative
    assert spec["auto"] == {"pair": "tiny-draft", "draft_model": "tiny-draft", "num_speculative_tokens": 4}
    assert {"auto", "lookup", "lookup:N", "early-exit:L", "recycling", "recycling:only", "self:bf16",
            "self:int8", "tiny-draft"} <= set(spec["draft_models"])
    assert "head" not in spec["draft_models"]  # no trained head ships for the tiny target
    assert models["hub-only"].available_offline is False
    assert client.models.retrieve("tiny-target").id == "tiny-target"


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("stream", [False, True])
def test_greedy_output_and_usage_equal_plain_decoding(client, tiny_reg, kind, stream):
    text, n, prompt_tokens = plain(tiny_reg, chat=kind == "chat")
    # without a γ, a named drafter runs at the γ of models.yaml's pair with it (tiny-lookup 5,
    # tiny-early-exit 3, also for another depth), "auto" at the recommended pair's (tiny-draft, 4)
    own = {"auto": 4, "lookup": 5, "early-exit:2": 3, "early-exit:1": 3}
    for speculative in (None, {"draft_model": "auto"}, {"draft_model": "lookup", "num_speculative_tokens": 3},
                        {"draft_model": "lookup"}, {"draft_model": "early-exit:2"}, {"draft_model": "early-exit:1"},
                        {"draft_model": None}):
        got, usage, finish = call(client, kind, stream, speculative)
        assert got == text, speculative
        assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (prompt_tokens, n, prompt_tokens + n)
        assert finish == "length"
        stats = usage.speculative
        on = speculative is not None and speculative.get("draft_model") is not None
        assert stats["mode"] == ("speculative" if on else "plain")
        assert stats["target_passes"] >= 1 and stats["accepted"] <= stats["proposed"]
        assert stats["tokens_per_pass"] == pytest.approx(n / stats["target_passes"])
        if on:
            assert stats["num_speculative_tokens"] == (speculative.get("num_speculative_tokens")
                                                       or own[speculative["draft_model"]]), speculative
        else:
            assert stats["proposed"] == 0 and stats["target_passes"] == n


def test_real_default_pair_greedy_equals_plain_decoding(real_pipeline_factory, client, monkeypatch):
    """The offline default pair (SmolLM2-135M + lookup): API text and usage == plain decoding."""
    reg = load_registry()
    monkeypatch.setattr(app_module, "REGISTRY", reg)
    pair = reg.pair(reg.default())
    pipe = real_pipeline_factory(pair.name)
    prompt = "Repeat this sentence twice: the quick brown fox jumps over the lazy dog."
    ids = pipe.encode(prompt, chat=True)
    *_, ref = pipe.vanilla(ids, DecodeConfig(max_new_tokens=40))
    for stream, speculative in ((False, {"draft_model": "auto"}), (True, {"draft_model": "auto"}), (False, None)):
        text, usage, _ = call(client, "chat", stream, speculative, max_tokens=40, prompt=prompt, model=pair.target)
        assert text == ref.text
        assert (usage.prompt_tokens, usage.completion_tokens) == (len(ids), ref.new_tokens)
        if speculative and not stream:
            assert usage.speculative["pair"] == pair.name and usage.speculative["accepted"] > 0  # it did speculate
    assert usage.speculative["mode"] == "plain"
    comp_ids = pipe.encode(prompt, chat=False)
    *_, ref = pipe.vanilla(comp_ids, DecodeConfig(max_new_tokens=24))
    text, usage, _ = call(client, "completion", False, {"draft_model": "lookup"}, max_tokens=24, prompt=prompt,
                          model=pair.target)
    assert text == ref.text and usage.completion_tokens == ref.new_tokens and usage.prompt_tokens == len(comp_ids)


def _err(client, **kw):
    body = {"model": "tiny-target", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8}
    body.update(kw)
    with pytest.raises(openai.APIStatusError) as info:
        client.post("/chat/completions", body=body, cast_to=object)
    return info.value


@pytest.mark.parametrize("kw,status,param,needle", [
    ({"model": "no-such-model"}, 404, "model", "does not exist"),
    ({"model": 5}, 400, "model", "model must be a string, one of the ids GET /v1/models lists; got 5"),
    ({"model": None}, 400, "model", "got null"),
    ({"model": ""}, 400, "model", "model is required"),
    ({"speculative": {"draft_model": "self:fp8"}}, 400, "speculative.draft_model", "one of bf16, bfloat16, int8, qint8, got 'fp8'"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, 400, "stream_options.include_usage",
     "true or false"),
    ({"model": "tiny-lookup"}, 404, "model", "is a pair: ask for its target 'tiny-target'"),
    ({"speculative": {"draft_model": "nope"}}, 400, "speculative.draft_model", "unknown drafter"),
    ({"speculative": {"draft_model": "lookup", "num_speculative_tokens": 0}}, 400,
     "speculative.num_speculative_tokens", "between 1 and 31"),
    ({"speculative": {"draft_model": "lookup", "num_speculative_tokens": 100}}, 400,
     "speculative.num_speculative_tokens", "between 1 and 31"),
    ({"speculative": {"draft_model": "tiny-other"}}, 400, "speculative.draft_model", "tokenizer"),
    ({"speculative": {"draft": "lookup"}}, 400, "speculative", "unknown field"),
    ({"speculative": {"draft_model": "lookup", "costs": "fast"}}, 400, "speculative.costs", '"reference" or a list'),
    ({"speculative": {"draft_model": "lookup", "costs": []}}, 400, "speculative.costs", "1 to 32 positive numbers"),
    ({"speculative": {"draft_model": "lookup", "costs": [1.0] * 33}}, 400, "speculative.costs", "1 to 32"),
    ({"speculative": {"draft_model": "lookup", "costs": [1.0, 0]}}, 400, "speculative.costs", "must be in (0, 1000]"),
    ({"speculative": {"draft_model": "lookup", "costs": [1.0, "2"]}}, 400, "speculative.costs", 'got "2"'),
    ({"model": "tiny-draft", "speculative": {"draft_model": "auto"}}, 400, "speculative.draft_model", "no pair"),
    ({"speculative": {"draft_model": "early-exit:9"}}, 400, "speculative.draft_model", "layer"),
    ({"temperature": -1}, 400, "temperature", "temperature must be in"),
    ({"top_p": 0}, 400, "top_p", "top_p must be in"),
    ({"messages": []}, 400, "messages", "non-empty"),
    ({"messages": [{"role": "user", "content": "x" * 100_000}]}, 400, "messages", "at most 20,000"),
    ({"max_tokens": 0}, 400, "max_tokens", ">= 1"),
    ({"max_tokens": 8, "max_completion_tokens": 16}, 400, "max_tokens", "disagree: give one of them"),
    ({"max_tokens": 10 ** 6}, 400, "max_tokens", "at most 1024"),
    ({"n": 2}, 400, "n", "not supported"),
    ({"n": True}, 400, "n", "not supported"),  # JSON's true is no count, though True == 1 in Python
    ({"logprobs": True}, 400, "logprobs", "logprobs: true is not supported"),  # JSON's words, not Python's
    ({"max_tokens": True}, 400, "max_tokens", "got true"),
    ({"top_k": "3"}, 400, "top_k", 'got "3"'),
    ({"frobnicate": 1}, 400, "frobnicate", "unrecognized"),
    ({"model": "hub-only"}, 503, "model", "cannot be loaded"),
])
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(client, kw, status, param, needle):
    e = _err(client, **kw)
    assert e.status_code == status
    err = e.body  # the openai client hands over the "error" object
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and needle in err["message"], err
    assert "Traceback" not in err["message"]
    assert call(client, "chat", False, None, max_tokens=4)[1].completion_tokens == 4


def test_error_codes_tell_a_drafter_that_does_not_fit_from_an_unknown_one(client):
    assert _err(client, speculative={"draft_model": "nope"}).body["code"] == "unknown_draft_model"
    for draft in ("early-exit:99", "tiny-other", "head"):
        e = _err(client, speculative={"draft_model": draft})
        assert (e.status_code, e.body["code"]) == (400, "unsupported_draft_model"), draft
    same = {"model": "tiny-target", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 3,
            "max_completion_tokens": 3, "temperature": 0}
    r = client.post("/chat/completions", body=same, cast_to=object)
    assert r["usage"]["completion_tokens"] == 3


def test_a_prompt_and_max_tokens_past_the_context_are_refused_not_clipped(client, tiny_reg):
    """The prompt plus an explicit max_tokens over the model's context was answered with a reply cut
    at the context and finish_reason "length"; OpenAI and vLLM answer 400. Without max_tokens the
    server's default still fits what room is left."""
    prompt = "abc " * 90
    _, _, n = plain(tiny_reg, prompt, max_new=1)
    context = 512  # the tiny target's
    assert 300 < n < context - 100
    for field in ("max_tokens", "max_completion_tokens"):
        e = _err(client, messages=[{"role": "user", "content": prompt}], **{"max_tokens": None, field: context - n + 1})
        assert (e.status_code, e.body["code"], e.body["param"]) == (400, "context_length_exceeded", field)
        assert f"ask for at most {context - n}" in e.body["message"]
    text, usage, finish = call(client, "chat", False, None, max_tokens=context - n, prompt=prompt)
    assert usage.prompt_tokens == n and usage.completion_tokens <= context - n
    r = client.chat.completions.create(model="tiny-target", messages=[{"role": "user", "content": prompt}],
                                       temperature=0)  # no max_tokens: the default, within the room left
    assert r.usage.prompt_tokens + r.usage.completion_tokens <= context


def test_malformed_json_and_unknown_routes(server, client):
    r = httpx.post(f"{server}/v1/chat/completions", content=b'{"model": "tiny-target", ',
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(f"{server}/v1/completions", content=b"[1, 2]")
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    r = httpx.get(f"{server}/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.options(f"{server}/v1/chat/completions")  # was Starlette's {"detail": "Method Not Allowed"}
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    r = httpx.head(f"{server}/v1/models")  # GET's answer without its body
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    r = httpx.post(f"{server}/v1/embeddings", json={})
    assert r.status_code == 404 and "no such endpoint" in r.json()["error"]["message"]
    assert httpx.get(f"{server}/").status_code == 200  # the page is still there
    assert call(client, "completion", False, None, max_tokens=4)[1].completion_tokens == 4
    # what json.loads itself refuses past the syntax: a 5,001-digit integer (Python's 4,300-digit
    # limit) and 100,000 nested arrays (recursion) are bad JSON too, not internal errors
    for raw in (b'{"model": "tiny-target", "max_tokens": 1' + b"0" * 5000 + b"}",
                b'{"model": "tiny-target", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"):
        r = httpx.post(f"{server}/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text[:300]
    # JSON may escape a lone surrogate, which no tokenizer encodes (the openai client cannot even
    # send one): refused, naming the field
    user = '"messages": [{"role": "user", "content": %s}]'
    for route, fields, param in (
            ("completions", r'"prompt": "a\ud800b"', "prompt"),
            ("chat/completions", user % r'"a\ud800b"', "messages[0].content"),
            ("chat/completions", user % r'[{"type": "text", "text": "\udfff"}]', "messages[0].content[0].text"),
            ("chat/completions", user % '"hi"' + r', "stop": ["ok", "\udc00"]', "stop")):
        r = httpx.post(f"{server}/v1/{route}", headers={"Content-Type": "application/json"},
                       content=('{"model": "tiny-target", "max_tokens": 3, %s}' % fields).encode())
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == param and "lone surrogate" in err["message"], err
    assert call(client, "completion", False, None, max_tokens=4)[1].completion_tokens == 4


def test_auth_with_an_api_key(server, monkeypatch):
    monkeypatch.setenv("SPECVIZ_API_KEY", "s3cret-key")
    for key in ("wrong", "s3cret-ke", "s3cret-key-and-more"):
        c = openai.OpenAI(base_url=f"{server}/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.AuthenticationError) as info:
            c.models.list()
        assert info.value.body["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            call(c, "chat", False, {"draft_model": "lookup"}, max_tokens=4)
    r = httpx.post(f"{server}/v1/chat/completions", json={"model": "tiny-target"})
    assert r.status_code == 401 and "missing API key" in r.json()["error"]["message"]
    good = openai.OpenAI(base_url=f"{server}/v1", api_key="s3cret-key", max_retries=0)
    assert call(good, "chat", True, {"draft_model": "lookup"}, max_tokens=4)[1].completion_tokens == 4
    monkeypatch.delenv("SPECVIZ_API_KEY")
    assert call(openai.OpenAI(base_url=f"{server}/v1", api_key="anything", max_retries=0),
                "chat", False, None, max_tokens=4)[2] == "length"


def test_stop_sequences_cut_text_and_count_tokens_alike(client, tiny_reg):
    text, _, _ = plain(tiny_reg, max_new=40)
    assert len(text) >= 8, text
    stop = text[5:8]
    expected = text[:text.find(stop)]
    results = [call(client, "chat", stream, spec, max_tokens=40, stop=[stop, "\u2603never"])
               for stream in (False, True) for spec in (None, {"draft_model": "auto"})]
    assert all(r[0] == expected and r[2] == "stop" for r in results), results
    assert len({r[1].completion_tokens for r in results}) == 1  # speculated or not: the same count


def test_text_stream_holds_back_partial_stops_and_characters():
    class Tok:  # ids are characters; 0 is half of a two-byte character
        def decode(self, ids, skip_special_tokens=True):
            s = "".join("\ufffd" if i == 0 else chr(i) for i in ids)
            return s.replace("\ufffd" + "\x01", "é")

    ts = TextStream(Tok(), ["STOP"])
    out = [ts.push(ord(c)) for c in "abS"]
    assert out == ["a", "b", ""]  # "S" may start STOP
    assert ts.push(ord("x")) == "Sx"
    assert ts.push(0) == "" and ts.push(1) == "é"  # no half character is sent
    assert [ts.push(ord(c)) for c in "STOP"] == ["", "", "", ""] and ts.stopped
    assert ts.text == "abSxé" and ts.finish() == ""
    two = TextStream(Tok(), ["xyz", "yq"])
    assert [two.push(ord(c)) for c in "axy"] == ["a", "", ""]  # "xy" may start xyz (and "y" yq)
    assert two.push(ord("w")) == "xyw" and not two.stopped


def test_client_that_disconnects_stops_its_decoding(server, client):
    stream = client.chat.completions.create(model="tiny-target", messages=[{"role": "user", "content": PROMPT}],
                                            max_tokens=480, temperature=0, stream=True)
    got = 0
    for chunk in stream:
        got += 1
        if got == 3:
            break
    stream.close()  # hang up with ~480 tokens to go (~1.1 s of decoding on the tiny model, up to the context)
    t0 = time.perf_counter()
    _, usage, _ = call(client, "chat", False, None, max_tokens=4)
    # the abandoned run let go at once (measured ~0.1-0.4 ms; the rest of its decoding would take ~1 s)
    assert usage.speculative["queue_ms"] < 500, usage.speculative
    assert time.perf_counter() - t0 < 5


def test_five_api_clients_and_a_page_run_share_the_queue(server, tiny_reg):
    from gradio_client import Client

    expected, n, _ = plain(tiny_reg, max_new=24)
    results, errors = [], []

    def api_client(i):
        try:
            c = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=300)
            spec = [None, {"draft_model": "auto"}, {"draft_model": "lookup"}, {"draft_model": "early-exit:2"},
                    {"draft_model": "auto", "num_speculative_tokens": 2}][i]
            results.append(call(c, ["chat", "chat", "chat", "chat", "chat"][i], i % 2 == 0, spec))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    page = Client(f"{server}/", verbose=False)
    threads = [threading.Thread(target=api_client, args=(i,)) for i in range(5)]
    job = page.submit(pair="tiny-draft", prompt=PROMPT, chat=True, gamma=4, temperature=0.0, max_new_tokens=24,
                      seed=0, with_vanilla=False, backend="specviz", vllm_url="", api_name="/run")
    for t in threads:
        t.start()
    final = job.result(timeout=300)
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert len(results) == 5 and all(r[0] == expected and r[1].completion_tokens == n for r in results)
    # the page's /run also hands gradio_client callers a structured result (the hidden JSON output)
    result = next(v for v in final if isinstance(v, dict) and "acceptance_rate" in v)
    assert result["text"] == expected and result["tokens"] == n and result["stop_reason"] == "max_new_tokens"


def test_page_points_to_the_api_and_its_snippets_run(server, tiny_reg, capsys):
    config = httpx.get(f"{server}/config").json()
    assert any(c.get("props", {}).get("elem_id") == "sv-api-curl" for c in config["components"])
    body = request_body("tiny-target", "it's \"quoted\" $HOME", True, "auto", 4, 0.0, 1.0, 8, 0)
    curl, python = snippets(server, body)
    sent = json.loads(re.search(r"-d '(.*)'$", curl, re.S).group(1).replace("'\\''", "'"))
    assert sent == body  # the shell quoting survives quotes, $ and apostrophes
    exec(compile(python, "snippet", "exec"), {})  # the Python snippet runs as shown
    out = capsys.readouterr().out
    assert "'mode': 'speculative'" in out
    # sampling settings the page has, top-k included, reach both snippets (top-k through extra_body)
    body = request_body("tiny-target", PROMPT, True, "auto", 4, 0.8, 0.9, 8, 5, top_k=3)
    assert body["top_k"] == 3 and body["top_p"] == 0.9 and body["seed"] == 5
    curl, python = snippets(server, body)
    assert json.loads(re.search(r"-d '(.*)'$", curl, re.S).group(1).replace("'\\''", "'"))["top_k"] == 3
    assert "extra_body={'speculative': {'draft_model': 'auto', 'num_speculative_tokens': 4}, 'top_k': 3}" in python
    exec(compile(python, "snippet", "exec"), {})
    assert "'mode': 'speculative'" in capsys.readouterr().out
    assert "top_k" not in request_body("tiny-target", PROMPT, top_k=0)
    # the page's reference profile reaches the call (its seeded sampled run then repeats through the API)
    body = request_body("tiny-target", PROMPT, True, "lookup", 4, 0.8, 1.0, 8, 5, costs="reference")
    assert body["speculative"]["costs"] == "reference"
    curl, python = snippets(server, body)
    exec(compile(python, "snippet", "exec"), {})
    assert "'source': 'pinned'" in capsys.readouterr().out
    assert "costs" not in request_body("tiny-target", PROMPT, costs="measured")["speculative"]


def test_a_full_queue_answers_429_with_retry_after(client, monkeypatch):
    monkeypatch.setenv("SPECVIZ_API_MAX_QUEUE", "1")
    stream = client.chat.completions.create(model="tiny-target", messages=[{"role": "user", "content": PROMPT}],
                                            max_tokens=400, temperature=0, stream=True)
    for chunk in stream:  # decoding has begun: the queue holds one run
        if chunk.choices and chunk.choices[0].delta.content:
            break
    with pytest.raises(openai.RateLimitError) as info:
        call(client, "chat", False, None, max_tokens=4)
    assert info.value.body["code"] == "queue_full" and int(info.value.response.headers["retry-after"]) >= 1
    wait = info.value.response.headers["retry-after"]
    assert f"(1 run running or waiting, the page's included); try again in about {wait} s" in info.value.body["message"]
    stream.close()
    monkeypatch.delenv("SPECVIZ_API_MAX_QUEUE")
    assert call(client, "chat", False, None, max_tokens=4)[1].completion_tokens == 4


def test_requests_arriving_together_cannot_pass_a_full_queue(server, client, monkeypatch):
    """Admission is checked and counted in one step: three requests released at once while each
    spends a second loading get one place between them (the queue's limit, 1), not three; a place
    is given back when the load fails, and none is left over afterwards."""
    from specviz.api import generate
    from specviz.errors import SpecvizError

    monkeypatch.setenv("SPECVIZ_API_MAX_QUEUE", "1")
    real = generate.load
    monkeypatch.setattr(generate, "load", lambda *a: (time.sleep(1.0), real(*a))[1])
    gate, codes = threading.Barrier(3), []

    def one():
        gate.wait()
        r = httpx.post(f"{server}/v1/chat/completions", timeout=120, json={
            "model": "tiny-target", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4})
        codes.append(r.status_code)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [200, 429, 429], codes
    assert app_module.RUNNER.queued == 0

    def broken(*a):
        raise SpecvizError("the weights are gone")

    monkeypatch.setattr(generate, "load", broken)
    with pytest.raises(openai.APIStatusError):
        call(client, "chat", False, None, max_tokens=4)
    assert app_module.RUNNER.queued == 0  # the failed load gave its place back
    monkeypatch.setattr(generate, "load", real)
    assert call(client, "chat", False, None, max_tokens=4)[1].completion_tokens == 4


def test_page_snippet_names_the_drafter_the_page_runs():
    """The page's API snippet asks for what the page would run: ``auto`` where the API's choice for
    the model is the chosen pair, else that pair's drafter; a target picked alone decodes with
    lookup, a drafter picked in the page is named as picked."""
    from specviz.api.generate import drafter_label, recommended_pair
    from specviz.api.snippets import page_draft_model
    from specviz.registry import load_registry

    reg = load_registry()
    pairs = [p for p, _ in reg.ordered_pairs()]
    assert page_draft_model(reg, reg.default(), None, None) == (reg.pair(reg.default()).target, "auto")
    others = [p for p in pairs if recommended_pair(reg, p.target).name != p.name]
    assert others
    for p in others:
        assert page_draft_model(reg, p.name, None, None) == (p.target, drafter_label(p.drafter))
    assert page_draft_model(reg, reg.default(), "some-target", None) == ("some-target", "lookup")
    assert page_draft_model(reg, reg.default(), None, "early-exit:3")[1] == "early-exit:3"


def test_one_gamma_limit_everywhere_within_the_exact_passes():
    from specviz.errors import SpecvizError

    from specviz.api.requests import MAX_SPECULATIVE_TOKENS
    from specviz.backends.exact import MAX_ROWS
    from specviz.engine import MAX_GAMMA, DecodeConfig

    assert MAX_SPECULATIVE_TOKENS == MAX_GAMMA == MAX_ROWS - 1  # a pass of gamma + 1 rows stays row-invariant
    DecodeConfig(gamma=MAX_GAMMA)
    with pytest.raises(SpecvizError, match="between 1 and 31"):
        DecodeConfig(gamma=MAX_GAMMA + 1)


def test_a_pinned_cost_profile_repeats_a_seeded_speculative_sample_beyond_this_server(client):
    """The lookup drafter chooses its proposal lengths from the cost profile the server measured at its
    first run, so a seeded, sampled speculative request gave other text after a restart, and the API had
    no way to pin it. ``speculative.costs`` pins it ("reference", or the ``usage.speculative.costs.v`` an
    earlier response reported, unrounded), and the lengths follow the profile given."""
    from specviz.costs import REFERENCE

    def ask(costs=None, seed=11):
        spec = {"draft_model": "lookup", "num_speculative_tokens": 4}
        if costs is not None:
            spec["costs"] = costs
        r = client.completions.create(model="tiny-target", prompt=PROMPT * 3, max_tokens=24, temperature=1.0,
                                      seed=seed, extra_body={"speculative": spec})
        return r.choices[0].text, r.usage.speculative

    text, used = ask()
    assert used["costs"]["source"].startswith("measured") and len(used["costs"]["v"]) == 5
    again, pinned = ask(used["costs"]["v"])
    assert (again, pinned["proposed"], pinned["accepted"]) == (text, used["proposed"], used["accepted"])
    assert pinned["costs"] == {"source": "pinned", "v": used["costs"]["v"]}
    assert ask("reference")[1]["costs"]["v"] == list(REFERENCE)
    assert ask("measured")[1]["costs"] == used["costs"]
    # the profile is what the lengths are chosen by: a pass that costs 100 steps is never worth proposing
    _, dear = ask([1.0] + [100.0] * 4)
    _, cheap = ask([1.0] * 5)
    assert dear["proposed"] == 0 and cheap["proposed"] > 0, (dear, cheap)
    # plain decoding has no drafter to hand a profile to
    r = client.completions.create(model="tiny-target", prompt=PROMPT, max_tokens=4, extra_body={"speculative": None})
    assert r.usage.speculative["costs"] is None


def test_any_int64_seed_is_taken_and_a_negative_one_seeds_as_torch_reads_it(client, tiny_reg):
    """OpenAI's seed is an int64: a negative seed reproduces, is echoed as given, and draws what the
    engine draws from its two's complement (torch's own reading of a negative seed)."""
    pipe = build_pipeline(tiny_reg, pair=tiny_reg.default(), device=app_module.DEVICE, dtype=app_module.DTYPE)
    ids = pipe.encode(PROMPT, chat=False)
    cfg = DecodeConfig(max_new_tokens=12, seed=2 ** 64 - 7, sampling=SamplingConfig(temperature=1.0))
    *_, ref = pipe.vanilla(ids, cfg)
    for _ in range(2):
        r = client.completions.create(model="tiny-target", prompt=PROMPT, max_tokens=12, temperature=1.0, seed=-7)
        assert r.choices[0].text == ref.text
        assert r.usage.speculative["seed"] == -7
    for seed in (-2 ** 63, 2 ** 63 - 1):
        assert client.completions.create(model="tiny-target", prompt=PROMPT, max_tokens=2, seed=seed).usage.completion_tokens == 2
    for seed in (-2 ** 63 - 1, 2 ** 63):
        e = _err(client, seed=seed)
        assert (e.status_code, e.body["param"]) == (400, "seed") and "between" in e.body["message"]


def test_a_load_left_waiting_when_the_server_stops_is_a_503_not_a_crash():
    """SIGTERM while a request's load waited behind a run: serving ends and cancels the queued load.
    The client got a plain-text 500 and the log a traceback (asyncio.CancelledError is no Exception);
    it is now the OpenAI-shaped 503 a stopping server gives, as is a job the stop interrupted."""
    import asyncio

    from specviz.api.errors import ApiError
    from specviz.api.server import Api, internal
    from specviz.mainthread import Interrupted
    from tests.test_mainthread import holding, start_serving

    runner, until, server = start_serving()
    release = threading.Event()
    held = runner.stream(holding(release))
    api = Api(lambda: None, runner)
    ran = []

    async def request():
        waiting = asyncio.ensure_future(api.on_decode_thread(ran.append, "loaded"))
        await asyncio.sleep(0.2)  # queued behind the run
        until.set()  # the server stops ...
        release.set()
        held.close()  # ... once the running job ends: the queued load is cancelled
        return await asyncio.wait_for(waiting, 20)
    try:
        assert next(held) == 0
        with pytest.raises(ApiError) as info:
            asyncio.run(request())
    finally:
        release.set()
        until.set()
        held.close()
        server.join(10)
    assert info.value.status == 503 and info.value.body()["error"]["code"] == "server_shutting_down"
    assert ran == []
    shaped = internal(Interrupted("the decode thread was interrupted"))
    assert shaped.status == 503 and shaped.body()["error"]["code"] == "server_shutting_down"
