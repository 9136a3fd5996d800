"""``shmrdv.torch.Store``: TCPStore's semantics, many threads and processes
at once, processes SIGKILLed inside calls (each crash window of the
module's state table), cleanup, and ``shmrdv ls`` showing it.

Children are forked (torch is imported once, here); every join is bounded
and every name is unique and removed (the session checks /dev/shm)."""
import datetime
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from shmrdv.torch import store as store_module  # noqa: E402
from shmrdv.torch.store import CLOSED_KEY, Store  # noqa: E402

from ..conftest import _new_name, segment_path  # noqa: E402

JOIN_S = 30.0
fork = multiprocessing.get_context("fork")


@pytest.fixture
def name():
    n = _new_name()
    yield n
    try:
        os.unlink(segment_path(n))
    except FileNotFoundError:
        pass


@pytest.fixture
def store(name):
    s = Store(name, timeout=5)
    yield s
    s.close()
    s.unlink()


def run_children(target, args_list, timeout=JOIN_S):
    procs = [fork.Process(target=target, args=args, daemon=True) for args in args_list]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [p.pid for p in procs if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    assert not hung, f"children still running after {timeout}s"
    return [p.exitcode for p in procs]


def messages_of(store, key):
    """How many messages the store's value key holds now (1 once an op has cleaned up after a crash)."""
    return sum(k.pending for k in store.rendezvous.keys() if k.name == "s/" + key)


# ---- semantics ----

def test_set_get_values_persist_and_overwrite(store):
    store.set("k", "v1")
    assert store.get("k") == b"v1"
    assert store.get("k") == b"v1"  # a read keeps the value
    store.set("k", b"\x00\xffbin")
    assert store.get("k") == b"\x00\xffbin"
    store.set("empty", b"")
    assert store.get("empty") == b""
    assert messages_of(store, "k") == 1


def test_get_missing_raises_dist_store_error_after_the_timeout(store):
    store.set_timeout(datetime.timedelta(seconds=0.2))
    started = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="[Tt]imeout"):
        store.get("missing")
    assert 0.2 <= time.monotonic() - started < 2
    with pytest.raises(RuntimeError):  # DistStoreError is a RuntimeError, as TCPStore's
        store.wait(["missing"], datetime.timedelta(seconds=0.1))


def test_get_waits_for_a_set_from_another_thread(store):
    threading.Timer(0.1, store.clone().set, ("late", "here")).start()
    started = time.monotonic()
    assert store.get("late") == b"here"
    assert time.monotonic() - started < 2
    store.wait(["late"])


def test_add_compare_set_append(store):
    assert store.add("n", 5) == 5
    assert store.add("n", -7) == -2
    assert store.get("n") == b"-2"
    assert store.compare_set("cs", "x", "y") == b"x"  # missing, expected not empty: unchanged
    assert not store.check(["cs"])
    assert store.compare_set("cs", "", "first") == b"first"
    assert store.compare_set("cs", "wrong", "second") == b"first"
    assert store.compare_set("cs", "first", "second") == b"second"
    store.append("ap", "ab")
    store.append("ap", b"cd")
    assert store.get("ap") == b"abcd"


def test_keys_check_delete_multi(store):
    store.multi_set(["a", "b"], ["1", b"2"])
    assert store.multi_get(["a", "b"]) == [b"1", b"2"]
    assert store.check(["a", "b"]) and not store.check(["a", "nope"])
    assert store.num_keys() == 2
    assert sorted(store.list_keys()) == ["a", "b"]
    assert store.delete_key("a") is True
    assert store.delete_key("a") is False
    assert store.num_keys() == 1 and not store.check(["a"])
    with pytest.raises(ValueError):
        store.multi_set(["x"], [])


def test_queues(store):
    assert store.queue_len("q") == 0
    for i in range(3):
        store.queue_push("q", f"item{i}")
    assert store.queue_len("q") == 3
    assert store.check(["q"])  # wait/check see a non-empty queue, as TCPStore's
    assert [store.queue_pop("q") for _ in range(3)] == [b"item0", b"item1", b"item2"]
    with pytest.raises(dist.QueueEmptyError):
        store.queue_pop("q", block=False)
    store.set_timeout(0.1)
    with pytest.raises(dist.DistStoreError):
        store.queue_pop("q")


def test_barrier_timeout_and_clone(store):
    store.barrier("b", 1)
    assert store.timeout == datetime.timedelta(seconds=5)
    store.set_timeout(datetime.timedelta(seconds=2))
    assert store.timeout == datetime.timedelta(seconds=2)
    other = store.clone()
    try:
        other.set("from-clone", "1")
        assert store.get("from-clone") == b"1"
    finally:
        other.close()
    again = pickle.loads(pickle.dumps(store))
    try:
        assert again.get("from-clone") == b"1"
    finally:
        again.close()


