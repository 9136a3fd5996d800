"""A receiver that keeps waiting sleeps in the kernel: it uses (almost) no CPU,
whichever way its waits end up waiting first (a spin for a sender on another
CPU, yields to one on its own)."""
import os
import time

import numpy as np
import pytest

from .. import workers
from ..conftest import cpu_seconds, wait_for


@pytest.mark.timeout(60)
def test_blocked_receiver_sleeps(rdv, children):
    queue = children.context.Queue()
    child = children.start(workers.recv_one, rdv.name, "later", queue)
    wait_for(lambda: rdv.stats().waiters > 0, "the child to block in recv")
    assert rdv.stats().waiters == 1
    time.sleep(0.2)  # past the bounded spin
    before = cpu_seconds(child.pid)
    time.sleep(2.0)
    used = cpu_seconds(child.pid) - before
    assert used < 0.1, f"a blocked receiver used {used:.2f} s of CPU in 2 s"
    assert queue.get(timeout=30) == "ready"
    rdv.send("later", np.arange(4))
    assert queue.get(timeout=30)[2] == workers.checksum(np.arange(4))
    children.join()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("placement", ["same CPU", "other CPU"])
def test_receiver_that_learned_its_sender_sleeps(rdv, children, placement):
    """Round trips first teach the receiver's waits where the sender runs (on
    its CPU: yield, elsewhere: spin); a wait that then goes on for 2 s still
    sleeps: under 5 % of a CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if placement == "other CPU" and len(cpus) < 2:
        pytest.skip("one CPU: no other CPU to place the sender on")
    mine, theirs = cpus[0], cpus[0] if placement == "same CPU" else cpus[1]
    queue = children.context.Queue()
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {mine})
    try:
        child = children.start(workers.echo_pinned_then_wait, rdv.name, theirs, 200, queue)
        ping = np.arange(16, dtype=np.float32)
        for _ in range(200):
            rdv.send("ping", ping)
            del_me = rdv.recv("pong", timeout=30)
            del del_me
        assert queue.get(timeout=30) == "learned"
        wait_for(lambda: rdv.stats().waiters > 0, "the child to block in recv")
        time.sleep(0.2)
        before = cpu_seconds(child.pid)
        time.sleep(2.0)
        used = cpu_seconds(child.pid) - before
    finally:
        os.sched_setaffinity(0, old)
    assert used < 0.1, f"a blocked receiver ({placement}) used {used:.2f} s of CPU in 2 s"
    rdv.send("last", np.arange(4))
    assert queue.get(timeout=30) == workers.checksum(np.arange(4))
    children.join()
