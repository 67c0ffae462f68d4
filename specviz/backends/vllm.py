"""vLLM as a specviz backend: the same event stream as specviz's own engine, from a real server.

specviz never imports vllm.  vLLM lives in its own virtualenv (``bash scripts/setup.sh --vllm``
makes ``.venv-vllm``); specviz starts its OpenAI-compatible server there as a subprocess on
127.0.0.1 and talks HTTP to it.  Two servers make a comparison: one with speculation, one
without (vLLM decides speculation per server, not per request).

Where the token view comes from: a lookup pair speculates through
:class:`specviz.backends.vllm_proposer.SpecvizProposer` (vLLM's own n-gram proposer, wrapped),
which writes each engine step's emitted ids and next drafts to a per-request JSON-lines file.
:class:`VLLMBackend` reads those files while the response streams and yields one
``IterationEvent`` per vLLM step.  A server specviz did not start (a URL) gives no such file:
then each streamed chunk becomes one iteration, with the drafts unknown.  vLLM exposes no p or q:
those fields stay empty and each iteration's ``reason`` says so.

The summary's totals are vLLM's own: ``server_metrics`` carries the request's
``metrics.speculative_decoding`` dict (``num_draft_tokens``, ``num_accepted_draft_tokens``,
``per_step_drafted``, ...), and the per-step events add up to it.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..engine import DecodeConfig, TokenText, encode_prompt
from ..errors import SpecvizError
from ..events import Correction, IterationEvent, StartEvent, SummaryEvent
from ..trace import PositionTally

REPO = Path(__file__).resolve().parents[2]
PROPOSER = "specviz.backends.vllm_proposer.SpecvizProposer"
NO_PQ = "no p/q from vLLM"
VLLM_LOOKUP = {"k": 4, "min_ngram": 2}  # vLLM's n-gram settings for lookup pairs (see plan_pair)


def vllm_home() -> Path:
    """Caches, converted models, logs and step traces (git-ignored)."""
    return Path(os.environ.get("SPECVIZ_VLLM_HOME") or REPO / ".cache" / "vllm")


def vllm_python() -> Path:
    """The interpreter of vLLM's own virtualenv."""
    return Path(os.environ.get("SPECVIZ_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")


def require_vllm() -> Path:
    py = vllm_python()
    if not py.exists():
        raise SpecvizError(f"vLLM is not installed ({py} is missing): run `bash scripts/setup.sh --vllm`")
    return py


# ---------------------------------------------------------------------------------------------
# What to serve for a pair of models.yaml


@dataclass
class ServePlan:
    pair: str
    target: str  # the registry's model name (also the served model name)
    model: str  # a folder vLLM can load, or a hub id
    offline: bool
    gamma: int
    method: str  # "lookup" | "suffix" | "draft_model"
    spec_config: dict
    env: dict = field(default_factory=dict)
    draft: str = ""  # the draft model's folder or hub id (draft_model pairs)

    @property
    def label(self) -> str:
        return f"{self.pair} @ vllm"


def _registry(path: str | os.PathLike | None) -> tuple[dict, Path]:
    import yaml

    p = Path(path) if path else REPO / "models.yaml"
    try:
        return yaml.safe_load(p.read_text()) or {}, p.parent
    except OSError as e:
        raise SpecvizError(f"cannot read the registry {p}: {e.strerror}") from None


def model_folder(name: str, reg: dict, base: Path, progress=None) -> tuple[str, bool]:
    """(what vLLM loads, offline?) for a registry model: a GGUF from a package is converted once
    to a safetensors folder under ``vllm_home()/models``; a local folder is used as is; a hub id
    is passed to vLLM (which downloads it, where a network exists)."""
    spec = (reg.get("models") or {}).get(name)
    if not spec:
        raise SpecvizError(f"unknown model {name!r} in models.yaml")
    hub = None
    for src in spec.get("sources") or []:
        if "package" in src and src.get("gguf"):
            found = importlib.util.find_spec(src["package"])
            if found is None or not found.origin:
                continue
            gguf = Path(found.origin).parent / src["gguf"]
            if gguf.is_file():
                return str(convert_gguf(gguf, vllm_home() / "models" / name, progress)), True
        elif "local" in src:
            folder = (base / os.path.expanduser(src["local"])).resolve()
            if folder.is_dir():
                return str(folder), True
        elif "hub" in src and hub is None:
            hub = src["hub"]
    if hub is None:
        raise SpecvizError(f"model {name!r} has no source vLLM can load here")
    return hub, False


def convert_gguf(gguf: Path, out: Path, progress=None) -> Path:
    """A GGUF (dequantised by transformers) saved as a folder vLLM loads; done once."""
    stamp = out / "specviz-source.json"
    want = {"gguf": str(gguf), "size": gguf.stat().st_size}
    if stamp.is_file() and json.loads(stamp.read_text()) == want:
        return out
    if progress:
        progress(f"converting {gguf.name} for vLLM into {out} (once, ~20 s)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.hf_quantizer = None  # the weights are plain floats now; vLLM must not look for GGUF
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "specviz-source.json").write_text(json.dumps(want))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def plan_pair(pair: str | None = None, gamma: int | None = None, models: str | None = None,
              progress=None, method: str = "ngram", check_only: bool = False) -> ServePlan | None:
    """How to serve a registry pair with vLLM, or a SpecvizError saying why it cannot be (``check_only``:
    only that, before vLLM is needed or the model converted).

    ``method`` (lookup pairs): "ngram", vLLM's n-gram proposer (wrapped to trace every step), or
    "suffix", vLLM's suffix decoding (arctic-inference) with the global tree of past responses
    off: a benchmark repeats each prompt, and a cache of answers would replay the last one."""
    if method not in ("ngram", "suffix"):
        raise SpecvizError(f"vLLM method {method!r}: choose ngram or suffix")
    reg, base = _registry(models)
    pairs = reg.get("pairs") or {}
    name = pair or reg.get("default_pair") or next(iter(pairs), None)
    if name not in pairs:
        raise SpecvizError(f"unknown pair {name!r}; `python -m specviz pairs` lists them")
    p = pairs[name]
    drafter = p.get("drafter") or {}
    kind = drafter.get("kind")
    if gamma is not None and (int(gamma) != gamma or gamma < 1):
        raise SpecvizError(f"gamma must be a whole number >= 1, got {gamma}")
    k = int(gamma or p.get("gamma") or 4)
    if kind == "early_exit":
        raise SpecvizError(f"pair {name!r} drafts with the target's own first layers (early exit), "
                           "which vLLM cannot run; pick a lookup or draft-model pair")
    if kind == "head":
        if drafter.get("lookup") is False:
            raise SpecvizError(f"pair {name!r} drafts with specviz's trained head alone, which vLLM cannot run")
        kind = "prompt_lookup"  # vLLM serves the pair's lookup half: it has no hook for the head's hidden state
    if check_only:  # what can be said without vLLM or converting the model
        return None
    model, offline = model_folder(p["target"], reg, base, progress)
    if kind == "prompt_lookup" and method == "suffix":  # it sizes each proposal itself; k is the cap
        return ServePlan(name, p["target"], model, offline, k, "suffix",
                         {"method": "suffix", "num_speculative_tokens": k, "suffix_decoding_max_cached_requests": 0})
    if kind == "prompt_lookup":
        # vLLM's n-gram proposer is not cost-aware like specviz's: it proposes k tokens at every
        # match.  The pair's own gamma and shortest n-gram are tuned for specviz's adaptive drafter
        # (gamma 10, 1-grams: 3% of drafts kept on vLLM here, no speedup), so vLLM gets its own.
        k = int(gamma or VLLM_LOOKUP["k"])
        lo = max(VLLM_LOOKUP["min_ngram"], int(drafter.get("min_ngram", 1)))
        hi = max(lo, int(drafter.get("max_ngram", 4)))
        return ServePlan(name, p["target"], model, offline, k, "lookup",
                         {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k},
                         {"SPECVIZ_VLLM_LOOKUP_MIN": str(lo), "SPECVIZ_VLLM_LOOKUP_MAX": str(hi)})
    if method != "ngram":
        raise SpecvizError(f"pair {name!r}: vLLM's {method} decoding drafts from text; this pair drafts with {kind}")
    if kind == "model":
        draft, draft_offline = model_folder(drafter["model"], reg, base, progress)
        return ServePlan(name, p["target"], model, offline and draft_offline, k, "draft_model",
                         {"method": "draft_model", "model": draft, "num_speculative_tokens": k}, draft=draft)
    raise SpecvizError(f"pair {name!r}: vLLM cannot run drafter kind {kind!r}")


# ---------------------------------------------------------------------------------------------
# A server process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMServer:
    """``python -m vllm.entrypoints.openai.api_server`` from vLLM's venv, on 127.0.0.1 only."""

    def __init__(self, plan: ServePlan, speculative: bool, port: int | None = None, dtype: str = "float32",
                 tensor_parallel_size: int = 1, host: str = "127.0.0.1", extra_args: list[str] | None = None):
        self.plan, self.speculative, self.dtype, self.host = plan, speculative, dtype, host
        self.port = port or free_port()
        self.tp = tensor_parallel_size
        self.extra_args = list(extra_args or [])
        home = vllm_home()
        self.trace_dir = home / "trace" / str(self.port) if speculative and plan.method == "lookup" else None
        self.log_path = home / "logs" / f"{'spec' if speculative else 'vanilla'}-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        self.startup_s = 0.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [str(require_vllm()), "-m", "vllm.entrypoints.openai.api_server", "--model", self.plan.model,
               "--served-model-name", self.plan.target, "--host", self.host, "--port", str(self.port),
               "--dtype", self.dtype, "--enforce-eager", "--tensor-parallel-size", str(self.tp),
               "--disable-uvicorn-access-log"]
        if self.speculative:
            cmd += ["--speculative-config", json.dumps(self.plan.spec_config),
                    "--per-request-spec-decode-metrics", "detailed"]
        return cmd + self.extra_args

    def environment(self) -> dict:
        home = vllm_home()
        run = home / "run"  # vLLM's sockets: a short path of our own, not /tmp
        for d in (home / "vllm-cache", home / "config", run, self.log_path.parent):
            d.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_CACHE_ROOT": str(home / "vllm-cache"),
                    "VLLM_CONFIG_ROOT": str(home / "config"), "VLLM_RPC_BASE_PATH": str(run), "TMPDIR": str(run),
                    "PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])})
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        omp = vllm_python().parent.parent / "lib" / "libiomp5.so"  # CPU build: Intel OpenMP, preloaded
        if omp.exists() and "libiomp5" not in env.get("LD_PRELOAD", ""):
            env["LD_PRELOAD"] = ":".join([str(omp)] + [p for p in [env.get("LD_PRELOAD")] if p])
        if self.plan.offline:
            env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        env.update(self.plan.env)
        if self.trace_dir:
            shutil.rmtree(self.trace_dir, ignore_errors=True)
            self.trace_dir.mkdir(parents=True)
            env["SPECVIZ_VLLM_TRACE_DIR"] = str(self.trace_dir)
        return env

    def start(self, timeout: float = 600.0, progress=None) -> "VLLMServer":
        import httpx

        env = self.environment()
        t0 = time.perf_counter()
        log = open(self.log_path, "w")
        # its own session: stop() ends the server and every worker it spawned, nothing else
        self.proc = subprocess.Popen(self.command(), env=env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=str(REPO), start_new_session=True)
        log.close()
        # its own session also means no signal of ours reaches it: it ends when this process does,
        # from the moment it exists (a server still starting is in no backend's hands yet)
        atexit.register(self.stop)
        if progress:  # the page shows this to visitors: no server paths
            progress(f"starting vLLM ({'speculative' if self.speculative else 'vanilla'}) on {self.url}")
        while True:
            if self.proc.poll() is not None:
                raise SpecvizError(f"the vLLM server exited during start-up ({self._last_error()}); "
                                   f"see {self.log_path}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.perf_counter() - t0 > timeout:
                self.stop()
                raise SpecvizError(f"the vLLM server did not answer within {timeout:.0f} s; see {self.log_path}")
            time.sleep(0.5)
        self.startup_s = time.perf_counter() - t0
        return self

    def _last_error(self) -> str:
        try:
            lines = [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "no log"
        errs = [ln for ln in lines if "Error" in ln or "error" in ln]
        return (errs or lines or ["no output"])[-1][-300:]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# ---------------------------------------------------------------------------------------------
# The backend: the Pipeline's shape, over HTTP


def _eos_ids(tok, extra=None) -> set[int]:
    ids = set(extra or [])
    if isinstance(getattr(tok, "eos_token_id", None), int):
        ids.add(tok.eos_token_id)
    return ids


class VLLMBackend:
    """Speculative decoding on one vLLM server, vanilla decoding on another, as specviz events."""

    def __init__(self, spec_url: str, vanilla_url: str | None, tokenizer, served_model: str, gamma: int,
                 name: str, trace_dir: str | os.PathLike | None = None, servers: list[VLLMServer] | None = None,
                 model_info: dict | None = None, timeout: float = 300.0):
        self.spec_url, self.vanilla_url = spec_url.rstrip("/"), (vanilla_url or "").rstrip("/") or None
        self.tokenizer, self.served_model, self.gamma, self.name = tokenizer, served_model, gamma, name
        self.trace_dir = Path(trace_dir) if trace_dir else None
        self.servers = list(servers or [])
        self.model_info = model_info or {}
        self.timeout = timeout

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def launch(cls, pair: str | None = None, gamma: int | None = None, dtype: str = "float32",
               tensor_parallel_size: int = 1, models: str | None = None, vanilla: bool = True,
               progress=None, timeout: float = 600.0, method: str = "ngram") -> "VLLMBackend":
        """Start a speculative (and a vanilla) server for a registry pair; ``close()`` stops them."""
        require_vllm()
        plan = plan_pair(pair, gamma, models, progress, method)
        servers = [VLLMServer(plan, True, dtype=dtype, tensor_parallel_size=tensor_parallel_size)]
        if vanilla:
            servers.append(VLLMServer(plan, False, dtype=dtype, tensor_parallel_size=tensor_parallel_size))
        try:
            for s in servers:  # one at a time: two start-ups at once on 2 cores take as long, and fail together
                s.start(timeout, progress)
            backend = cls.connect(servers[0].url, servers[1].url if vanilla else None, plan=plan,
                                  trace_dir=servers[0].trace_dir, servers=servers, dtype=dtype)
            backend.warm_up()
        except BaseException:
            for s in servers:
                s.stop()
            raise
        return backend

    @classmethod
    def connect(cls, spec_url: str, vanilla_url: str | None = None, pair: str | None = None,
                plan: ServePlan | None = None, trace_dir=None, servers=None, dtype: str = "?",
                models: str | None = None) -> "VLLMBackend":
        """A backend over servers that are already running (started by ``vllm-serve`` or anyone)."""
        import httpx
        from transformers import AutoTokenizer

        try:  # asked first: planning may convert the model to a folder (hundreds of MB) for nothing
            served = httpx.get(spec_url.rstrip("/") + "/v1/models", timeout=5).json()["data"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            raise SpecvizError(f"no vLLM server answers at {spec_url} ({type(e).__name__})") from None
        plan = plan or plan_pair(pair, None, models)
        max_len = served[0].get("max_model_len")
        tok = AutoTokenizer.from_pretrained(plan.model)
        info = {"name": plan.target, "device": f"vLLM at {spec_url}", "dtype": dtype, "source": plan.model,
                "max_model_len": max_len}
        eos: list = []
        gen = Path(plan.model) / "generation_config.json"
        if gen.is_file():
            v = json.loads(gen.read_text()).get("eos_token_id")
            eos = [v] if isinstance(v, int) else list(v or [])
        return cls(spec_url, vanilla_url, tok, served[0]["id"], plan.gamma, plan.label, trace_dir, servers,
                   {"target": info, "method": plan.method, "spec_config": plan.spec_config, "eos": eos})

    def close(self) -> None:
        for s in self.servers:
            s.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def warm_up(self) -> None:
        """One short request per server: the first step compiles vLLM's n-gram kernels (~1 s)."""
        cfg = DecodeConfig(gamma=self.gamma, max_new_tokens=8)
        for run in (self.speculative, self.vanilla) if self.vanilla_url else (self.speculative,):
            for _ in run("Say hello, hello, hello.", cfg):
                pass

    # -- the Pipeline's shape ----------------------------------------------------------------

    def info(self) -> dict:
        target = dict(self.model_info.get("target", {}))
        kind = {"lookup": "vLLM's n-gram proposer (wrapped by specviz)",
                "suffix": "vLLM's suffix decoding (arctic-inference)"}.get(self.model_info.get("method"),
                                                                           "vLLM's draft-model proposer")
        return {"target": target, "draft": {"name": kind, "device": target.get("device", "vLLM"),
                                            "dtype": target.get("dtype", "?"), "source": "vLLM speculative_config "
                                            + json.dumps(self.model_info.get("spec_config", {}))}}

    def encode(self, prompt: str, chat: bool = True) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, chat)

    def speculative(self, prompt: str | list[int], cfg: DecodeConfig, chat: bool = True) -> Iterator:
        return self._run("speculative", self.spec_url, prompt, cfg, chat)

    def vanilla(self, prompt: str | list[int], cfg: DecodeConfig, chat: bool = True) -> Iterator:
        if not self.vanilla_url:
            raise SpecvizError("this vLLM backend has no server without speculation for vanilla decoding")
        return self._run("vanilla", self.vanilla_url, prompt, cfg, chat)

    # -- one request ---------------------------------------------------------------------------

    def _run(self, mode: str, url: str, prompt, cfg: DecodeConfig, chat: bool) -> Iterator:
        ids = prompt if isinstance(prompt, list) else self.encode(prompt, chat)
        if not ids:
            raise SpecvizError("the prompt is empty")
        return _Request(self, mode, url, ids, cfg).events()


def _stream(url: str, body: dict, headers: dict, out: queue.Queue, timeout: float) -> None:
    """Read the server's SSE stream into a queue, stamping arrival times, so the consumer's own
    pace (a UI rendering each event) never slows or skews the measured decoding."""
    import httpx

    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, headers=headers,
                          timeout=httpx.Timeout(timeout, connect=5)) as r:
            if r.status_code != 200:
                r.read()
                try:
                    msg = r.json().get("error", {}).get("message") or r.text
                except ValueError:
                    msg = r.text
                out.put(("error", f"vLLM refused the request ({r.status_code}): {str(msg).strip()[:300]}"))
                return
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    out.put(("chunk", time.time(), json.loads(line[6:])))
    except httpx.HTTPError as e:
        out.put(("error", f"the vLLM server at {url} is unreachable or failed ({type(e).__name__}: {e})"))
    finally:
        out.put(("done",))


class _Request:
    """One completion request turned into specviz events."""

    def __init__(self, be: VLLMBackend, mode: str, url: str, ids: list[int], cfg: DecodeConfig):
        self.be, self.mode, self.url, self.ids, self.cfg = be, mode, url, list(ids), cfg
        self.tok = be.tokenizer
        self.tag = f"specviz-{uuid.uuid4().hex[:16]}"
        self.traced = mode == "speculative" and be.trace_dir is not None
        self.trace_path: Path | None = None
        self.trace_pos = 0
        self.pending = ""

    def body(self) -> dict:
        s = self.cfg.sampling
        b = {"model": self.be.served_model, "prompt": self.ids, "max_tokens": self.cfg.max_new_tokens,
             "temperature": float(s.temperature), "top_p": float(s.top_p), "stream": True,
             "return_token_ids": True, "stream_options": {"include_usage": True}, "skip_special_tokens": True}
        if s.top_k:
            b["top_k"] = int(s.top_k)
        if self.cfg.seed is not None and not s.greedy:
            b["seed"] = int(self.cfg.seed)
        return b

    def _records(self) -> list[dict]:
        """Steps the proposer has written for this request since the last call."""
        if self.trace_path is None:
            hits = list(self.be.trace_dir.glob(f"*{self.tag}*.jsonl"))
            if not hits:
                return []
            self.trace_path = hits[0]
        try:
            with open(self.trace_path) as f:
                f.seek(self.trace_pos)
                data = f.read()
        except OSError:
            return []
        data = self.pending + data
        self.trace_pos += len(data) - len(self.pending)
        lines = data.split("\n")
        self.pending = lines.pop()  # a line still being written
        return [json.loads(ln) for ln in lines if ln.strip()]

    def events(self) -> Iterator:
        q: queue.Queue = queue.Queue()
        t0 = time.time()
        th = threading.Thread(target=_stream, args=(self.url, self.body(), {"X-Request-Id": self.tag}, q,
                                                     self.be.timeout), daemon=True)
        th.start()
        st = _State(self, t0)
        first = True
        while True:
            item = q.get()
            if item[0] == "error":
                raise SpecvizError(item[1])
            if item[0] == "done":
                break
            _, t, chunk = item
            if first:
                first = False
                yield st.start_event(t)
            choices = chunk.get("choices") or []
            for c in choices:
                st.stream_ids.extend(int(x) for x in c.get("token_ids") or [])
                st.finish = c.get("finish_reason") or st.finish
            if chunk.get("metrics"):
                st.metrics = (chunk["metrics"] or {}).get("speculative_decoding") or {}
            if choices:
                yield from (st.from_records(self._records(), t) if self.traced else st.from_chunk(choices, t))
        if first or st.finish is None:
            logs = [str(s.log_path) for s in self.be.servers if s.url == self.url]
            raise SpecvizError("the vLLM server stopped answering in the middle of the request"
                               + (f"; see {logs[0]}" if logs else ""))
        if self.traced:
            deadline = time.time() + 2.0  # the last step's line is written before its output is sent
            while st.emitted_total < len(st.stream_ids) and time.time() < deadline:
                recs = self._records()
                yield from st.from_records(recs, time.time())
                if not recs:
                    time.sleep(0.01)
            if st.emitted_total != len(st.stream_ids) or st.out_ids != st.stream_ids:
                raise SpecvizError(f"the proposer's step trace ({st.emitted_total} tokens) does not line up with "
                                   f"the server's output ({len(st.stream_ids)} tokens); see {self.trace_path}")
            if self.trace_path is not None:
                self.trace_path.unlink(missing_ok=True)
        yield st.summary()


class _State:
    """Running totals of one request, and the events built from them."""

    def __init__(self, req: _Request, t0: float):
        self.req, self.t0 = req, t0
        self.prompt = req.ids
        self.stream_ids: list[int] = []  # what the HTTP stream says was generated
        self.out_ids: list[int] = []  # what the events emitted
        self.emitted_total = 0
        self.iterations = self.proposed = self.accepted = 0
        self.positions = PositionTally()
        self.drafts: list[int] = []  # the drafts the previous step proposed (verified in this one)
        self.last_t = t0
        self.first_t = t0
        self.draft_ms = self.verify_ms = 0.0
        self.finish = None
        self.metrics: dict = {}
        self.eos = _eos_ids(req.tok, req.be.model_info.get("eos"))
        self.texts = TokenText(req.tok)  # token texts in context, as the engine shows them

    def start_event(self, t: float) -> StartEvent:
        be, req = self.req.be, self.req
        self.first_t = t
        spec = req.mode == "speculative"
        return StartEvent(
            mode=req.mode, drafter={"kind": "vllm", "name": be.info()["draft"]["name"] if spec else "vanilla",
                                    "server": req.url},
            sampling=req.cfg.sampling.to_dict(), gamma=be.gamma if spec else 0,
            max_new_tokens=req.cfg.max_new_tokens, seed=req.cfg.seed, prompt_ids=list(self.prompt),
            prompt_text=self.req.tok.decode(self.prompt, skip_special_tokens=False),
            target=be.info()["target"], draft=be.info()["draft"] if spec else {},
            prefill_ms=self._since_start(t))

    def _event(self, proposed: list[int], sampled: list[int], t: float, draft_ms: float, reason: str):
        texts = self.texts
        limit = self.req.cfg.max_new_tokens
        context = self.prompt + self.out_ids
        k = max(0, len(sampled) - 1) if proposed else 0
        emitted = []
        for x in sampled[: max(0, limit - len(self.out_ids))]:  # vLLM cuts what a step made past a stop
            emitted.append(x)
            if x in self.eos:
                break
        nxt = sampled[-1]
        kind = "sample" if not proposed else ("bonus" if k == len(proposed) else "resample")
        verify_ms = 0.0 if self.iterations == 0 else max(0.0, (t - self.last_t) * 1000.0 - draft_ms)
        self.last_t = t
        self.iterations += 1
        self.proposed += len(proposed)
        self.accepted += k
        self.draft_ms += draft_ms
        self.verify_ms += verify_ms
        self.positions.add([], k, len(proposed))
        ctx_k = context + proposed[:k]
        ev = IterationEvent(
            index=self.iterations - 1, drafter="vllm" if self.req.mode == "speculative" else "vanilla",
            gamma=self.req.be.gamma if self.req.mode == "speculative" else 0, reason=reason,
            proposed=list(proposed), proposed_text=texts.pieces(context, proposed),
            q=[], p=[], q_raw=[], p_raw=[], accept_prob=[], draws=[], accepted=k,
            correction=Correction(int(nxt), texts.piece(ctx_k, nxt), kind, 0.0, []),  # p unknown: NO_PQ
            target_top=[], emitted=list(emitted), emitted_text=texts.pieces(context, emitted),
            draft_ms=draft_ms, verify_ms=verify_ms, tokens_total=len(self.out_ids) + len(emitted),
            proposed_total=self.proposed, accepted_total=self.accepted, elapsed_ms=self._since_start(t))
        self.out_ids.extend(emitted)
        self.emitted_total += len(emitted)
        return ev

    def from_records(self, recs: list[dict], t_now: float) -> Iterator:
        for r in recs:
            reason = NO_PQ + ("; prefill step: the prompt pass samples the first token" if r["step"] == 0 else
                              "" if self.drafts else "; no n-gram match: a plain step")
            yield self._event(self.drafts, r["sampled"], r["t"], float(r.get("propose_ms", 0.0)), reason)
            self.drafts = r["drafts"]

    def from_chunk(self, choices: list[dict], t: float) -> Iterator:
        for c in choices:
            ids = [int(x) for x in c.get("token_ids") or []]
            if not ids:
                continue
            if self.req.mode == "vanilla":
                for x in ids:  # one token per vLLM step; a late reader may get several in one chunk
                    yield self._event([], [x], t, 0.0, NO_PQ + "; plain decoding")
            else:  # a server without specviz's proposer: drafts unknown, one chunk = one step
                yield self._event([], ids, t, 0.0, NO_PQ + "; this server publishes no per-step drafts")

    def _since_start(self, t: float) -> float:
        """ms since the request was sent. Wall-clock times (the proposer's step records come from the
        server's process), never negative even if the clock stepped back mid-run, so a saved run
        always replays."""
        return max(0.0, (t - self.t0) * 1000.0)

    def summary(self) -> SummaryEvent:
        tok = self.req.tok
        wall, prefill = self._since_start(self.last_t), self._since_start(self.first_t)
        new = len(self.out_ids)
        it = max(self.iterations, 1)
        m = self.metrics
        proposed = self.proposed if self.req.traced or not m else int(m.get("num_draft_tokens", 0))
        accepted = self.accepted if self.req.traced or not m else int(m.get("num_accepted_draft_tokens", 0))
        eos = getattr(tok, "eos_token_id", None)
        stop = {"length": "max_new_tokens", "stop": "eos" if self.out_ids and self.out_ids[-1] == eos else "stop",
                "abort": "stopped"}.get(self.finish or "", "stopped")
        return SummaryEvent(
            mode=self.req.mode, output_ids=list(self.out_ids), text=tok.decode(self.out_ids, skip_special_tokens=True),
            new_tokens=new, iterations=self.iterations, proposed=proposed, accepted=accepted,
            examined=self.positions.examined,
            acceptance_rate=(accepted / proposed) if proposed else None,
            alpha=(self.accepted / self.positions.examined) if self.positions.examined else None,
            tokens_per_iteration=new / it, tokens_per_second=new / (wall / 1000.0) if wall > 0 else 0.0,
            wall_ms=wall, prefill_ms=prefill, draft_ms=self.draft_ms, verify_ms=self.verify_ms,
            stop_reason=stop, accepted_by_position=self.positions.rows(), server_metrics=dict(m))


def peer_run(backend: VLLMBackend, ids: list[int], cfg: DecodeConfig) -> dict:
    """One prompt on both servers, for a benchmark's vLLM columns (``bench --peer vllm``): wall
    times (prefill included), outputs and vLLM's acceptance numbers."""
    spec = list(backend.speculative(ids, cfg))[-1]
    van = list(backend.vanilla(ids, cfg))[-1]
    return {"spec_ms": spec.wall_ms, "vanilla_ms": van.wall_ms, "spec_ids": spec.output_ids,
            "vanilla_ids": van.output_ids, "new_tokens": spec.new_tokens, "steps": spec.iterations,
            "proposed": spec.proposed, "accepted": spec.accepted,
            "identical": spec.output_ids == van.output_ids if cfg.sampling.greedy else None,
            "server_metrics": spec.server_metrics}


def start_or_connect(pair: str, url: str | None, cache: dict) -> Iterator:
    """For a front end: yield progress lines while the backend for ``pair`` starts (its own two
    servers, ``url`` None) or connects (``url``: "speculative[, vanilla]"), then the backend.
    ``cache`` keeps backends across calls; started servers stop when the process exits."""
    import atexit

    key = (pair, (url or "").strip())
    if key in cache:
        yield cache[key]
        return
    if url is not None:
        urls = [u.strip() for u in url.split(",") if u.strip()]
        if not urls:
            raise SpecvizError("give the vLLM server's URL (and, after a comma, one without speculation)")
        yield f"connecting to vLLM at {urls[0]}"
        cache[key] = VLLMBackend.connect(urls[0], urls[1] if len(urls) > 1 else None, pair=pair)
        yield cache[key]
        return
    done, box = threading.Event(), {}

    def start():
        try:
            box["backend"] = VLLMBackend.launch(pair, progress=lambda m: box.__setitem__("msg", str(m)))
        except BaseException as e:  # raised in the caller's thread below
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=start, daemon=True).start()
    t0 = time.monotonic()
    while not done.wait(1.0):
        yield (f"starting vLLM servers for {pair} (once per process; ~1-2 min on a CPU): "
               f"{box.get('msg', 'starting')} · {time.monotonic() - t0:.0f} s")
    if "error" in box:
        raise box["error"]
    cache[key] = box["backend"]
    atexit.register(cache[key].close)
    yield cache[key]
