"""The live page measured as a user meets it: launch the app, click Run in headless Chromium, and
measure how often the page redraws (frames with charts, per second of the run), the decoders' own
tokens/s in the page (from the Summary) against the same run through the CLI, and the wall time
of a run. ``--charts-every S`` changes the chart throttle (e.g. 1e9: charts only at the end) to
measure what live charts cost. Optionally save screenshots (light, dark, mobile).

    python scripts/measure_app.py --runs 3
    python scripts/measure_app.py --runs 3 --charts-every 1e9
    python scripts/measure_app.py --runs 1 --screenshots assets
"""

import argparse
import json
import re
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import app as app_module  # noqa: E402
from specviz.engine import DecodeConfig  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.trace import Trace  # noqa: E402
from specviz.view import frames as frames_module  # noqa: E402

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


class CountingMaker(frames_module.FrameMaker):
    """Records when each frame with charts was sent."""

    log: list[tuple[float, str]] = []

    def add(self, state):
        frame = super().add(state)
        if frame is not None and frame.charts:
            self.log.append((time.perf_counter(), state.phase))
        return frame


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--screenshots", help="folder for screenshot-*.png (light, dark, mobile)")
    ap.add_argument("--example", type=int, default=1, help="which example prompt (assets/examples.yaml)")
    ap.add_argument("--charts-every", type=float, default=frames_module.CHARTS_EVERY_S)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    frames_module.CHARTS_EVERY_S = args.charts_every
    app_module.FrameMaker = CountingMaker
    pair = app_module.REGISTRY.default()
    pipe = build_pipeline(app_module.REGISTRY, pair=pair)  # weights loaded and costs measured first,
    pipe.warm_up(max_gamma=16)  # as the app's start-up preload does
    prompt = app_module.EXAMPLES[args.example]["prompt"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo = app_module.build_demo()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                **app_module.launch_kwargs())
    runs, done, failure = [], threading.Event(), []

    def one_run(page, shots: str | None = None):
        page.locator("#sv-prompt textarea").fill(prompt)
        box = page.get_by_label("number input for Max new tokens")
        box.fill(str(args.max_new_tokens))
        box.press("Enter")
        CountingMaker.log.clear()
        t0 = time.perf_counter()
        page.click("#sv-run")
        page.wait_for_selector("#sv-tokens .sv-it", timeout=120_000)
        first = time.perf_counter() - t0
        if shots:
            time.sleep(1.5)
            page.screenshot(path=f"{shots}-running.png")
        page.wait_for_function("document.querySelector('#sv-status')?.innerText.includes('done')", timeout=300_000)
        wall = time.perf_counter() - t0
        if page.viewport_size["width"] < 600:  # a phone: the tabs fold into a menu; the picture is the point
            page.screenshot(path=f"{shots}-done.png") if shots else None
            return
        page.get_by_role("tab", name="Summary").click()
        text = page.locator("#sv-summary").inner_text()
        tps = [float(x) for x in re.search(r"tokens / s\s+([\d.]+)\s+([\d.]+)", text).groups()]
        drawing = float(re.search(r"the ([\d.]+) s this page spent", text).group(1))
        log = CountingMaker.log[:-1]  # the last frame is the end of the run
        span = (log[-1][0] - log[0][0]) if len(log) > 1 else 0.0
        runs.append({"first_iteration_s": first, "wall_s": wall, "spec_tps": tps[0], "vanilla_tps": tps[1],
                     "drawing_s": drawing, "chart_frames": len(log),
                     "chart_frames_vanilla": sum(1 for _, ph in log if ph == "vanilla"),
                     "redraw_hz": (len(log) - 1) / span if span else 0.0})
        if shots:
            page.get_by_role("tab", name="Output").click()
            time.sleep(0.5)
            page.screenshot(path=f"{shots}-done.png", full_page=True)
            page.get_by_role("tab", name="Charts").click()
            time.sleep(1.0)
            page.screenshot(path=f"{shots}-charts.png", full_page=True)

    def browse():
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"http://127.0.0.1:{port}/")
                page.wait_for_selector("#sv-run", timeout=60_000)
                for i in range(args.runs):
                    one_run(page, f"{args.screenshots}/screenshot" if args.screenshots and i == 0 else None)
                if args.screenshots:
                    dark = browser.new_page(viewport={"width": 1400, "height": 1000})
                    dark.goto(f"http://127.0.0.1:{port}/?__theme=dark")
                    dark.wait_for_selector("#sv-run", timeout=60_000)
                    one_run(dark, f"{args.screenshots}/screenshot-dark")
                    mobile = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True,
                                              has_touch=True, device_scale_factor=1)
                    mobile.goto(f"http://127.0.0.1:{port}/")
                    mobile.wait_for_selector("#sv-run", timeout=60_000)
                    one_run(mobile, f"{args.screenshots}/screenshot-mobile")
                browser.close()
        except BaseException as e:  # reported after the main thread stops serving
            failure.append(e)
        finally:
            done.set()

    threading.Thread(target=browse).start()
    app_module.RUNNER.serve_forever(until=done)  # decode on the main thread, as app.py does
    done.wait()
    demo.close()
    if failure:
        raise failure[0]
    cfg = DecodeConfig(gamma=pipe.gamma, max_new_tokens=args.max_new_tokens)
    cli_tps = [Trace.of(pipe.speculative(prompt, cfg)).tokens_per_second for _ in range(args.runs)]
    med = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
    print(json.dumps({"charts_every_s": args.charts_every, "runs": runs, "cli_spec_tps": cli_tps}, indent=1))
    print(f"\ncharts every {args.charts_every:g} s: redraw {med('redraw_hz'):.2f} Hz "
          f"({med('chart_frames'):.0f} chart frames, {med('chart_frames_vanilla'):.0f} during vanilla); "
          f"page speculative {med('spec_tps'):.1f} tok/s vs CLI {statistics.median(cli_tps):.1f} tok/s; "
          f"wall {med('wall_s'):.1f} s, drawing {med('drawing_s'):.2f} s, first iteration {med('first_iteration_s'):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
