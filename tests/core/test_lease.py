"""Leased receive: a message whose receiver dies before releasing it goes back to the head of
its key instead of being freed, so a forwarder (the network bridge) delivers at least once.

Real deaths (SIGKILL) first; then crash windows put in place through the segment's bytes, as
test_crash_windows does: a process-table entry that nobody holds, owning leased views, caught
in the middle of a pop or its reclaimer caught in the middle of giving them back."""
import os
import random
import struct
import threading
import time

import numpy as np
import pytest

import shmrdv
from shmrdv._binding import ffi, lib

from .. import workers
from ..conftest import MiB, kill_process, only_me, wait_for
from ..segment_bytes import (DEAD, DELIVERED, FLAGS, LEASED, MAX_KEYS, OWNER, QUEUED, SLOT_COUNT, SLOT_Q_HEAD,
                            SLOT_Q_TAIL, STAGE, Segment, granule_of)

QUEUE_TIMEOUT = 30
Q_HEAD, Q_TAIL, COUNT = SLOT_Q_HEAD, SLOT_Q_TAIL, SLOT_COUNT  # in a key slot




def _message(n):
    """Message n: its number, then bytes that depend on it (checked on arrival)."""
    return workers.payload(n, 2000 + 37 * n)


def _number(view):
    """The number of a message built by _message, or -1 if its bytes are wrong."""
    n = next((n for n in range(64) if len(view) == 2000 + 37 * n), -1)
    return n if n >= 0 and workers.checksum(view) == workers.checksum(_message(n)) else -1


def _drain(rdv, key, number=_number):
    got = []
    while (view := rdv.try_recv(key)) is not None:
        got.append(number(view))
        del view
    return got


def _value(view):
    return int(view[0])


# ---- the API ------------------------------------------------------------------------------


def test_a_released_leased_view_is_freed(rdv):
    for n in range(3):
        rdv.send("k", _message(n))
    view = rdv.recv("k", timeout=5, lease=True)
    assert _number(view) == 0
    other = rdv.try_recv("k", lease=True)
    assert _number(other) == 1
    derived = other[10:20]
    del view, other
    assert rdv.stats().pending_messages == 1
    del derived  # the lease ends with the last view of the block
    assert _drain(rdv, "k") == [2]
    stats = rdv.stats()
    assert stats.bytes_used == 0 and stats.keys == 0
    assert rdv.try_recv("k", lease=True) is None


def test_a_leased_recv_times_out_like_recv(rdv):
    with pytest.raises(shmrdv.RendezvousTimeout):
        rdv.recv("empty", timeout=0.01, lease=True)


# ---- a receiver killed holding leased views ------------------------------------------------


def lease_and_hold(name, key, count, queue):
    """Lease-receive count messages of key, report their numbers, and wait to be killed."""
    rdv = shmrdv.Rendezvous(name, create=False)
    views = [rdv.recv(key, timeout=workers.CHILD_TIMEOUT, lease=True) for _ in range(count)]
    queue.put([_number(v) for v in views])
    time.sleep(workers.CHILD_TIMEOUT)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("reclaim", ["collect_garbage", "attach"])
def test_a_killed_receiver_gives_its_leased_messages_back_first(rdv, children, reclaim):
    for n in range(5):
        rdv.send("k", _message(n))
    queue = children.context.Queue()
    child = children.start(lease_and_hold, rdv.name, "k", 3, queue)
    assert queue.get(timeout=QUEUE_TIMEOUT) == [0, 1, 2]
    rdv.send("k", _message(5))  # queued while the child holds its leases
    rdv.send("k", _message(6))
    held = [p for p in rdv.processes() if p.pid == child.pid]
    assert len(held) == 1 and held[0].views == 3
    kill_process(child)
    assert rdv.stats().pending_messages == 4
    if reclaim == "collect_garbage":
        assert rdv.collect_garbage() == 1
    else:
        with shmrdv.Rendezvous(rdv.name, create=False) as other:
            assert other.reclaimed_pids() == [child.pid]
    assert rdv.stats().pending_messages == 7
    assert _drain(rdv, "k") == [0, 1, 2, 3, 4, 5, 6]
    stats = rdv.stats()
    assert stats.bytes_used == 0 and stats.keys == 0 and only_me(rdv)


