"""The Gradio app: build without launching, handlers end to end on tiny models, replay safety,
the served API through gradio_client, and a real browser (Playwright + Debian's chromium)."""

import html
import json
import re
import shutil
import socket
import time
from pathlib import Path

import pytest

import app as app_module
from specviz.cli import main as cli_main
from specviz.registry import load_registry


@pytest.fixture()
def tiny_app(tiny_registry, monkeypatch):
    monkeypatch.setattr(app_module, "REGISTRY", load_registry(tiny_registry))
    return app_module


@pytest.fixture()
def every_state(monkeypatch):
    """No redraw throttle: every state of a run is a frame, however fast the machine (a quiet CI box
    finishes the tiny run inside one throttle window)."""
    from specviz.view import frames

    monkeypatch.setattr(frames, "TOKENS_EVERY_S", 0.0)
    monkeypatch.setattr(frames, "CHARTS_EVERY_S", 0.0)


@pytest.fixture()
def uploads(tiny_app, monkeypatch, tmp_path):
    """Handlers called directly: gradio's upload folder is a temporary folder of the test's."""
    folder = tmp_path / "uploads"
    folder.mkdir()
    monkeypatch.setattr(app_module.gr.utils, "get_upload_folder", lambda: str(folder))
    return folder


def args(pair="tiny-draft", prompt="abc abc abc", gamma=4, temperature=0.0, top_k=0, top_p=1.0,
         max_new=24, seed=0, vanilla=True, target=None, drafter=None, costs="measured"):
    return [pair, target or app_module.PAIR_CHOICE, drafter or app_module.PAIR_CHOICE, prompt, True, gamma,
            temperature, top_k, top_p, max_new, seed, costs, vanilla]


def named(update: dict) -> dict:
    """A handler's {component: value} as {name: value}."""
    names = {id(c): k for k, c in app_module.C.items()}
    return {names[id(c)]: v for c, v in update.items()}


def plain(markdown: str) -> str:
    """Escaped Markdown as the reader sees it."""
    return html.unescape(markdown.replace("\\", ""))


def final_of(frames) -> dict:
    """The last value of every output over a stream of updates."""
    out = {}
    for f in frames:
        out.update(named(f))
    return out


def test_demo_builds_without_launching():
    assert app_module.demo is not None
    names = {fn.name for fn in app_module.demo.fns.values()}
    assert {"run_decoding", "replay", "stop", "inspect"} <= names


def test_typed_slider_values_are_clamped_not_refused():
    """A number typed into a slider's box beyond its range reaches the handlers clamped; gradio's
    slider raised before them (HTTP 500 on every change). The page still draws gradio's slider."""
    import gradio as gr

    sliders = [b for b in app_module.demo.blocks.values() if isinstance(b, gr.Slider)]
    assert len(sliders) >= 5
    for s in sliders:
        assert s.get_block_name() == "slider", s.label
        assert s.preprocess(s.maximum + 1000) == s.maximum and s.preprocess(s.minimum - 5) == s.minimum
        mid = s.minimum + (s.maximum - s.minimum) / 2 if s.step is None else s.minimum + s.step
        assert s.preprocess(mid) == pytest.approx(mid)
    # A run sets the Iteration slider's range; gradio then keeps a fresh Slider(**kwargs) for the
    # session (blocks.py, prop updates) and preprocesses with it: 999 typed must still clamp.
    it = app_module.C["iteration"]
    kwargs = {**it.constructor_args, "maximum": 7, "render": False}
    kwargs.pop("value", None)
    fresh = type(it)(**kwargs)
    assert fresh.preprocess(999) == 7 and fresh.preprocess(-3) == 1 and fresh.preprocess(4) == 4
    # a second import (gradio's reload mode re-runs app.py in the same module) keeps gradio's own check
    # underneath the clamp instead of wrapping the clamp in itself (endless recursion on every slider)
    import os
    import subprocess
    import sys

    code = ("import importlib, app, gradio as gr; importlib.reload(app); s = gr.Slider(0, 5); "
            "assert (s.preprocess(999), s.preprocess(3)) == (5, 3)")
    root = Path(app_module.__file__).resolve().parent
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SPECVIZ_PRELOAD": "0"})
    assert done.returncode == 0, done.stderr[-1500:]


def test_a_seed_a_browser_holds_exactly_is_taken():
    """Up to 2^53 - 1 a typed seed is the seed that runs (a double holds it exactly). Above, gradio 6 hands
    the browser's rounded double over as an int (18446744073709551615 typed arrived as
    18446744073709552000 and was refused as out of range, naming a number nobody typed): refused by
    its size whatever its type, with the way to use it. 2^53 itself is refused: 2^53 + 1 typed arrives
    as 2^53 and ran with no word while the box showed ...993."""
    assert app_module.typed_seed(float(2 ** 53 - 1)) == 2 ** 53 - 1 and app_module.typed_seed(None) == 0
    assert app_module.typed_seed(2 ** 53 - 1) == 2 ** 53 - 1 and app_module.typed_seed(7) == 7
    for seed in (-5, -1.0, 1.5):  # refused naming the range this box holds, not the engine's 2^64 - 1
        with pytest.raises(app_module.SpecvizError, match=r"from 0 to 2\^53 - 1 \(9,007,199,254,740,991\) here") as e:
            app_module.typed_seed(seed)
        assert "18446744073709551615" not in str(e.value)
    for seed in (float(2 ** 53), 2 ** 53, float(2 ** 53 + 2), 2 ** 53 + 2, 18446744073709552000, 2 ** 64 - 1):
        with pytest.raises(app_module.SpecvizError, match="cannot be typed exactly.*/v1 API or the CLI"):
            app_module.typed_seed(seed)


def test_typed_whole_numbers_reach_the_handlers_as_typed():
    """The seed and top-k boxes hand a typed 1.5 to the handlers, which refuse it by name; gradio's
    Number(precision=0) rounded it to 2 and ran a setting nobody asked for."""
    import gradio as gr

    boxes = {b.label: b for b in app_module.demo.blocks.values() if isinstance(b, gr.Number)}
    for label in ("Seed", "Top-k (0 = off)"):
        assert boxes[label].preprocess(1.5) == 1.5, label
        assert boxes[label].preprocess(3) == 3, label


def test_the_break_it_menu_names_the_one_experiment_it_changes():
    """The "Break it" menu sat beside all five Lab buttons as if it changed each; only "Same outputs?"
    draws a broken rule."""
    import gradio as gr

    from specviz.lab import EXPERIMENTS

    menus = [b for b in app_module.demo.blocks.values() if isinstance(b, gr.Dropdown) and "Break it" in (b.label or "")]
    assert len(menus) == 1
    n = list(EXPERIMENTS).index("same_outputs") + 1
    assert f"{n}. {EXPERIMENTS['same_outputs'][1]} only" in menus[0].label
    assert not any(t in menus[0].label for _, t, _ in [v for k, v in EXPERIMENTS.items() if k != "same_outputs"])


