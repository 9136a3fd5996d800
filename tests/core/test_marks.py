"""Producer marks: a commit that also sets a small record in the segment, atomically with
respect to the committing process's death, so that an idempotent producer (the network
bridge) restarted after a SIGKILL knows exactly which of its messages were committed.

The crash windows are put in place through the segment's bytes, as test_crash_windows does:
a process-table entry that nobody holds, caught in the middle of a marked commit."""
import os
import random
import signal
import struct
import time

import numpy as np
import pytest

import shmrdv
from shmrdv.marks import MAX_MARKS

from ..conftest import only_me, wait_for
from ..segment_bytes import DEAD, MARK_RECORD, MARKS, Segment, granule_of

ID = 0x5EED_0000_0001  # a mark id: which producer the mark belongs to
ENTRY = Segment.entry(None, DEAD)  # the dead producer's process-table entry
WRITING, QUEUED = 1, 2
NO_MESSAGE = (1 << 64) - 1  # mark_pos of a plain set_mark


def _mark_bytes(seg, idx, value=None):
    if value is not None:
        struct.pack_into("<QQQ", seg.mem, MARKS + 32 * idx, *value)
    return struct.unpack_from("<QQQ", seg.mem, MARKS + 32 * idx)


def _dead_producer_changing(seg, idx, pos, prev, new):
    """Entry DEAD: registered (ALIVE) but nobody holds its lock, and it died in the middle of
    changing mark idx from prev to new, committing the block at pos: record armed, mark written."""
    struct.pack_into("<II", seg.mem, ENTRY, 1, 999_999)  # state ALIVE, pid
    struct.pack_into("<IIQQQQ", seg.mem, ENTRY + MARK_RECORD, idx + 1, 0, pos, *prev)
    _mark_bytes(seg, idx, new)


def _block(seg, pos, stage, owner):
    """Set a message block's stage and owner (entry + 1) as its writer would have."""
    at = seg.block(granule_of(pos))
    struct.pack_into("<B", seg.mem, at + 31, stage)
    struct.pack_into("<H", seg.mem, at + 36, owner)


def _lock_slot_of(seg, rdv):
    """Put DEAD's id in the lock word of the one live key slot, as if it died holding it."""
    index_off, slots = struct.unpack_from("<QQ", seg.mem, 24)
    live = [index_off + 64 * i for i in range(slots) if struct.unpack_from("<I", seg.mem, index_off + 64 * i + 8)[0] == 1]
    assert len(live) == 1
    struct.pack_into("<I", seg.mem, live[0], DEAD + 1)


def _reserve(rdv, seg, key, value):
    """Reserve and fill a one-element block as a producer would before committing; the
    position it got, and the buffer (whose reference keeps the handle's mapping)."""
    pos = seg.next_pos
    buf = rdv.alloc(key, (1,), np.uint64).__enter__()  # never exited: the commit is the test's
    buf[0] = value
    return pos, buf


def _drain(rdv, key):
    values = []
    while (view := rdv.try_recv(key)) is not None:
        values.append(int(view[0]))
        del view
    return values



# ---- the API ------------------------------------------------------------------------


def test_marks_start_zero_and_round_trip(rdv):
    assert MAX_MARKS == 64
    assert all(rdv.mark(i) == (0, 0, 0) for i in range(MAX_MARKS))
    top = (1 << 64) - 1
    rdv.set_mark(MAX_MARKS - 1, top, top - 1, 7)
    assert rdv.mark(MAX_MARKS - 1) == (top, top - 1, 7)
    assert rdv.mark(MAX_MARKS - 2) == (0, 0, 0)
    with shmrdv.Rendezvous(rdv.name, create=False) as other:  # in the segment, not the handle
        assert other.mark(MAX_MARKS - 1) == (top, top - 1, 7)


def test_a_marked_alloc_commits_message_and_mark(rdv):
    rdv.set_mark(3, ID, 0, 0)
    for n in (1, 2):
        with rdv.alloc("k", (2,), np.uint64, mark=(3, ID, n, n * 10)) as buf:
            buf[:] = n
            assert rdv.mark(3) == (ID, n - 1, (n - 1) * 10)  # not before the commit
        assert rdv.mark(3) == (ID, n, n * 10)
    assert [list(rdv.recv("k", timeout=5)) for _ in range(2)] == [[1, 1], [2, 2]]


def test_an_exception_in_a_marked_alloc_leaves_the_mark(rdv):
    rdv.set_mark(0, ID, 5, 0)
    with pytest.raises(KeyError):
        with rdv.alloc("k", (1,), np.uint64, mark=(0, ID, 6, 0)):
            raise KeyError("producer failed")
    assert rdv.mark(0) == (ID, 5, 0)
    assert rdv.try_recv("k") is None and rdv.stats().bytes_used == 0


