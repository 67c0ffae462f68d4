"""Run decoding on the main thread while a web server's worker threads consume it.

On this kind of CPU build (MKL + GNU OpenMP), torch's intra-op parallelism is only effective on
one thread: the same matmul takes 50 us on the main thread and 116 us in a worker thread (125 us
with one thread), and once another thread has run a parallel operator, even one softmax, every
later target pass of the main thread is ~30% slower (measured on a 2-core CPU with
``scripts/page_speed_probe.py``: 66-69 ms against 50-53; the OpenMP wait policy and spin count
change nothing, so the cause is not spinning). Web frameworks run handlers in worker threads, so a
UI that decodes there, or only touches torch there, is much slower than the CLI.

``MainThreadRunner`` fixes that: the main thread serves a job queue; a handler streams the items of
a generator that runs there (``stream``/``turns``) or has a function run there (``call``: model
loads, whose exactness checks must also run at the decode thread's thread count). While it serves,
threads that start using torch get one intra-op thread (no team), so stray work elsewhere does not
slow decoding. Without ``serve_forever`` (tests, notebooks) everything runs in the caller's thread.

The two threads work in lockstep: the generator is advanced only when the consumer asks for
the next item, so while a UI draws an iteration the decoder is paused (and, since the engine
leaves the time its consumer holds the stream out of its clock, the drawing does not count as
decoding time, for speculative and vanilla decoding alike).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import CancelledError, Future
from typing import Any, Callable, Iterator

import torch


class MainThreadRunner:
    """One decode queue for a whole process: the page's runs and API requests take turns here
    (first come, first served), so they never slow each other down on a CPU."""

    WAIT_S = 0.5  # how often a job waiting for its consumer's next request checks whether it left

    def __init__(self) -> None:
        self._jobs: queue.Queue = queue.Queue()
        self.serving = False
        self._turn = threading.Condition()
        self._waiting: list[int] = []  # tickets in arrival order; the first one decodes
        self._next_ticket = 0
        self._reserved = 0  # places promised by reserve() whose runs have not taken their ticket yet
        self.recent_s: list[float] = []  # how long the last runs held the queue (for estimates)
        self._thread: threading.Thread | None = None  # the serving thread
        self._since: float | None = None  # when the turn of the run decoding now began

    @property
    def queued(self) -> int:
        """Runs in the queue now: the one decoding, those waiting and those admitted by ``reserve``
        that are still loading."""
        with self._turn:
            return len(self._waiting) + self._reserved

    def position(self, ticket: int) -> int:
        """How many runs are ahead of ``ticket`` (0: it is decoding)."""
        with self._turn:
            return self._waiting.index(ticket) if ticket in self._waiting else 0

    def estimate_s(self, ahead: int) -> float | None:
        """Seconds until a run with ``ahead`` runs before it starts: what is typical of the recent
        runs (their median) for each of them, less the time the one decoding has already had (so a
        waiting visitor's estimate counts down), at least a second for it."""
        if not self.recent_s:
            return None
        if ahead <= 0:
            return 0.0
        recent = sorted(self.recent_s[-8:])
        typical = recent[len(recent) // 2]
        with self._turn:
            since = self._since
        first = typical if since is None else max(1.0, typical - (time.perf_counter() - since))
        return first + (ahead - 1) * typical

    def reserve(self, limit: int) -> bool:
        """Admit one more run if fewer than ``limit`` are queued, checked and counted in one step
        (requests arriving together cannot all pass the check before any of them is counted). The
        place is the run's until ``turns(..., reserved=True)`` takes its ticket or ``unreserve()``."""
        with self._turn:
            if len(self._waiting) + self._reserved >= limit:
                return False
            self._reserved += 1
            return True

    def unreserve(self) -> None:
        with self._turn:
            self._reserved = max(0, self._reserved - 1)

    def take_ticket(self, reserved: bool = False) -> int:
        with self._turn:
            if reserved:
                self._reserved = max(0, self._reserved - 1)
            ticket = self._next_ticket
            self._next_ticket += 1
            self._waiting.append(ticket)
            return ticket

    def wait_turn(self, ticket: int, timeout: float | None = None) -> bool:
        """Block until ``ticket`` is first in line (True) or ``timeout`` passes (False)."""
        with self._turn:
            return self._turn.wait_for(lambda: self._waiting and self._waiting[0] == ticket, timeout)

    def done(self, ticket: int, held_s: float | None = None) -> None:
        with self._turn:
            if self._waiting and self._waiting[0] == ticket:
                self._since = None  # its turn has ended; the next one's starts when it takes it
            if ticket in self._waiting:
                self._waiting.remove(ticket)
            if held_s is not None:
                self.recent_s = (self.recent_s + [held_s])[-16:]
            self._turn.notify_all()

    def turns(self, make: Callable[[], Iterator], on_wait: Callable[[int, float | None], object] | None = None,
              reserved: bool = False, tick_s: float | None = None) -> Iterator:
        """``stream(make, tick_s)`` after waiting for this caller's turn in the queue. While it waits,
        ``on_wait(runs ahead, estimated seconds)`` is yielded every half second (if given).
        ``reserved``: the place was promised by ``reserve`` (a generator closed before it starts
        keeps it: its owner then calls ``unreserve``). The turn ends when the job has ended on the
        serving thread, not merely when its consumer left: the run after it waits as long as it must."""
        ticket = self.take_ticket(reserved)
        t0 = None
        try:
            while not self.wait_turn(ticket, timeout=0.5):
                if on_wait is not None:
                    ahead = self.position(ticket)
                    yield on_wait(ahead, self.estimate_s(ahead))
            t0 = time.perf_counter()
            with self._turn:
                self._since = t0
            yield from self.stream(make, tick_s)
        finally:
            self.done(ticket, time.perf_counter() - t0 if t0 is not None else None)

    def serve_forever(self, poll_s: float = 0.5, until: threading.Event | None = None) -> None:
        """Execute jobs on this (the main) thread until interrupted (or ``until`` is set). Meanwhile
        torch's intra-op threads are this thread's alone: threads that first use torch while it
        serves get one (see the module's doc)."""
        self._thread = threading.current_thread()
        torch.set_num_threads(torch.get_num_threads())  # this thread's own count, whatever the default becomes
        _serving_starts()
        self.serving = True
        try:
            while until is None or not until.is_set():
                try:
                    job = self._jobs.get(timeout=poll_s)  # wakes up now and then so Ctrl-C works
                except queue.Empty:
                    continue
                job()
        finally:
            self.serving = False
            self._thread = None
            _serving_ends()
            while True:  # calls still waiting will not run: their callers hear so now
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if getattr(job, "future", None) is not None:
                    job.future.cancel()

    def on_serving_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, fn: Callable[..., Any], *args, **kwargs) -> Future:
        """``fn(*args, **kwargs)`` as a job of the serving thread, after the job it may be running (a
        load waits for the run that holds the queue); a Future of its result. Cancelling the Future
        before the job starts skips it (Stop). Where nothing serves, or on the serving thread itself,
        it runs at once, in the caller's thread."""
        fut: Future = Future()
        if not self.serving or self.on_serving_thread():
            _run_into(fut, fn, args, kwargs)
            return fut

        def job() -> None:
            if fut.set_running_or_notify_cancel():
                _run_into(fut, fn, args, kwargs)
        job.future = fut
        self._jobs.put(job)
        if not self.serving:  # serving ended before the queue was drained of it: it will not run
            fut.cancel()
        return fut

    def call(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """``submit``, waiting here for the result (or the exception, raised here)."""
        try:
            return self.submit(fn, *args, **kwargs).result()
        except CancelledError:
            raise Interrupted("the decode thread stopped before it could run this (the server is stopping)") from None

    def stream(self, make: Callable[[], Iterator], tick_s: float | None = None) -> Iterator:
        """Yield the items of ``make()``, computed on the serving thread when there is one. ``tick_s``:
        while an item is being computed, yield ``TICK`` that often, so that a consumer waiting on a
        long step (a Lab experiment's) can look at its Stop flag and answer at once. Closed early, it
        returns once the job has ended there (at the generator's next item: the step under way
        finishes first)."""
        if not self.serving or self.on_serving_thread():
            yield from make()
            return
        out: queue.Queue = queue.Queue()
        want = threading.Semaphore(0)  # one release per item the consumer asks for
        stop = threading.Event()
        started = threading.Event()

        def job() -> None:
            started.set()
            gen = None
            try:
                gen = make()
                while True:
                    while not want.acquire(timeout=self.WAIT_S):
                        if stop.is_set():
                            return
                    if stop.is_set():
                        return
                    try:
                        item = next(gen)
                    except StopIteration:
                        return
                    out.put(("item", item))
            except Exception as e:  # handed to the consumer, raised there
                out.put(("error", e))
            except BaseException:  # Ctrl-C, SIGTERM: it stops the serving thread; the consumer gets a plain error
                out.put(("error", Interrupted(INTERRUPTED)))
                raise
            finally:
                if gen is not None and hasattr(gen, "close"):
                    try:
                        gen.close()
                    except Exception as e:  # a generator's cleanup failing must not end the serving thread
                        out.put(("error", e))
                out.put(("end", None))

        self._jobs.put(job)
        ended = False
        try:
            while True:
                want.release()
                while True:
                    try:
                        kind, value = out.get(timeout=tick_s)
                        break
                    except queue.Empty:
                        yield TICK
                if kind == "item":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    ended = True
                    return
        finally:
            stop.set()  # the consumer went away (done, or Stop): the job ends at its next item,
            want.release()  # at once: woken here, not at its next check, so the next run starts now
            if not ended and started.is_set():  # wait for that (bounded: a step never takes this long)
                deadline = time.monotonic() + END_WAIT_S
                while time.monotonic() < deadline:
                    try:
                        if out.get(timeout=max(0.0, deadline - time.monotonic()))[0] == "end":
                            break
                    except queue.Empty:
                        break


def _run_into(fut: Future, fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    try:
        fut.set_result(fn(*args, **kwargs))
    except StopIteration as e:  # asyncio cannot carry it across (wrap_future): a plain error
        fut.set_exception(RuntimeError(f"StopIteration raised by {getattr(fn, '__name__', fn)}: {e}"))
    except Exception as e:  # raised in the caller's thread (fut.result())
        fut.set_exception(e)
    except BaseException:  # Ctrl-C, SIGTERM: it stops the serving thread; the caller gets a plain error
        fut.set_exception(Interrupted(INTERRUPTED))  # (raised as is, it would end an event loop's task abruptly)
        raise


INTERRUPTED = "the decode thread was interrupted (the server is stopping)"
TICK = object()  # ``stream(..., tick_s)``: no item yet, the step under way is still computing
END_WAIT_S = 600.0  # the longest a consumer that left waits for its job's step to end


class Interrupted(RuntimeError):
    """A job that did not run, or did not finish, because the serving thread stopped (Ctrl-C, SIGTERM)."""


_SERVING = {"count": 0, "default": 0}  # runners serving now, and the thread default before the first
_SERVING_LOCK = threading.Lock()


def _serving_starts() -> None:
    with _SERVING_LOCK:
        if _SERVING["count"] == 0:
            _SERVING["default"] = _default_threads()
            _set_default_threads(1)
        _SERVING["count"] += 1


def _serving_ends() -> None:
    with _SERVING_LOCK:
        _SERVING["count"] -= 1
        if _SERVING["count"] == 0:
            _set_default_threads(_SERVING["default"])


def _default_threads() -> int:
    """The intra-op thread count a thread gets when it first uses torch (torch keeps one per thread,
    each set from this default on first use)."""
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(n=torch.get_num_threads()))
    t.start()
    t.join()
    return box["n"]


def _set_default_threads(n: int) -> None:
    """Set that default from a thread of its own: ``torch.set_num_threads`` also sets the calling
    thread's count, which must stay as it is in every thread that runs."""
    t = threading.Thread(target=torch.set_num_threads, args=(n,))
    t.start()
    t.join()


class StopFlag(threading.Event):
    """Set by a Stop button; the job that opened it checks it between steps and ends itself."""

    def __init__(self, owner: "StopFlags", key: tuple) -> None:
        super().__init__()
        self.owner, self.key = owner, key

    def close(self) -> None:
        """The job is over: Stop no longer reaches it (a newer job under the same key keeps its own)."""
        with self.owner.lock:
            if self.owner.flags.get(self.key) is self:
                del self.owner.flags[self.key]


class StopFlags:
    """One flag per running job, by key (e.g. session and which button). A job that stops itself
    ends as a normal event: cancelling it from outside can race its last update."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.flags: dict[tuple, StopFlag] = {}

    def open(self, *key) -> StopFlag:
        flag = StopFlag(self, key)
        with self.lock:
            self.flags[key] = flag
        return flag

    def stop(self, *key) -> bool:
        """Ask the job under ``key`` to stop; False when none is running."""
        with self.lock:
            flag = self.flags.get(key)
        if flag is not None:
            flag.set()
        return flag is not None
