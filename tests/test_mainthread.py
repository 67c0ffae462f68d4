"""MainThreadRunner: items computed on the serving thread reach the consumer in order; errors
and early stops cross over cleanly; without a server it runs inline."""

import threading
import time

import pytest

from specviz.mainthread import MainThreadRunner, StopFlags


def counting(n, log=None, fail_at=None):
    def gen():
        try:
            for i in range(n):
                if i == fail_at:
                    raise ValueError("boom")
                yield (i, threading.get_ident())
        finally:
            if log is not None:
                log.append("closed")
    return gen


def start_serving(daemon: bool = True):
    """A runner serving on a thread of its own, as app.py's main thread serves: (runner, until, thread)."""
    runner, until = MainThreadRunner(), threading.Event()
    thread = threading.Thread(target=runner.serve_forever, kwargs={"poll_s": 0.05, "until": until}, daemon=daemon)
    thread.start()
    while not runner.serving:
        pass
    return runner, until, thread


def holding(release: threading.Event, timeout: float = 20):
    """``make`` for a run that holds the serving thread (another visitor's) until ``release`` is set."""
    def run():
        yield 0
        release.wait(timeout)
        yield 1
    return run


@pytest.fixture()
def served():
    runner, until, t = start_serving(daemon=False)
    yield runner, t.ident
    until.set()
    t.join()



def test_inline_without_server():
    items = list(MainThreadRunner().stream(counting(3)))
    assert [i for i, _ in items] == [0, 1, 2] and {tid for _, tid in items} == {threading.get_ident()}


def test_items_computed_on_serving_thread(served):
    runner, server_tid = served
    items = list(runner.stream(counting(5)))
    assert [i for i, _ in items] == list(range(5)) and {tid for _, tid in items} == {server_tid}


def test_errors_reach_the_consumer(served):
    runner, _ = served
    with pytest.raises(ValueError, match="boom"):
        list(runner.stream(counting(5, fail_at=2)))
    assert len(list(runner.stream(counting(2)))) == 2  # and the server keeps serving


def test_consumer_stop_closes_the_producer(served):
    runner, _ = served
    log = []
    stream = runner.stream(counting(10_000_000, log))
    next(stream)
    stream.close()
    for _ in range(200):
        if log:
            break
        threading.Event().wait(0.01)
    assert log == ["closed"]


def test_turns_queue_first_come_first_served_with_positions():
    """Two callers share one decode queue: the second waits (told how many runs are ahead) and
    decodes only after the first is done; nothing interleaves."""
    import threading
    import time

    runner = MainThreadRunner()
    order, waits = [], []
    first_started = threading.Event()

    def slow(name):
        def gen():
            for i in range(3):
                order.append((name, i))
                first_started.set()
                time.sleep(0.3)
                yield i
        return gen

    def consume(name):
        for item in runner.turns(slow(name), on_wait=lambda ahead, eta: ("waiting", ahead)):
            if isinstance(item, tuple):
                waits.append((name, item[1]))

    a = threading.Thread(target=consume, args=("a",))
    a.start()
    first_started.wait(5)
    consume("b")
    a.join()
    assert order == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2)]
    assert waits and all(name == "b" and ahead == 1 for name, ahead in waits)
    assert runner.position(12345) == 0 and runner.recent_s  # a finished run's duration is remembered


def test_the_wait_estimate_counts_down_while_the_run_ahead_decodes(served):
    """A visitor waiting behind a run read "about 243 s" for the whole wait (it started after 71 s):
    the estimate was runs ahead x the typical run, however long the one decoding had already run."""
    runner, _ = served
    release = threading.Event()
    runner.recent_s = [30.0, 30.0, 30.0]
    assert runner.estimate_s(1) == 30.0 and runner.estimate_s(0) == 0.0  # nothing decoding yet
    first = runner.turns(holding(release))
    try:
        assert next(first) == 0  # its turn began
        time.sleep(0.3)
        one, two = runner.estimate_s(1), runner.estimate_s(2)
        time.sleep(0.3)
        assert 29.0 < runner.estimate_s(1) < one < 30.0 and two == pytest.approx(one + 30.0, abs=0.1)
        runner.recent_s = [0.5]  # the run ahead has already had longer than is typical: a second, not 0
        assert runner.estimate_s(1) == 1.0
        release.set()
        assert list(first) == [1]
    finally:
        release.set()
        first.close()
    runner.recent_s = [30.0]
    assert runner.estimate_s(1) == 30.0  # its turn ended: the next one's has not begun