def test_a_failed_marked_commit_leaves_the_mark(rdv):
    rdv.set_mark(0, ID, 5, 0)
    allocation = rdv.alloc("k", (1,), np.uint64, mark=(0, ID, 6, 0))
    with pytest.raises(shmrdv.Aborted):
        with allocation:
            rdv.abort("stop")  # the commit finds the rendezvous aborted
    assert rdv.mark(0) == (ID, 5, 0)
    assert rdv.stats().bytes_used == 0


@pytest.mark.parametrize("idx", [-1, MAX_MARKS, 1 << 40])
def test_a_bad_mark_index_names_the_range(rdv, idx):
    with pytest.raises(shmrdv.InvalidArgument, match=r"\[0, 64\)"):
        rdv.mark(idx)
    with pytest.raises(shmrdv.InvalidArgument, match=r"\[0, 64\)"):
        rdv.set_mark(idx, 1, 2, 3)
    with pytest.raises(shmrdv.InvalidArgument, match=r"\[0, 64\)"):
        rdv.alloc("k", (1,), np.uint8, mark=(idx, 1, 2, 3))


@pytest.mark.parametrize(
    "mark, error",
    [
        ((0, 1, 2), shmrdv.InvalidType),
        ([0, 1, 2, 3], shmrdv.InvalidType),
        ((0, 1, 2, 3, 4), shmrdv.InvalidType),
        (("0", 1, 2, 3), shmrdv.InvalidType),
        ((True, 1, 2, 3), shmrdv.InvalidType),
        ((0, 1.0, 2, 3), shmrdv.InvalidType),
        ((0, 1, None, 3), shmrdv.InvalidType),
        ((0, -1, 2, 3), shmrdv.InvalidArgument),
        ((0, 1, 1 << 64, 3), shmrdv.InvalidArgument),
        ((0, 1, 2, -3), shmrdv.InvalidArgument),
    ],
)
def test_a_bad_mark_tuple_is_refused_up_front(rdv, mark, error):
    with pytest.raises(error):
        rdv.alloc("k", (1,), np.uint8, mark=mark)  # before anything is reserved
    if isinstance(mark, tuple) and len(mark) == 4:
        with pytest.raises(error):
            rdv.set_mark(*mark)
    assert rdv.mark(0) == (0, 0, 0) and rdv.stats().bytes_used == 0


# ---- crash windows, forced through the segment's bytes ---------------------------------


@pytest.mark.timeout(60)
def test_died_before_the_commit_point_rolls_the_mark_back(rdv, seg):
    rdv.set_mark(0, ID, 4, 0)
    pos, buf = _reserve(rdv, seg, "k", 5)
    _block(seg, pos, WRITING, DEAD + 1)  # the dead producer's block, never committed
    _dead_producer_changing(seg, 0, pos, prev=(ID, 4, 0), new=(ID, 5, 0))
    assert rdv.collect_garbage() == 1
    assert rdv.mark(0) == (ID, 4, 0)
    del buf
    assert rdv.try_recv("k") is None
    assert rdv.stats().bytes_used == 0 and only_me(rdv)


@pytest.mark.timeout(60)
def test_died_after_the_commit_point_keeps_the_mark(rdv, seg):
    rdv.set_mark(0, ID, 4, 0)
    pos = seg.next_pos
    rdv.send("k", np.array([5], dtype=np.uint64))  # queued: committed
    _dead_producer_changing(seg, 0, pos, prev=(ID, 4, 0), new=(ID, 5, 0))
    assert rdv.collect_garbage() == 1
    assert rdv.mark(0) == (ID, 5, 0)
    assert _drain(rdv, "k") == [5]
    assert rdv.stats().bytes_used == 0 and only_me(rdv)


@pytest.mark.timeout(60)
def test_a_commit_already_received_keeps_the_mark(rdv, seg):
    rdv.set_mark(0, ID, 4, 0)
    pos = seg.next_pos
    rdv.send("k", np.array([5], dtype=np.uint64))
    assert _drain(rdv, "k") == [5]  # delivered and freed before the producer's death was noticed
    _dead_producer_changing(seg, 0, pos, prev=(ID, 4, 0), new=(ID, 5, 0))
    assert rdv.collect_garbage() == 1
    assert rdv.mark(0) == (ID, 5, 0)


