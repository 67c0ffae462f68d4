"""Run decoding on the main thread while a web server's worker threads consume it.

On this kind of CPU build (MKL + GNU OpenMP), torch's intra-op parallelism is only effective
on the process's main thread: the same matmul runs about 2.5x slower when called from another
thread (measured: 50 us on the main thread, 116 us in a worker thread, 125 us with one thread).
Web frameworks run handlers in worker threads, so a UI that decodes there is much slower than
the CLI.  ``MainThreadRunner`` fixes that: the main thread serves a job queue, a handler streams
the items of a generator that runs there.  Without ``serve_forever`` (tests, notebooks) the
generator simply runs in the caller's thread.

The two threads work in lockstep: the generator is advanced only when the consumer asks for
the next item, so while a UI draws an iteration the decoder is paused (and, since the engine
leaves the time its consumer holds the stream out of its clock, the drawing does not count as
decoding time, for speculative and vanilla decoding alike).
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator


class MainThreadRunner:
    def __init__(self) -> None:
        self._jobs: queue.Queue = queue.Queue()
        self.serving = False

    def serve_forever(self, poll_s: float = 0.5, until: threading.Event | None = None) -> None:
        """Execute jobs on this (the main) thread until interrupted (or ``until`` is set)."""
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

    def stream(self, make: Callable[[], Iterator]) -> Iterator:
        """Yield the items of ``make()``, computed on the serving thread when there is one."""
        if not self.serving:
            yield from make()
            return
        out: queue.Queue = queue.Queue()
        want = threading.Semaphore(0)  # one release per item the consumer asks for
        stop = threading.Event()

        def job() -> None:
            gen = None
            try:
                gen = make()
                while True:
                    while not want.acquire(timeout=0.5):
                        if stop.is_set():
                            return
                    if stop.is_set():
                        return
                    try:
                        item = next(gen)
                    except StopIteration:
                        return
                    out.put(("item", item))
            except BaseException as e:  # handed to the consumer, raised there
                out.put(("error", e))
            finally:
                if gen is not None and hasattr(gen, "close"):
                    gen.close()
                out.put(("end", None))

        self._jobs.put(job)
        try:
            while True:
                want.release()
                kind, value = out.get()
                if kind == "item":
                    yield value
                elif kind == "error":
                    raise value
                else:
                    return
        finally:
            stop.set()  # the consumer went away (Stop): the job ends at its next item