def test_handler_streams_and_summarises(tiny_app, every_state):
    frames = list(tiny_app.run_decoding(*args()))
    assert len(frames) >= 4  # loading/prefill, several iterations, the end
    assert all(f for f in frames)  # no empty updates are sent
    last = final_of(frames)
    assert "done" in last["status"]
    assert "identical to vanilla" in last["summary"]
    assert "per-position acceptance α" in last["summary"]
    assert 'class="sv-tok sv-acc' in last["tokens"] or 'class="sv-tok sv-res' in last["tokens"]
    runs = last["runs"]
    saved = json.load(open(last["export"]))
    assert saved["speculative"][-1]["output_ids"] == runs["spec"].output_ids == runs["vanilla"].output_ids
    assert last["result"]["identical"] is True and last["result"]["tokens"] == runs["spec"].tokens
    assert "Identical outputs" in last["output"] and "vanilla" in last["output"]
    html_, fig = tiny_app.inspect(runs, 1)
    assert "Iteration 1" in html_ and fig is not None


def _upload(folder, content: str, name="run.json") -> str:
    """What gradio does with an upload: the content, in a new folder inside its upload folder."""
    dest = folder / f"u{time.time_ns()}" / name
    dest.parent.mkdir()
    dest.write_text(content)
    return str(dest)


def test_replay_needs_no_model(tiny_app, uploads, monkeypatch):
    last = final_of(tiny_app.run_decoding(*args()))
    monkeypatch.setattr(app_module, "build_pipeline", lambda *a, **k: pytest.fail("replay loaded a model"))
    final = final_of(tiny_app.replay(_upload(uploads, open(last["export"]).read())))
    assert "replayed" in final["status"] and final["runs"]["spec"].output_ids == last["runs"]["spec"].output_ids
    assert "Identical outputs" in final["output"]
    # the page's controls keep the visitor's settings: the status says what the file ran with
    status = plain(final["status"])
    assert "ran tiny-target with drafter" in status and "γ 4, greedy" in status and "still yours" in status


def test_replay_reads_only_uploads(tiny_app, uploads, tmp_path):
    """A path outside the upload folder (another visitor's export, any server file, a missing
    file) gets one and the same refusal: nothing is read, nothing about it is told."""
    last = final_of(tiny_app.run_decoding(*args()))
    other = tmp_path / "elsewhere.json"
    shutil.copy(last["export"], other)
    messages = set()
    for path in (last["export"], str(other), str(uploads / "missing.json"), "/etc/passwd",
                 str(uploads / ".." / "elsewhere.json")):
        final = final_of(tiny_app.replay(path))
        assert final["status"].startswith("**Error:**") and "runs" not in final
        messages.add(final["status"])
    assert len(messages) == 1 and "uploaded" in messages.pop()


@pytest.mark.parametrize("content,needle", [
    ("{not json", "not a specviz run file: it is not valid JSON (expecting property name enclosed in double "
                  "quotes at line 1, column 2)"),
    ("", "the file is empty"),
    ("   ", "not valid JSON (expecting value at line 1, column 4)"),
    ("[" * 100_000, "not a specviz run file"),
    ('{"speculative": "abc"}', "speculative: expected a list"),
    ('{"nothing": []}', "no 'speculative' events"),
])
def test_malformed_files_get_specific_messages(tiny_app, uploads, content, needle):
    final = final_of(tiny_app.replay(_upload(uploads, content)))
    assert final["status"].startswith("**Error:**") and needle in plain(final["status"])
    assert "anything shown below is from an earlier run" in plain(final["status"])


def test_damaged_field_is_named(tiny_app, uploads):
    last = final_of(tiny_app.run_decoding(*args()))
    data = json.load(open(last["export"]))
    data["speculative"][1]["proposed_text"] = 5
    final = final_of(tiny_app.replay(_upload(uploads, json.dumps(data))))
    assert "proposed_text" in plain(final["status"]) and "expected a list" in final["status"]


@pytest.mark.parametrize("edit,needle", [
    (lambda it: it["q"].__setitem__(0, 1e300), "q[0]: 1e+300 is not a probability"),
    (lambda it: it["p"].__setitem__(0, -5), "p[0]: -5.0 is not a probability"),
    (lambda it: it["correction"].__setitem__("p", 2.0), "correction.p: 2.0 is not a probability"),
    (lambda it: it.__setitem__("draft_ms", 1e300), "draft_ms: 1e+300 is not a time"),
    (lambda it: it.__setitem__("verify_ms", -1.0), "verify_ms: -1.0 is not a time"),
    (lambda it: it.__setitem__("tokens_total", 10 ** 40), "is out of range"),
    (lambda start: start["sampling"].__setitem__("temperature", "abc"), "sampling.temperature: 'abc' is not"),
    (lambda start: start["sampling"].__setitem__("temperature", [1]), "sampling.temperature: [1] is not"),
])
def test_numbers_that_are_no_probability_or_time_are_refused(tiny_app, uploads, edit, needle):
    """A crafted file with the right types but impossible values (a probability of 1e300 or -5, a
    pass of 1e300 ms, an integer beyond any run) is refused naming the field, before any frame."""
    last = final_of(tiny_app.run_decoding(*args()))
    data = json.load(open(last["export"]))
    edit(data["speculative"][0] if "sampling.temperature" in needle else data["speculative"][1])
    frames = list(tiny_app.replay(_upload(uploads, json.dumps(data))))
    final = final_of(iter(frames))
    assert len(frames) == 1 and "runs" not in final
    assert final["status"].startswith("**Error:**") and needle in plain(final["status"]), final["status"]


def test_inconsistent_files_are_refused_before_any_frame(tiny_app, uploads):
    """A file that passes the field types but not the run's own logic (a token kind the view does
    not know, a summary that counts tokens no iteration emitted, bytes that are not text) is refused
    with one clear message; no half-drawn replay is left on the page."""
    last = final_of(tiny_app.run_decoding(*args()))
    data = json.load(open(last["export"]))
    weird = json.loads(json.dumps(data))
    weird["speculative"][2]["correction"]["kind"] = "weird"
    bare = json.loads(json.dumps(data))
    bare["speculative"] = [bare["speculative"][0], bare["speculative"][-1]]
    binary = _upload(uploads, "")
    Path(binary).write_bytes(b"\x00\xff\xfe garbage \x80")
    for path, needle in ((_upload(uploads, json.dumps(weird)), "speculative[2].correction.kind: 'weird'"),
                         (_upload(uploads, json.dumps(bare)), "the iterations emit 0"),
                         (binary, "not UTF-8 text")):
        frames = list(tiny_app.replay(path))
        assert len(frames) == 1, needle  # refused up front: no frame of a partial replay
        final = final_of(iter(frames))
        assert final["status"].startswith("**Error:**") and needle in plain(final["status"]), final["status"]
        assert "runs" not in final


EVIL = '<img src="http://198.51.100.1/x.png" onerror="alert(1)"><div style="position:fixed;inset:0">[x](http://e)'


def _poison(value):
    if isinstance(value, str):
        return EVIL
    if isinstance(value, list):
        return [_poison(v) for v in value]
    if isinstance(value, dict):
        return {k: (v if k == "event" else _poison(v)) for k, v in value.items()}
    return value


def evil_run_file(tiny_app) -> str:
    last = final_of(tiny_app.run_decoding(*args()))
    data = json.load(open(last["export"]))
    data["meta"]["saved"] = EVIL
    for part in ("speculative", "vanilla"):
        data[part] = [_poison(ev) for ev in data[part]]
        for ev in data[part]:
            if ev["event"] == "iteration":  # keep token lists aligned with their texts
                ev["correction"]["kind"] = "resample" if ev["proposed"] else "sample"
    return json.dumps(data)


