"""A receiver that keeps waiting sleeps in the kernel: it uses (almost) no CPU."""
import time

import numpy as np
import pytest

from . import workers
from .conftest import cpu_seconds, wait_for


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
    assert used < 0.2, f"a blocked receiver used {used:.2f} s of CPU in 2 s"
    assert queue.get(timeout=30) == "ready"
    rdv.send("later", np.arange(4))
    assert queue.get(timeout=30)[2] == workers.checksum(np.arange(4))
    children.join()
