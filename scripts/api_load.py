"""Load check for the OpenAI-compatible API, against the real `python app.py` (page + API, one process).

Starts app.py on a free loopback port (the default pair, decoding on the main thread as in
production), then:
  1. five concurrent API clients (chat and completions, streamed or not, with and without
     ``speculative``) plus one page run through gradio_client's ``/run``: all must finish, none error;
  2. N sequential API requests (default 50), sampling the server's resident memory (RSS) as it goes.
Then hangs up a long stream and checks the next request is not kept waiting.
Prints tables; exits non-zero if anything failed.

    python scripts/api_load.py                    # 5 + 1 concurrent, then 50 requests
    python scripts/api_load.py --requests 20 --max-tokens 16
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["Repeat this sentence twice: the quick brown fox jumps over the lazy dog.",
           "Name three colours.", "Translate to French: good morning, my friend.",
           "Write a haiku about the sea."]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    env = dict(os.environ, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port), HF_HUB_OFFLINE="1",
               GRADIO_ANALYTICS_ENABLED="False")
    env.pop("SPECVIZ_API_KEY", None)
    return subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(os.environ.get("API_LOAD_LOG", os.devnull), "w"))


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"app.py exited with status {proc.returncode}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("app.py did not answer in time")


def api_call(client, model: str, i: int, max_tokens: int) -> dict:
    kind = "chat" if i % 3 != 2 else "completion"
    stream = i % 2 == 1
    spec = [{"draft_model": "auto"}, None, {"draft_model": "lookup", "num_speculative_tokens": 4},
            {"draft_model": "early-exit:22", "num_speculative_tokens": 3}][i % 4]
    prompt = PROMPTS[i % len(PROMPTS)]
    args = dict(model=model, max_tokens=max_tokens, temperature=0 if i % 5 else 0.7, seed=i,
                extra_body={"speculative": spec} if spec else None)
    t0 = time.perf_counter()
    if kind == "chat":
        args["messages"] = [{"role": "user", "content": prompt}]
        create = client.chat.completions.create
    else:
        args["prompt"] = prompt
        create = client.completions.create
    usage = None
    if stream:
        for chunk in create(stream=True, stream_options={"include_usage": True}, **args):
            usage = chunk.usage or usage
    else:
        usage = create(**args).usage
    return {"kind": kind, "stream": stream, "draft": (spec or {}).get("draft_model", "-"),
            "s": time.perf_counter() - t0, "tokens": usage.completion_tokens,
            "queue_ms": usage.speculative["queue_ms"], "passes": usage.speculative["target_passes"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--model", default=None, help="target (default: the default pair's)")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the server below is stopped too

    from gradio_client import Client
    from openai import OpenAI

    sys.path.insert(0, str(ROOT))
    from specviz.registry import load_registry

    reg = load_registry()
    pair = reg.pair(reg.default())
    model = a.model or pair.target
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(port)
    failures = 0
    try:
        t0 = time.time()
        wait_ready(url, proc)
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
        warm = api_call(client, model, 0, 8)
        mem = psutil.Process(proc.pid)
        print(f"server up and warm in {time.time() - t0:.0f} s (first request {warm['s']:.1f} s); "
              f"RSS {mem.memory_info().rss / 2**20:.0f} MiB\n")

        # 1. five API clients and one page run at once
        rows, errors = [], []

        def run_api(i):
            try:
                rows.append({"who": f"api #{i + 1}", **api_call(client, model, i, a.max_tokens)})
            except Exception as e:
                errors.append(f"api #{i + 1}: {e!r}")

        def run_page():
            try:
                t = time.perf_counter()
                out = Client(f"{url}/", verbose=False).predict(
                    pair=pair.name, prompt=PROMPTS[0], max_new_tokens=a.max_tokens, temperature=0, seed=0,
                    with_vanilla=False, backend="specviz", vllm_url="", api_name="/run")
                result = next(v for v in out if isinstance(v, dict) and "acceptance_rate" in v)
                rows.append({"who": "page /run", "kind": "page", "stream": True, "draft": pair.name,
                             "s": time.perf_counter() - t, "tokens": result["tokens"], "queue_ms": None,
                             "passes": result["iterations"]})
            except Exception as e:
                errors.append(f"page: {e!r}")

        threads = [threading.Thread(target=run_page)] + [threading.Thread(target=run_api, args=(i,))
                                                         for i in range(5)]
        t = time.perf_counter()
        for th in threads:
            th.start()
            time.sleep(0.05)
        for th in threads:
            th.join()
        print(f"5 API clients + 1 page run, concurrently: {time.perf_counter() - t:.1f} s wall, "
              f"{len(rows)}/6 finished, {len(errors)} errors")
        print(f"{'who':<10} {'kind':<10} {'stream':<6} {'drafter':<20} {'tokens':>6} {'passes':>6} "
              f"{'queued s':>8} {'total s':>8}")
        for r in rows:
            q = "" if r["queue_ms"] is None else f"{r['queue_ms'] / 1000:.1f}"
            print(f"{r['who']:<10} {r['kind']:<10} {str(r['stream']):<6} {str(r['draft']):<20} {r['tokens']:>6} "
                  f"{r['passes']:>6} {q:>8} {r['s']:>8.1f}")
        for e in errors:
            print("ERROR", e)
        failures += len(errors) + (6 - len(rows) - len(errors))

        # 2. memory over sequential requests
        print(f"\n{a.requests} sequential requests (mixed kinds; {a.max_tokens} max tokens):")
        print(f"{'after':>6} {'RSS MiB':>8} {'vs first':>9} {'s/request':>10}")
        rss0 = mem.memory_info().rss
        print(f"{0:>6} {rss0 / 2**20:>8.1f} {0:>+9.1f} {'':>10}")
        t = time.perf_counter()
        samples = []
        for i in range(a.requests):
            try:
                api_call(client, model, i, a.max_tokens)
            except Exception as e:
                failures += 1
                print("ERROR", repr(e))
            if (i + 1) % 10 == 0 or i + 1 == a.requests:
                rss = mem.memory_info().rss
                samples.append(rss)
                print(f"{i + 1:>6} {rss / 2**20:>8.1f} {(rss - rss0) / 2**20:>+9.1f} "
                      f"{(time.perf_counter() - t) / (i + 1):>10.2f}")
        if len(samples) >= 2:
            print(f"growth from request 10 to {a.requests}: {(samples[-1] - samples[0]) / 2**20:+.1f} MiB")

        # 3. a client that hangs up mid-stream frees the decoder at once
        stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPTS[3]}],
                                                max_tokens=512, temperature=0.8, seed=1, stream=True)
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        stream.close()
        after = api_call(client, model, 1, 4)
        print(f"\nhung up a 512-token stream after its first text; the next request waited "
              f"{after['queue_ms'] / 1000:.2f} s in the queue")
        failures += after["queue_ms"] > 5000
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