def test_through_torch_prefix_store(store):
    """What torch's C++ side calls (PrefixStore, init_process_group) reaches the Python methods."""
    prefixed = dist.PrefixStore("job", store)
    prefixed.set("k", "v")
    assert store.get("job/k") == b"v"
    assert prefixed.add("n", 2) == 2
    assert prefixed.compare_set("k", "v", "w") == b"w"
    prefixed.multi_set(["m"], ["1"])
    assert prefixed.multi_get(["m"]) == [b"1"]
    prefixed.append("k", "x")
    assert prefixed.check(["k"]) and prefixed.get("k") == b"wx"
    prefixed.wait(["k"], datetime.timedelta(seconds=1))
    prefixed.barrier("bar", 1)


def test_init_process_group_with_the_store(store):
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        t = torch.ones(3)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
    finally:
        dist.destroy_process_group()


# ---- many threads, many processes ----

def test_threads_add_and_compare_set_exact(store):
    def adder():
        for _ in range(200):
            store.add("sum", 1)

    def cas_incrementer():
        s = store.clone()
        try:
            for i in range(50):
                while True:  # values are "count:thread:i", unique, so success cannot be mistaken
                    cur = s.get("cas")
                    want = f"{int(cur.split(b':')[0]) + 1}:{threading.get_ident()}:{i}".encode()
                    if s.compare_set("cas", cur, want) == want:
                        break
        finally:
            s.close()

    store.set("cas", "0")
    threads = [threading.Thread(target=adder) for _ in range(4)] + [threading.Thread(target=cas_incrementer)
                                                                     for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads)
    assert store.get("sum") == b"800"
    assert store.get("cas").split(b":")[0] == b"150"


def _add_many(name, n):
    s = Store(name, timeout=20)
    for _ in range(n):
        s.add("total", 1)
    s.set(f"done/{os.getpid()}", "1")
    for i in range(n):
        s.queue_push("items", str(i))
    s.close()


def test_processes_add_and_queue_sums(store, name):
    codes = run_children(_add_many, [(name, 150)] * 3)
    assert codes == [0, 0, 0]
    assert store.get("total") == b"450"
    items = [int(store.queue_pop("items")) for _ in range(450)]
    assert sum(items) == 3 * sum(range(150))
    assert store.queue_len("items") == 0


def _late_setter(name):
    time.sleep(0.3)
    with Store(name) as s:
        s.set("late", "v")


def test_get_waits_for_another_process(store, name):
    p = fork.Process(target=_late_setter, args=(name,), daemon=True)
    p.start()
    try:
        assert store.get("late") == b"v"
    finally:
        p.join(JOIN_S)
    assert p.exitcode == 0


def _ping(name, n):
    with Store(name, timeout=20) as s:
        for _ in range(n):
            s.queue_push("pong", s.queue_pop("ping"))


def test_queue_round_trips_between_processes(store, name):
    p = fork.Process(target=_ping, args=(name, 200), daemon=True)
    p.start()
    try:
        for i in range(200):
            store.queue_push("ping", str(i))
            assert store.queue_pop("pong") == str(i).encode()
    finally:
        p.join(JOIN_S)
    assert p.exitcode == 0


# ---- SIGKILL inside calls ----

def _die_inside(name, where, key, value):
    """Set ``key`` (or delete it) and SIGKILL ourselves at ``where`` in the state table."""
    s = Store(name, timeout=5)
    me = os.getpid()
    rdv = s.rendezvous
    if where == "after-take":  # step 1 done: the leased messages are ours
        with s._lock:
            taken = s._take("s/" + key)
            os.kill(me, signal.SIGKILL)
            del taken
    elif where == "after-commit":  # step 2 done: the new value is queued, the old one still ours
        with s._lock:
            taken = s._take("s/" + key)
            rdv.send("s/" + key, store_module._array(value))
            os.kill(me, signal.SIGKILL)
            del taken
    elif where == "delete-before-newest":  # delete let the stale ones go, not the newest
        with s._lock:
            taken = s._take("s/" + key)
            while len(taken) > 1:
                del taken[0]
            os.kill(me, signal.SIGKILL)
    elif where == "holding-lock":
        with s._lock:
            os.kill(me, signal.SIGKILL)


@pytest.mark.parametrize("where, expected", [
    ("after-take", b"old"),  # nothing happened
    ("after-commit", b"new"),  # the set happened
    ("holding-lock", b"old"),
])
def test_killed_inside_a_set_leaves_old_or_new(store, name, where, expected):
    store.set("k", "old")
    store.set("stale", "a")
    codes = run_children(_die_inside, [(name, where, "k", b"new")])
    assert codes == [-signal.SIGKILL]
    started = time.monotonic()
    assert store.get("k") == expected  # the lock is free at once, the leases back
    assert time.monotonic() - started < 2
    assert store.add("k2", 1) == 1
    store.set("k", "after")
    assert store.get("k") == b"after"
    assert messages_of(store, "k") == 1  # what the crash left is gone after one op


