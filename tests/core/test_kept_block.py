"""The kept block (csrc/rdv_arena.c): a handle that releases the view of a small message keeps
its block for its next send. What must hold: the next send reuses it; nothing counts it as
used or as a view; a producer short of space frees it, in any process, and is never left
waiting while one is kept; the keeper's close or death frees it; a leased view once released
is not given back when its receiver dies."""
import contextlib
import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest

import shmrdv

from ..conftest import fill
from ..segment_bytes import (
    BUSY, CTL_SPACE_WANTING, DELIVERED, DROPPING, GRANULE_BITS, KEPT, KEPT_POS, MSG_POS, OWNER, STAGE,
    Segment, granule_of, kind,
)

KiB = 1024


def _kept(seg):
    """[(entry, granule)] of the blocks kept now, as the process table names them."""
    out = []
    for i in range(128):
        kept = seg.u64(seg.entry(i) + KEPT_POS)  # the block's position + 1
        if kept:
            out.append((i, granule_of(kept - 1)))
    return out


def _wanting(seg):
    """The entries whose producers are short of space, as the bits say."""
    bits = seg.ctl(CTL_SPACE_WANTING, size=8) | seg.ctl(CTL_SPACE_WANTING + 8, size=8) << 64
    return [i for i in range(128) if bits >> i & 1]


def _block_is_kept(seg, g, entry):
    at = seg.block(g)
    owner_and_flags = seg.u32(at + OWNER)  # two u16: owner, then flags
    return (kind(seg.side(g)) == BUSY and seg.mem[at + STAGE] == DELIVERED
            and owner_and_flags == (KEPT << 16 | (entry + 1)))


def _receive_and_release(rdv, key, timeout):
    assert rdv.recv(key, timeout=timeout) is not None  # the view is dropped at once


def test_a_released_view_is_kept_and_the_next_send_reuses_its_block(rdv, seg):
    rdv.send("k", np.arange(16, dtype=np.float32))
    view = rdv.recv("k", timeout=5)
    assert _kept(seg) == []  # a view held is no kept block
    del view
    [(entry, g)] = _kept(seg)
    assert _block_is_kept(seg, g, entry)
    old_pos = seg.u64(seg.block(g) + MSG_POS)
    rdv.send("k", np.full(16, 7, np.float32))  # written into the kept block
    assert _kept(seg) == []
    new_pos = seg.u64(seg.block(g) + MSG_POS)
    assert granule_of(new_pos) == g and seg.mem[seg.block(g) + STAGE] != DELIVERED
    # a new allocation number: positions stay unique (leases order by them, stale ones are refused)
    assert new_pos >> GRANULE_BITS > old_pos >> GRANULE_BITS
    assert rdv.recv("k", timeout=5)[3] == 7


def test_a_kept_block_counts_as_free_space_and_as_no_view(rdv, seg):
    for i in range(3):
        rdv.send("k", np.full(100, i, np.int32))
        assert rdv.recv("k", timeout=5)[0] == i
    assert len(_kept(seg)) == 1
    st = rdv.stats()
    assert (st.bytes_used, st.live_blocks, st.bytes_free, st.largest_free) == (0, 0, rdv.capacity, rdv.capacity)
    [me] = [p for p in rdv.processes() if p.pid == os.getpid()]
    assert me.views == 0 and me.writing == 0
    seg.check_allocator()


def test_a_message_too_big_for_the_kept_block_is_cut_from_the_free_lists(rdv, seg):
    rdv.send("k", np.zeros(16, np.float32))
    _receive_and_release(rdv, "k", 5)
    [kept] = _kept(seg)
    rdv.send("big", np.zeros(1000, np.float32))  # 4 KiB does not fit the block of 64 B: it stays kept
    assert _kept(seg) == [kept]
    assert rdv.recv("big", timeout=5).shape == (1000,)


def test_large_messages_are_never_kept(rdv, seg):
    rdv.send("k", np.zeros(64 * KiB, np.uint8))
    _receive_and_release(rdv, "k", 5)
    assert _kept(seg) == []
    assert rdv.stats().largest_free == rdv.capacity


@pytest.mark.timeout(60)
def test_a_producer_short_of_space_frees_the_block_another_process_keeps(rdv_name):
    with shmrdv.Rendezvous(rdv_name, size=64 * KiB, create=True) as rdv:
        try:
            rdv.send("small", np.zeros(16, np.float32))
            with _keeper(rdv_name):
                seg = Segment(rdv_name)
                try:
                    assert len(_kept(seg)) == 1  # the child's
                    # a message whose block needs the whole arena (128 B of it its header):
                    # it fits only once the kept block is freed
                    room = rdv.capacity - 128
                    rdv.send("whole", np.zeros(room, np.uint8), timeout=5)
                    assert _kept(seg) == []
                finally:
                    seg.close()
                assert rdv.recv("whole", timeout=5).nbytes == room
        finally:
            rdv.unlink()