def test_replayed_html_is_inert(tiny_app, uploads):
    final = final_of(tiny_app.replay(_upload(uploads, evil_run_file(tiny_app))))
    assert "replayed" in final["status"]
    for key in ("tokens", "output", "inspect_html"):  # HTML: entities
        assert "<img" not in final[key] and "<div style" not in final[key], key
    for key in ("status", "summary"):  # Markdown: every punctuation character backslash-escaped
        assert not re.search(r"(?<!\\)[<\[]", final[key]), key


@pytest.mark.parametrize("kw,needle", [
    ({"gamma": 0}, "gamma"), ({"temperature": -1}, "temperature"), ({"temperature": 1e-39}, "temperature"),
    ({"prompt": "  "}, "empty"), ({"prompt": "abc \ud800 def"}, "not valid Unicode at character 5"), ({"top_k": 1.5}, "top-k"), ({"seed": 1.5}, "seed"), ({"seed": -1}, "seed"), ({"max_new": None}, "max new tokens"),
    ({"seed": float(2 ** 64 - 1)}, "cannot be typed exactly in a browser"),
    ({"seed": 18446744073709552000}, "cannot be typed exactly in a browser"),
    ({"pair": "tiny-mismatch"}, "tokenizers"), ({"target": "hub-only"}, "could not load"),
])
def test_bad_input_is_a_message_not_a_crash(tiny_app, kw, needle):
    final = final_of(tiny_app.run_decoding(*args(**kw)))
    assert needle in plain(final["status"]) and final["status"].startswith("**Error:**")
    # refused before anything ran: the page's results are still an earlier run's, and it says so
    assert "anything shown below is from an earlier run" in plain(final["status"])
    assert "tokens" not in final


def test_vllm_refuses_a_drafter_it_would_ignore(tiny_app, monkeypatch):
    """vLLM runs the pair's own drafting method: a drafter chosen in the page is refused by name
    before any server starts, not silently dropped (the summary would credit the wrong drafter)."""
    monkeypatch.setattr(tiny_app, "vllm_backend", lambda *a, **k: pytest.fail("started vLLM"))
    final = final_of(tiny_app.run_decoding(*args(drafter="lookup"), "vllm", ""))
    status = plain(final["status"])
    assert final["status"].startswith("**Error:**") and "pair's own drafting (tiny-draft)" in status, status
    assert "not lookup" in status and "(the pair's)" in status and "earlier run" in status


def test_a_prompt_longer_than_the_context_leaves_the_earlier_run_marked(tiny_app):
    """Refused by the engine itself (after the page said 'prefilling'): nothing of this run is on
    the page, and the status says what is shown is an earlier run's."""
    final = final_of(tiny_app.run_decoding(*args(prompt="abc " * 5000)))
    status = plain(final["status"])
    assert final["status"].startswith("**Error:**") and "context" in status, status
    assert "anything shown below is from an earlier run" in status and "runs" not in final
    assert "tokens" not in final and "summary" not in final  # the earlier run's page is kept whole: nothing lost


def test_an_error_after_the_run_began_does_not_call_its_tokens_earlier(tiny_app, monkeypatch):
    """A failure mid-run leaves this run's own partial tokens on the page: no 'earlier run' note."""
    real = tiny_app.live_run

    def broken(*a, **k):
        for i, item in enumerate(real(*a, **k)):
            if i == 3:
                raise RuntimeError("boom")
            yield item
    monkeypatch.setattr(tiny_app, "live_run", broken)
    final = final_of(tiny_app.run_decoding(*args()))
    assert "boom" in plain(final["status"]) and "earlier run" not in final["status"]


def test_sampled_run_and_custom_drafter(tiny_app):
    final = final_of(tiny_app.run_decoding(*args(temperature=0.9, top_k=10, seed=3, drafter="early-exit:2",
                                                 target="tiny-target")))
    assert "error" not in final["status"].lower(), final["status"]
    assert "the two differ by design" in final["summary"] and "Greedy check" not in final["summary"]


def test_stop_leaves_a_summary_of_what_ran(tiny_app):
    gen = tiny_app.run_decoding(*args(max_new=200))
    for update in gen:  # until the first iterations are on the page
        if "tokens" in named(update) and "sv-it" in named(update)["tokens"]:
            break
    assert tiny_app.stop() is None  # Stop writes nothing itself: the run draws the stopped page
    rest = list(gen)
    assert len(rest) == 1, "the stopped page is the run's last update"
    final = named(rest[0])
    assert final["status"].startswith("■ stopped after") and "token" in final["status"]
    assert "Stopped" in final["summary"] and final["export"] and final["result"]["stopped"] is True
    assert json.load(open(final["export"]))["speculative"][0]["event"] == "start"
    assert final["iteration"]["maximum"] >= 1
    assert not tiny_app.STOPS.flags  # the run ended: nothing left to stop
    tiny_app.stop()  # Stop with nothing running is harmless


def test_stop_while_loading_runs_nothing(tiny_app):
    gen = tiny_app.run_decoding(*args())
    first = named(next(gen))
    assert any(word in first["status"] for word in ("loading", "preparing", "prefilling")), first["status"]
    tiny_app.stop()
    final = final_of(gen)
    assert final["status"] == tiny_app.STOPPED_EARLY, final["status"]
    assert "sv-it" not in final.get("tokens", "")  # no iteration was decoded


def test_a_second_run_or_a_replay_first_clears_what_the_last_run_drew(tiny_app, uploads):
    """While a second run streamed, the page kept the first run's summary, time split, inspector
    (with the first run's slider range over the new run's iterations) and file, as if they were the
    new run's: nothing draws those before a run ends."""
    first = final_of(tiny_app.run_decoding(*args(max_new=8)))
    assert first["summary"] and first["export"] and first["fig_split"] is not None
    for gen in (tiny_app.run_decoding(*args(prompt="xyz xyz", max_new=8)),
                tiny_app.replay(_upload(uploads, open(first["export"]).read()))):
        seen = {}
        for update in gen:
            seen.update(named(update))
            if "summary" in seen:
                break
        assert seen["summary"] == "" and seen["export"] is None and seen["fig_split"] is None
        assert seen["runs"] is None or seen["runs"]["spec"] is not first["runs"]["spec"]
        assert all(seen[f"fig_{n}"] is not first[f"fig_{n}"] for n in tiny_app.CHART_NAMES)
        assert seen["iteration"]["interactive"] is False and "sv-it" not in seen["tokens"]
        assert "No iteration yet" in seen["inspect_html"]
        final = final_of(gen)
        assert final["summary"] and final["fig_split"] is not None  # (a replay offers no file: the visitor has it)


def test_exports_stay_bounded(tiny_app):
    from specviz.trace import Trace

    runs = final_of(tiny_app.run_decoding(*args(max_new=8, vanilla=False)))["runs"]
    exports = app_module.Exports()
    for i in range(100):
        exports.save(f"session-{i % 3}", runs["spec"], None)
    assert exports.count() <= 3 * 5
    for i in range(100):
        exports.save(f"visitor-{i}", runs["spec"], Trace())
    assert exports.count() <= 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def served(tiny_app):
    demo = app_module.build_demo()
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                **app_module.launch_kwargs())
    yield demo, f"http://127.0.0.1:{port}/"
    demo.close()


