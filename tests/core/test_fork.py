"""A Rendezvous inherited through fork(): the child gets a handle of its own on first use and
never touches the parent's process entry, views or blocks."""
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from .. import workers

REPO = Path(__file__).resolve().parent.parent.parent


@pytest.mark.timeout(60)
def test_fork_child_attaches_its_own_handle(rdv):
    rdv.send("held", np.full(10_000, 42, dtype=np.int64))
    view = rdv.recv("held", timeout=5)
    rdv.send("to-child", np.arange(5))
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=workers.forked_child, args=(rdv, view, queue))
    child.start()
    try:
        pids = queue.get(timeout=30)
        child.join(30)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
    assert pids == sorted([os.getpid(), child.pid])
    assert list(rdv.recv("to-parent", timeout=5)) == [0, 2, 4, 6, 8]
    assert (view == 42).all()  # the parent's view is untouched
    assert [p.pid for p in rdv.processes()] == [os.getpid()]  # still registered; the child left
    del view
    assert rdv.stats().bytes_used == 0


def _only_us_left(rdv, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if [p.pid for p in rdv.processes()] == [os.getpid()]:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["os.fork", "fork", "forkserver"])
def test_a_child_never_keeps_its_killed_parent_alive(rdv, how):
    # A parent holding a view and an open block starts a child that uses the
    # rendezvous; the parent is killed. The child must not hold the parent's
    # liveness: the parent shows dead and is reclaimed while the child lives.
    # A plain subprocess, not multiprocessing: its child inherits no pipe the
    # test would wait on.
    parent = subprocess.Popen([sys.executable, "-c", f"from tests import workers; workers.fork_parent({rdv.name!r}, {how!r})"],
                              cwd=REPO)
    child_pid = None
    try:
        child_pid = int(rdv.recv("parent-child", timeout=60)[0])
        assert int(rdv.recv("child-pid", timeout=60)[0]) == child_pid
        assert rdv.stats().bytes_used > 0  # the parent's view and open block
        parent.kill()
        parent.wait(30)
        by_pid = {p.pid: p for p in rdv.processes()}
        assert not by_pid[parent.pid].alive, "the child keeps its dead parent alive"
        assert by_pid[child_pid].alive  # registered as itself
        assert rdv.collect_garbage() == 1
        assert parent.pid in rdv.reclaimed_pids()
        assert rdv.stats().bytes_used == 0
        assert parent.pid not in {p.pid for p in rdv.processes()}
        rdv.send("child-go", np.zeros(1))
        assert _only_us_left(rdv, 30)  # the child closed its own handle and left
    finally:
        parent.kill()
        parent.wait(30)
        if child_pid is not None:
            try:
                os.kill(child_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