@contextlib.contextmanager
def _keeper(name):
    """A child that receives "small", keeps its block and waits; it must exit cleanly."""
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_keep_one_and_wait, args=(name, ready, done))
    child.start()
    try:
        assert ready.wait(30)
        yield
    finally:
        done.set()
        child.join(30)
    assert child.exitcode == 0


def _keep_one_and_wait(name, ready, done):
    with shmrdv.Rendezvous(name, create=False) as rdv:
        _receive_and_release(rdv, "small", 10)
        ready.set()
        done.wait(30)


@pytest.mark.timeout(60)
def test_a_view_released_while_a_producer_waits_for_space_is_freed_not_kept(rdv_name):
    """The handshake: once a producer (in another process, asleep) waits for space, a
    release frees, and wakes it, instead of keeping the block from it."""
    ctx = multiprocessing.get_context("fork")
    with shmrdv.Rendezvous(rdv_name, size=64 * KiB, create=True) as rdv:
        try:
            n = fill(rdv, "fill", np.zeros(200, np.uint8))  # blocks of 384 B: kept if nobody wanted space
            seg = Segment(rdv_name)
            try:
                producer = ctx.Process(target=_send_late, args=(rdv_name,))
                producer.start()
                deadline = time.monotonic() + 10
                while not _wanting(seg) and time.monotonic() < deadline:
                    time.sleep(0.001)
                assert len(_wanting(seg)) == 1
                time.sleep(0.2)  # past its spin: asleep on the space word
                _receive_and_release(rdv, "fill", 5)  # the one release that makes room
                assert _kept(seg) == []  # freed at once (a kept block would wait for the producer's next look)
                producer.join(20)
                assert producer.exitcode == 0
                assert _wanting(seg) == [] and _kept(seg) == []
            finally:
                seg.close()
            assert rdv.stats().pending_messages == n
        finally:
            rdv.unlink()


def _send_late(name):
    with shmrdv.Rendezvous(name, create=False) as rdv:
        rdv.send("late", np.zeros(200, np.uint8), timeout=15)


@pytest.mark.timeout(60)
def test_closing_frees_the_kept_block(rdv, seg):
    other = shmrdv.Rendezvous(rdv.name, create=False)
    rdv.send("k", np.zeros(16, np.float32))
    _receive_and_release(other, "k", 5)
    [(entry, g)] = _kept(seg)
    other.close()
    assert _kept(seg) == [] and kind(seg.side(g)) != BUSY
    seg.check_allocator()


@pytest.mark.timeout(60)
def test_a_dead_keeper_s_block_is_freed_and_a_leased_view_it_released_is_not_given_back(rdv, seg):
    ctx = multiprocessing.get_context("fork")
    rdv.send("leased", np.arange(16, dtype=np.float32))
    ready = ctx.Event()
    child = ctx.Process(target=_release_leased_then_hang, args=(rdv.name, ready))
    child.start()
    try:
        assert ready.wait(30)
        [(entry, g)] = _kept(seg)
        assert _block_is_kept(seg, g, entry)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
    assert rdv.collect_garbage() >= 1
    assert _kept(seg) == [] and kind(seg.side(g)) != BUSY
    assert rdv.try_recv("leased") is None  # released before the death: consumed, not redelivered
    assert rdv.stats().bytes_used == 0
    seg.check_allocator()


def _release_leased_then_hang(name, ready):
    rdv = shmrdv.Rendezvous(name, create=False)
    view = rdv.recv("leased", timeout=10, lease=True)
    assert view[3] == 3
    del view
    ready.set()
    time.sleep(60)