def lease_async_and_hold(name, key, count, queue):
    """Put count leased recv_async receivers of key in line, say so, then
    report the numbers they are served and wait to be killed."""
    rdv = shmrdv.Rendezvous(name, create=False)
    futures = [rdv.recv_async(key, lease=True) for _ in range(count)]
    queue.put("waiting")
    views = [f.result(timeout=workers.CHILD_TIMEOUT) for f in futures]
    queue.put([_number(v) for v in views])
    time.sleep(workers.CHILD_TIMEOUT)


@pytest.mark.timeout(60)
def test_messages_served_to_a_killed_leased_recv_async_go_back_first(rdv, children):
    queue = children.context.Queue()
    child = children.start(lease_async_and_hold, rdv.name, "k", 3, queue)
    assert queue.get(timeout=QUEUE_TIMEOUT) == "waiting"
    wait_for(lambda: rdv.stats().waiters == 3, "the receivers to wait")
    for n in range(5):  # each of the first three handed to a waiter, taken by the completion thread
        rdv.send("k", _message(n))
    assert queue.get(timeout=QUEUE_TIMEOUT) == [0, 1, 2]
    kill_process(child)
    assert rdv.collect_garbage() == 1
    assert _drain(rdv, "k") == [0, 1, 2, 3, 4]
    assert rdv.stats().bytes_used == 0 and only_me(rdv)


@pytest.mark.timeout(60)
def test_a_key_emptied_by_a_killed_receiver_comes_back_and_wakes_its_waiter(rdv, children):
    for n in range(2):
        rdv.send("k", _message(n))
    queue = children.context.Queue()
    child = children.start(lease_and_hold, rdv.name, "k", 2, queue)
    assert queue.get(timeout=QUEUE_TIMEOUT) == [0, 1]
    assert rdv.stats().keys == 0  # the key's slot went with its last message
    waiter = rdv.recv_async("k")
    wait_for(lambda: rdv.stats().waiters == 1, "the waiter to wait")
    kill_process(child)
    assert rdv.collect_garbage() == 1
    assert _number(waiter.result(timeout=10)) == 0
    del waiter  # and the view it holds
    assert _drain(rdv, "k") == [1]
    assert rdv.stats().bytes_used == 0


@pytest.mark.timeout(60)
def test_plain_views_of_a_killed_receiver_are_still_freed(rdv, children):
    for n in range(3):
        rdv.send("k", _message(n))
    queue = children.context.Queue()
    child = children.start(workers.hold_view_then_wait, rdv.name, "k", queue)
    queue.get(timeout=QUEUE_TIMEOUT)
    kill_process(child)
    assert rdv.collect_garbage() == 1
    assert _drain(rdv, "k") == [1, 2]  # at most once without a lease
    assert rdv.stats().bytes_used == 0


# ---- crash windows, forced through the segment's bytes -----------------------------------


def _send_values(rdv, key, values):
    for v in values:
        rdv.send(key, np.array([v], dtype=np.uint64))


def _lease_raw(rdv, key):
    """Lease-receive the oldest message of key with no view that would release it (a process
    that dies holding it): its block position."""
    kb = key.encode()
    info = ffi.new("struct rdv_msg_info *")
    assert lib.rdv_recv_leased(rdv._handle(), kb, len(kb), 0, info) == 0
    lib.rdv_unref(rdv._handle())  # the payload's reference: nobody releases this one
    return info.pos