def test_served_api_streams_and_matches_cli(served, every_state, tiny_registry, capsys):
    from gradio_client import Client

    _, url = served
    client = Client(url, verbose=False)
    job = client.submit(*args(max_new=30), api_name="/run")
    outputs = job.outputs()
    final = job.result()
    assert len(outputs) >= 4  # it streamed
    result = next(x for x in final if isinstance(x, dict) and "tokens" in x and "alpha" in x)
    code = cli_main(["run", "--models", str(tiny_registry), "--pair", "tiny-draft", "--prompt", "abc abc abc",
                     "--gamma", "4", "--max-new-tokens", "30", "--seed", "0", "--json"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and summary["text"] == result["text"] and summary["new_tokens"] == result["tokens"]


def test_served_replay_refuses_a_server_path(served, tmp_path):
    """Through the API, naming a file on the server (not an upload) replays nothing."""
    from gradio_client import Client, handle_file

    _, url = served
    secret = tmp_path / "secret.json"
    secret.write_text('{"speculative": []}')
    client = Client(url, verbose=False)
    try:
        out = client.predict({"path": str(secret), "meta": {"_type": "gradio.FileData"}}, api_name="/replay")
    except Exception as e:  # gradio itself may refuse the path before the handler
        assert "secret" not in str(e) or "not" in str(e)
        return
    assert "runs" not in str(out) and "Error" in str(out)
    assert handle_file  # the supported way to send a file is an upload


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed and could not "
                                    "be (scripts/setup.sh --dev installs it with apt-get)")


@needs_chromium
def test_browser_replay_of_a_crafted_file_is_inert(served, tiny_app, tmp_path):
    from playwright.sync_api import sync_playwright

    _, url = served
    path = tmp_path / "evil.json"
    path.write_text(evil_run_file(tiny_app))
    outside = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.on("request", lambda r: outside.append(r.url) if "127.0.0.1" not in r.url and not r.url.startswith("data:") else None)
        dialogs = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(url)
        page.wait_for_selector("#sv-run", timeout=60_000)
        before = page.locator("img").count()
        page.get_by_text("Replay a saved run").click()
        page.locator("input[type=file]").set_input_files(str(path))
        page.wait_for_function("document.querySelector('#sv-status')?.innerText.includes('replayed')", timeout=60_000)
        time.sleep(1.0)
        assert page.locator("img").count() == before
        assert page.locator("div[style*='position:fixed']").count() == 0
        assert not dialogs and not outside, (dialogs, outside)
        browser.close()


@needs_chromium
def test_browser_run_output_hide_drafts_and_stop(real_pipeline_factory, tmp_path):
    """The real default pair in a real browser: Run, see kept/refused/corrected tokens and the
    output panel, the race chart grows before the end, hide drafts, Stop leaves a stopped page."""
    from playwright.sync_api import sync_playwright

    real_pipeline_factory(app_module.REGISTRY.default())  # weights loaded before the clock starts
    demo = app_module.build_demo()
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                **app_module.launch_kwargs())
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("#sv-run", timeout=60_000)
            page.locator("#sv-prompt textarea").fill(app_module.EXAMPLES[1]["prompt"])
            page.click("#sv-run")
            page.wait_for_selector("#sv-tokens .sv-acc", timeout=90_000)
            page.get_by_role("tab", name="Charts").click()
            page.wait_for_selector(".js-plotly-plot .scatterlayer .trace", timeout=30_000)  # race chart, mid-run
            assert "done" not in page.locator("#sv-status").inner_text()
            page.locator("#sv-tokens .sv-tok").first.click()  # mid-run a click opens nothing
            time.sleep(0.5)
            assert page.get_by_role("tab", name="Charts").get_attribute("aria-selected") == "true"
            for cls in ("sv-rej", "sv-res"):
                page.wait_for_selector(f"#sv-tokens .{cls}", timeout=90_000)
            hide = page.locator("#sv-hide input")
            for _ in range(5):  # mid-run the live charts below redraw, which can shift the page under a click
                hide.click()
                if hide.is_checked():
                    break
            assert hide.is_checked() and page.locator("#sv-tokens .sv-rej").first.is_hidden()
            page.get_by_role("tab", name="Output").click()
            assert page.locator("#sv-output .sv-out-text").first.inner_text().strip()
            page.click("#sv-stop")
            # "■ stopped after N tokens", or, where the speculative run had just ended on its own,
            # "■ done: ...; the vanilla comparison was stopped ..."
            page.wait_for_function("document.querySelector('#sv-status')?.innerText.includes('stopped ')",
                                   timeout=30_000)
            n1 = page.locator("#sv-tokens .sv-it").count()
            time.sleep(2.0)
            assert page.locator("#sv-tokens .sv-it").count() == n1 > 0  # nothing arrives after Stop
            errors = page.locator(".error, [data-testid='error']")
            assert errors.count() == 0, errors.all_inner_texts()
            page.get_by_role("tab", name="Summary").click()
            assert "Stopped" in page.locator("#sv-summary").inner_text()
            page.screenshot(path=str(tmp_path / "stopped.png"))
            # once it has ended, a click on a token opens its iteration in the inspector (slider and table)
            page.locator("#sv-hide input").uncheck()
            k = min(3, n1)  # counted from 1, as the status line's count is
            page.locator(f"#sv-tokens .sv-done .sv-it[data-it='{k}'] .sv-tok").first.click()
            page.wait_for_function(f"document.querySelector('.sv-inspect b')?.innerText === 'Iteration {k}'",
                                   timeout=15_000)
            assert page.get_by_role("tab", name="Iteration inspector").get_attribute("aria-selected") == "true"
            assert page.locator("#sv-iteration input[type=range]").input_value() == str(k)
            # on a phone every tab stays a tab (gradio's default hid the last ones in a "more" menu)
            page.set_viewport_size({"width": 390, "height": 844})
            time.sleep(0.5)
            for name in ("Output", "Charts", "Iteration inspector", "Summary", "Lab"):
                assert page.get_by_role("tab", name=name).is_visible(), name
            # there the inspector lies below the token view: a click on a token brings it into sight
            page.locator("#sv-tokens").scroll_into_view_if_needed()
            page.locator(f"#sv-tokens .sv-done .sv-it[data-it='1'] .sv-tok").first.click()
            page.wait_for_function("document.querySelector('.sv-inspect b')?.innerText === 'Iteration 1'",
                                   timeout=15_000)
            time.sleep(0.3)
            top = page.evaluate("document.getElementById('sv-iteration').getBoundingClientRect().top")
            assert 0 <= top < 844 - 160, top
            browser.close()
    finally:
        demo.close()


@needs_chromium
def test_the_token_view_follows_a_live_run_unless_the_reader_scrolled_up():
    """Each frame redraws the token view, which put it back at its top: the newest tokens grew out of
    sight below the box. The page's script (assets/specviz.js) keeps it at the end, keeps the place
    of a reader who scrolled up, and follows again when a new run starts."""
    from playwright.sync_api import sync_playwright

    script = (Path(app_module.__file__).resolve().parent / "assets" / "specviz.js").read_text()
    css = (Path(app_module.__file__).resolve().parent / "assets" / "specviz.css").read_text()

    def view(n):  # what a frame puts on the page: the whole view, redrawn
        return '<div class="sv-tokens">' + "".join(f'<span class="sv-it">token {i}<br></span>' for i in range(n))

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 800, "height": 900})
        page.set_content(f"<style>{css}</style><div id='sv-tokens'></div>")
        page.evaluate(f"({script})()")
        state = "() => {const e = document.querySelector('#sv-tokens .sv-tokens'); return [e.scrollTop, e.scrollHeight - e.clientHeight];}"

        def frame(n):
            page.evaluate("h => { document.getElementById('sv-tokens').innerHTML = h; }", view(n))
            page.wait_for_timeout(120)  # the observer settles on the next animation frame
            return page.evaluate(state)

        top, end = frame(60)
        assert end > 200 and abs(top - end) <= 1  # at the newest tokens
        top, end = frame(80)
        assert end > 300 and abs(top - end) <= 1
        page.evaluate("() => { document.querySelector('#sv-tokens .sv-tokens').scrollTop = 40; }")
        page.wait_for_timeout(120)
        for n in (90, 100):
            top, end = frame(n)
            assert abs(top - 40) <= 1, (top, end)  # the reader's place is kept through redraws
        top, end = frame(5)  # a new run
        top, end = frame(70)
        assert abs(top - end) <= 1
        browser.close()


