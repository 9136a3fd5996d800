"""A reclaimer that meets a lock held by another dead process reclaims that
one first instead of spinning on it: process A waits in line on K and dies;
K's slot lock is left held by another dead process C (as C dies holding it
in the middle of a try_recv); the next attach reclaims A, meets C's lock
while unlinking A's waiter, reclaims C, and returns."""
import os
import signal
import subprocess
import sys

import pytest

from .. import workers
from ..conftest import wait_for
from ..segment_bytes import DEAD, Segment

pytestmark = pytest.mark.timeout(120)

SLOT_STATE, SLOT_KEY_LEN, SLOT_WAITERS = 8, 32, 52


def _slot_with_waiter(seg):
    for i in range(seg.slots):
        at = seg.index_off + 64 * i
        if seg.u32(at + SLOT_STATE) == 1 and seg.u32(at + SLOT_WAITERS) == 1:
            return at
    raise AssertionError("no key with one waiter")


def test_a_reclaimer_meeting_a_dead_holders_lock_reclaims_it_first(rdv, children):
    queue = children.context.Queue()
    a = children.start(workers.recv_in_line, rdv.name, "K", queue)
    assert queue.get(timeout=30)[0] == "ready"
    wait_for(lambda: rdv.stats().waiters == 1, "A in line on K")
    seg = Segment(rdv.name)
    try:
        slot = _slot_with_waiter(seg)
        os.kill(a.pid, signal.SIGSTOP)
        os.kill(a.pid, signal.SIGKILL)
        a.join(10)
        seg.dead_entry()  # C: registered, its process gone ...
        seg.u32(slot, DEAD + 1)  # ... holding K's slot lock
    finally:
        seg.close()
    attach = [sys.executable, "-c",
              f"import shmrdv; r = shmrdv.Rendezvous({rdv.name!r}, create=False); print(r.reclaimed_pids()); r.close()"]
    done = subprocess.run(attach, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    st = rdv.stats()
    assert st.waiters == 0
    rdv.send("K", workers.payload(1, 64))  # K works again: nobody holds its lock
    assert rdv.recv("K", timeout=5).nbytes == 64