def _block(seg, pos, stage=None, owner=None, flags=None):
    at = seg.block(granule_of(pos))
    for off, fmt, value in ((STAGE, "<B", stage), (OWNER, "<H", owner), (FLAGS, "<H", flags)):
        if value is not None:
            struct.pack_into(fmt, seg.mem, at + off, value)
    return struct.unpack_from("<B", seg.mem, at + STAGE)[0], struct.unpack_from("<HH", seg.mem, at + OWNER)


def _link(seg, pos, value=None):
    """A block's next link (granule + 1)."""
    at = seg.block(granule_of(pos))
    if value is not None:
        struct.pack_into("<I", seg.mem, at, value)
    return struct.unpack_from("<I", seg.mem, at)[0]


def _g(seg, pos):
    return granule_of(pos) + 1


def _live_slot(seg):
    index_off, slots = struct.unpack_from("<QQ", seg.mem, 24)
    live = [index_off + 64 * i for i in range(slots) if struct.unpack_from("<I", seg.mem, index_off + 64 * i + 8)[0] == 1]
    assert len(live) == 1
    return live[0]


def _dead_entry(seg):
    """Entry DEAD: registered (ALIVE) but nobody holds its lock."""
    seg.dead_entry()


def _to_dead(seg, *positions):
    """Make our leased views those of entry DEAD."""
    for pos in positions:
        stage, (_, flags) = _block(seg, pos)
        assert (stage, flags) == (DELIVERED, LEASED)
        _block(seg, pos, owner=DEAD + 1)
    _dead_entry(seg)


def _raise_max_keys(seg, n):
    seg.u64(MAX_KEYS, n)


def _leases_dropped(rdv):
    out = ffi.new("struct rdv_stats *")
    assert lib.rdv_stats(rdv._handle(), out) == 0
    return out.leases_dropped


@pytest.mark.timeout(60)
@pytest.mark.parametrize("held_lock", [False, True], ids=["idle", "reclaimer-died-before-the-commit-point"])
def test_leased_views_of_a_dead_entry_go_back_in_order(rdv, seg, held_lock):
    _send_values(rdv, "k", [0, 1, 2])
    leased = [_lease_raw(rdv, "k"), _lease_raw(rdv, "k")]
    _send_values(rdv, "k", [3])
    _to_dead(seg, *leased)
    if held_lock:
        # Its reclaimer had chained them onto the queue's head and died holding the slot
        # lock as the dead, before pointing the queue at them.
        _link(seg, leased[1], struct.unpack_from("<I", seg.mem, _live_slot(seg) + Q_HEAD)[0])
        struct.pack_into("<I", seg.mem, _live_slot(seg), DEAD + 1)
    assert rdv.collect_garbage() == 1
    assert [_block(seg, p) for p in leased] == [(QUEUED, (0, 0))] * 2
    assert _drain(rdv, "k", _value) == [0, 1, 2, 3]
    assert rdv.stats().bytes_used == 0 and only_me(rdv) and _leases_dropped(rdv) == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flipped", [0, 1, 2])
def test_a_reclaimer_that_died_after_the_commit_point_is_repaired_in_order(rdv, seg, flipped):
    _send_values(rdv, "k", [0, 1, 2])
    leased = [_lease_raw(rdv, "k"), _lease_raw(rdv, "k")]
    _to_dead(seg, *leased)
    # The queue already points at them (the pops left their links in place), the first
    # `flipped` are QUEUED again, count and tail not fixed yet; the lock names the dead.
    assert _link(seg, leased[0]) == _g(seg, leased[1])
    slot = _live_slot(seg)
    struct.pack_into("<I", seg.mem, slot + Q_HEAD, _g(seg, leased[0]))
    for pos in leased[:flipped]:
        _block(seg, pos, stage=QUEUED, owner=0, flags=0)
    struct.pack_into("<I", seg.mem, slot, DEAD + 1)
    assert rdv.collect_garbage() == 1
    assert struct.unpack_from("<I", seg.mem, slot + COUNT)[0] == 3
    assert _drain(rdv, "k", _value) == [0, 1, 2]
    assert rdv.stats().bytes_used == 0 and only_me(rdv)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("leased", [True, False])