@pytest.mark.timeout(60)
def test_died_linking_a_queued_message_under_the_slot_lock_keeps_the_mark(rdv, seg):
    rdv.send("k", np.array([1], dtype=np.uint64))  # the key's slot exists, one message queued
    rdv.set_mark(0, ID, 1, 0)
    pos, buf = _reserve(rdv, seg, "k", 2)
    # Past the commit point (QUEUED) with the slot lock held, not yet linked: repair keeps it.
    _block(seg, pos, QUEUED, DEAD + 1)
    _lock_slot_of(seg, rdv)
    _dead_producer_changing(seg, 0, pos, prev=(ID, 1, 0), new=(ID, 2, 0))
    del buf
    assert rdv.collect_garbage() == 1
    assert rdv.mark(0) == (ID, 2, 0)
    assert _drain(rdv, "k") == [1, 2]
    assert rdv.stats().bytes_used == 0


@pytest.mark.timeout(60)
def test_died_holding_the_slot_lock_before_the_commit_point_rolls_back(rdv, seg):
    rdv.send("k", np.array([1], dtype=np.uint64))
    rdv.set_mark(0, ID, 1, 0)
    pos, buf = _reserve(rdv, seg, "k", 2)
    _block(seg, pos, WRITING, DEAD + 1)  # took the lock, had not marked it QUEUED: repair drops it
    _lock_slot_of(seg, rdv)
    _dead_producer_changing(seg, 0, pos, prev=(ID, 1, 0), new=(ID, 2, 0))
    del buf
    assert rdv.collect_garbage() == 1
    assert rdv.mark(0) == (ID, 1, 0)
    assert _drain(rdv, "k") == [1]
    assert rdv.stats().bytes_used == 0


@pytest.mark.timeout(60)
def test_died_in_set_mark_rolls_back(rdv, seg):
    rdv.set_mark(0, ID, 4, 0)
    _dead_producer_changing(seg, 0, NO_MESSAGE, prev=(ID, 4, 0), new=(ID + 1, 0, 0))
    assert rdv.collect_garbage() == 1
    assert rdv.mark(0) == (ID, 4, 0)


@pytest.mark.timeout(60)
def test_reading_a_mark_reclaims_a_dead_writer_first(rdv, seg):
    rdv.set_mark(0, ID, 4, 0)
    pos, buf = _reserve(rdv, seg, "k", 5)
    _block(seg, pos, WRITING, DEAD + 1)
    _dead_producer_changing(seg, 0, pos, prev=(ID, 4, 0), new=(ID, 5, 0))
    del buf
    assert rdv.mark(1) == (0, 0, 0)  # another mark: no need to wait
    assert rdv.mark(0) == (ID, 4, 0)  # never the value of a change that did not happen
    assert rdv.stats().bytes_used == 0 and only_me(rdv)


def test_an_out_of_range_mark_record_is_damage(rdv, seg):
    struct.pack_into("<I", seg.mem, ENTRY + MARK_RECORD, MAX_MARKS + 1)
    with pytest.raises(shmrdv.SegmentMismatch, match="damaged"):
        shmrdv.Rendezvous(rdv.name, create=False)
    struct.pack_into("<I", seg.mem, ENTRY + MARK_RECORD, 0)


# ---- a producer SIGKILLed at random moments, restarted from its mark ----------------------

KILLS = 20


def produce_counting(name, key, mark_id):
    """Publish 1, 2, 3, ... under key, each with mark 0 = (mark_id, n, 0), starting after
    the value the mark holds; until killed (or 30 s)."""
    with shmrdv.Rendezvous(name, create=False) as rdv:
        _, n, _ = rdv.mark(0)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            n += 1
            with rdv.alloc(key, (1,), np.uint64, timeout=10, mark=(0, mark_id, n, 0)) as buf:
                buf[0] = n


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_producer_killed_at_random_delivers_each_message_exactly_once(rdv, children):
    rdv.set_mark(0, ID, 0, 0)
    rng = random.Random(20240611)
    received = []
    for _ in range(KILLS):
        before = rdv.mark(0)[1]
        child = children.start(produce_counting, rdv.name, "k", ID)
        wait_for(lambda: rdv.mark(0)[1] > before, "the producer to commit", timeout=30)
        time.sleep(rng.uniform(0, 0.02))
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        assert child.exitcode == -signal.SIGKILL
        received += _drain(rdv, "k")
    rdv.collect_garbage()
    mark_id, last, _ = rdv.mark(0)
    received += _drain(rdv, "k")
    assert mark_id == ID and last > KILLS
    assert received == list(range(1, last + 1))  # no gap, no duplicate, in order
    assert rdv.stats().bytes_used == 0 and only_me(rdv)
