"""How fast the real app decodes, against the CLI on the same prompt: starts `python app.py` (page +
API, one process, the default pair), waits for its start-up warm-up, then alternates, for each
round: an API request with plain decoding, one with the default pair (tok/s by the reply's own
``decode_ms``), and a page run through gradio_client's ``/run`` with vanilla beside it (the page's
own tok/s for both, prefill included). Then the same prompt through the engine in this process, on
its main thread, as the CLI runs it. Prints a table of medians and every value. (The API's numbers
leave the prefill out; compare the page with the CLI, and the API with itself.)

    python scripts/app_speed.py [--rounds 3] [--max-tokens 96]

Written when the page and the API decoded ~35-40% slower than the CLI (docs/MEASUREMENTS.md,
2026-12-07): torch work in a server thread slowed every later pass of the decode thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import yaml

from api_load import ROOT, free_port, start_server, wait_ready


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--warm-s", type=float, default=20.0, help="wait for the app's start-up warm-up")
    a = ap.parse_args()

    from gradio_client import Client
    from openai import OpenAI

    sys.path.insert(0, str(ROOT))
    from specviz.registry import load_registry

    reg = load_registry()
    pair = reg.pair(reg.default())
    prompt = yaml.safe_load((ROOT / "assets" / "examples.yaml").read_text())[1]["prompt"]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(port)
    got: dict[str, list[float]] = {}
    try:
        wait_ready(url, proc)
        time.sleep(a.warm_s)
        api = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
        page = Client(f"{url}/", verbose=False)
        for _ in range(a.rounds):
            for name, extra in (("API, plain", {}), ("API, the default pair",
                                                     {"extra_body": {"speculative": {"draft_model": "auto"}}})):
                out = api.chat.completions.create(model=pair.target, messages=[{"role": "user", "content": prompt}],
                                                  max_tokens=a.max_tokens, temperature=0, **extra)
                ms = out.model_dump()["usage"]["speculative"]["decode_ms"]
                got.setdefault(name, []).append(out.usage.completion_tokens / ms * 1000.0)
            res = page.predict(pair=pair.name, prompt=prompt, max_new_tokens=a.max_tokens, temperature=0, seed=0,
                               with_vanilla=True, backend="specviz", vllm_url="", api_name="/run")
            summary = next(v for v in res if isinstance(v, dict) and "acceptance_rate" in v)
            got.setdefault("page, speculative", []).append(summary["tokens_per_second"])
            got.setdefault("page, vanilla", []).append(summary["tokens_per_second"] / summary["speedup"])
    finally:
        proc.terminate()
        proc.wait(30)

    from specviz.engine import DecodeConfig
    from specviz.pipeline import build_pipeline

    pipe = build_pipeline(reg, pair=pair.name)
    pipe.warm_up(max_gamma=16)  # as the app's start-up does
    ids = pipe.encode(prompt, True)
    cfg = DecodeConfig(gamma=pipe.gamma, max_new_tokens=a.max_tokens)
    for _ in range(a.rounds):
        for name, run in (("CLI, speculative", pipe.speculative), ("CLI, vanilla", pipe.vanilla)):
            got.setdefault(name, []).append(list(run(ids, cfg))[-1].tokens_per_second)
    print(f"{'path':<24} {'median tok/s':>12}  values")
    for name, v in got.items():
        print(f"{name:<24} {statistics.median(v):>12.1f}  {', '.join(f'{x:.1f}' for x in v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
