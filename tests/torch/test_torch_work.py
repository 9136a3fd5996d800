"""The torch backend's Worker and Work (shmrdv.torch.work) on their own, in
one process: a synchronous call runs on the caller's thread only when
nothing is pending, calls never overlap and keep their order whoever runs
them, and a Work completes, fails and hands out its Future alike either
way."""
import datetime
import threading
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from shmrdv.errors import RendezvousError, RendezvousTimeout  # noqa: E402
from shmrdv.torch.work import Work, Worker  # noqa: E402

WAIT_S = 10.0  # every wait of these tests ends well within this


@pytest.fixture
def worker():
    errors = []
    w = Worker("test-worker", errors.append)
    w.errors = errors
    yield w
    w.close(timeout=WAIT_S)
    assert not w.running


def _recorder(log, name, gate=None, started=None):
    def run():
        if started is not None:
            started.set()
        if gate is not None:
            assert gate.wait(WAIT_S)
        log.append((name, threading.current_thread().name))
    return run


@pytest.mark.timeout(30)
def test_a_waited_call_with_nothing_pending_runs_on_the_callers_thread(worker):
    log = []
    value = [torch.ones(2)]
    work = worker.submit(_recorder(log, "a"), value, waited=True)
    assert work.is_completed() and work.is_success()
    assert log == [("a", threading.current_thread().name)]
    assert work.wait() is True
    assert work.result() is value


@pytest.mark.timeout(30)
def test_an_unwaited_call_runs_on_the_worker(worker):
    log = []
    work = worker.submit(_recorder(log, "a"), [])
    assert work.wait(datetime.timedelta(seconds=WAIT_S))
    assert log == [("a", "test-worker")]


@pytest.mark.timeout(30)
def test_a_waited_call_behind_a_pending_one_goes_through_the_worker_in_order(worker):
    log, gate, started = [], threading.Event(), threading.Event()
    first = worker.submit(_recorder(log, "first", gate, started), [])
    assert started.wait(WAIT_S)  # running on the worker, held there
    second = worker.submit(_recorder(log, "second"), [], waited=True)
    assert not second.is_completed()  # queued, not run here
    gate.set()
    second.wait(datetime.timedelta(seconds=WAIT_S))
    assert first.is_completed()
    assert log == [("first", "test-worker"), ("second", "test-worker")]


@pytest.mark.timeout(30)
def test_a_call_queued_while_a_caller_runs_its_own_waits_for_it(worker):
    """The worker holds a call queued meanwhile (from another thread) until
    the caller's own call is done: they never overlap, and keep their order."""
    log, gate, started = [], threading.Event(), threading.Event()
    done = {}

    def caller():
        done["w"] = worker.submit(_recorder(log, "waited", gate, started), [], waited=True)

    t = threading.Thread(target=caller, name="caller")
    t.start()
    assert started.wait(WAIT_S)
    later = worker.submit(_recorder(log, "later"), [])
    with pytest.raises(RendezvousTimeout):
        later.wait(datetime.timedelta(seconds=0.2))  # held behind the caller's call
    assert log == []
    gate.set()
    t.join(WAIT_S)
    assert later.wait(datetime.timedelta(seconds=WAIT_S))
    assert log == [("waited", "caller"), ("later", "test-worker")]
    assert done["w"].is_completed()


@pytest.mark.timeout(30)
def test_a_waited_call_that_raises_fails_its_work_and_tells_the_group(worker):
    def run():
        raise ValueError("boom")

    work = worker.submit(run, [], waited=True)
    assert work.is_completed() and not work.is_success()
    assert isinstance(work.exception(), ValueError)
    with pytest.raises(ValueError, match="boom"):
        work.wait()
    assert [type(e) for e in worker.errors] == [ValueError]
    with pytest.raises(RuntimeError, match="ValueError: boom"):  # the continuation's error, as torch gives it
        work.get_future().wait()
    # the worker goes on
    assert worker.submit(lambda: None, [], waited=True).is_success()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("waited", [False, True])
def test_the_future_gives_the_value_whether_asked_before_or_after_completion(worker, waited):
    value = [torch.arange(3)]
    gate = threading.Event()
    if waited:
        work = worker.submit(lambda: None, value, waited=True)
        future = work.get_future()  # after
    else:
        work = worker.submit(lambda: gate.wait(WAIT_S), value)
        future = work.get_future()  # before
        chained = future.then(lambda f: f.value()[0] * 2)
        gate.set()
        assert chained.wait().tolist() == [0, 2, 4]
    assert future.wait() is value
    assert work.get_future() is future


