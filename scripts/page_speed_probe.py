"""Why the page decoded slower than the CLI: the same run through the app's decode queue, with the
consumer the page uses and with lighter ones, timed by the engine's own clock (the mean target
pass, which leaves out the time the consumer holds the stream).

    python scripts/page_speed_probe.py [--rounds 2] [--max-new-tokens 96]

Each round runs, alternated: the run on the main thread with no consumer thread ("direct"), then
through MainThreadRunner consumed by a worker thread that does nothing, keeps the states, renders
each iteration's HTML (tokens.iteration_html, which reads the events' deferred fields), runs the
page's FrameMaker, or runs one torch softmax. Prints the mean pass (ms) of the speculative and the
vanilla run for each.

What it found: a torch operator run in the consumer's thread, even once, made every later pass on
the main thread ~30% slower (the events' deferred raw probabilities were a softmax there). Now the
deferred fields use numpy, and while the runner serves, a thread that starts using torch gets one
intra-op thread (mainthread.py). To see the slowdown again, run this with the runner of before
(``git show 9131186:specviz/mainthread.py``): the torch consumer's passes take ~30% longer.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import yaml  # noqa: E402

from specviz.engine import DecodeConfig  # noqa: E402
from specviz.mainthread import MainThreadRunner  # noqa: E402
from specviz.pipeline import build_pipeline  # noqa: E402
from specviz.registry import load_registry  # noqa: E402
from specviz.view import frames, tokens  # noqa: E402


def mean_pass(trace) -> float:
    return statistics.fmean(e.verify_ms for e in trace.iterations)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--example", type=int, default=1, help="which example prompt (assets/examples.yaml)")
    args = ap.parse_args()
    reg = load_registry()
    pipe = build_pipeline(reg, pair=reg.default())
    root = Path(__file__).resolve().parent.parent
    prompt = yaml.safe_load((root / "assets" / "examples.yaml").read_text())[args.example]["prompt"]
    ids = pipe.encode(prompt, True)
    cfg = DecodeConfig(gamma=pipe.gamma, max_new_tokens=args.max_new_tokens)
    runner = MainThreadRunner()

    def through_runner(consume) -> frames.LiveState:
        done, box = threading.Event(), {}

        def worker() -> None:
            while not runner.serving:  # the job must run on the main thread, not this one
                time.sleep(0.005)
            for state in runner.turns(lambda: frames.live_run(pipe, ids, cfg)):
                consume(state)
                box["last"] = state
            done.set()

        threading.Thread(target=worker, daemon=True).start()
        runner.serve_forever(poll_s=0.02, until=done)
        return box["last"]

    def direct() -> frames.LiveState:
        state = None
        for state in frames.live_run(pipe, ids, cfg):
            pass
        return state

    def html_of_each_iteration():
        out: list[str] = []
        return lambda s: out.append(tokens.iteration_html(s.last)) if s.last is not None else None

    def torch_once():
        done = []
        return lambda s: done or done.append(torch.ones(8, 49152).softmax(-1))

    consumers = {"nothing": lambda: (lambda s: None), "keep states": lambda: [].append,
                 "iteration HTML": html_of_each_iteration, "FrameMaker": lambda: frames.FrameMaker().add,
                 "a torch softmax, once": torch_once}
    results: dict[str, list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        s = direct()
        results.setdefault("direct (main thread)", []).append((mean_pass(s.spec), mean_pass(s.vanilla)))
        for name, make in consumers.items():
            s = through_runner(make())
            results.setdefault(f"runner + {name}", []).append((mean_pass(s.spec), mean_pass(s.vanilla)))
    print(f"{'consumer':<28} {'spec pass ms':>14} {'vanilla pass ms':>16}")
    for name, rows in results.items():
        print(f"{name:<28} {statistics.median(r[0] for r in rows):>14.1f} {statistics.median(r[1] for r in rows):>16.1f}")


if __name__ == "__main__":
    main()