def test_died_in_a_pop_before_unlinking(rdv, seg, leased):
    _send_values(rdv, "k", [0, 1])
    slot = _live_slot(seg)
    head = struct.unpack_from("<I", seg.mem, slot + Q_HEAD)[0] - 1  # a granule, as a position
    # Owner, flags and stage written, the queue not moved on yet, the slot lock held.
    _block(seg, head, stage=DELIVERED, owner=DEAD + 1, flags=LEASED if leased else 0)
    _dead_entry(seg)
    struct.pack_into("<I", seg.mem, slot, DEAD + 1)
    assert rdv.collect_garbage() == 1
    assert _drain(rdv, "k", _value) == ([0, 1] if leased else [1])  # kept in place, or freed
    assert rdv.stats().bytes_used == 0 and only_me(rdv)


@pytest.mark.timeout(60)
def test_leased_views_are_freed_in_an_aborted_rendezvous(rdv, seg):
    _send_values(rdv, "k", [0, 1, 2])
    leased = [_lease_raw(rdv, "k"), _lease_raw(rdv, "k")]
    _to_dead(seg, *leased)
    rdv.abort("stop")
    assert rdv.collect_garbage() == 1
    stats = rdv.stats()
    assert stats.bytes_used == 0 and stats.keys == 0 and stats.pending_messages == 0


@pytest.mark.timeout(60)
def test_a_lease_with_no_room_in_the_key_index_is_freed_and_counted(rdv_name):
    with shmrdv.Rendezvous(rdv_name, size=1 * MiB, max_keys=1, create=True) as rdv:  # 64 slots
        seg = Segment(rdv_name)
        try:
            _send_values(rdv, "k", [7])
            leased = _lease_raw(rdv, "k")  # its slot is deleted with its last message
            fillers = [f"f{i}" for i in range(64)]
            _send_values(rdv, fillers[0], [0])
            with pytest.raises(shmrdv.TooManyKeys):  # max_keys: 1
                rdv.send("one-too-many", np.zeros(1))
            # A message going back to its key may pass max_keys (it was live
            # before), up to a full index: fill every slot, as damage would.
            _raise_max_keys(seg, 64)
            for i, key in enumerate(fillers[1:], 1):
                _send_values(rdv, key, [i])
            with pytest.raises(shmrdv.TooManyKeys):  # no slot left at all
                rdv.send("one-too-many", np.zeros(1))
            _to_dead(seg, leased)
            assert rdv.collect_garbage() == 1
            assert _leases_dropped(rdv) == 1
            assert [_drain(rdv, key, _value) for key in fillers] == [[i] for i in range(64)]
            assert rdv.try_recv("k") is None and rdv.stats().bytes_used == 0
        finally:
            seg.close()


