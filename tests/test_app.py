"""The Gradio app: build without launching, handlers end to end on tiny models, the served
API through gradio_client, and a real browser (Playwright + Debian's chromium)."""

import json
import shutil
import socket
import time

import pytest

import app as app_module
from specviz.cli import main as cli_main
from specviz.registry import load_registry


@pytest.fixture()
def tiny_app(tiny_registry, monkeypatch):
    monkeypatch.setattr(app_module, "REGISTRY", load_registry(tiny_registry))
    return app_module


def args(pair="tiny-draft", prompt="abc abc abc", gamma=4, temperature=0.0, top_k=0, top_p=1.0,
         max_new=24, seed=0, vanilla=True, target=None, drafter=None):
    return [pair, target or app_module.PAIR_CHOICE, drafter or app_module.PAIR_CHOICE, prompt, True, gamma,
            temperature, top_k, top_p, max_new, seed, vanilla]


def test_demo_builds_without_launching():
    assert app_module.demo is not None
    names = {fn.name for fn in app_module.demo.fns.values()}
    assert {"run_decoding", "replay", "inspector"} <= names


def test_handler_streams_and_summarises(tiny_app):
    frames = list(tiny_app.run_decoding(*args()))
    assert len(frames) >= 4  # loading/prefill, several iterations, the end
    assert all(len(f) == len(tiny_app.OUTPUT_NAMES) for f in frames)
    last = dict(zip(tiny_app.OUTPUT_NAMES, frames[-1]))
    assert "done" in last["status"]
    assert "identical to vanilla" in last["summary"]
    assert 'class="sv-tok sv-acc' in last["tokens"] or 'class="sv-tok sv-res' in last["tokens"]
    runs = last["runs"]
    saved = json.load(open(last["download"]))
    assert saved["speculative"][-1]["output_ids"] == runs["spec"].output_ids == runs["vanilla"].output_ids
    # the inspector shows any iteration
    html_, fig = tiny_app.inspector(runs, 1)
    assert "Iteration 1" in html_ and fig is not None


def test_replay_needs_no_model(tiny_app, monkeypatch, tmp_path):
    last = dict(zip(tiny_app.OUTPUT_NAMES, list(tiny_app.run_decoding(*args()))[-1]))
    monkeypatch.setattr(app_module, "build_pipeline", lambda *a, **k: pytest.fail("replay loaded a model"))
    frames = list(tiny_app.replay(last["download"]))
    final = dict(zip(tiny_app.OUTPUT_NAMES, frames[-1]))
    assert "replayed" in final["status"] and final["runs"]["spec"].output_ids == last["runs"]["spec"].output_ids
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    frames = list(tiny_app.replay(str(bad)))
    assert "not a specviz run file" in frames[-1][0]


@pytest.mark.parametrize("kw,needle", [
    ({"gamma": 0}, "gamma"), ({"temperature": -1}, "temperature"), ({"prompt": "  "}, "empty"),
    ({"top_k": 1.5}, "top-k"), ({"max_new": None}, "max new tokens"), ({"pair": "tiny-mismatch"}, "tokenizers"),
    ({"target": "hub-only"}, "could not load"),
])
def test_bad_input_is_a_message_not_a_crash(tiny_app, kw, needle):
    frames = list(tiny_app.run_decoding(*args(**kw)))
    assert needle in frames[-1][0] and frames[-1][0].startswith("**Error:**")


def test_sampled_run_and_custom_drafter(tiny_app):
    frames = list(tiny_app.run_decoding(*args(temperature=0.9, top_k=10, seed=3, drafter="early-exit:2",
                                              target="tiny-target")))
    last = dict(zip(tiny_app.OUTPUT_NAMES, frames[-1]))
    assert "error" not in last["status"].lower(), last["status"]
    assert "outputs differ by design" in last["summary"]


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


def test_served_api_streams_and_matches_cli(served, tiny_registry, capsys):
    from gradio_client import Client

    _, url = served
    client = Client(url, verbose=False)
    job = client.submit(*args(max_new=30), api_name="/run")
    outputs = job.outputs()
    final = job.result()
    assert len(outputs) >= 4  # it streamed
    download = final[11]
    path = download if isinstance(download, str) else download["path"] if isinstance(download, dict) else download.path
    app_ids = json.load(open(path))["speculative"][-1]["output_ids"]
    code = cli_main(["run", "--models", str(tiny_registry), "--pair", "tiny-draft", "--prompt", "abc abc abc",
                     "--gamma", "4", "--max-new-tokens", "30", "--seed", "0", "--json"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and summary["output_ids"] == app_ids


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed and could not be "
                    "(scripts/setup.sh --dev installs it with apt-get)")
def test_browser_run_shows_tokens_and_stop_works(real_pipeline_factory, tmp_path):
    """The real default pair in a real browser: Run, see kept/refused/corrected tokens, Stop."""
    from playwright.sync_api import sync_playwright

    real_pipeline_factory(app_module.DEFAULT_PAIR)  # weights loaded before the clock starts
    demo = app_module.build_demo()
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                **app_module.launch_kwargs())
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
                "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("#sv-run", timeout=60_000)
            page.locator("#sv-prompt textarea").fill(app_module.EXAMPLES[1]["prompt"])
            page.click("#sv-run")
            for cls in ("sv-acc", "sv-rej", "sv-res"):
                page.wait_for_selector(f"#sv-tokens .{cls}", timeout=90_000)
            page.click("#sv-stop")
            time.sleep(1.0)
            n1 = page.locator("#sv-tokens .sv-it").count()
            time.sleep(2.0)
            n2 = page.locator("#sv-tokens .sv-it").count()
            assert n1 == n2 > 0  # nothing arrives after Stop
            assert "done" not in page.locator("#sv-status").inner_text()
            page.screenshot(path=str(tmp_path / "stopped.png"))
            browser.close()
    finally:
        demo.close()
