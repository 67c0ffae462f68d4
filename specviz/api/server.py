"""The HTTP side: Starlette routes for ``/v1/...``, mounted on the page's own server.

Handlers are async; decoding runs in the shared decode queue (``MainThreadRunner.turns``), one
item at a time through a worker thread, so the event loop never blocks and a request whose
client goes away stops decoding at its next item (an iteration, or half a second in the queue).
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import json
import logging
import os
import time
import uuid
from typing import Callable

import anyio
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import drafters
from ..mainthread import Interrupted, MainThreadRunner
from ..registry import Registry
from . import generate
from .errors import ApiError, bad
from .generate import Outcome
from .requests import GenRequest, Limits, parse

log = logging.getLogger("specviz.api")
_END = object()


class Waiting:
    """Yielded by the queue while a request waits for its turn."""

    def __init__(self, ahead: int, eta_s: float | None):
        self.ahead, self.eta_s = ahead, eta_s


class Api:
    def __init__(self, registry: Callable[[], Registry], runner: MainThreadRunner, device: str = "auto",
                 dtype: str = "auto"):
        self.registry, self.runner, self.device, self.dtype = registry, runner, device, dtype

    # ---- plumbing -------------------------------------------------------------------------

    async def dispatch(self, request: Request) -> Response:
        path = request.path_params.get("path", "").strip("/")
        method = request.method
        try:
            self.check_key(request)
            if path in ("chat/completions", "completions"):
                if method != "POST":
                    raise ApiError(405, f"/v1/{path} takes POST", code="method_not_allowed")
                return await self.generate(request, "chat" if path == "chat/completions" else "completion")
            if path == "models" or path.startswith("models/"):
                if method not in ("GET", "HEAD"):  # HEAD: GET's status and headers (Starlette drops the body)
                    raise ApiError(405, "/v1/models takes GET", code="method_not_allowed")
                return self.models(path[len("models/"):] if "/" in path else None)
            raise ApiError(404, f"no such endpoint: /v1/{path} (this server offers POST /v1/chat/completions, "
                           "POST /v1/completions and GET /v1/models)", code="unknown_url")
        except ApiError as e:
            return error_response(e)
        except ClientDisconnect:
            return Response(status_code=499)
        except Interrupted:  # Ctrl-C or SIGTERM while this request waited or decoded: no stack trace to log
            return error_response(stopping())
        except Exception as e:  # never a stack trace to the client; the log has it
            log.exception("specviz API: unexpected error")
            return error_response(internal(e))

    def check_key(self, request: Request) -> None:
        key = os.environ.get("SPECVIZ_API_KEY", "")
        if not key:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise ApiError(401, "missing API key: send the header Authorization: Bearer <key>", None,
                           "invalid_api_key")
        if not hmac.compare_digest(given.strip().encode(), key.encode()):
            raise ApiError(401, "incorrect API key", None, "invalid_api_key")

    async def body(self, request: Request, limits: Limits):
        size = request.headers.get("content-length")
        cap = limits.max_body_bytes
        if size and size.isdigit() and int(size) > cap:
            raise ApiError(413, f"the request body is larger than {cap:,} bytes", None, "request_too_large")
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > cap:
                raise ApiError(413, f"the request body is larger than {cap:,} bytes", None, "request_too_large")
            chunks.append(chunk)
        raw = b"".join(chunks)
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as e:  # ValueError: bad bytes, bad JSON, an integer of > 4300 digits
            what = "nested too deeply" if isinstance(e, RecursionError) else str(e)[:200]
            raise bad(f"the body is not valid JSON: {what}", None, "invalid_json") from None

    # ---- endpoints --------------------------------------------------------------------------

    def models(self, one: str | None) -> Response:
        reg = self.registry()
        rows = [model_card(reg, name) for name in reg.models]
        if one is not None:
            row = next((r for r in rows if r["id"] == one), None)
            if row is None:
                raise ApiError(404, f"the model {one!r} does not exist", "model", "model_not_found")
            return JSONResponse(row)
        return JSONResponse({"object": "list", "data": rows})

    async def on_decode_thread(self, fn, *args):
        """``fn(*args)`` on the decode thread, where models load (torch work in another thread slows
        decoding: mainthread.py), awaited without holding a worker thread (it may wait behind a long
        run); where nothing serves the queue, in a worker thread (never in the event loop's)."""
        if not self.runner.serving:
            return await anyio.to_thread.run_sync(fn, *args)
        fut = self.runner.submit(fn, *args)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:  # the job, cancelled as serving ended (not this request: re-raised)
            task = asyncio.current_task()
            if fut.cancelled() and not (task is not None and task.cancelling()):
                raise stopping() from None
            raise

    async def generate(self, request: Request, kind: str) -> Response:
        limits = Limits.from_env()
        body = await self.body(request, limits)
        req = parse(body, kind, limits)
        reg = self.registry()
        plan = generate.plan(reg, req)
        if not self.runner.reserve(limits.max_queue):  # the place is this request's from here on
            eta, n = self.runner.estimate_s(self.runner.queued), self.runner.queued
            wait = max(1, round(eta or 5))  # the message and Retry-After say the same ("about 0 s" read oddly)
            raise ApiError(429, f"the decode queue is full ({n} run{'' if n == 1 else 's'} running or waiting, "
                           f"the page's included); try again in about {wait} s (SPECVIZ_API_MAX_QUEUE)", None,
                           "queue_full", "rate_limit_error", retry_after=wait)
        asked = time.perf_counter()
        try:  # models load on the decode thread (torch work elsewhere slows decoding: mainthread.py)
            pipe = await self.on_decode_thread(generate.load, reg, plan, self.device, self.dtype)
            ids = await anyio.to_thread.run_sync(generate.encode, pipe, req)
            cfg = generate.config(req, plan)
        except BaseException:
            self.runner.unreserve()
            raise
        turns = Turns(self.runner, lambda: generate.decode(pipe, ids, cfg, plan, req.stop,
                                                           time.perf_counter() - asked), reserved=True)
        reply = Reply(req, len(ids))
        if req.stream:  # the background close also runs when the client left before the body began
            return StreamingResponse(self.sse(turns, reply), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                                     background=BackgroundTask(turns.close))
        try:
            while True:
                item = await turns.next()
                if isinstance(item, Outcome):
                    return JSONResponse(reply.whole(item))
                if item is _END:
                    raise RuntimeError("decoding ended without a result")
                if await request.is_disconnected():
                    return Response(status_code=499)
        finally:
            await turns.close()

    async def sse(self, turns: "Turns", reply: "Reply"):
        def event(data) -> str:
            return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"

        try:
            if reply.req.kind == "chat":
                yield event(reply.chunk(role=True))
            while True:
                item = await turns.next()
                if item is _END:
                    break
                if isinstance(item, Waiting):  # an SSE comment: clients ignore it, proxies see traffic
                    yield f": waiting for the decoder, {item.ahead} ahead\n\n"
                elif isinstance(item, str):
                    yield event(reply.chunk(text=item))
                elif isinstance(item, Outcome):
                    yield event(reply.chunk(finish=item.finish_reason))
                    if reply.req.include_usage:
                        yield event(reply.usage_chunk(item))
                    break
            yield "data: [DONE]\n\n"
        except ApiError as e:
            yield event(e.body())
            yield "data: [DONE]\n\n"
        except Interrupted:
            yield event(stopping().body())
            yield "data: [DONE]\n\n"
        except Exception as e:  # the headers are gone: report in the stream, in the OpenAI shape
            log.exception("specviz API: error while streaming")
            yield event(internal(e).body())
            yield "data: [DONE]\n\n"
        finally:
            await turns.close()


class Turns:
    """A decoding generator behind the shared queue, stepped from async code one item at a time."""

    def __init__(self, runner: MainThreadRunner, make, reserved: bool = False):
        self.runner, self.reserved = runner, reserved
        self.gen = runner.turns(make, on_wait=Waiting, reserved=reserved)
        self.closed = False

    async def next(self):
        # not abandoned on cancellation: a disconnect waits for this item, then close() runs
        return await anyio.to_thread.run_sync(next, self.gen, _END)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.reserved and inspect.getgeneratorstate(self.gen) == inspect.GEN_CREATED:
            self.runner.unreserve()  # never started: its place was never turned into a ticket
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.gen.close)


