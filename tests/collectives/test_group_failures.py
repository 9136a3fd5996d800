"""shmrdv.Group when things go wrong: mismatched calls, ranks SIGKILLed or
closing mid-collective, timeouts, aborts (also from another thread),
joining errors and stale segments, subgroups, the cost of waiting, leaks,
and fork.

Each rank is a forked process running a closure of the test; it reports to
the parent through a pipe (what it raised, with the exception's rank and pid
and the CLOCK_MONOTONIC time, which is system-wide, so the parent can time a
reaction from the moment it sent SIGKILL). Every test is bounded: a timeout
mark, bounded joins, and every child killed at teardown. After every test
the `no_leaks` fixture checks that no group segment of ours is left in
/dev/shm, that no child process is alive, and that the parent's fd count is
unchanged.
"""
import fcntl
import itertools
import multiprocessing
import os
import resource
import signal
import struct
import threading
import time
import traceback

import numpy as np
import pytest

import shmrdv
import shmrdv.cli
from tests.conftest import child_processes, wait_for

pytestmark = pytest.mark.timeout(60)

CTX = multiprocessing.get_context("fork")  # ranks start in milliseconds and take closures
TAG = f"tgf-{os.getpid()}"
MiB = 1 << 20
DEADLINE = 1.5  # seconds: a death must be seen within 1 s; the slack is for a loaded machine
_count = itertools.count()
_tracked_pids = []  # processes not our children (a rank's forked child) that must be gone after the test


def new_name(what: str) -> str:
    return f"{TAG}-{next(_count)}-{what}"


def shm_entries(name: str = TAG):
    return sorted(e for e in os.listdir("/dev/shm") if "shmrdv" in e and name in e)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False




def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(autouse=True)
def no_leaks():
    fds = _fd_count()
    before = set(child_processes())  # e.g. multiprocessing's resource tracker, started by an earlier module
    yield
    try:
        deadline = time.monotonic() + 5
        while (set(child_processes()) - before or any(map(_alive, _tracked_pids))) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not set(child_processes()) - before, f"child processes left: {sorted(set(child_processes()) - before)}"
        assert not [p for p in _tracked_pids if _alive(p)], f"processes left: {_tracked_pids}"
        assert shm_entries() == [], f"left in /dev/shm: {shm_entries()}"
        assert _fd_count() == fds, f"the parent had {fds} fds before the test, {_fd_count()} after"
    finally:
        for pid in _tracked_pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        _tracked_pids.clear()
        for e in shm_entries():
            os.unlink(os.path.join("/dev/shm", e))


# ---------------------------------------------------------------- processes


def describe(exc: BaseException) -> dict:
    return {"type": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__], "msg": str(exc),
            "rank": getattr(exc, "rank", None), "pid": getattr(exc, "pid", None),
            "missing": getattr(exc, "missing", None), "t": time.monotonic()}


class Report(dict):
    """What a call did; pickles (to the parent) without the "group" a successful Group() leaves for its rank."""

    def __reduce__(self):
        return (dict, ({k: v for k, v in self.items() if k != "group"},))


def attempt(fn, *args, **kwargs) -> dict:
    """What fn did: {"ok": value} or the exception described; with "dt", its duration."""
    t0 = time.monotonic()
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which judges
        out = Report(describe(exc))
    else:
        out = Report(t=time.monotonic())
        if isinstance(value, shmrdv.Group):
            out["group"] = value  # for the rank's own use: picklable reports carry its repr
            value = repr(value)
        elif isinstance(value, np.ndarray) or hasattr(value, "numpy"):
            value = np.asarray(value).tolist()
        out["ok"] = value
    out["dt"] = time.monotonic() - t0
    return out


def _child_main(fn, conn, args) -> None:
    code = 1
    try:
        fn(conn, *args)
        code = 0
    except BaseException:
        try:
            conn.send(("crash", traceback.format_exc()))
        except Exception:
            pass
    finally:
        os._exit(code)


