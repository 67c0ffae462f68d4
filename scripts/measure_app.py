"""The live view's cost, measured as a user meets it: launch the app, click Run in headless
Chromium, time the first rendered iteration, read the run's tokens/s from the page, and compare
with the same run through the CLI.  Optionally save screenshots (during and after a run).

    python scripts/measure_app.py --screenshots assets
"""

import argparse
import json
import re
import socket
import statistics
import threading
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import app as app_module  # noqa: E402
from specviz.engine import DecodeConfig  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.trace import Trace  # noqa: E402

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--screenshots", help="folder for screenshot-running.png and screenshot-done.png")
    ap.add_argument("--example", type=int, default=1, help="which example prompt (assets/examples.yaml)")
    ap.add_argument("--worker-thread", action="store_true", help="decode in Gradio's worker thread (the slow way)")
    ap.add_argument("--client", action="store_true", help="drive the app with gradio_client instead of a browser")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    pipe = build_pipeline(app_module.REGISTRY, pair=app_module.DEFAULT_PAIR)  # weights loaded first,
    pipe.warm_up(max_gamma=16)  # and verify costs measured, as the app's start-up preload does
    prompt = app_module.EXAMPLES[args.example]["prompt"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo = app_module.build_demo()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                **app_module.launch_kwargs())
    first, app_tps, drawing = [], [], []
    done = threading.Event()
    failure = []

    def browse():
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"http://127.0.0.1:{port}/")
                page.wait_for_selector("#sv-run", timeout=60_000)
                page.locator("#sv-prompt textarea").fill(prompt)
                for i in range(args.runs):
                    t0 = time.perf_counter()
                    page.click("#sv-run")
                    page.wait_for_function("document.querySelectorAll('#sv-tokens .sv-it').length > 0 && "
                                           "!document.querySelector('#sv-status').innerText.includes('done')",
                                           timeout=120_000) if i else page.wait_for_selector("#sv-tokens .sv-it")
                    first.append(time.perf_counter() - t0)
                    if args.screenshots and i == min(1, args.runs - 1):
                        time.sleep(1.2)
                        page.screenshot(path=str(Path(args.screenshots) / "screenshot-running.png"))
                    page.wait_for_selector("#sv-status:has-text('done')", timeout=300_000)
                    page.get_by_role("tab", name="Summary").click()
                    text = page.locator("#sv-summary").inner_text()
                    app_tps.append(float(re.search(r"tokens / s\s+([\d.]+)", text).group(1)))
                    drawing.append(float(re.search(r"the ([\d.]+) s this page spent", text).group(1)))
                    if args.screenshots and i == min(1, args.runs - 1):
                        page.get_by_role("tab", name="Charts").click()
                        time.sleep(1.0)
                        page.screenshot(path=str(Path(args.screenshots) / "screenshot-done.png"), full_page=True)
                    else:
                        page.get_by_role("tab", name="Charts").click()
                browser.close()
        except BaseException as e:  # reported after the main thread stops serving
            failure.append(e)
        finally:
            done.set()


    def call_api():
        from gradio_client import Client

        try:
            client = Client(f"http://127.0.0.1:{port}/", verbose=False)
            for _ in range(args.runs):
                t0 = time.perf_counter()
                job = client.submit(app_module.DEFAULT_PAIR, app_module.PAIR_CHOICE, app_module.PAIR_CHOICE, prompt,
                                    True, pipe.gamma, 0, 0, 1, 96, 0, True, api_name="/run")
                while len(job.outputs()) < 2 and not job.done():
                    time.sleep(0.01)
                first.append(time.perf_counter() - t0)  # the prefill notice, then the first iteration
                md = job.result()[7]
                app_tps.append(float(re.search(r"tokens / s\s+\|\s+([\d.]+)", md).group(1)))
                drawing.append(float(re.search(r"the ([\d.]+) s this page spent", md).group(1)))
        except BaseException as e:
            failure.append(e)
        finally:
            done.set()

    threading.Thread(target=call_api if args.client else browse).start()
    if not args.worker_thread:
        app_module.RUNNER.serve_forever(until=done)  # decode on the main thread, as app.py does
    done.wait()
    demo.close()
    if failure:
        raise failure[0]
    cfg = DecodeConfig(gamma=pipe.gamma, max_new_tokens=96)
    cli_tps = [Trace.of(pipe.speculative(prompt, cfg)).tokens_per_second for _ in range(args.runs)]
    out = {"first_iteration_s": first, "app_tokens_per_s": app_tps, "cli_tokens_per_s": cli_tps,
           "page_drawing_s_per_run": drawing,
           "median_first_iteration_s": statistics.median(first),
           "overhead": 1 - statistics.median(app_tps) / statistics.median(cli_tps)}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