def test_stop_flags_reach_the_running_job_only():
    stops = StopFlags()
    assert stops.stop("s1", "run") is False  # nothing running: nothing to stop
    old = stops.open("s1", "run")
    new = stops.open("s1", "run")  # the same session runs again before the first ended
    other = stops.open("s2", "run")
    assert stops.stop("s1", "run") is True
    assert new.is_set() and not old.is_set() and not other.is_set()
    old.close()  # the older job ending does not unhook the newer one
    assert stops.flags[("s1", "run")] is new
    new.close()
    other.close()
    assert not stops.flags


def test_a_finished_consumer_frees_the_serving_thread_at_once(served):
    """A request that has its answer stops asking for items; its job must end then, not at its next
    check (it held the serving thread, so the next request waited up to that long: 0.4 s seen on
    back-to-back API calls). With checks 30 s apart, the next stream still starts at once."""
    runner, _ = served
    runner.WAIT_S = 30.0
    log = []
    first = runner.stream(counting(10, log))
    next(first)
    first.close()
    done = threading.Event()
    threading.Thread(target=lambda: (list(runner.stream(counting(3))), done.set()), daemon=True).start()
    assert done.wait(10), "the serving thread stayed with the finished job"
    assert log == ["closed"]


def test_call_runs_on_the_serving_thread_and_brings_back_its_result_or_error(served):
    """Model loads go through ``call``: their exactness checks run at the decode thread's thread
    count, and no torch work starts an OpenMP team in a handler's thread."""
    runner, server_tid = served
    assert runner.call(lambda a, b=0: (a + b, threading.get_ident()), 2, b=3) == (5, server_tid)
    with pytest.raises(ValueError, match="bad load"):
        runner.call(lambda: (_ for _ in ()).throw(ValueError("bad load")))

    def nested():  # a job that loads (the Lab's runs do): inline, not queued behind itself
        yield runner.call(threading.get_ident)
    assert list(runner.stream(nested)) == [server_tid]
    assert MainThreadRunner().call(threading.get_ident) == threading.get_ident()  # nothing serves: inline


def test_while_serving_only_the_serving_thread_runs_torch_on_several_threads():
    """A torch operator run once in another thread made every later target pass on the decode
    thread ~30% slower (a second OpenMP team on a 2-core CPU). While the runner serves, a thread
    that starts using torch gets one intra-op thread; the serving thread keeps its own count; the
    default comes back when serving ends."""
    import torch

    def fresh_count() -> int:
        box = {}
        t = threading.Thread(target=lambda: box.update(n=torch.get_num_threads()))
        t.start()
        t.join()
        return box["n"]

    before = fresh_count()
    runners = [(MainThreadRunner(), threading.Event()) for _ in range(2)]  # two serving at once (tests do)
    servers = [threading.Thread(target=r.serve_forever, kwargs={"poll_s": 0.05, "until": u}, daemon=True)
               for r, u in runners]
    try:
        for (runner, _), server in zip(runners, servers):
            server.start()
            while not runner.serving:
                pass
            if server is servers[0]:  # (the second's thread first used torch while the first served)
                assert runner.call(torch.get_num_threads) == before
            assert fresh_count() == 1
    finally:
        for (_, until), server in zip(runners, servers):
            until.set()
            server.join()
            assert fresh_count() == (before if server is servers[-1] else 1)
    assert fresh_count() == before


