"""A producer waiting for arena space sleeps in the kernel, however the held blocks cut up the
free space, and wakes as soon as a free makes room for it."""
import time

import pytest

from .. import workers
from ..conftest import ROOT, build_sanitized, cpu_seconds, run_c_program

META = 128  # header, shape, strides, a short key and the position copy: one 1-D message's metadata


@pytest.mark.timeout(60)
def test_producer_blocked_by_held_views_sleeps(rdv, children):
    # Four messages that fill the arena exactly, all received and held; then the second is
    # released. A 1.5-quarter message does not fit in the one free quarter.
    quarter = rdv.capacity // 4
    for seed in range(4):
        rdv.send("held", workers.payload(seed, quarter - META), timeout=5)
    views = [rdv.recv("held", timeout=5) for _ in range(4)]
    assert rdv.stats().bytes_free == 0
    views[1] = None
    queue = children.context.Queue()
    child = children.start(workers.send_when_room, rdv.name, "big", 9, quarter * 3 // 2, queue)
    assert queue.get(timeout=30) == "sending"
    assert rdv.stats().bytes_free == rdv.stats().largest_free == quarter
    time.sleep(0.3)  # past the bounded spin
    before = cpu_seconds(child.pid)
    time.sleep(2.0)
    used = cpu_seconds(child.pid) - before
    assert used < 0.2, f"a producer blocked on a full arena used {used:.2f} s of CPU in 2 s"
    assert rdv.try_recv("big") is None

    released = time.monotonic()
    views[2] = None  # next to the free quarter: room for the message
    sent = queue.get(timeout=30)
    assert sent - released < 0.5, f"the producer took {sent - released:.2f} s to notice the room"
    assert workers.checksum(rdv.recv("big", timeout=5)) == workers.checksum(workers.payload(9, quarter * 3 // 2))
    children.join()
    del views
    assert rdv.stats().bytes_used == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_no_lost_wakeups_under_sanitizers(tmp_path):
    # Producers that wait with no timeout at all, so a wake-up that never comes hangs them (see
    # the program's header); built under ASan/UBSan like the stress run.
    exe = tmp_path / "space_wait"
    build_sanitized(ROOT / "tests" / "c" / "space_wait.c", exe)
    run = run_c_program(exe, "t-cspace", timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1200 messages" in run.stdout
