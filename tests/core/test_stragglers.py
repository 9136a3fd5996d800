"""Messages nobody receives for a long time, and views held for a long time, do not stall the
ring behind them: the arena steps over them (up to 64 such blocks at once)."""
import numpy as np
import pytest

from .. import workers

ARENA = 1 << 20


@pytest.fixture
def small(rdv_name):
    import shmrdv

    rdv = shmrdv.Rendezvous(rdv_name, size=ARENA, create=True)
    yield rdv
    rdv.close()
    rdv.unlink()


@pytest.mark.timeout(60)
def test_a_message_nobody_receives_does_not_stall_the_ring(small):
    straggler = workers.payload(7, 100_000)
    small.send("late", straggler)
    chunk = np.empty(64 * 1024, dtype=np.uint8)
    for i in range(20 * ARENA // chunk.nbytes):  # 20 laps of the arena
        chunk.fill(i % 251)
        small.send("stream", chunk, timeout=5)
        assert small.recv("stream", timeout=5)[0] == i % 251
    view = small.recv("late", timeout=5)  # still there, intact, delivered once
    assert workers.checksum(view) == workers.checksum(straggler)
    del view
    assert small.try_recv("late") is None
    assert small.stats().bytes_used == 0


@pytest.mark.timeout(60)
def test_stragglers_and_held_views_mixed(small):
    held = []
    for k in range(6):
        small.send(f"late-{k}", workers.payload(k, 20_000))
        small.send("held", workers.payload(100 + k, 20_000))
        held.append(small.recv("held", timeout=5))
        for i in range(40):
            small.send("stream", np.full(8192, i, dtype=np.int64), timeout=5)
            assert small.recv("stream", timeout=5)[-1] == i
    for k in range(6):
        assert workers.checksum(small.recv(f"late-{k}", timeout=5)) == workers.checksum(workers.payload(k, 20_000))
    assert [workers.checksum(v) for v in held] == [workers.checksum(workers.payload(100 + k, 20_000)) for k in range(6)]
    del held
    assert small.stats().bytes_used == 0