@needs_chromium
def test_a_crafted_long_token_wraps_in_the_inspector_instead_of_pushing_its_numbers_away():
    """A saved run can carry any token text. A 3,000-character one (or a run of a token without spaces)
    was laid out on one line (``white-space: pre``): the table grew ~30,000 px wide and its q, p and
    decision columns, and the top-token list, were scrolled out of sight."""
    from playwright.sync_api import sync_playwright

    from specviz.events import Correction, IterationEvent
    from specviz.view.tokens import inspector_html

    long = "A" * 3000
    e = IterationEvent(index=1, drafter="lookup", gamma=2, reason="crafted", proposed=[5, 6],
                       proposed_text=[long, "ok"], q=[1.0, 1.0], p=[0.9, 0.1], q_raw=[1.0, 1.0], p_raw=[0.9, 0.1],
                       accept_prob=[0.9, 0.1], draws=[0.2, 0.5], accepted=1,
                       correction=Correction(token=7, text=long, kind="resample", p=0.8, top=[[7, long, 0.8]]),
                       target_top=[], emitted=[5, 7], emitted_text=[long, long], draft_ms=1.0, verify_ms=2.0,
                       tokens_total=2, proposed_total=2, accepted_total=1, elapsed_ms=3.0)
    css = (Path(app_module.__file__).resolve().parent / "assets" / "specviz.css").read_text()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 800, "height": 900})
        page.set_content(f"<style>{css}</style><div id='box' style='width: 700px'>{inspector_html(e, 2)}</div>")
        widths = page.evaluate("""() => {
            const s = document.querySelector('.sv-scroll');
            const cells = [...document.querySelectorAll('.sv-table td')].map(c => c.getBoundingClientRect().right);
            const items = [...document.querySelectorAll('.sv-top code, .sv-inspect b')].map(c => c.getBoundingClientRect().right);
            const lines = c => { const r = document.createRange(); r.selectNodeContents(c);
                                 return new Set([...r.getClientRects()].map(x => Math.round(x.top))).size; };
            const split = [...document.querySelectorAll('.sv-table th, .sv-table td:not(:nth-child(2))')]
                .filter(c => !/\\s/.test(c.innerText.trim()) && lines(c) > 1).map(c => c.innerText);
            return {scroll: s.scrollWidth, client: s.clientWidth, cells: Math.max(...cells), items: Math.max(...items), split};
        }""")
        browser.close()
    assert widths["scroll"] <= widths["client"] + 1, widths  # nothing to scroll sideways to
    assert widths["cells"] <= 710 and widths["items"] <= 710, widths  # every column and list item within the box
    assert not widths["split"], widths  # only the token column breaks inside a word: "toke/n", "0./8" read as noise
    # on a phone an ordinary token stays whole (the table scrolls sideways instead): "phras/e" read as two tokens
    short = IterationEvent(**{**e.__dict__, "proposed_text": [" phrase", " sentence"], "emitted_text": [" phrase", "x"],
                              "correction": Correction(token=7, text=" sentence", kind="resample", p=0.8, top=[])})
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 390, "height": 900})
        page.set_content(f"<style>{css}</style><div style='width: 326px'>{inspector_html(short, 2)}</div>")
        broken = page.evaluate("""() => [...document.querySelectorAll('.sv-table td:nth-child(2)')].filter(c => {
            const r = document.createRange(); r.selectNodeContents(c);
            return new Set([...r.getClientRects()].map(x => Math.round(x.top))).size > 1; }).map(c => c.innerText)""")
        browser.close()
    assert not broken, broken


@needs_chromium
def test_a_crafted_token_puts_no_link_or_markup_into_the_inspector_chart():
    """Plotly reads a subset of HTML in its labels: a saved run whose token text was
    ``<a href="https://...">`` drew a clickable link to anywhere into the inspector's chart."""
    from playwright.sync_api import sync_playwright

    from specviz.events import Correction, IterationEvent
    from specviz.view.charts import inspector_figure

    evil = '<a href="https://example.invalid/login">Sign in again</a><b>bold</b>'
    e = IterationEvent(index=1, drafter="lookup", gamma=1, reason="crafted", proposed=[5], proposed_text=[evil],
                       q=[0.5], p=[0.2], q_raw=[0.5], p_raw=[0.2], accept_prob=[0.4], draws=[0.9], accepted=0,
                       correction=Correction(token=7, text=evil, kind="resample", p=0.8, top=[[7, evil, 0.8], [8, "x" * 500, 0.2]]),
                       target_top=[], emitted=[7], emitted_text=[evil], draft_ms=1.0, verify_ms=2.0,
                       tokens_total=1, proposed_total=1, accepted_total=0, elapsed_ms=3.0)
    page_html = inspector_figure(e).to_html(include_plotlyjs=True, full_html=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 900, "height": 500})
        page.set_content(page_html)
        page.wait_for_selector(".xtick text", timeout=30_000)
        found = page.evaluate("""() => ({links: document.querySelectorAll('svg a').length,
            bold: [...document.querySelectorAll('svg text tspan')].filter(t => t.style.fontWeight === 'bold').length,
            ticks: [...document.querySelectorAll('.xtick text')].map(t => t.textContent)})""")
        browser.close()
    assert found["links"] == 0 and found["bold"] == 0, found
    assert any('<a href="https://example.inval' in t for t in found["ticks"]), found  # shown as text
    assert max(len(t) for t in found["ticks"]) <= 40, found  # a 500-character token is cut short


def test_preload_measures_the_cost_profile_in_the_decode_queue(monkeypatch):
    """The start-up preload loads and warms up (measures the cost profile) as jobs of the decode
    queue: on the thread that serves decode, never beside a Run."""
    import threading

    from specviz.mainthread import MainThreadRunner

    seen = {}

    class Pipe:
        def warm_up(self, max_gamma=None):
            seen["thread"], seen["gamma"] = threading.get_ident(), max_gamma
            # a visitor queued behind it is told it is the server's start-up, not another visitor's run
            seen["said"] = app_module.waiting(1, None)
            time.sleep(1.1)
            seen["later"] = app_module.waiting(1, None)  # and that it is moving: the seconds so far

    runner, until = MainThreadRunner(), threading.Event()
    server = threading.Thread(target=runner.serve_forever, kwargs={"poll_s": 0.05, "until": until})
    server.start()
    while not runner.serving:
        pass
    monkeypatch.setattr(app_module, "RUNNER", runner)
    monkeypatch.setattr(app_module, "build_pipeline", lambda *a, **k: seen.update(load=threading.get_ident()) or Pipe())
    loader = threading.Thread(target=app_module.preload, kwargs={"await_server": True})
    loader.start()
    loader.join(30)
    until.set()
    server.join()
    said, later = seen.pop("said"), seen.pop("later")
    assert seen == {"load": server.ident, "thread": server.ident, "gamma": 16}  # loads there too (mainthread.py)
    assert "the server is still starting" in said and "1 run ahead" not in said
    so_far = [int(re.search(r"(\d+) s so far", line).group(1)) for line in (said, later)]
    assert so_far[1] >= so_far[0] + 1, (said, later)
    assert not app_module.STARTING.is_set() and "1 run ahead" in app_module.waiting(1, None)


