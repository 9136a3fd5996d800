"""A Rendezvous inherited through fork(): the child gets a handle of its own on first use and
never touches the parent's process entry, views or blocks."""
import multiprocessing
import os

import numpy as np
import pytest

from . import workers


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