class Procs:
    """Forked processes by key, each with a duplex pipe to the parent."""

    def __init__(self):
        self.procs = {}
        self.conns = {}

    def start(self, key, fn, *args):
        here, there = CTX.Pipe()
        proc = CTX.Process(target=_child_main, args=(fn, there, args), daemon=True)
        proc.start()
        there.close()
        self.procs[key], self.conns[key] = proc, here
        return proc

    def pid(self, key) -> int:
        return self.procs[key].pid

    def get(self, key, timeout: float = 15.0):
        conn = self.conns[key]
        if not conn.poll(timeout):
            raise AssertionError(f"{key}: no report within {timeout} s (hung?)")
        try:
            msg = conn.recv()
        except EOFError:
            raise AssertionError(f"{key} exited (code {self.procs[key].exitcode}) without a report") from None
        if isinstance(msg, tuple) and msg and msg[0] == "crash":
            raise AssertionError(f"{key} crashed:\n{msg[1]}")
        return msg

    def put(self, key, msg) -> None:
        self.conns[key].send(msg)

    @staticmethod
    def _reap(proc, timeout: float) -> None:
        # Polls waitpid rather than Process.join(timeout), which waits for the
        # sentinel pipe: a rank's forked child holds that open after the rank dies.
        deadline = time.monotonic() + timeout
        while proc.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.005)

    def kill(self, key) -> float:
        """SIGKILL key; the CLOCK_MONOTONIC time it was sent."""
        t = time.monotonic()
        os.kill(self.pid(key), signal.SIGKILL)
        self._reap(self.procs[key], 10)
        assert self.procs[key].exitcode == -signal.SIGKILL
        return t

    def kill_together(self, *keys) -> None:
        """SIGKILL keys as one: all stopped first, so none sees another die."""
        for key in keys:
            os.kill(self.pid(key), signal.SIGSTOP)
        for key in keys:
            os.kill(self.pid(key), signal.SIGKILL)
        for key in keys:
            self._reap(self.procs[key], 10)
            assert self.procs[key].exitcode == -signal.SIGKILL

    def join(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            self._reap(proc, max(0.0, deadline - time.monotonic()))
        hung = [k for k, p in self.procs.items() if p.exitcode is None]
        assert not hung, f"still running after {timeout} s: {hung}"
        failed = {k: p.exitcode for k, p in self.procs.items() if p.exitcode not in (0, -signal.SIGKILL)}
        assert not failed, f"exit codes: {failed}"

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.exitcode is None:
                proc.kill()
            self._reap(proc, 10)
        for conn in self.conns.values():
            conn.close()
        for proc in self.procs.values():
            if proc.exitcode is not None:
                proc.close()


@pytest.fixture
def procs():
    p = Procs()
    yield p
    p.close()


def wait_parent(conn, timeout: float = 30.0):
    """In a rank: the parent's next message (or give up: the parent is gone)."""
    if not conn.poll(timeout):
        raise TimeoutError("no word from the parent")
    return conn.recv()


def assert_raised(rep: dict, exc_name: str, *fragments: str) -> None:
    assert "ok" not in rep, f"expected {exc_name}, the call returned {rep['ok']!r}"
    assert exc_name in rep["mro"], f"expected {exc_name}, got {rep['type']}: {rep['msg']}"
    for fragment in fragments:
        assert fragment in rep["msg"], f"{fragment!r} not in the message: {rep['msg']}"


def assert_peer_lost(rep: dict, rank: int, pid: int, *, since: float = None, closed: bool = False) -> None:
    assert_raised(rep, "PeerLost", f"rank {rank}", f"pid {pid}", "closed the group" if closed else "died")
    assert (rep["rank"], rep["pid"]) == (rank, pid), rep
    if since is not None:
        assert rep["t"] - since < DEADLINE, f"PeerLost {rep['t'] - since:.3f} s after the peer was lost"


# ---------------------------------------------------------------- mismatched calls

F32 = np.float32
X = np.arange(12, dtype=F32)

MISMATCHES = {
    "op": lambda g: g.allreduce(X, "max" if g.rank == 1 else "sum"),
    "op_on_every_rank": lambda g: g.allreduce(X, ("sum", "prod", "max")[g.rank]),
    "shape_same_bytes": lambda g: g.allreduce(X.reshape((3, 4) if g.rank == 2 else (4, 3))),
    "shape": lambda g: g.allreduce(np.ones(12 + (g.rank == 2), F32)),
    "dtype_same_bytes": lambda g: g.allreduce(X.astype(np.int32) if g.rank == 0 else X),
    "dtype": lambda g: g.allgather(X.astype(np.float64) if g.rank == 1 else X),
    "root": lambda g: g.broadcast(X, root=1 if g.rank == 2 else 0),
    "root_on_every_rank": lambda g: g.reduce(X, root=g.rank),
    "scatter_root": lambda g: g.scatter(np.ones((3, 2), F32), root=0 if g.rank == 0 else 1),
    "allreduce_vs_broadcast": lambda g: g.broadcast(X, 0) if g.rank == 1 else g.allreduce(X),
    "barrier_vs_allgather": lambda g: g.barrier() if g.rank == 0 else g.allgather(X),
    "alltoall_vs_allgather": lambda g: g.alltoall(X.reshape(3, 4)) if g.rank else g.allgather(X.reshape(3, 4)),
    "reduce_scatter_vs_allreduce": lambda g: g.reduce_scatter(X) if g.rank == 2 else g.allreduce(X),
    "large_vs_small": lambda g: g.allreduce(np.ones(3 * MiB // 4 if g.rank != 1 else 256, F32)),
    "large_other_op": lambda g: g.allreduce(np.ones(3 * MiB // 4, F32), "sum" if g.rank else "max"),
}


@pytest.mark.parametrize("variant", sorted(MISMATCHES))
def test_mismatch_raises_on_every_rank_and_the_group_goes_on(procs, variant):
    W, name, call = 3, new_name("mm"), MISMATCHES[variant]

    def rank_main(conn, rank):
        with shmrdv.Group(name, rank, W, timeout=20) as g:
            first = attempt(call, g)
            again = attempt(call, g)  # a second mismatch in a row
            after = attempt(g.allreduce, np.full(5, rank + 1, np.int64))
            bcast = attempt(g.broadcast, np.full(3, rank, np.int16), 2)
            big = attempt(lambda: g.allreduce(np.full(MiB, rank + 1, F32)).sum())
            conn.send((first, again, after, bcast, big))

    for r in range(W):
        procs.start(r, rank_main, r)
    for r in range(W):
        first, again, after, bcast, big = procs.get(r)
        for rep in (first, again):
            assert_raised(rep, "CollectiveMismatch", "every rank must make the same calls")
            assert "ValueError" in rep["mro"]
        if variant == "shape_same_bytes":
            assert "another shape" in first["msg"]
        assert after.get("ok") == [6] * 5, after
        assert bcast.get("ok") == [2] * 3, bcast
        assert big.get("ok") == 6.0 * MiB, big
    procs.join()


def test_argument_error_on_one_rank_stops_every_rank_at_that_call(procs):
    """Rank 1's reduce_scatter has rows that do not divide by world_size, and
    its first broadcast a root out of range: it raises InvalidArgument,
    while ranks 0 and 2 raise CollectiveMismatch naming rank 1 and its
    error, instead of pairing their call with rank 1's next one (the
    broadcasts' shapes agree: that would have gone unseen). The calls after
    are right on every rank."""
    W, name = 3, new_name("argerr")
    good, bad = np.arange(6.0), np.arange(4.0)

    def rank_main(conn, rank):
        with shmrdv.Group(name, rank, W, timeout=10) as g:
            first = attempt(g.reduce_scatter, bad if rank == 1 else good)
            second = attempt(g.broadcast, np.full(3, rank, np.int32), W if rank == 1 else 0)
            third = attempt(g.broadcast, np.full(3, rank + 10, np.int32), 2)
            total = attempt(g.allreduce, np.full(2, rank + 1, np.int64))
            conn.send((first, second, third, total))

    for r in range(W):
        procs.start(r, rank_main, r)
    for r in range(W):
        first, second, third, total = procs.get(r)
        if r == 1:
            assert_raised(first, "InvalidArgument", "must be a multiple of world_size")
            assert_raised(second, "InvalidArgument", "root must be a rank")
        else:
            assert_raised(first, "CollectiveMismatch", "rank 1 could not make its reduce_scatter",
                          "InvalidArgument: reduce_scatter: array.shape[0] must be a multiple")
            assert_raised(second, "CollectiveMismatch", "rank 1 could not make its broadcast", "root must be")
        assert third.get("ok") == [12, 12, 12], third
        assert total.get("ok") == [6, 6], total
    procs.join()


# ---------------------------------------------------------------- ranks lost


def test_peer_killed_while_the_others_wait(procs):
    """Rank 2 is SIGKILLed while ranks 0 and 1 wait for it in allreduce:
    both raise PeerLost naming rank 2 and its pid within a second, and every
    later call raises it at once."""
    W, name = 3, new_name("kill")

    def rank_main(conn, rank):
        with shmrdv.Group(name, rank, W, timeout=30) as g:
            conn.send("joined")
            if rank == 2:
                time.sleep(60)
            first = attempt(g.allreduce, np.ones(1000, F32))
            later = [attempt(g.barrier), attempt(g.allreduce, np.ones(10, F32)), attempt(g.broadcast, X, 0)]
            conn.send((first, later))

    for r in range(W):
        procs.start(r, rank_main, r)
    for r in range(W):
        assert procs.get(r) == "joined"
    time.sleep(0.3)  # ranks 0 and 1 are asleep in allreduce by now
    victim = procs.pid(2)
    t_kill = procs.kill(2)
    for r in (0, 1):
        first, later = procs.get(r)
        assert_peer_lost(first, 2, victim, since=t_kill)
        for rep in later:
            assert_peer_lost(rep, 2, victim)
            assert rep["dt"] < 0.2, f"a call on a broken group took {rep['dt']:.3f} s"
    procs.join()


@pytest.mark.parametrize("W,slot", [(2, None), (3, None), (3, 4096)])
def test_peer_killed_inside_a_large_allreduce(procs, W, slot):
    """Every rank loops on a 16 MiB allreduce (many phases); the last rank is
    SIGKILLed in the middle of one: the others raise PeerLost within a second."""
    name = new_name("killbig")
    kw = {} if slot is None else {"_slot_bytes": slot}

    def rank_main(conn, rank):
        with shmrdv.Group(name, rank, W, timeout=30, **kw) as g:
            a = np.full(4 * MiB, rank + 1, F32)
            out = np.empty_like(a)
            res = g.allreduce(a, out=out)
            conn.send(("looping", float(res[0]), float(res[-1])))
            calls = 0
            while True:
                rep = attempt(g.allreduce, a, out=out)
                if "ok" not in rep:
                    break
                calls += 1
            conn.send((rep, calls, attempt(g.allreduce, a)))

    for r in range(W):
        procs.start(r, rank_main, r)
    total = W * (W + 1) / 2
    for r in range(W):
        assert procs.get(r) == ("looping", total, total)
    time.sleep(0.4)
    victim = procs.pid(W - 1)
    t_kill = procs.kill(W - 1)
    for r in range(W - 1):
        rep, calls, later = procs.get(r)
        assert_peer_lost(rep, W - 1, victim, since=t_kill)
        assert_peer_lost(later, W - 1, victim)
    procs.join()


def test_rank_closing_while_others_wait(procs):
    """A rank that closes the group while the others wait for it: they raise PeerLost (closed)."""
    W, name = 3, new_name("close")

    def rank_main(conn, rank):
        g = shmrdv.Group(name, rank, W, timeout=30)
        conn.send("joined")
        if rank == 1:
            wait_parent(conn)
            g.close()
            assert g.closed
            conn.send(("closed", time.monotonic(), attempt(g.barrier)))
            wait_parent(conn)  # stays alive: the closing, not an exit, is what the others see
            return
        rep = attempt(g.barrier)
        conn.send((rep, attempt(g.allreduce, X)))
        g.close()

    for r in range(W):
        procs.start(r, rank_main, r)
    for r in range(W):
        assert procs.get(r) == "joined"
    time.sleep(0.3)
    procs.put(1, "close now")
    what, t_closed, own = procs.get(1)
    assert what == "closed"
    assert_raised(own, "RendezvousError", "closed")
    for r in (0, 2):
        rep, later = procs.get(r)
        assert_peer_lost(rep, 1, procs.pid(1), since=t_closed, closed=True)
        assert_peer_lost(later, 1, procs.pid(1), closed=True)
    procs.put(1, "exit")
    procs.join()


@pytest.mark.parametrize("victim", [1, 0])
def test_peer_killed_while_joining(procs, victim):
    """Ranks 0 and 1 of 3 have joined and wait in Group() (no timeout) for
    rank 2; one of them is SIGKILLed, rank 0 (the creator) too: the other's
    Group() raises PeerLost naming it within a second, and removes the
    segment as it leaves (no_leaks)."""
    W, name = 3, new_name("joinkill")

    def rank_main(conn, rank):
        conn.send("joining")
        conn.send(attempt(shmrdv.Group, name, rank, W))

    procs.start(0, rank_main, 0)
    assert procs.get(0) == "joining"
    procs.start(1, rank_main, 1)
    assert procs.get(1) == "joining"
    time.sleep(0.4)
    pid = procs.pid(victim)
    t_kill = procs.kill(victim)
    assert_peer_lost(procs.get(1 - victim), victim, pid, since=t_kill)
    procs.join()


def test_signals_during_a_call(procs):
    """A signal whose handler returns lets a blocked call go on (and finish
    right); Ctrl-C (SIGINT) raises KeyboardInterrupt in the blocked rank and
    aborts the group, so the others raise Aborted saying why instead of waiting."""
    W, name = 2, new_name("sig")

    def rank_main(conn, rank):
        with shmrdv.Group(name, rank, W, timeout=30) as g:
            if rank == 0:
                hits = []
                signal.signal(signal.SIGUSR1, lambda *_: hits.append(1))
                conn.send("waiting")
                res = attempt(g.allreduce, np.full(1000, 1, np.int64))
                conn.send((res["ok"][:3] if "ok" in res else res, len(hits)))
                conn.send("waiting")
                try:
                    g.allreduce(np.ones(10, F32))
                    conn.send("returned")
                except KeyboardInterrupt:
                    conn.send(("KeyboardInterrupt", time.monotonic()))
            else:
                wait_parent(conn)
                g.allreduce(np.full(1000, 1, np.int64))
                wait_parent(conn)
                conn.send(attempt(g.allreduce, np.ones(10, F32)))

    for r in range(W):
        procs.start(r, rank_main, r)
    assert procs.get(0) == "waiting"
    time.sleep(0.2)
    for _ in range(3):
        os.kill(procs.pid(0), signal.SIGUSR1)
        time.sleep(0.1)
    procs.put(1, "go")
    assert procs.get(0) == ([2, 2, 2], 3)
    assert procs.get(0) == "waiting"
    time.sleep(0.3)
    t_sig = time.monotonic()
    os.kill(procs.pid(0), signal.SIGINT)
    what, t_raised = procs.get(0)
    assert what == "KeyboardInterrupt" and t_raised - t_sig < DEADLINE
    procs.put(1, "go")
    assert_raised(procs.get(1), "Aborted", "rank 0 was interrupted", "KeyboardInterrupt")
    procs.join()


# ---------------------------------------------------------------- timeouts and aborts


def test_call_timeout_names_the_missing_rank_and_nobody_hangs(procs):
    """timeout=: rank 2 comes 2.5 s late to an allreduce; ranks 0 and 1 (timeout
    1 s) give up, whichever first aborting the group: every rank, rank 2
    too when it comes, raises GroupTimeout, both a RendezvousTimeout (so a
    TimeoutError) and an Aborted, naming rank 2 as missing."""
    W, name = 3, new_name("timeout")

    def rank_main(conn, rank):
        with shmrdv.Group(name, rank, W, timeout=1.0 if rank < 2 else 20) as g:
            conn.send("joined")
            if rank == 2:
                time.sleep(2.5)
            conn.send((attempt(g.allreduce, X), attempt(g.barrier)))

    for r in range(W):
        procs.start(r, rank_main, r)
    for r in range(W):
        assert procs.get(r) == "joined"
    reps = {r: procs.get(r, timeout=20) for r in range(W)}
    for r in range(W):
        for rep in reps[r]:
            assert_raised(rep, "GroupTimeout", "ranks [2] had not arrived")  # said by whoever gave up
            assert {"RendezvousTimeout", "TimeoutError", "Aborted"} <= set(rep["mro"]), rep
            assert rep["missing"] == (2,), rep
        if r < 2:
            assert reps[r][0]["dt"] < 2.5, reps[r]
    procs.join()


def test_join_timeout_of_one_rank_is_a_timeout_on_every_rank(procs):
    """Ranks 0 and 1 of 3 join; rank 2 never comes. Rank 1 (timeout 0.5 s)
    gives up and aborts the join: rank 0 (no timeout) raises GroupTimeout
    too, at once, naming rank 2."""
    W, name = 3, new_name("jointo")

    def rank_main(conn, rank):
        conn.send(attempt(shmrdv.Group, name, rank, W, timeout=0.5 if rank == 1 else None))

    procs.start(0, rank_main, 0)
    procs.start(1, rank_main, 1)
    reps = [procs.get(0), procs.get(1)]
    for rep in reps:
        assert_raised(rep, "GroupTimeout", "rank 1 gave up joining", "ranks [2] had not joined")
        assert "TimeoutError" in rep["mro"] and rep["missing"] == (2,), rep
    assert abs(reps[0]["t"] - reps[1]["t"]) < DEADLINE
    procs.join()


def test_abort_from_one_rank_reaches_every_member(procs):
    W, name, reason = 3, new_name("abort"), "rank 1 found a NaN in its gradients"

    def rank_main(conn, rank):
        with shmrdv.Group(name, rank, W, timeout=30) as g:
            g.barrier()
            if rank == 1:
                time.sleep(0.3)
                g.abort(reason)
                conn.send((attempt(g.allreduce, X), attempt(g.barrier)))
            else:
                conn.send((attempt(g.allreduce, X), attempt(g.barrier)))

    for r in range(W):
        procs.start(r, rank_main, r)
    for r in range(W):
        first, later = procs.get(r)
        assert_raised(first, "Aborted", reason)
        assert_raised(later, "Aborted", reason)
        assert later["dt"] < 0.2
    procs.join()


def test_abort_from_another_thread_of_a_blocked_rank(procs):
    """Rank 0 is blocked in allreduce (rank 1 is late); a thread of rank 0
    aborts: rank 0's call raises Aborted at once, and so does rank 1's."""
    W, name, reason = 2, new_name("thread"), "the watchdog thread gave up"

    def rank_main(conn, rank):
        with shmrdv.Group(name, rank, W, timeout=30) as g:
            g.barrier()
            if rank == 0:
                fired = []

                def watchdog():
                    time.sleep(0.4)
                    fired.append(time.monotonic())
                    g.abort(reason)

                thread = threading.Thread(target=watchdog)
                thread.start()
                rep = attempt(g.allreduce, np.ones(MiB, F32))
                thread.join()
                conn.send((rep, fired[0]))
                conn.send("done")
            else:
                wait_parent(conn)
                conn.send((attempt(g.allreduce, np.ones(MiB, F32)), None))

    for r in range(W):
        procs.start(r, rank_main, r)
    rep, fired = procs.get(0)
    assert_raised(rep, "Aborted", reason)
    assert rep["t"] - fired < DEADLINE
    assert procs.get(0) == "done"
    procs.put(1, "go")
    rep, _ = procs.get(1)
    assert_raised(rep, "Aborted", reason)
    procs.join()


def test_close_from_another_thread_of_a_blocked_rank(procs):
    """A thread of rank 0 closes the group while rank 0's main thread waits
    in allreduce: that call raises (closed) at once, rank 1 then gets
    PeerLost (closed), and nothing crashes."""
    W, name = 2, new_name("tclose")

    def rank_main(conn, rank):
        g = shmrdv.Group(name, rank, W, timeout=30)
        g.barrier()
        if rank == 0:
            closed = []
            thread = threading.Thread(target=lambda: (time.sleep(0.3), closed.append(time.monotonic()), g.close()))
            thread.start()
            rep = attempt(g.allreduce, np.ones(MiB, F32))
            thread.join()
            conn.send((rep, closed[0], attempt(g.barrier)))
        else:
            wait_parent(conn)
            conn.send(attempt(g.allreduce, np.ones(MiB, F32)))
            g.close()

    for r in range(W):
        procs.start(r, rank_main, r)
    rep, closed, later = procs.get(0)
    assert_raised(rep, "RendezvousError", "closed")
    assert rep["t"] - closed < DEADLINE
    assert_raised(later, "RendezvousError", "closed")
    procs.put(1, "go")
    assert_peer_lost(procs.get(1), 0, procs.pid(0), closed=True)
    procs.join()


# ---------------------------------------------------------------- joining


def _join_then(procs, name: str, W: int, ranks, intrude) -> dict:
    """Ranks `ranks` of a group of W join with no timeout and wait for the
    others; once they hold their slots, intrude(conn) runs in a process of
    its own. Every member's Group() must raise within DEADLINE of the
    intruder's report; their reports, and the intruder's, by key."""

    def member(conn, rank):
        conn.send(attempt(shmrdv.Group, name, rank, W))

    for r in ranks:
        procs.start(r, member, r)
    deadline = time.monotonic() + 10
    while not all(holds_its_slot(name, r) for r in ranks):
        assert time.monotonic() < deadline, "the members did not join"
        time.sleep(0.01)
    time.sleep(0.1)  # asleep in their wait for the others
    procs.start("intruder", intrude)
    reps = {"intruder": procs.get("intruder")}
    for r in ranks:
        reps[r] = procs.get(r, timeout=5)
        assert reps[r]["t"] - reps["intruder"]["t"] < DEADLINE, (r, reps[r])
    return reps


def test_join_with_another_world_size_is_refused_on_every_rank(procs):
    """Rank 0 (world_size 2, no timeout) waits; rank 1 comes with world_size
    3: it raises CollectiveMismatch, and rank 0's Group() raises at once too,
    saying why, leaving nothing in /dev/shm (no_leaks)."""
    name = new_name("ws")
    reps = _join_then(procs, name, 2, [0], lambda conn: conn.send(attempt(shmrdv.Group, name, 1, 3, timeout=5)))
    assert_raised(reps["intruder"], "CollectiveMismatch", "world_size=3", "another world_size", "refused")
    assert "ValueError" in reps["intruder"]["mro"]
    assert_raised(reps[0], "Aborted", "its join was refused", f"pid {procs.pid('intruder')} came as rank 1 "
                  "with world_size=3")
    procs.join()


def test_same_rank_joined_twice_is_refused_on_every_rank(procs):
    """While ranks 0 and 1 of 3 wait in Group() (no timeout) for rank 2, a
    second process joins as rank 1: it raises naming the holder, and so do
    ranks 0 and 1, at once; rank 2, coming later, finds no group of theirs."""
    W, name = 3, new_name("twice")
    reps = _join_then(procs, name, W, [0, 1], lambda conn: conn.send(attempt(shmrdv.Group, name, 1, W, timeout=3)))
    assert_raised(reps["intruder"], "RendezvousError", f"rank 1 is taken by pid {procs.pid(1)}",
                  "give each job its own name")
    for r in (0, 1):
        assert_raised(reps[r], "Aborted", "its join was refused", f"came as rank 1, which pid {procs.pid(1)} holds")
    procs.start(2, lambda conn: conn.send(attempt(shmrdv.Group, name, 2, W, timeout=0.5)))
    assert_raised(procs.get(2), "RendezvousTimeout", "rank 0 has not created it")
    procs.join()


def test_same_rank_joined_twice_in_one_process_is_refused(procs):
    """A second Group() as rank 1 in rank 1's own process (from a thread)
    is refused like another process's: every member raises."""
    W, name = 3, new_name("twice1")

    def member(conn, rank):
        again = []
        if rank == 1:
            def join_again():
                wait_parent(conn)
                again.append(attempt(shmrdv.Group, name, 1, W, timeout=2))

            thread = threading.Thread(target=join_again)
            thread.start()
        rep = attempt(shmrdv.Group, name, rank, W)
        if rank == 1:
            thread.join()
            rep["again"] = again[0]
        conn.send(rep)

    for r in (0, 1):
        procs.start(r, member, r)
    deadline = time.monotonic() + 10
    while not (holds_its_slot(name, 0) and holds_its_slot(name, 1)):
        assert time.monotonic() < deadline, "the members did not join"
        time.sleep(0.01)
    procs.put(1, "join again")
    reps = {r: procs.get(r) for r in (0, 1)}
    assert_raised(reps[1].pop("again"), "RendezvousError", f"rank 1 is taken by pid {procs.pid(1)}")
    for r in (0, 1):
        assert_raised(reps[r], "Aborted", "its join was refused")
    procs.join()


def test_second_rank0_is_refused_on_every_rank(procs):
    W, name = 3, new_name("twice0")
    reps = _join_then(procs, name, W, [0, 1], lambda conn: conn.send(attempt(shmrdv.Group, name, 0, W, timeout=3)))
    assert_raised(reps["intruder"], "RendezvousError", f"pid {procs.pid(0)} created it as rank 0 already")
    for r in (0, 1):
        assert_raised(reps[r], "Aborted", "its join was refused", "came as rank 0 too")
    procs.join()


def test_a_rank_that_comes_after_the_group_formed_cannot_disturb_it(procs):
    """A group of 2 forms, but its name is left (the last joiner kept it, as
    one killed before removing it would); a second rank 1 then finds the
    group formed: it raises (came late) and removes the name; the group
    goes on."""
    W, name = 2, new_name("late")

    def member(conn, rank):
        shmrdv.Group._unlink = lambda self: None  # this process keeps the name: the window before it goes
        with shmrdv.Group(name, rank, W, timeout=20) as g:
            conn.send("joined")
            wait_parent(conn)
            conn.send(attempt(g.allreduce, np.full(3, rank + 1, np.int64)))

    for r in range(W):
        procs.start(r, member, r)
    for r in range(W):
        assert procs.get(r) == "joined"
    assert shm_entries(name), "the name should still be there"
    procs.start("late", lambda conn: conn.send(attempt(shmrdv.Group, name, 1, W, timeout=3)))
    assert_raised(procs.get("late"), "RendezvousError", "rank 1 is taken", "formed", "came late")
    assert shm_entries(name) == []
    for r in range(W):
        procs.put(r, "go")
    for r in range(W):
        assert procs.get(r).get("ok") == [3, 3, 3]
    procs.join()


def _join_and_sum(conn, label, name, rank, world, **kwargs):
    """Join group name as rank (kwargs to Group) and send back what joining
    gave, or the allreduce of 1s (job A) or 100s (job B)."""
    joined = attempt(shmrdv.Group, name, rank, world, **kwargs)
    if "ok" not in joined:
        conn.send(joined)
        return
    with joined["group"] as g:
        conn.send(attempt(g.allreduce, np.full(2, 1 if label == "A" else 100, np.int64)))


@pytest.mark.parametrize("token", ["job=", "launcher"])
def test_two_jobs_with_one_name_and_their_own_job_tokens_form_two_groups(procs, token):
    """The issue's mix: job A's ranks 0 and 1 join; job B's ranks 2, 0 and 1
    come, then A's rank 2. Without a token, B's rank 2 completed A's group
    and A's rank 2 joined B's next one. With job= tokens, or the job ids
    their launcher gave them (here SHMRDV_JOB), B's ranks wait while A's
    group forms, then form their own: each job sums its own."""
    W, name = 3, new_name("jobs")

    def rank_main(conn, job, rank):
        if token == "launcher":
            os.environ["SHMRDV_JOB"] = job
            _join_and_sum(conn, job, name, rank, W, timeout=20)
        else:
            _join_and_sum(conn, job, name, rank, W, timeout=20, job=job)

    for r in (0, 1):
        procs.start(("A", r), rank_main, "A", r)
    wait_for(lambda: holds_its_slot(name, 0) and holds_its_slot(name, 1), "A's ranks 0 and 1 to join", 10)
    for r in (2, 0, 1):
        procs.start(("B", r), rank_main, "B", r)
        time.sleep(0.1)
    time.sleep(0.2)
    procs.start(("A", 2), rank_main, "A", 2)
    for job, total in (("A", 3), ("B", 300)):
        for r in range(W):
            assert procs.get((job, r)).get("ok") == [total, total], (job, r)
    procs.join()


def test_two_jobs_with_one_name_that_meet_while_joining_both_fail(procs):
    """Without job=, job B's rank 0 finds job A's join under way (A's ranks 0
    and 1 wait for rank 2): it refuses that join and raises, and A's ranks
    raise at once; B's rank 2 and A's rank 2, coming next, find nothing to
    join. Nobody computes: never a mixed group (the old way, B's rank 2
    completed A's group)."""
    W, name = 3, new_name("meet")

    def rank_main(conn, job, rank, timeout):
        _join_and_sum(conn, job, name, rank, W, timeout=timeout)

    for r in (0, 1):
        procs.start(("A", r), rank_main, "A", r, 10)
    wait_for(lambda: holds_its_slot(name, 0) and holds_its_slot(name, 1), "A's ranks 0 and 1 to join", 10)
    procs.start(("B", 0), rank_main, "B", 0, 10)
    b0 = procs.get(("B", 0))
    assert_raised(b0, "RendezvousError", "created it as rank 0 already", "pass each its own job=")
    for r in (0, 1):
        rep = procs.get(("A", r))
        assert_raised(rep, "Aborted", "its join was refused", "came as rank 0 too")
        assert rep["t"] - b0["t"] < DEADLINE
    for key in (("B", 2), ("A", 2)):
        procs.start(key, rank_main, *key, 0.5)
        assert_raised(procs.get(key), "RendezvousTimeout", "rank 0 has not created it")
    procs.join()


def test_same_rank_joined_twice_names_the_holder(procs):
    W, name = 3, new_name("holder")

    def member(conn, rank):
        conn.send(attempt(shmrdv.Group, name, rank, W, timeout=1.5))

    def intruder(conn):
        conn.send(attempt(shmrdv.Group, name, 1, W, timeout=1))

    procs.start(0, member, 0)
    procs.start(1, member, 1)
    time.sleep(0.3)
    procs.start("intruder", intruder)
    rep = procs.get("intruder")
    procs.get(0), procs.get(1)  # their join times out: rank 2 never comes
    procs.join()
    assert_raised(rep, "RendezvousError", f"rank 1 is taken by pid {procs.pid(1)}")


def test_join_timeout_names_the_missing_ranks(procs):
    """Ranks 1 and 3 of 4 never start: rank 0 (timeout 0.5 s) names them,
    aborting the join; rank 2 (longer timeout) raises the same timeout; a
    rank whose rank 0 never starts says so."""
    name = new_name("jt")

    procs.start(0, lambda conn: conn.send(attempt(shmrdv.Group, name, 0, 4, timeout=0.5)))
    time.sleep(0.1)
    procs.start(2, lambda conn: conn.send(attempt(shmrdv.Group, name, 2, 4, timeout=2.0)))
    rep = procs.get(0)
    assert_raised(rep, "RendezvousTimeout", "ranks [1, 3] had not joined")
    assert rep["dt"] < 1.5
    rep = procs.get(2)
    assert_raised(rep, "RendezvousTimeout", "ranks [1, 3] had not joined")
    assert rep["missing"] == (1, 3)
    lonely = new_name("nobody")
    procs.start(5, lambda conn: conn.send(attempt(shmrdv.Group, lonely, 1, 2, timeout=0.5)))
    assert_raised(procs.get(5), "RendezvousTimeout", "rank 0 has not created it")
    procs.join()


def test_a_symbolic_link_at_the_groups_name_is_refused_saying_so(procs):
    """A symbolic link at the group's name (someone else's doing) is refused
    by rank 0 and the others alike with a PermissionError that says so and
    names a command that removes it; that command does."""
    name = new_name("symlink")
    path = "/dev/shm" + shmrdv.group.GROUP_PREFIX + name
    os.symlink(f"/dev/shm/{TAG}-nowhere", path)
    try:
        for rank in (0, 1):
            procs.start(rank, lambda conn, rank: conn.send(attempt(shmrdv.Group, name, rank, 2, timeout=0.5)), rank)
            rep = procs.get(rank)
            assert_raised(rep, "PermissionError", "symbolic link", f"shmrdv rm --group {name}")
        assert shmrdv.cli.main(["rm", "--group", name]) == 0
        assert not os.path.lexists(path)
    finally:
        if os.path.lexists(path):
            os.unlink(path)
    procs.join()


def test_a_group_segment_open_to_others_is_refused_naming_a_command_that_removes_it(procs, capsys):
    name = new_name("mode")
    path = "/dev/shm" + shmrdv.group.GROUP_PREFIX + name
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.fchmod(fd, 0o644)
    os.close(fd)
    procs.start(1, lambda conn: conn.send(attempt(shmrdv.Group, name, 1, 2, timeout=0.5)))
    assert_raised(procs.get(1), "PermissionError", "refusing to attach to group", "mode 0644",
                  f"shmrdv rm --group {name}")
    assert shmrdv.cli.main(["rm", "--group", name]) == 0
    assert f"group {name}: removed" in capsys.readouterr().out
    assert not os.path.lexists(path)
    assert shmrdv.cli.main(["rm", "--group", name]) == 1
    assert "no such group" in capsys.readouterr().err
    procs.join()


def test_rm_group_leaves_a_join_under_way_unless_forced(procs, capsys):
    """shmrdv rm --group NAME of a group still joining refuses, naming its
    rank 0; with --force it refuses the join (the members raise at once,
    saying so) and removes the segment."""
    name = new_name("rmjoin")
    procs.start(0, lambda conn: conn.send(attempt(shmrdv.Group, name, 0, 2)))
    deadline = time.monotonic() + 10
    while not holds_its_slot(name, 0):
        assert time.monotonic() < deadline, "rank 0 did not create the group"
        time.sleep(0.01)
    time.sleep(0.1)  # the lock is the first step of creating it; the rest takes microseconds
    assert shmrdv.cli.main(["rm", "--group", name]) == 1
    assert f"its rank 0 is live process {procs.pid(0)}; not removed" in capsys.readouterr().err
    assert shm_entries(name)
    t_rm = time.monotonic()
    status = shmrdv.cli.main(["rm", "--group", "--force", name])
    out = capsys.readouterr()
    assert status == 0 and f"group {name}: removed (its join refused first" in out.out, out
    rep = procs.get(0)
    assert_raised(rep, "Aborted", "removed by shmrdv rm --force")
    assert rep["t"] - t_rm < DEADLINE
    assert shm_entries(name) == []
    procs.join()


def holds_its_slot(name: str, rank: int) -> bool:
    """Whether some process holds rank's liveness lock in group name's
    segment: an OFD lock on byte 1 + rank (RDV_COLL_LIVE_BYTE, csrc/rdv_coll.h),
    taken when the rank joins. Only asks (F_OFD_GETLK): takes nothing."""
    try:
        fd = os.open("/dev/shm" + shmrdv.group.GROUP_PREFIX + name, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        query = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 1 + rank, 1, 0)
        return struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_OFD_GETLK, query))[0] != fcntl.F_UNLCK
    finally:
        os.close(fd)


def _stale_then_new_job(procs, name: str, old_ranks, waves):
    """An old job of 3 whose old_ranks joined is SIGKILLed while joining: its
    segment stays. Then a new job with the same name starts, its ranks in
    waves 0.5 s apart: every rank must join and compute."""
    W = 3

    def old(conn, rank):
        conn.send("joining")
        shmrdv.Group(name, rank, W, timeout=30)  # waits for rank 2, which never comes

    def new(conn, rank):
        joined = attempt(shmrdv.Group, name, rank, W, timeout=5)
        if "ok" not in joined:
            conn.send(joined)
            return
        with joined["group"] as g:
            conn.send(attempt(g.allreduce, np.full(3, rank + 1, np.int64)))

    for r in old_ranks:
        procs.start(f"old{r}", old, r)
        assert procs.get(f"old{r}") == "joining"
        deadline = time.monotonic() + 10
        while not (holds_its_slot(name, r) and os.stat("/dev/shm" + shmrdv.group.GROUP_PREFIX + name).st_size):
            assert time.monotonic() < deadline, f"the old rank {r} did not join"
            time.sleep(0.01)
    time.sleep(0.2)  # the lock is the first step of joining; the rest takes microseconds
    procs.kill_together(*(f"old{r}" for r in old_ranks))  # the job dies while joining
    assert shm_entries(name), "the killed job's segment should be left (else this test tests nothing)"
    for i, wave in enumerate(waves):
        if i:
            time.sleep(0.5)
        for r in wave:
            procs.start(r, new, r)
    reps = {r: procs.get(r) for r in range(W)}
    assert all(rep.get("ok") == [6, 6, 6] for rep in reps.values()), \
        {r: rep.get("ok", f"{rep.get('type')}: {rep.get('msg')}") for r, rep in reps.items()}
    procs.join()


@pytest.mark.parametrize("old_ranks,waves", [
    ([0], [[0, 1, 2]]),
    ([0, 1], [[0], [1, 2]]),
    ([0, 1], [[1], [2], [0]]),  # new rank 1 finds its old slot used, so the segment stale, and removes it
], ids=["rank0_with_the_others", "rank0_first", "rank1_first_on_a_used_slot"])
def test_stale_segment_of_a_killed_job_does_not_stop_a_new_job(procs, old_ranks, waves):
    _stale_then_new_job(procs, new_name("stale"), old_ranks, waves)


def test_stale_segment_does_not_stop_a_new_job_whose_rank0_starts_last(procs):
    _stale_then_new_job(procs, new_name("stale2"), [0], [[1, 2], [0]])


def test_every_member_killed_after_joining_leaves_nothing(procs):
    """Once every rank has joined, the name is gone from /dev/shm: SIGKILLing
    them all leaves nothing behind (checked here and by no_leaks)."""
    W, name = 4, new_name("allkilled")

    def rank_main(conn, rank):
        g = shmrdv.Group(name, rank, W, timeout=20)
        g.allreduce(np.ones(1000, F32))
        conn.send("joined")
        time.sleep(60)

    for r in range(W):
        procs.start(r, rank_main, r)
    for r in range(W):
        assert procs.get(r) == "joined"
    assert shm_entries(name) == []
    for r in range(W):
        procs.kill(r)
    assert shm_entries(name) == []
    procs.join()


# ---------------------------------------------------------------- subgroups


def test_disjoint_subgroups_run_concurrently(procs):
    """Ranks {0, 2} and {3, 1} (3 is the second's rank 0) of a group of 4
    run collectives at the same time, each in its own subgroup; a non-member
    cannot create a subgroup; the parent group still works afterwards."""
    W, name = 4, new_name("sub")

    def rank_main(conn, rank):
        with shmrdv.Group(name, rank, W, timeout=30) as g:
            bad = [attempt(g.new_group, [0, 2] if rank in (1, 3) else [1, 3]),
                   attempt(g.new_group, [rank, rank]), attempt(g.new_group, [rank, W])]
            members = [0, 2] if rank in (0, 2) else [3, 1]
            sub = g.new_group(members)
            info = (sub.rank, sub.world_size)
            g.barrier()  # both subgroups start their loops together
            sums, bcasts, big = set(), set(), None
            t0 = time.monotonic()
            for i in range(300):
                sums.add(float(sub.allreduce(np.full(64, rank + 1, F32))[0]))
                bcasts.add(int(sub.broadcast(np.full(4, rank * 10 + i % 3, np.int32), root=i % 2)[0]) - i % 3)
            big = sub.allreduce(np.full(2 * MiB, rank + 1, F32))
            big_ok = bool((big == sum(m + 1 for m in members)).all())
            t1 = time.monotonic()
            again = g.new_group(members)  # the same members twice: a second, distinct group
            second = again.allreduce(np.full(3, rank, np.int64)).tolist()
            again.close()
            sub.close()
            whole = g.allreduce(np.full(2, rank + 1, np.int64)).tolist()
            conn.send((bad, info, sorted(sums), sorted(bcasts), big_ok, (t0, t1), second, whole))

    for r in range(W):
        procs.start(r, rank_main, r)
    reps = {r: procs.get(r, timeout=40) for r in range(W)}
    expected_info = {0: (0, 2), 2: (1, 2), 3: (0, 2), 1: (1, 2)}
    for r, (bad, info, sums, bcasts, big_ok, _, second, whole) in reps.items():
        assert_raised(bad[0], "InvalidArgument", f"rank {r} is not in")
        assert "ValueError" in bad[0]["mro"]
        assert_raised(bad[1], "InvalidArgument", "distinct")
        assert_raised(bad[2], "InvalidArgument", "distinct")
        assert info == expected_info[r]
        members = [0, 2] if r in (0, 2) else [3, 1]
        assert sums == [float(sum(m + 1 for m in members))]
        assert sorted(bcasts) == sorted({10 * m for m in members}), bcasts
        assert big_ok
        assert second == [sum(members)] * 3
        assert whole == [10, 10]
    (a0, a1), (b0, b1) = reps[0][5], reps[3][5]
    assert a0 < b1 and b0 < a1, "the two subgroups' loops did not overlap in time"
    procs.join()


# ---------------------------------------------------------------- waiting is cheap


def _cpu() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


@pytest.mark.slow
def test_waiting_for_a_slow_peer_costs_little_cpu(procs):
    """Rank 0 waits for rank 1 (1 s late) in Group(), 2 s in a barrier, 1 s
    in an allreduce: each wait uses < 10 % of a CPU (user + sys over wall)."""
    name = new_name("cpu")

    def rank_main(conn, rank):
        if rank == 1:
            time.sleep(1)
        c0, t0 = _cpu(), time.monotonic()
        g = shmrdv.Group(name, rank, 2, timeout=30)
        joined = (_cpu() - c0, time.monotonic() - t0)
        waits = []
        for late, call in ((2, g.barrier), (1, lambda: g.allreduce(np.ones(MiB, F32)))):
            if rank == 1:
                time.sleep(late)
            c0, t0 = _cpu(), time.monotonic()
            call()
            waits.append((_cpu() - c0, time.monotonic() - t0))
        g.close()
        conn.send([joined] + waits)

    procs.start(0, rank_main, 0)
    procs.start(1, rank_main, 1)
    for what, (cpu, wall) in zip(("join", "barrier", "allreduce"), procs.get(0, timeout=30)):
        assert wall > (1.8 if what == "barrier" else 0.8), (what, wall)
        assert cpu / wall < 0.10, f"waiting in {what} for {wall:.2f} s used {cpu:.3f} s of CPU"
    procs.get(1)
    procs.join()


# ---------------------------------------------------------------- fork


def test_forked_child_cannot_use_the_group_nor_keep_its_parent_alive(procs):
    """Rank 1 forks: the child's calls raise a clear error; then rank 1 is
    SIGKILLed while rank 0 waits for it, the child still alive: rank 0
    raises PeerLost naming rank 1 (the child does not hold its rank)."""
    name = new_name("fork")

    def rank_main(conn, rank):
        g = shmrdv.Group(name, rank, 2, timeout=30)
        g.barrier()
        if rank == 0:
            conn.send("entering")
            conn.send(attempt(g.allreduce, np.ones(10, F32)))
            g.close()
            return
        pid = os.fork()
        if pid == 0:  # the child
            try:
                reps = [attempt(g.barrier), attempt(g.allreduce, np.ones(10, F32)), attempt(g.abort, "child"),
                        attempt(g.broadcast, X, 1), attempt(g.scatter, None, 0)]
                conn.send(("child", os.getpid(), reps))
                time.sleep(30)
            finally:
                os._exit(0)
        time.sleep(60)

    procs.start(0, rank_main, 0)
    procs.start(1, rank_main, 1)
    what, child, reps = procs.get(1)
    assert what == "child"
    _tracked_pids.append(child)
    for rep in reps:
        assert_raised(rep, "RendezvousError", "fork")
    assert procs.get(0) == "entering"
    time.sleep(0.3)
    parent = procs.pid(1)
    t_kill = procs.kill(1)
    assert _alive(child)
    assert_peer_lost(procs.get(0), 1, parent, since=t_kill)
    os.kill(child, signal.SIGKILL)
    procs.join()


def test_forked_child_closing_its_copy_does_not_close_the_parents_rank(procs):
    name = new_name("forkclose")

    def rank_main(conn, rank):
        with shmrdv.Group(name, rank, 2, timeout=30) as g:
            g.barrier()
            if rank == 1:
                pid = os.fork()
                if pid == 0:
                    try:
                        g.close()
                        del g
                    finally:
                        os._exit(0)
                _, status = os.waitpid(pid, 0)
                assert status == 0
            g.barrier()
            conn.send(attempt(g.allreduce, np.full(3, rank + 1, np.int64)))

    procs.start(0, rank_main, 0)
    procs.start(1, rank_main, 1)
    for r in (0, 1):
        assert procs.get(r).get("ok") == [3, 3, 3]
    procs.join()


@pytest.mark.parametrize("how", ["forked_child", "closed"])
def test_new_group_on_an_unusable_group_raises_at_once(procs, how):
    name = new_name("ng")

    def rank_main(conn, rank):
        g = shmrdv.Group(name, rank, 2, timeout=2)
        g.barrier()
        if how == "closed":
            g.close()
            rep = attempt(g.new_group, [rank])
        elif rank == 1:
            child = os.fork()
            if child == 0:
                try:
                    conn.send(attempt(g.new_group, [0, 1]))
                finally:
                    os._exit(0)
            os.waitpid(child, 0)
            rep = None
        else:
            rep = None
        conn.send(rep)
        if how != "closed":
            g.close()

    procs.start(0, rank_main, 0)
    procs.start(1, rank_main, 1)
    reps = [procs.get(1)] if how == "forked_child" else []
    reps += [procs.get(0), procs.get(1)]
    procs.join()
    for rep in reps:
        if rep is not None:
            assert_raised(rep, "RendezvousError", "fork" if how == "forked_child" else "closed")
            assert rep["dt"] < 0.5