def test_model_menus_tag_hub_models_and_the_pair_text_says_what_runs(tiny_app):
    """The target and drafter menus mark a model that must come from the Hub, as the pair menu
    does; choosing a target or drafter below rewrites the pair's text to what will really run."""
    from specviz.view import menus

    reg = tiny_app.REGISTRY
    entries = dict((value, label) for label, value in menus.model_choices(reg, reg.models))
    assert entries["hub-only"].endswith("(needs the Hub)") and entries["tiny-target"] == "tiny-target"
    own = tiny_app.choice_details("tiny-draft", tiny_app.PAIR_CHOICE, tiny_app.PAIR_CHOICE)
    assert own == menus.pair_details(reg, "tiny-draft") and "instead" not in own
    swapped = plain(tiny_app.choice_details("tiny-draft", tiny_app.PAIR_CHOICE, "early-exit:2"))
    assert "Runs instead" in swapped and "target tiny-target, drafter early-exit:2" in swapped
    alone = plain(tiny_app.choice_details("tiny-draft", "tiny-target", None))
    assert "target tiny-target, drafter prompt lookup" in alone  # a target alone runs with lookup


def test_warning_toasts_show_text_not_html(monkeypatch):
    """gradio's toast renders HTML: an error quoting a replay's field or a typed URL must stay text."""
    shown = []
    monkeypatch.setattr(app_module.gr, "Warning", shown.append)
    out = app_module._error("bad <img src=x onerror=alert(1)> and <h1>big</h1>")
    assert shown == ["bad &lt;img src=x onerror=alert(1)&gt; and &lt;h1&gt;big&lt;/h1&gt;"]
    assert not re.search(r"(?<!\\)<", next(iter(out.values())))  # the status: Markdown, escaped


@pytest.mark.parametrize("edit", [
    lambda its: [e["correction"].__setitem__("top", [[1, {"a": 1}, 0.5]]) for e in its if e.get("correction")],
])
def test_replay_of_values_no_run_makes_ends_in_a_message(tiny_app, uploads, edit):
    """Values no run makes that pass the loader's field checks end the replay with a message (the
    handler raised, and the page showed gradio's bare "Error" badges)."""
    last = final_of(tiny_app.run_decoding(*args()))
    data = json.load(open(last["export"]))
    its = [e for e in data["speculative"] if e.get("event") == "iteration"]
    edit(its)
    final = final_of(tiny_app.replay(_upload(uploads, json.dumps(data))))
    assert final["status"].startswith("**Error:**") and "cannot replay this file" in plain(final["status"])


def test_a_second_lab_experiment_in_a_tab_stops_the_first(tiny_app):
    """Experiment 2 clicked while experiment 1 ran waited behind it in the decode queue, while
    experiment 1 went on unseen (both draw in the Lab's one status, chart and takeaway)."""
    fns = {f.name: f.fn for f in tiny_app.demo.fns.values()}
    settings = ("tiny-draft", tiny_app.PAIR_CHOICE, tiny_app.PAIR_CHOICE, "abc abc abc", True, 0.0, 0)
    first = fns["run_lab_gamma_sweep"]("raw_q", *settings)
    assert "loading" in next(first)[0]
    second = fns["run_lab_same_outputs"](None, *settings)
    assert "loading" in next(second)[0]
    rest = list(first)
    assert "■ stopped" in rest[-1][0] and not any("■ done" in r[0] for r in rest)
    assert "■ done" in list(second)[-1][0]  # the new one runs to its end


def test_a_lab_run_first_clears_the_last_result_and_a_stop_before_any_chart_says_so(tiny_app):
    """Stopping an experiment early left the previous experiment's chart, takeaway and JSON on the
    page under the new one's "stopped" line, as if they were its result."""
    fn = next(f.fn for f in tiny_app.demo.fns.values() if f.name == "run_lab_gamma_sweep")
    gen = fn("raw_q", "tiny-draft", tiny_app.PAIR_CHOICE, tiny_app.PAIR_CHOICE, "abc abc abc", True, 0.0, 0)
    status, plot, takeaway, export = next(gen)
    assert "loading" in status and (plot, takeaway, export) == (None, "", None)
    tiny_app.stop_lab()
    rest = list(gen)
    assert rest and "■ stopped" in rest[-1][0] and "before anything was measured" in rest[-1][0]
    assert not any("■ done" in r[0] for r in rest)
    assert "Stopped before anything was measured" in rest[-1][2]  # the takeaway's place says why it is empty
    # stopped once its chart has grown: the chart stays, and the takeaway's place says it is partial
    gen = fn("raw_q", "tiny-draft", tiny_app.PAIR_CHOICE, tiny_app.PAIR_CHOICE, "abc abc abc", True, 0.0, 0)
    for status, plot, takeaway, export in gen:
        if plot is not None and not isinstance(plot, dict):
            break
    tiny_app.stop_lab()
    last = list(gen)[-1]
    assert "■ stopped" in last[0] and "the chart shows what ran" in last[0]
    assert re.search(r"Stopped before the end \(\d+ of \d+ steps\)", last[2])
    assert not isinstance(last[3], str)  # no file: nothing whole to save
    # run to the end, it fills all three (and a stop is per run: the flag did not outlive it)
    done = list(fn("raw_q", "tiny-draft", tiny_app.PAIR_CHOICE, tiny_app.PAIR_CHOICE, "abc abc abc", True, 0.0, 0))
    status, plot, takeaway, export = done[-1]
    assert "■ done" in status and plot is not None and takeaway and export
    saved = json.load(open(export))  # the page's file defines its numbers, as the command line's does
    assert saved["result"]["runs"] and set(saved["result"]["runs"][0]) <= set(saved["glossary"])


@pytest.mark.parametrize("edit,needle", [
    # more kept than proposed: an acceptance rate of 4.8
    (lambda its: its[-1].__setitem__("accepted_total", 100), "accepted_total: 100 is not the running total"),
    # a trillion tokens in the last iteration: a speedup of millions
    (lambda its: its[-1].__setitem__("tokens_total", 10 ** 12), "tokens_total: 1000000000000 is not the running"),
    (lambda its: its[-1].__setitem__("tokens_total", -3), "tokens_total: -3 is not the running total"),
    (lambda its: its[-1].__setitem__("proposed_total", 0), "proposed_total: 0 is not the running total"),
    # a clock that goes back: a negative time for the last step
    (lambda its: its[-1].__setitem__("elapsed_ms", its[0]["elapsed_ms"] / 2), "a run's clock only moves forward"),
])
def test_running_totals_and_clock_that_no_run_makes_are_refused(tiny_app, uploads, edit, needle):
    """Each iteration's running totals are what its iterations sum to and its clock never goes back:
    the speedup, throughput and acceptance charts read them, so a file that lies there is refused,
    naming the field, before any frame."""
    last = final_of(tiny_app.run_decoding(*args()))
    data = json.load(open(last["export"]))
    its = [e for e in data["speculative"] if e.get("event") == "iteration"]
    assert len(its) >= 2 and its[-1]["tokens_total"] == sum(len(e["emitted"]) for e in its)
    edit(its)
    frames = list(tiny_app.replay(_upload(uploads, json.dumps(data))))
    final = final_of(iter(frames))
    assert len(frames) == 1 and "runs" not in final
    assert final["status"].startswith("**Error:**") and needle in plain(final["status"]), final["status"]
    assert f"speculative[{len(its)}]." in plain(final["status"])  # the edited event, by its place in the file