def test_killed_inside_a_delete_keeps_the_value(store, name):
    store.set("k", "old")
    # two messages under the key, as a crash after a commit leaves them
    run_children(_die_inside, [(name, "after-commit", "k", b"new")])
    assert messages_of(store, "k") == 1  # the old one is back once the dead are reclaimed, by the next op
    codes = run_children(_die_inside, [(name, "delete-before-newest", "k", b"")])
    assert codes == [-signal.SIGKILL]
    assert store.get("k") == b"new"


def _add_forever(name, index):
    s = Store(name, timeout=20)
    n = 0
    while True:
        s.add("total", 1)
        n += 1
        s.set(f"acked/{index}", str(n))


@pytest.mark.slow
def test_adders_killed_at_random_leave_a_consistent_sum(store, name):
    """Adders SIGKILLed at random points: each add happened or not, and the lock never sticks."""
    import random

    rng = random.Random(42)
    acked_total, killed = 0, 0
    for round_ in range(12):
        procs = [fork.Process(target=_add_forever, args=(name, f"{round_}-{i}"), daemon=True) for i in range(2)]
        for p in procs:
            p.start()
        time.sleep(0.2 + rng.random() * 0.3)
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.join(10)
            killed += 1
        for i in range(2):
            try:
                acked_total += int(store.get(f"acked/{round_}-{i}") if store.check([f"acked/{round_}-{i}"]) else 0)
            except ValueError:
                pytest.fail("a value is not an integer after a crash")
    total = int(store.get("total"))
    assert acked_total <= total <= acked_total + killed
    assert store.add("total", 1) == total + 1
    assert messages_of(store, "total") == 1


# ---- cleanup and tools ----

def _member(name, world):
    Store(name, world_size=world).close()


def test_the_jobs_last_member_removes_the_segment(name):
    first = Store(name, world_size=3)
    run_children(_member, [(name, 3)])
    assert os.path.exists(segment_path(name))
    assert first.get(CLOSED_KEY) == b"1"
    first.close()  # the second close of three: still there
    assert os.path.exists(segment_path(name))
    run_children(_member, [(name, 3)])
    assert not os.path.exists(segment_path(name))


def test_shmrdv_ls_and_stat_show_it(store, name):
    store.set("k", "v")
    shmrdv_cli = [sys.executable, "-m", "shmrdv"]
    ls = subprocess.run(shmrdv_cli + ["ls"], capture_output=True, text=True, timeout=60)
    assert name in ls.stdout, ls.stdout + ls.stderr
    stat = subprocess.run(shmrdv_cli + ["stat", name], capture_output=True, text=True, timeout=60)
    assert stat.returncode == 0 and "s/k" in stat.stdout, stat.stdout + stat.stderr


# ---- shmrdv:// and torchrun ----

def _shmrdv_url_rank(name, rank):
    import shmrdv.torch  # noqa: F401

    dist.init_process_group("gloo", init_method=f"shmrdv://{name}", rank=rank, world_size=2)
    t = torch.ones(2) * (rank + 1)
    dist.all_reduce(t)
    assert t.tolist() == [3.0, 3.0]
    dist.destroy_process_group()


def test_init_method_shmrdv_url(name):
    assert run_children(_shmrdv_url_rank, [(name, 0), (name, 1)]) == [0, 0]
    assert not os.path.exists(segment_path(name))  # the last of the two removed it


def test_init_method_needs_rank_and_world_size(monkeypatch):
    import shmrdv.torch  # noqa: F401

    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="rank parameter missing"):
        next(dist.rendezvous("shmrdv://never?world_size=1"))


def test_torchrun_entry_point_loads_nothing():
    code = ("import sys, shmrdv_torchrun; from importlib.metadata import entry_points;"
            "eps = [e for e in entry_points(group='torchrun.handlers') if e.name == 'shmrdv'];"
            "assert eps and eps[0].load() is shmrdv_torchrun.handler;"
            "assert 'torch' not in sys.modules and 'shmrdv' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _torchrun(backend, run_id, endpoint, init_method):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    script = os.path.join(os.path.dirname(__file__), "ddp_script.py")
    started = time.monotonic()
    run = subprocess.run([torchrun, "--nproc-per-node=2", f"--rdzv-backend={backend}", f"--rdzv-id={run_id}",
                          f"--rdzv-endpoint={endpoint}", script, init_method],
                         capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": os.path.dirname(__file__)})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    firsts = [float(line.split("first-collective-s ")[1].split()[0]) for line in run.stdout.splitlines()
              if "first-collective-s" in line]
    assert len(firsts) == 2, run.stdout
    return max(firsts), time.monotonic() - started


@pytest.mark.slow
def test_torchrun_rdzv_backend_shmrdv_runs_ddp(name):
    """A real torchrun job of two ranks meeting through --rdzv-backend=shmrdv and shmrdv://."""
    run_id = name.replace("t-", "job-")
    first, wall = _torchrun("shmrdv", run_id, name, "shmrdv://")
    print(f"shmrdv: first collective {first:.2f} s after start, job {wall:.2f} s")
    assert not os.path.exists(segment_path(name))
    assert not os.path.exists(segment_path(f"torchrun-{run_id}-0"))