@pytest.mark.timeout(60)
def test_a_producer_killed_while_waiting_for_space_is_taken_out_of_the_count(rdv_name):
    ctx = multiprocessing.get_context("fork")
    with shmrdv.Rendezvous(rdv_name, size=64 * KiB, create=True) as rdv:
        try:
            rdv.send("fill", np.zeros(rdv.capacity - 256, np.uint8))
            child = ctx.Process(target=_send_forever, args=(rdv_name,))
            child.start()
            seg = Segment(rdv_name)
            try:
                deadline = time.monotonic() + 10
                while not _wanting(seg) and time.monotonic() < deadline:
                    time.sleep(0.001)
                assert len(_wanting(seg)) == 1
                os.kill(child.pid, signal.SIGKILL)
                child.join(30)
                assert rdv.collect_garbage() == 1
                assert _wanting(seg) == []
                _receive_and_release(rdv, "fill", 5)
                rdv.send("k", np.zeros(16, np.float32))
                _receive_and_release(rdv, "k", 5)
                assert len(_kept(seg)) == 1  # keeping works again
            finally:
                seg.close()
        finally:
            rdv.unlink()


def _send_forever(name):
    with shmrdv.Rendezvous(name, create=False) as rdv:
        rdv.send("more", np.zeros(1024, np.uint8))


def test_threads_keeping_and_reusing_lose_nothing(rdv, seg):
    """Four threads ping-pong through one handle: every exchange of kept_pos is atomic."""
    rounds = 2000

    def pair(i):
        for r in range(rounds):
            rdv.send(f"a{i}", np.full(4, r, np.int64))
            assert rdv.recv(f"a{i}", timeout=10)[0] == r

    threads = [threading.Thread(target=pair, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert len(_kept(seg)) <= 1
    st = rdv.stats()
    assert (st.bytes_used, st.pending_messages, st.largest_free) == (0, 0, rdv.capacity)
    seg.check_allocator()


def test_a_kept_block_is_neither_released_nor_given_back_again(rdv, seg):
    """A stale payload of a block that is kept now is refused: the C calls say -EINVAL."""
    from shmrdv._native import ffi, lib

    rdv.send("k", np.arange(16, dtype=np.float32))
    view = rdv.recv("k", timeout=5)
    payload = ffi.cast("void *", view.ctypes.data)
    h = rdv._handle()
    del view
    [(entry, g)] = _kept(seg)
    assert lib.rdv_give_back(h, payload) == -22  # EINVAL
    assert lib.rdv_release_payload(h, payload) == -22
    assert _kept(seg) == [(entry, g)] and _block_is_kept(seg, g, entry)
    assert rdv.try_recv("k") is None


def _taken_by_the_dead(seg, g, dead=100):
    """The state a producer short of space leaves when it dies between its CAS of a kept
    block's position (to a new allocation number, recorded in its entry first) and the free."""
    seg.dead_entry(dead)
    old = seg.u64(seg.block(g) + MSG_POS)
    new = (old >> GRANULE_BITS) + (1 << 20) << GRANULE_BITS | g  # a number nothing else has
    seg.u64(seg.entry(dead) + DROPPING, new + 1)
    seg.u64(seg.block(g) + MSG_POS, new)
    return dead


@pytest.mark.timeout(60)
def test_a_process_killed_while_freeing_another_s_kept_block_leaves_it_to_its_reclaimer(rdv_name):
    """The keeper is alive and still points at the block; the dead taker's reclaimer frees
    it, by the position the taker recorded."""
    with shmrdv.Rendezvous(rdv_name, size=1024 * KiB, create=True) as rdv:
        try:
            rdv.send("small", np.zeros(16, np.float32))
            with _keeper(rdv_name):
                seg = Segment(rdv_name)
                try:
                    [(entry, g)] = _kept(seg)
                    dead = _taken_by_the_dead(seg, g)
                    assert rdv.collect_garbage() == 1
                    assert kind(seg.side(g)) != BUSY and seg.u64(seg.entry(dead) + DROPPING) == 0
                    assert rdv.stats().bytes_used == 0
                    seg.check_allocator()
                finally:
                    seg.close()
        finally:
            rdv.unlink()


@pytest.mark.timeout(60)
def test_a_keeper_whose_block_was_taken_sends_from_the_free_lists(rdv, seg):
    """The position decides, not kept_pos: a keeper whose block another process took (and
    has not freed yet) leaves it alone."""
    rdv.send("k", np.zeros(16, np.float32))
    _receive_and_release(rdv, "k", 5)
    [(entry, g)] = _kept(seg)
    taken = _taken_by_the_dead(seg, g)
    rdv.send("k", np.full(16, 3, np.float32))
    assert _kept(seg) == []
    assert rdv.recv("k", timeout=5)[0] == 3
    assert seg.u64(seg.block(g) + MSG_POS) == seg.u64(seg.entry(taken) + DROPPING) - 1  # untouched
    assert rdv.collect_garbage() == 1
    assert kind(seg.side(g)) != BUSY
    seg.check_allocator()