class Reply:
    """Response bodies and stream chunks in the OpenAI formats."""

    def __init__(self, req: GenRequest, prompt_tokens: int):
        self.req, self.prompt_tokens = req, prompt_tokens
        chat = req.kind == "chat"
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.object = "chat.completion" if chat else "text_completion"
        self.created = int(time.time())

    def head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.req.model,
                "system_fingerprint": None}

    def usage(self, out: Outcome) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": out.completion_tokens,
                "total_tokens": self.prompt_tokens + out.completion_tokens, "speculative": out.stats}

    def whole(self, out: Outcome) -> dict:
        if self.req.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": out.text, "refusal": None},
                      "logprobs": None, "finish_reason": out.finish_reason}
        else:
            choice = {"index": 0, "text": out.text, "logprobs": None, "finish_reason": out.finish_reason}
        return {**self.head(self.object), "choices": [choice], "usage": self.usage(out)}

    def chunk(self, text: str = "", role: bool = False, finish: str | None = None) -> dict:
        if self.req.kind == "chat":
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {**self.head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {**self.head("text_completion"), "choices": [choice]}

    def usage_chunk(self, out: Outcome) -> dict:
        obj = "chat.completion.chunk" if self.req.kind == "chat" else "text_completion"
        return {**self.head(obj), "choices": [], "usage": self.usage(out)}


def model_card(reg: Registry, name: str) -> dict:
    """A /v1/models entry: the target, whether it loads offline, and the drafters it can use."""
    pair = generate.recommended_pair(reg, name)
    draft_models = sorted({p.draft_model for p in reg.pairs.values() if p.target == name and p.draft_model})
    return {"id": name, "object": "model", "created": 0, "owned_by": "specviz",
            "description": reg.models[name].description,
            "available_offline": reg.models[name].offline_source() is not None,
            "speculative": {
                "draft_models": (["auto"] if pair else []) + drafters.forms(name) + draft_models,
                "auto": ({"pair": pair.name, "draft_model": generate.drafter_label(pair.drafter),
                          "num_speculative_tokens": pair.gamma} if pair else None),
                "pairs": [p.name for p in reg.pairs.values() if p.target == name]}}


def stopping() -> ApiError:
    return ApiError(503, "the server is shutting down: try again once it is back", None, "server_shutting_down")


def internal(e: Exception) -> ApiError:
    if isinstance(e, Interrupted):
        return stopping()
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
        return ApiError(503, "the server ran out of memory: try fewer max_tokens or a shorter prompt", None,
                        "out_of_memory")
    return ApiError(500, f"internal error ({type(e).__name__}); the server log has the details", None,
                    "internal_error")


def error_response(e: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else {}
    if e.retry_after:
        headers["Retry-After"] = str(e.retry_after)
    return JSONResponse(e.body(), status_code=e.status, headers=headers or None)


def routes(registry: Callable[[], Registry], runner: MainThreadRunner, device: str = "auto",
           dtype: str = "auto") -> list[Route]:
    """The API's routes, for a Starlette/FastAPI app (gradio: ``launch(app_kwargs={"routes": ...})``).
    ``registry`` is called per request (so a test or a reload can swap it)."""
    api = Api(registry, runner, device, dtype)
    methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]  # every one answered in OpenAI's shape
    return [Route("/v1/{path:path}", api.dispatch, methods=methods)]
