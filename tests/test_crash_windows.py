"""A process killed between the atomic steps of an arena operation: reserving at the tail
(claim, tail move, publish) or reclaiming at the head (claim, head move, clear). The segment
is put in the state such a death leaves, through its bytes (a test knows the layout), and
the rendezvous must finish or undo the dead process's step and go on."""
import mmap
import struct

import numpy as np
import pytest

from .conftest import segment_path

DEAD = 100  # a process-table entry that no live process holds
GRANULE = 64
CLAIM = 0xC0000000
FREE = 0x80000000
OP_ALLOC, OP_RECLAIM = 1, 2


class Segment:
    def __init__(self, name):
        self._file = open(segment_path(name), "r+b")
        self.mem = mmap.mmap(self._file.fileno(), 0)
        self.side_off, self.arena_off, self.cap = struct.unpack_from("<QQQ", self.mem, 40)

    def close(self):
        self.mem.close()
        self._file.close()

    def u64(self, off, value=None):
        if value is not None:
            struct.pack_into("<Q", self.mem, off, value)
        return struct.unpack_from("<Q", self.mem, off)[0]

    def side(self, pos, value=None):
        off = self.side_off + 4 * ((pos % self.cap) // GRANULE)
        if value is not None:
            struct.pack_into("<I", self.mem, off, value)
        return struct.unpack_from("<I", self.mem, off)[0]

    @property
    def tail(self):
        return self.u64(128)

    @tail.setter
    def tail(self, value):
        self.u64(128, value)

    @property
    def head(self):
        return self.u64(192)

    def dead_process_in_step(self, kind, pos, val):
        """Entry DEAD: registered (ALIVE) but nobody holds its lock, mid-step."""
        entry = 4096 + 256 * DEAD
        struct.pack_into("<II", self.mem, entry, 1, 999_999)  # state ALIVE, pid
        struct.pack_into("<IIQ", self.mem, entry + 16, kind, val, pos)


@pytest.fixture
def seg(rdv):
    s = Segment(rdv.name)
    yield s
    s.close()


def _round_trip(rdv, n=20):
    for i in range(n):
        rdv.send("after", np.full(1000, i))
        assert rdv.recv("after", timeout=5)[0] == i


@pytest.mark.timeout(60)
def test_died_after_claiming_the_tail(rdv, seg):
    rdv.send("warm", np.arange(10))
    rdv.recv("warm", timeout=5)
    t = seg.tail
    seg.dead_process_in_step(OP_ALLOC, t, 4)
    seg.side(t, CLAIM | DEAD)
    _round_trip(rdv)  # the next producer waits on the claim, finds it dead, undoes it
    assert rdv.stats().bytes_used == 0 and seg.side(t) != CLAIM | DEAD


@pytest.mark.timeout(60)
def test_died_after_moving_the_tail(rdv, seg):
    t = seg.tail
    seg.dead_process_in_step(OP_ALLOC, t, 4)
    seg.side(t, CLAIM | DEAD)
    seg.tail = t + 4 * GRANULE  # its reservation, never published
    assert rdv.collect_garbage() == 1
    assert seg.side(t) == 4 | FREE or seg.head > t  # published as free padding (maybe passed already)
    _round_trip(rdv)
    assert rdv.stats().bytes_used == 0


@pytest.mark.timeout(60)
def test_died_claiming_a_free_block_behind_a_pending_one(rdv, seg):
    rdv.send("first", np.arange(100))  # pending at the head: the ring cannot pass it
    rdv.send("second", np.arange(100))
    rdv.recv("second", timeout=5)  # freed, behind "first"
    second = next(p for p in range(seg.head, seg.tail, GRANULE) if seg.side(p) & FREE)
    value = seg.side(second)
    # It read a stale head, claimed this FREE entry, and died before its head CAS failed.
    seg.dead_process_in_step(OP_RECLAIM, second, value)
    seg.side(second, CLAIM | DEAD)
    assert rdv.collect_garbage() == 1
    assert seg.side(second) == value  # given back
    rdv.recv("first", timeout=5)
    assert rdv.stats().bytes_used == 0  # both reclaimed


@pytest.mark.timeout(60)
def test_died_after_moving_the_head(rdv, seg):
    rdv.send("k", np.arange(100))
    rdv.recv("k", timeout=5)
    behind = seg.head - GRANULE  # behind the head now
    seg.dead_process_in_step(OP_RECLAIM, behind, 1 | FREE)
    seg.side(behind, CLAIM | DEAD)
    assert rdv.collect_garbage() == 1
    assert seg.side(behind) == 0  # its claim cleared
    # Wrap the ring round past that granule.
    for i in range(4 * rdv.capacity // (64 * 1024)):
        rdv.send("wrap", np.zeros(8 * 1024))
        rdv.recv("wrap", timeout=5)
    assert rdv.stats().bytes_used == 0