def test_a_job_errors_reach_the_caller_as_plain_errors_and_the_server_goes_on(served):
    """StopIteration (asyncio cannot carry it across wrap_future: an API request hung) and a
    generator whose cleanup fails (it ended the serving thread) come back as errors; it serves on."""
    runner, server_tid = served
    with pytest.raises(RuntimeError, match="StopIteration"):
        runner.call(next, iter([]))

    def bad_cleanup():
        try:
            yield 1
        finally:
            raise ValueError("cleanup failed")
    with pytest.raises(ValueError, match="cleanup failed"):
        list(runner.stream(bad_cleanup))
    assert runner.serving and runner.call(threading.get_ident) == server_tid


def test_ctrl_c_in_a_job_stops_the_serving_thread_and_its_caller_hears_of_it():
    """A KeyboardInterrupt or SystemExit (SIGTERM) raised while a job runs is not swallowed by the
    job: serve_forever ends (the app exits as it should) and the caller gets a plain error (raised as
    is in the API's event loop, it ended the loop before the server could close)."""
    runner, done = MainThreadRunner(), {}

    def serve():
        try:
            runner.serve_forever(poll_s=0.05)
        except SystemExit as e:
            done["exit"] = e.code
    server = threading.Thread(target=serve, daemon=True)
    server.start()
    while not runner.serving:
        pass
    with pytest.raises(RuntimeError, match="interrupted"):
        runner.call(lambda: (_ for _ in ()).throw(SystemExit(143)))
    server.join(5)
    assert done == {"exit": 143} and not runner.serving


def test_calls_left_waiting_when_serving_ends_hear_so():
    runner, until = MainThreadRunner(), threading.Event()
    server = threading.Thread(target=runner.serve_forever, kwargs={"poll_s": 0.05, "until": until}, daemon=True)
    server.start()
    while not runner.serving:
        pass
    started, release = threading.Event(), threading.Event()
    blocker = runner.submit(lambda: started.set() or release.wait(10))
    waiting = runner.submit(lambda: "never")
    assert started.wait(5)
    until.set()
    release.set()
    server.join(5)
    assert blocker.result() is True and waiting.cancelled()
    late = runner.submit(lambda: "too late")  # nothing serves now: it runs at once, inline
    assert late.result() == "too late"
    put = runner._jobs.put  # a call that lost the race with the end: serving when checked, not after
    runner.serving = True
    runner._jobs.put = lambda job: (put(job), setattr(runner, "serving", False))
    lost = runner.submit(lambda: "never")
    assert lost.cancelled()  # its caller hears so (call() raises), instead of waiting for ever
    runner.serving = True
    with pytest.raises(RuntimeError, match="stopped before it could run"):
        runner.call(lambda: "never")


def test_a_long_step_ticks_and_a_consumer_that_leaves_frees_the_turn_only_when_the_step_ends(served):
    """A Lab step can take half a minute (a second copy of the target loading): its consumer got
    nothing to look at Stop with until it ended, and once it left, the next run took the turn while
    the serving thread was still busy with that step (its status said "prefilling" for the rest)."""
    from specviz.mainthread import TICK

    runner, _ = served
    release, log = threading.Event(), []

    def slow():
        yield "first"
        release.wait(10)  # a long step
        log.append("step ended")
        yield "second"

    gen = runner.turns(slow, tick_s=0.02)
    assert next(gen) == "first"
    assert next(gen) is TICK and next(gen) is TICK  # the step is under way: ticks, not a block
    closer = threading.Thread(target=gen.close)  # Stop: the consumer leaves mid-step
    closer.start()
    got: list = []
    other = threading.Thread(target=lambda: got.extend(runner.turns(lambda: iter(["next run"]))))
    other.start()  # the next visitor's run
    closer.join(0.3)
    # the consumer waits for the step, keeping its turn meanwhile: the next run waits behind it
    assert closer.is_alive() and runner.queued == 2 and got == []
    release.set()
    closer.join(5)
    other.join(5)
    assert not closer.is_alive() and log == ["step ended"]
    assert got == ["next run"] and runner.queued == 0
