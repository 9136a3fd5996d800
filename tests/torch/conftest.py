"""Fixtures of the torch tests: the forkserver their ranks come from, and
the check that no test leaves a group's /dev/shm entry behind."""
import multiprocessing
import multiprocessing.forkserver
import os
import time

import pytest


@pytest.fixture(scope="module")
def ctx():
    """A forkserver context whose server has imported torch and shmrdv.torch
    (and torch._dynamo, which DistributedDataParallel imports on first use)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "shmrdv.torch"])
    yield context
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    if server is not None and hasattr(server, "_stop"):
        server._stop()  # not left running until pytest exits


def _our_shm():
    """The /dev/shm entries of this backend's groups (their names start with torch-)."""
    return {e for e in os.listdir("/dev/shm") if e.startswith("shmrdv") and "torch-" in e}


@pytest.fixture(autouse=True)
def nothing_left_behind():
    before = _our_shm()
    yield
    # A group's name goes once all its ranks have joined: one that stays is
    # a leak, one that goes within a second was another job's, joining.
    deadline = time.monotonic() + 2.0
    while _our_shm() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _our_shm() - before == set()
