"""python -m specviz vllm-serve: start vLLM servers for a pair (and optionally decode a prompt).

Kept out of cli.py so the CLI's other commands never touch vLLM; nothing here imports vllm.
"""

from __future__ import annotations

import json
import signal
import sys
import time

from .errors import SpecvizError


def add_parser(sub) -> None:
    p = sub.add_parser("vllm-serve", help="serve a pair with vLLM (speculative + vanilla servers)")
    p.add_argument("--pair", help="a pair from models.yaml (default: the offline default pair)")
    p.add_argument("--models", help="registry file (default: models.yaml)")
    p.add_argument("--gamma", type=int, help="draft tokens per step (lookup pairs: 4 unless given)")
    p.add_argument("--port", type=int, help="port of the speculative server (default: a free one)")
    p.add_argument("--vanilla-port", type=int, help="port of the server without speculation")
    p.add_argument("--only", choices=["speculative", "vanilla"], help="start just one of the two servers")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per server (vLLM's -tp)")
    p.add_argument("--dtype", default="float32", help="float32 (default) | bfloat16 | float16 | auto")
    p.add_argument("--timeout", type=float, default=600, help="seconds to wait for each server")
    p.add_argument("--prompt", help="decode this prompt on both servers, print the steps, then stop them")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--no-chat", action="store_true", help="feed the prompt as plain text, no chat template")
    p.add_argument("--json", action="store_true", help="with --prompt: JSON lines on standard output")


def _say(msg: str) -> None:
    print(f"[specviz] {msg}", file=sys.stderr, flush=True)


def _fmt(ev) -> str:
    if not ev.proposed:
        return f"#{ev.index:<3} {ev.correction.kind:8} {''.join(ev.emitted_text)!r}  ({ev.verify_ms:.0f} ms)"
    marks = [f"{t!r}:{'ok' if i < ev.accepted else 'NO' if i == ev.accepted else '--'}"
             for i, t in enumerate(ev.proposed_text)]
    return (f"#{ev.index:<3} {ev.accepted}/{len(ev.proposed)} kept  " + " ".join(marks) +
            f"  -> {ev.correction.kind} {ev.correction.text!r}  ({ev.verify_ms:.0f} ms)")


def _decode(backend, args) -> None:
    from .engine import DecodeConfig
    from .events import to_dict

    cfg = DecodeConfig(gamma=backend.gamma, max_new_tokens=args.max_new_tokens)
    backend.warm_up()  # the first step compiles vLLM's n-gram kernels: not part of a measurement
    ids = backend.encode(args.prompt, chat=not args.no_chat)
    for mode in [args.only] if args.only else ["speculative", "vanilla"]:
        for ev in getattr(backend, mode)(ids, cfg):
            if args.json:
                if ev.event != "start":
                    print(json.dumps(to_dict(ev)), flush=True)
            elif ev.event == "iteration" and mode == "speculative":
                print(_fmt(ev), file=sys.stderr)
            elif ev.event == "summary":
                rate = "n/a" if ev.acceptance_rate is None else f"{ev.acceptance_rate:.1%}"
                print(ev.text)
                print(f"\n[{mode}] {ev.new_tokens} tokens in {ev.iterations} steps, acceptance {rate}, "
                      f"{ev.tokens_per_second:.1f} tokens/s (prefill {ev.prefill_ms:.0f} ms), stop: {ev.stop_reason}"
                      + (f"\n  vLLM: {json.dumps(ev.server_metrics)}" if ev.server_metrics else ""), file=sys.stderr)


def main(args) -> int:
    from .backends.vllm import VLLMBackend, VLLMServer, plan_pair, require_vllm

    for flag, port in (("--port", args.port), ("--vanilla-port", args.vanilla_port)):
        if port is not None and not 1 <= port <= 65535:
            raise SpecvizError(f"{flag} must be a port from 1 to 65535, got {port}")
    plan_pair(args.pair, args.gamma, args.models, check_only=True)  # a wrong pair is said before "not installed"
    require_vllm()
    plan = plan_pair(args.pair, args.gamma, args.models, progress=_say)
    servers = []
    if args.only != "vanilla":
        servers.append(VLLMServer(plan, True, args.port, args.dtype, args.tensor_parallel_size, args.host))
    if args.only != "speculative":
        servers.append(VLLMServer(plan, False, args.vanilla_port, args.dtype, args.tensor_parallel_size, args.host))
    try:
        for s in servers:
            s.start(args.timeout, progress=_say)
            _say(f"{'speculative' if s.speculative else 'vanilla'} server ready at {s.url} in {s.startup_s:.0f} s")
        if plan.method == "lookup" and args.only != "vanilla":
            _say(f"speculation: {json.dumps(plan.spec_config)}; per-step trace in {servers[0].trace_dir}")
        if args.prompt:
            spec = servers[0] if servers[0].speculative else None
            van = servers[-1] if not servers[-1].speculative else None
            backend = VLLMBackend.connect((spec or van).url, van.url if van else None, plan=plan,
                                          trace_dir=spec.trace_dir if spec else None, dtype=args.dtype)
            if spec is None:  # vanilla only: the same server answers both
                backend.trace_dir = None
            _decode(backend, args)
            return 0
        _say("serving; Ctrl-C stops the servers")
        signal.signal(signal.SIGTERM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
        while all(s.proc.poll() is None for s in servers):
            time.sleep(1)
        dead = next(s for s in servers if s.proc.poll() is not None)
        _say(f"a vLLM server exited; see {dead.log_path}")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for s in servers:
            s.stop()