@pytest.mark.parametrize("part", ["speculative", "vanilla"])
def test_a_summary_whose_time_ends_before_its_iterations_is_refused(tiny_app, uploads, part):
    """The speedup and tokens/s read the summary's wall time, the race chart the iterations' clock: a
    file whose summary claimed 1 ms showed a speedup of thousands beside a chart that said otherwise."""
    last = final_of(tiny_app.run_decoding(*args()))
    data = json.load(open(last["export"]))
    its = [e for e in data[part] if e.get("event") == "iteration"]
    summary = data[part][-1]
    assert summary["event"] == "summary" and summary["wall_ms"] >= its[-1]["elapsed_ms"]  # as every run writes it
    summary["wall_ms"] = 1.0
    final = final_of(tiny_app.replay(_upload(uploads, json.dumps(data))))
    assert "runs" not in final and final["status"].startswith("**Error:**")
    assert f"{part}: the summary's wall_ms (1) is earlier than its last iteration's" in plain(final["status"])


def _kept(its):
    """The first iteration that kept a proposal (greedy: its draws are under min(1, p/q) = 1)."""
    return next(e for e in its if e["accepted"] >= 1)


@pytest.mark.parametrize("edit,needle", [
    # a lone surrogate: the server failed sending the page's update, and the tab stayed broken until reloaded
    (lambda d, its: _kept(its)["proposed_text"].__setitem__(0, "\ud800"), "not valid Unicode"),
    (lambda d, its: d["speculative"][0]["target"].__setitem__("name", "\ud83d"), "target.name: text that is not valid"),
    (lambda d, its: d["speculative"][0]["target"].__setitem__("\udfff", 1), "(a key): text that is not valid"),
    # what the views state must be what the rule did
    (lambda d, its: _kept(its).update(draws=[0.99] + _kept(its)["draws"][1:],
                                      accept_prob=[0.1] + _kept(its)["accept_prob"][1:]),
     "yet proposal 1 was kept: the rule keeps it exactly when u < min(1, p/q)"),
    (lambda d, its: _kept(its)["proposed_text"].__setitem__(0, "LIE"), "the kept proposals' text differs"),
    (lambda d, its: _kept(its)["emitted"].__setitem__(0, 12345), "emitted: not the"),
    (lambda d, its: _kept(its)["correction"].__setitem__("kind", "sample"), "the rule gives"),
    (lambda d, its: _kept(its).update(draws=[]), "q, p, accept_prob and draws are given for some"),
    (lambda d, its: _kept(its).update(q_raw=[]) or _kept(its).update(p_raw=[0.5]), "p_raw: 1 items for"),
    # the inspector finds an iteration by its index: another one showed under its name
    (lambda d, its: [e.__setitem__("index", 100 - e["index"]) for e in its], "but it is iteration 0 of the run"),
    (lambda d, its: _kept(its)["correction"].__setitem__("top", [[1, 2, 0.5]]), "expected [id, text, probability]"),
    (lambda d, its: d["speculative"][0].__setitem__("gamma", -5), "gamma -5 or max_new_tokens"),
    (lambda d, its: d["speculative"][0].__setitem__("max_new_tokens", 2), "more than the 2 its start event allows"),
    (lambda d, its: d["speculative"][0]["sampling"].__setitem__("temperature", float("nan")), "nan is not a number"),
    (lambda d, its: d["speculative"][0].__setitem__("costs", {"source": "x", "v": {"a": 1}}), "costs.v: a cost profile"),
    # a 3,000-character "token" filled the inspector's table: the page grew 6,000 px tall
    (lambda d, its: its[0]["correction"].__setitem__("text", "w" * 3000), "a token's text of 3,000 characters"),
])
def test_replays_that_no_run_makes_are_refused_naming_the_field(tiny_app, uploads, edit, needle):
    """From a crafted-file audit: each of these passed the loader, then broke the tab (a lone
    surrogate), showed another iteration in the inspector than the one clicked, failed later with
    Python's words (IndexError, TypeError) or showed statements no run makes (a kept token whose draw
    was over min(1, p/q), the token view and the output disagreeing, γ -5, a NaN temperature read as
    greedy)."""
    last = final_of(tiny_app.run_decoding(*args(pair="tiny-lookup", max_new=32)))  # a random model repeats itself
    data = json.load(open(last["export"]))
    edit(data, [e for e in data["speculative"] if e.get("event") == "iteration"])
    frames = list(tiny_app.replay(_upload(uploads, json.dumps(data))))
    final = final_of(iter(frames))
    assert len(frames) == 1 and "runs" not in final
    assert final["status"].startswith("**Error:**") and needle in plain(final["status"]), final["status"]


def test_a_replay_reads_a_byte_order_mark_and_refuses_a_number_of_thousands_of_digits(tiny_app, uploads):
    last = final_of(tiny_app.run_decoding(*args()))
    text = Path(last["export"]).read_text()
    final = final_of(tiny_app.replay(_upload(uploads, "\ufeff" + text)))  # some editors save one
    assert "replayed" in final["status"] and final["runs"]
    data = json.loads(text)
    data["speculative"][0]["seed"] = 7
    huge = json.dumps(data).replace('"seed": 7', '"seed": ' + "9" * 5000, 1)
    final = final_of(tiny_app.replay(_upload(uploads, huge)))
    assert "a number with thousands of digits" in plain(final["status"]) and "set_int_max_str_digits" not in final["status"]


def test_direction_controls_from_a_model_or_a_file_cannot_turn_the_page_around():
    """A saved run's \\u202e (right-to-left override) turned the status line's own words backwards and
    showed "\\u202egnp.exe" as "exe.png". Every text helper shows such a control as its code point."""
    from specviz.view.charts import token_label
    from specviz.view.text import md, md_text, output_html
    from specviz.view.tokens import show

    for shown, code in ((md("\u202e2026 saved"), "202E"), (md_text("a \u2067b\u2069 c"), "2069"),
                        (show("\u202egnp.exe"), "202E"), (token_label("x\u200fy"), "200F")):
        assert not re.search("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]", shown), shown
        assert code.lower() in shown.lower(), shown  # repr writes \\u200f; Markdown escapes \\[U\\+202E\\]
    assert "[U+202E]gnp.exe" in show("\u202egnp.exe")


def test_an_error_that_ran_nothing_reads_as_two_sentences(monkeypatch):
    """"... pick a pair Nothing ran: ..." read as one broken sentence: the message ends before the note."""
    monkeypatch.setattr(app_module.gr, "Warning", lambda m: None)
    status = plain(next(iter(app_module._error("the prompt is empty", ran=False).values())))
    assert "the prompt is empty. Nothing ran: anything shown below is from an earlier run." in status
    status = plain(next(iter(app_module._error("cannot replay this file.", ran=False).values())))
    assert "file.. " not in status and "file. Nothing ran" in status
    assert plain(next(iter(app_module._error("no stop here").values()))).endswith("no stop here")


