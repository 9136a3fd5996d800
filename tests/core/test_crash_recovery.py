"""A process that dies (SIGKILL) never leaves a rendezvous stuck or its memory leaked: each
reclamation path, one at a time. Reclaiming is what any attach does; here it is asked for
explicitly with collect_garbage() so the tests can check its result."""
import mmap
import struct

import numpy as np
import pytest

import shmrdv

from .. import workers
from ..conftest import kill_process, only_me, segment_path, wait_for

QUEUE_TIMEOUT = 30




@pytest.mark.timeout(60)
def test_views_of_a_dead_receiver_are_freed(rdv, children):
    queue = children.context.Queue()
    message = workers.payload(1, 100_000)
    rdv.send("k", message)
    child = children.start(workers.hold_view_then_wait, rdv.name, "k", queue)
    assert queue.get(timeout=QUEUE_TIMEOUT) == workers.checksum(message)
    held = [p for p in rdv.processes() if p.pid == child.pid]
    assert len(held) == 1 and held[0].views == 1 and held[0].view_bytes >= 100_000
    kill_process(child)
    assert rdv.stats().bytes_used >= 100_000
    assert rdv.collect_garbage() == 1
    assert rdv.stats().bytes_used == 0 and only_me(rdv)


@pytest.mark.timeout(60)
def test_a_dead_receivers_view_of_an_empty_array_is_freed(rdv, children):
    queue = children.context.Queue()
    rdv.send("k", np.zeros(0, dtype=np.float32))  # a block that is all metadata
    child = children.start(workers.hold_view_then_wait, rdv.name, "k", queue)
    queue.get(timeout=QUEUE_TIMEOUT)
    kill_process(child)
    assert rdv.stats().bytes_used > 0
    assert rdv.collect_garbage() == 1
    assert rdv.stats().bytes_used == 0


@pytest.mark.timeout(60)
def test_half_written_alloc_of_a_dead_producer_is_dropped(rdv, children):
    queue = children.context.Queue()
    child = children.start(workers.alloc_halfway_then_wait, rdv.name, "k", 200_000, queue)
    assert queue.get(timeout=QUEUE_TIMEOUT) == "inside"
    assert rdv.stats().bytes_used >= 200_000
    kill_process(child)
    assert rdv.collect_garbage() == 1
    stats = rdv.stats()
    assert stats.bytes_used == 0 and stats.pending_messages == 0
    assert rdv.try_recv("k") is None  # never delivered


@pytest.mark.timeout(60)
def test_a_completed_send_survives_a_killed_producer(rdv, children):
    queue = children.context.Queue()
    child = children.start(workers.send_then_wait, rdv.name, "k", 5, 300_000, queue)
    assert queue.get(timeout=QUEUE_TIMEOUT) == "sent"
    kill_process(child)
    rdv.collect_garbage()
    view = rdv.recv("k", timeout=5)
    assert workers.checksum(view) == workers.checksum(workers.payload(5, 300_000))
    del view
    assert rdv.try_recv("k") is None  # exactly once
    assert rdv.stats().bytes_used == 0


@pytest.mark.timeout(60)
def test_a_dead_waiter_is_withdrawn(rdv, children):
    queue = children.context.Queue()
    child = children.start(workers.report_entry_then_recv, rdv.name, "k", queue)
    queue.get(timeout=QUEUE_TIMEOUT)
    wait_for(lambda: rdv.stats().waiters == 1, "the child to wait")
    kill_process(child)
    assert rdv.collect_garbage() == 1
    stats = rdv.stats()
    assert stats.waiters == 0 and stats.keys == 0
    rdv.send("k", np.arange(3))  # the key works as new
    assert list(rdv.recv("k", timeout=5)) == [0, 1, 2]


def _slot_of_waited_key(path):
    """Offset of the one LIVE key slot in the segment (a test knows the layout)."""
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as seg:
        index_off, slots = struct.unpack_from("<QQ", seg, 24)
        for i in range(slots):
            off = index_off + 64 * i
            if struct.unpack_from("<I", seg, off + 8)[0] == 1:  # state == LIVE
                return off
    raise AssertionError("no live key slot")


@pytest.mark.timeout(60)
def test_a_lock_held_by_a_dead_process_is_repaired(rdv, children):
    queue = children.context.Queue()
    child = children.start(workers.report_entry_then_recv, rdv.name, "k", queue)
    entry = queue.get(timeout=QUEUE_TIMEOUT)
    wait_for(lambda: rdv.stats().waiters == 1, "the child to wait")
    kill_process(child)
    # As if it had died inside a critical section: its id in the key's lock word.
    path = segment_path(rdv.name)
    off = _slot_of_waited_key(path)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as seg:
        struct.pack_into("<I", seg, off, entry + 1)
    # The next sender spins on the lock, finds its holder dead, reclaims, and proceeds.
    rdv.send("k", np.arange(5), timeout=10)
    assert list(rdv.recv("k", timeout=5)) == [0, 1, 2, 3, 4]
    stats = rdv.stats()
    assert stats.waiters == 0 and stats.pending_messages == 0 and only_me(rdv)


@pytest.mark.timeout(60)
def test_attach_reclaims_the_dead(rdv, children):
    queue = children.context.Queue()
    rdv.send("k", workers.payload(2, 50_000))
    child = children.start(workers.hold_view_then_wait, rdv.name, "k", queue)
    queue.get(timeout=QUEUE_TIMEOUT)
    kill_process(child)
    with shmrdv.Rendezvous(rdv.name, create=False):  # attaching reclaims
        pass
    assert rdv.stats().bytes_used == 0 and only_me(rdv)