def _wrap_arena(rdv):
    """Send and receive enough to reuse the whole arena more than once."""
    for i in range(3 * rdv.capacity // (256 * 1024)):
        rdv.send("wrap", np.full(256 * 1024 // 8 - 64, i, dtype=np.uint64))
        assert rdv.recv("wrap", timeout=5)[0] == i


@pytest.mark.timeout(60)
def test_a_long_held_lease_goes_back_and_is_freed_when_received(rdv, seg):
    _send_values(rdv, "k", [0])
    leased = _lease_raw(rdv, "k")
    _wrap_arena(rdv)  # the space around the held view is reused, again and again
    _send_values(rdv, "k", [1])
    _to_dead(seg, leased)
    assert rdv.collect_garbage() == 1
    assert _block(seg, leased) == (QUEUED, (0, 0))
    # Leased again by one who dies too, given back again.
    assert _lease_raw(rdv, "k") == leased
    _to_dead(seg, leased)
    _send_values(rdv, "k", [2])
    assert rdv.collect_garbage() == 1
    view = rdv.recv("k", timeout=5, lease=True)
    assert _value(view) == 0
    del view
    assert _drain(rdv, "k", _value) == [1, 2]
    assert rdv.stats().bytes_used == 0
    _wrap_arena(rdv)
    assert rdv.stats().bytes_used == 0 and only_me(rdv)


@pytest.mark.timeout(60)
def test_leases_go_back_in_allocation_order_not_arena_order(rdv, seg):
    third = rdv.capacity // 3
    rdv.send("front", np.zeros(third // 8))  # the front of the arena
    _send_values(rdv, "k", [0])  # after it
    rest = rdv.stats().largest_free  # the rest of the arena, after the cursor
    rdv.send("back", np.zeros((rest - 256) // 8), timeout=5)  # fills it: nothing fits after it
    rdv.recv("front", timeout=5)  # dropped at once: the front is free again
    _send_values(rdv, "k", [1])  # allocated later, placed earlier
    leased = [_lease_raw(rdv, "k"), _lease_raw(rdv, "k")]
    assert granule_of(leased[1]) < granule_of(leased[0])
    _to_dead(seg, *leased)
    assert rdv.collect_garbage() == 1
    assert _drain(rdv, "k", _value) == [0, 1]
    rdv.recv("back", timeout=5)


# ---- a forwarder SIGKILLed over and over ------------------------------------------------

KILLS = 20


def forward_until_killed(name, key, log_path):
    """Lease-receive numbered messages, log each number, pass it on (a short sleep) and only
    then release it; until killed (or the timeout)."""
    with shmrdv.Rendezvous(name, create=False) as rdv:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        while True:
            view = rdv.recv(key, timeout=workers.CHILD_TIMEOUT, lease=True)
            n = int(view[0]) if int(view[1]) == 3 * int(view[0]) + 1 else 0
            os.write(fd, struct.pack("<Q", n))
            time.sleep(0.0005)  # the far side acknowledges
            del view


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_forwarder_killed_over_and_over_loses_nothing(rdv, children, tmp_path):
    stop = threading.Event()
    produced = []

    def produce():  # keeps a few hundred messages queued
        n = 0
        while not stop.is_set():
            if rdv.stats().pending_messages > 200:
                time.sleep(0.001)
                continue
            n += 1
            rdv.send("k", np.array([n, 3 * n + 1] + [n] * 30, dtype=np.uint64), timeout=10)
            produced.append(n)

    producer = threading.Thread(target=produce)
    producer.start()
    rng = random.Random(20260611)
    logs = []
    try:
        for k in range(KILLS):
            log = tmp_path / f"forwarder-{k}.log"
            logs.append(log)
            child = children.start(forward_until_killed, rdv.name, "k", str(log))
            wait_for(lambda: log.exists() and log.stat().st_size >= 8, "the forwarder to forward")
            time.sleep(rng.uniform(0, 0.05))
            kill_process(child)
    finally:
        stop.set()
        producer.join(30)
    rdv.collect_garbage()
    forwarded = []
    for log in logs:
        data = log.read_bytes()
        forwarded += [n for (n,) in struct.iter_unpack("<Q", data[: len(data) // 8 * 8])]
    drained = _drain(rdv, "k", _value)
    again = len(forwarded) + len(drained) - len(produced)
    print(f"\nforwarder kill loop: {KILLS} kills, {len(produced)} messages, {again} forwarded again")
    assert 0 not in forwarded  # no payload arrived damaged
    assert drained == sorted(set(drained))  # no duplicate in the queue, in order
    assert set(forwarded) | set(drained) == set(produced)  # nothing lost
    # At least once: a number comes again only after a forwarder was killed holding it (which
    # most kills are: it holds a view most of the time).
    assert 0 < again <= KILLS
    # Given back at the head: every forwarder went on from where the last one stopped.
    assert forwarded + drained == sorted(forwarded + drained)
    stats = rdv.stats()
    assert (stats.bytes_used, stats.pending_messages, stats.keys) == (0, 0, 0) and only_me(rdv)