def test_every_setting_read_from_the_environment_is_in_the_readme():
    """A variable the code reads and the README never names is a setting nobody can find. (The three
    that specviz sets itself for the vLLM server it starts are internal.)"""
    root = Path(app_module.__file__).resolve().parent
    sources = [root / "app.py", *sorted((root / "specviz").rglob("*.py"))]
    read = {m for f in sources for m in re.findall(r"\bSPECVIZ_[A-Z0-9_]+", f.read_text())}
    internal = {"SPECVIZ_VLLM_TRACE_DIR", "SPECVIZ_VLLM_LOOKUP_MIN", "SPECVIZ_VLLM_LOOKUP_MAX"}
    assert {"SPECVIZ_MODELS", "SPECVIZ_PRELOAD", "SPECVIZ_EXACT"} <= read
    readme = (root / "README.md").read_text()
    assert sorted(v for v in read - internal if v not in readme) == []


def test_sigterm_ends_the_app_with_its_exit_handlers(tmp_path, tiny_registry):
    """`kill <app>` (a Space restarting) ended the process without its exit handlers: the vLLM servers
    the page had started, each in a process group of its own, lived on holding ports and memory. A
    child started the same way here (new session, stopped at exit) must go with the app."""
    import os
    import signal
    import subprocess
    import sys

    pidfile = tmp_path / "child.pid"
    (tmp_path / "sitecustomize.py").write_text(
        "import atexit, os, signal, subprocess\n"
        "child = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
        "atexit.register(lambda: (os.killpg(child.pid, signal.SIGTERM), child.wait()))\n")
    root = Path(app_module.__file__).resolve().parent
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)]), "SPECVIZ_PRELOAD": "0",
           "GRADIO_SERVER_PORT": str(port), "GRADIO_SERVER_NAME": "127.0.0.1", "SPECVIZ_MODELS": str(tiny_registry)}
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=root, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        assert proc.poll() is None and pidfile.exists(), proc.stderr.read().decode()[-2000:]
        child = int(pidfile.read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        # the child was reaped by the app's exit handler: its pid no longer names a live process
        gone = False
        for _ in range(40):
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                gone = True
                break
            time.sleep(0.25)
        assert gone, "the child started in its own session outlived the app"
    finally:
        if proc.poll() is None:
            proc.kill()
        if pidfile.exists():
            try:
                os.killpg(int(pidfile.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_gradios_idle_polling_is_slowed():
    """gradio's queue polls every 1 ms while free (~7% of a core beside a decode on 2 cores). The app
    slows it to 20 ms; if a gradio release renames these attributes, this says so instead of the fix
    silently doing nothing."""
    demo = app_module.build_demo()
    queue = demo._queue
    assert queue.sleep_when_free >= app_module.QUEUE_POLL_S
    assert queue.progress_update_sleep_when_free >= app_module.PROGRESS_POLL_S


def test_every_decoding_event_lets_several_visitors_wait_in_the_apps_queue():
    """A second tab's Run must start its handler at once and wait in the decode queue, where it shows
    its place and sees Stop. gradio gives the events of one concurrency_id the lowest limit among them
    (whichever arrives first), so a Lab button left at the default limit of 1 made a second tab's Run
    wait in gradio's queue: its status read "Ready", its Stop was lost and later API calls went first."""
    demo = app_module.build_demo()
    fns = [f for f in demo.fns.values() if f.concurrency_id == "decode"]
    names = {f.name for f in fns}
    assert "run_decoding" in names and any(n.startswith("run_lab") for n in names)
    for order in (fns, fns[::-1]):  # the limit gradio ends with, as its own queue computes it, either way round
        queue = app_module.build_demo()._queue
        for f in order:
            queue.create_event_queue_for_fn(f)
        assert queue.event_queue_per_concurrency_id["decode"].concurrency_limit == app_module.DECODE_EVENTS[
            "concurrency_limit"] > 1


def test_a_run_whose_load_waits_behind_another_run_shows_its_place_then_runs(tiny_app, monkeypatch):
    """A run's pair is made ready in the run's own turn on the decode thread: while another visitor's
    run decodes, the page says how many go first, then that it prepares the drafter, then runs."""
    import threading

    from tests.test_mainthread import holding, start_serving

    runner, until, server = start_serving()
    release = threading.Event()
    monkeypatch.setattr(tiny_app, "RUNNER", runner)
    other = runner.turns(holding(release))
    try:
        assert next(other) == 0  # another visitor's run holds the decode thread
        gen = tiny_app.run_decoding(*args(max_new=8, vanilla=False))
        statuses, deadline = [], time.monotonic() + 15  # a regression fails, never hangs
        for update in gen:
            if time.monotonic() > deadline:
                break
            status = None if "__type__" in update else named(update).get("status")  # gr.skip() is a plain dict
            if status:
                statuses.append(status)
            if any("waiting for the decoder: 1 run ahead" in s for s in statuses):
                break
        release.set()
        assert list(other) == [1]
        rest = list(gen)
        final = final_of(rest)
    finally:
        release.set()
        other.close()
        until.set()
        server.join(10)
    assert "waiting for the decoder: 1 run ahead" in statuses[-1], statuses
    later = [named(u).get("status") for u in rest if "__type__" not in u]
    assert [s for s in later if s][:2] == ["● preparing the model drafter…", "● prefilling the prompt…"], later
    assert "done" in final["status"], final["status"]


def test_a_run_that_must_load_waits_for_the_runs_queued_before_it(tiny_app, monkeypatch):
    """A visitor who switches pairs loads the new one in their own place in line: the load (~20 s
    for a real model) used to be queued on the decode thread at once, so it went before every run
    already waiting, which then waited for it."""
    import threading

    from tests.test_mainthread import holding, start_serving

    runner, until, server = start_serving()
    release, order = threading.Event(), []
    monkeypatch.setattr(tiny_app, "RUNNER", runner)
    build = tiny_app.build_pipeline

    def recorded(*a, **k):
        order.append("load")
        return build(*a, **k)
    monkeypatch.setattr(tiny_app, "build_pipeline", recorded)

    def queued_run():  # a visitor already waiting when the pair is switched
        order.append("run queued first")
        yield "ran"
    first = runner.turns(holding(release))
    threads = []
    try:
        assert next(first) == 0  # a run decodes
        waiter = runner.turns(queued_run)
        threads.append(threading.Thread(target=lambda: list(waiter)))
        threads[-1].start()
        deadline = time.monotonic() + 10
        while runner.queued < 2 and time.monotonic() < deadline:  # its ticket is taken: it waits
            time.sleep(0.01)
        switched = tiny_app.run_decoding(*args(pair="tiny-lookup", max_new=8, vanilla=False))
        frames = []
        threads.append(threading.Thread(target=lambda: frames.extend(switched)))
        threads[-1].start()
        while runner.queued < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # where a load could jump the line, it is on the decode thread's queue by now
        release.set()
        assert list(first) == [1]
        for t in threads:
            t.join(30)
    finally:
        release.set()
        first.close()
        until.set()
        server.join(10)
    assert order == ["run queued first", "load"], order
    assert "done" in final_of(frames)["status"]


def test_a_preload_cut_short_by_the_app_stopping_ends_quietly(monkeypatch, capsys):
    """SIGTERM during the start-up preload: its thread printed a traceback; it now just ends."""
    from specviz.mainthread import INTERRUPTED, Interrupted

    class Stopped:
        serving = True

        def call(self, *a, **k):
            raise Interrupted(INTERRUPTED)
    monkeypatch.setattr(app_module, "RUNNER", Stopped())
    app_module.preload()  # raises nothing
    assert "Traceback" not in capsys.readouterr().err