@pytest.mark.timeout(30)
def test_wait_times_out_and_a_late_completion_still_completes(worker):
    gate = threading.Event()
    work = worker.submit(lambda: gate.wait(WAIT_S), [])
    with pytest.raises(RendezvousTimeout):
        work.wait(datetime.timedelta(seconds=0.05))
    gate.set()
    assert work.wait(datetime.timedelta(seconds=WAIT_S))
    assert work.wait()  # again: a done Work's wait returns at once, every time


@pytest.mark.timeout(30)
def test_several_threads_wait_on_one_work(worker):
    gate = threading.Event()
    work = worker.submit(lambda: gate.wait(WAIT_S), [])
    results = []
    threads = [threading.Thread(target=lambda: results.append(work.wait())) for _ in range(4)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(WAIT_S)
    assert results == [True] * 4


@pytest.mark.timeout(30)
def test_a_closed_worker_refuses_calls(worker):
    worker.close(timeout=WAIT_S)
    with pytest.raises(RendezvousError, match="shut down"):
        worker.submit(lambda: None, [], waited=True)


def test_a_work_made_alone_is_not_done():
    work = Work()
    assert not work.is_completed() and not work.is_success() and work.exception() is None


@pytest.mark.timeout(30)
@pytest.mark.parametrize("asked", ["before", "after", "racing"])
def test_a_works_future_is_settled_once_however_it_meets_the_completion(asked):
    value = [torch.ones(1)]
    work = Work()
    if asked == "before":
        future = work.get_future()
        work._finish(value)
    elif asked == "after":
        work._finish(value)
        future = work.get_future()
    else:  # another thread completes it while this one asks
        t = threading.Thread(target=work._finish, args=(value,))
        t.start()
        future = work.get_future()
        t.join(WAIT_S)
    assert future.wait() is value and work.get_future() is future


@pytest.mark.timeout(30)
def test_an_interrupted_waited_call_gives_the_turn_back(worker):
    """Ctrl-C (or a signal handler's exception) in a call run on the
    caller's thread fails its Work, tells the group, and leaves the worker
    as it was: the next waited call runs on the caller's thread again."""
    def run():
        raise KeyboardInterrupt

    work = worker.submit(run, [], waited=True)
    with pytest.raises(KeyboardInterrupt):
        work.wait()
    assert [type(e) for e in worker.errors] == [KeyboardInterrupt]
    log = []
    assert worker.submit(_recorder(log, "next"), [], waited=True).is_success()
    assert log == [("next", threading.current_thread().name)]
    assert worker.submit(_recorder(log, "queued"), []).wait(datetime.timedelta(seconds=WAIT_S))
    assert log[-1] == ("queued", "test-worker")


@pytest.mark.timeout(30)
def test_a_call_made_inside_a_call_that_runs_on_its_callers_thread(worker):
    """What a signal handler sees that makes a collective while its thread
    runs one: waiting for it raises at once (it could only run after the
    running one, which cannot finish first), an unwaited one runs after."""
    log, seen = [], {}

    def outer():
        with pytest.raises(RendezvousError, match="signal handler"):
            worker.submit(_recorder(log, "nested waited"), [], waited=True)
        later = seen["later"] = worker.submit(_recorder(log, "nested"), [])
        with pytest.raises(RendezvousError, match="signal handler"):
            later.wait()
        log.append(("outer", threading.current_thread().name))

    assert worker.submit(outer, [], waited=True).is_success()
    assert seen["later"].wait(datetime.timedelta(seconds=WAIT_S))
    assert log == [("outer", threading.current_thread().name), ("nested", "test-worker")]


@pytest.mark.timeout(30)
def test_close_waits_for_a_call_run_on_another_callers_thread(worker):
    gate, started = threading.Event(), threading.Event()
    t = threading.Thread(target=lambda: worker.submit(_recorder([], "a", gate, started), [], waited=True))
    t.start()
    assert started.wait(WAIT_S)
    worker.close(timeout=0.2)  # gives up waiting: the call still runs
    assert worker.running
    threading.Timer(0.2, gate.set).start()
    worker.close(timeout=WAIT_S)
    assert not worker.running
    t.join(WAIT_S)


@pytest.mark.timeout(30)
def test_a_queued_call_runs_in_its_callers_inference_mode(worker):
    seen = []
    with torch.inference_mode():
        work = worker.submit(lambda: seen.append(torch.is_inference_mode_enabled()), [])
    work.wait(datetime.timedelta(seconds=WAIT_S))
    worker.submit(lambda: seen.append(torch.is_inference_mode_enabled()), []).wait()
    assert seen == [True, False]


@pytest.mark.timeout(60)
def test_the_backend_runs_synchronous_calls_on_the_callers_thread(tmp_path):
    """Through torch.distributed (a group of one, in this process): what
    async_op=False runs here, async_op=True on the group's worker."""
    import torch.distributed as dist

    import shmrdv.torch  # noqa: F401  (registers the backend)

    dist.init_process_group("shmrdv", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        pg = dist.distributed_c10d._get_default_group()
        transport, threads = pg._transport, []
        real = transport.allreduce

        def allreduce(t, op):
            threads.append(threading.current_thread().name)
            real(t, op)

        transport.allreduce = allreduce
        t = torch.ones(4)
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
        assert threads[0] == threading.current_thread().name and threads[1].startswith("shmrdv-pg")
        assert t.tolist() == [1.0] * 4
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("threads", [1, 3])
def test_calls_from_several_threads_never_overlap_and_each_runs_once(worker, threads):
    """Waited and unwaited calls from several threads, and callbacks on the
    worker that make waited calls: no two ever run at once, each runs
    exactly once, and the count and the turn come back to rest."""
    import random

    guard, state = threading.Lock(), {"busy": 0, "overlaps": 0, "inline": 0}
    runs = []

    def body(tag):
        def run():
            with guard:
                state["busy"] += 1
                state["overlaps"] += state["busy"] > 1
            if threading.current_thread().name != "test-worker":
                state["inline"] += 1
            runs.append(tag)
            with guard:
                state["busy"] -= 1
        return run

    def user(seed):
        r, pending = random.Random(seed), []
        for i in range(400):
            tag, c = (seed, i), r.random()
            if c < 0.5:
                worker.submit(body(tag), [], waited=True).wait(datetime.timedelta(seconds=WAIT_S))
            elif c < 0.8:
                pending.append(worker.submit(body(tag), []))
            else:
                first = worker.submit(body(tag), [])
                first.get_future().then(
                    lambda f, tag=tag: worker.submit(body(tag + ("cb",)), [], waited=True).wait())
                pending.append(first)
            if len(pending) > 5:
                pending.pop(0).wait(datetime.timedelta(seconds=WAIT_S))
        for p in pending:
            p.wait(datetime.timedelta(seconds=WAIT_S))

    users = [threading.Thread(target=user, args=(s,)) for s in range(threads)]
    for t in users:
        t.start()
    for t in users:
        t.join(100)
    assert not any(t.is_alive() for t in users)
    deadline = time.monotonic() + WAIT_S
    while (worker._pending or worker._owner is not None) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state["overlaps"] == 0
    assert len(runs) == len(set(runs)), "a call ran twice"
    assert sum(1 for tag in runs if len(tag) == 2) == 400 * threads
    assert worker._pending == 0 and worker._owner is None
    if threads == 1:
        assert state["inline"] > 0  # the caller's own thread ran some


def _interrupted_at(n, kind, handler="raise"):
    """Run one scenario with a signal handler run at the n-th point of
    shmrdv/torch/work.py where Python 3.11 can run one on the interrupted
    thread (the entry of its functions and of the Python functions they
    call, just after a C call returns): one
    that raises KeyboardInterrupt, or one that makes a waited call of the
    same worker and waits for it (it must run, or be refused at once).
    None once n is past the last point; else where it fired and what is
    wrong afterwards."""
    import linecache
    import sys

    import shmrdv.torch.work as work_module

    source = work_module.__file__
    w = Worker("test-worker", lambda e: None)
    box = {}
    if kind == "inline":  # a caller runs its own call; another thread queues one meanwhile
        def inline():
            t = threading.Thread(target=lambda: box.setdefault("queued", w.submit(lambda: None, [])))
            t.start()
            t.join(WAIT_S)

        def target():
            w.submit(inline, [], waited=True)
    else:  # a waited call queued behind one the worker runs
        gate, started = threading.Event(), threading.Event()
        box["queued"] = w.submit(lambda: (started.set(), gate.wait(WAIT_S)), [])
        assert started.wait(WAIT_S)
        threading.Timer(0.05, gate.set).start()

        def target():
            w.submit(lambda: None, [], waited=True).wait(datetime.timedelta(seconds=WAIT_S))
    count, where, handled = [0], [], []

    def fire(frame, what):
        count[0] += 1
        if count[0] != n:
            return
        where.append((frame.f_code.co_name, frame.f_lineno, what))
        if handler == "raise":
            raise KeyboardInterrupt
        sys.settrace(None)
        sys.setprofile(None)
        try:
            w.submit(lambda: handled.append("ran"), [], waited=True).wait(datetime.timedelta(seconds=3))
        except RendezvousTimeout:
            handled.append("hung")
        except RendezvousError:
            handled.append("refused")

    def trace(frame, event, arg):  # the entry of work.py's functions and of those it calls
        caller = frame.f_back
        if event == "call" and (frame.f_code.co_filename == source or
                                (caller is not None and caller.f_code.co_filename == source)):
            fire(frame, linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip())

    def profile(frame, event, arg):
        if event == "c_return" and frame.f_code.co_filename == source:
            fire(frame, getattr(arg, "__qualname__", repr(arg)))

    def body():
        sys.settrace(trace)
        sys.setprofile(profile)
        try:
            target()
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
            sys.setprofile(None)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(WAIT_S)
    bad = ["the interrupted thread hangs"] if t.is_alive() else []
    if "hung" in handled:
        bad.append("the handler's call hung")
    if "queued" in box:
        try:
            box["queued"].wait(datetime.timedelta(seconds=WAIT_S))
        except RendezvousTimeout:
            bad.append("a queued call never ran")
    deadline = time.monotonic() + WAIT_S
    while (w._pending or w._owner is not None) and time.monotonic() < deadline:
        time.sleep(0.005)
    if w._pending or w._owner is not None:
        bad.append(f"count {w._pending}, turn {'held' if w._owner is not None else 'free'}")
    log = []
    try:
        w.submit(lambda: log.append(threading.current_thread().name), [], waited=True).wait(
            datetime.timedelta(seconds=WAIT_S))
        if log != [threading.current_thread().name]:
            bad.append("the next waited call no longer runs on its caller's thread")
    except RendezvousTimeout:
        bad.append("the next waited call hangs")
    w.close(WAIT_S)
    if w.running:
        bad.append("close leaves it running")
    return (where[0] if where else None), bad


@pytest.mark.timeout(300)
# an interrupt fired in a weakref callback that work.py's frames set off is ignored by Python, and said so
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("handler", ["raise", "collective"])
@pytest.mark.parametrize("kind", ["inline", "queued"])
def test_a_signal_handler_wherever_it_can_run_leaves_the_worker_whole(kind, handler):
    failures, n = [], 1
    while True:
        where, bad = _interrupted_at(n, kind, handler)
        if where is None:
            break
        if bad:
            failures.append((n, where, bad))
        n += 1
    assert n > 5, "the interrupt points were not reached"
    assert not failures


@pytest.mark.timeout(60)
def test_a_signal_handler_that_waits_inside_submits_lock_hold_gets_an_error(worker):
    """A handler that runs just after submit has queued a call (Python runs
    them after a C call returns, here inside the hold of the worker's lock,
    which the worker needs to run anything) and waits for a collective of
    its own: an error at once, not a deadlock; both calls still run."""
    import sys

    import shmrdv.torch.work as work_module

    seen = {}

    def handler_like(frame, event, arg):
        if (event == "c_return" and frame.f_code.co_filename == work_module.__file__
                and getattr(arg, "__name__", "") == "put" and "nested" not in seen):
            sys.setprofile(None)
            seen["nested"] = worker.submit(lambda: seen.setdefault("ran", True), [])
            with pytest.raises(RendezvousError, match="signal handler"):
                seen["nested"].wait(datetime.timedelta(seconds=WAIT_S))

    gate, started = threading.Event(), threading.Event()
    first = worker.submit(lambda: (started.set(), gate.wait(WAIT_S)), [])
    assert started.wait(WAIT_S)
    sys.setprofile(handler_like)
    try:
        second = worker.submit(lambda: None, [], waited=True)  # queued behind the first
    finally:
        sys.setprofile(None)
    gate.set()
    assert "nested" in seen
    for w in (first, second, seen["nested"]):
        assert w.wait(datetime.timedelta(seconds=WAIT_S))
    assert seen.get("ran")


@pytest.mark.timeout(60)
def test_close_from_the_thread_that_runs_a_call_does_not_wait_for_the_worker(worker):
    """What a signal handler's destroy_process_group meets while its thread
    runs its own call and the worker waits for the turn behind it: close
    returns at once (the worker cannot end first) and says a call runs;
    once the call ends, the worker runs what it holds and stops."""
    seen = {}

    def run():
        seen["queued"] = worker.submit(lambda: seen.setdefault("ran", True), [])  # the worker takes it and waits
        deadline = time.monotonic() + WAIT_S
        while worker._queue.qsize() and time.monotonic() < deadline:
            time.sleep(0.001)
        t0 = time.monotonic()
        worker.close(timeout=WAIT_S)
        seen["close_s"], seen["running"] = time.monotonic() - t0, worker.running

    assert worker.submit(run, [], waited=True).is_success()
    assert seen["close_s"] < WAIT_S / 2 and seen["running"]
    assert seen["queued"].wait(datetime.timedelta(seconds=WAIT_S)) and seen["ran"]
    worker.close(timeout=WAIT_S)
    assert not worker.running
