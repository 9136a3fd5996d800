"""The arena as a heap: any number of live blocks, freed in any order.

The ring it replaced held at most 64 "islands" of live blocks: a 65th
message left pending, or a producer stopped inside ``alloc``, or a bridge
peer that stops mid-message, could stall every other stream through the
segment. Here: none of them stalls a stream that laps the arena many times,
and ``stats()`` tells the truth about what is live and what is free."""
import os
import random
import signal
import socket
import time

import numpy as np
import pytest

import shmrdv
from shmrdv.bridge import auth, protocol
from shmrdv.bridge.protocol import Frame

from ..bridge.bridges import BridgeProc, write_token
from ..conftest import MiB, kill_process, wait_for

GRANULE = 64
MIN_BLOCK = 4 * GRANULE  # RDV_MIN_BLOCK granules
HEADER = 64  # sizeof(struct rdv_msg)
STREAM_WORDS = 512  # a 4 KiB int64 message
SEND_TIMEOUT = 5.0  # every send of a stream must get through within this
RECV_TIMEOUT = 10.0
TOKEN = "arena v3 token"


def round_up(n: int, to: int = GRANULE) -> int:
    return -(-n // to) * to


def meta_bytes(ndim: int, key_len: int) -> int:
    """rdv_meta_bytes (csrc/rdv_queue.c): header, shape and strides, key and
    the block's position, rounded up to a granule; the payload starts here."""
    return round_up(HEADER + 16 * ndim + key_len + 8)


def block_bytes(key: str, shape, dtype) -> int:
    """The block rdv_arena_alloc cuts for a message: meta + payload rounded up
    to a granule, at least RDV_MIN_BLOCK granules. (It may take up to three
    granules more when the free block's remainder would be too small to list:
    see carve() in csrc/rdv_arena.c.)"""
    shape = tuple(shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return max(MIN_BLOCK, meta_bytes(len(shape), len(key.encode())) + round_up(nbytes))


def stream_message(i: int) -> np.ndarray:
    return np.arange(STREAM_WORDS, dtype=np.int64) ^ (i * 0x9E3779B97F4A7C15 % (1 << 62))


STREAM_BLOCK = block_bytes("stream", (STREAM_WORDS,), np.int64)


def assert_consistent(st) -> None:
    assert st.bytes_used + st.waiter_bytes + st.bytes_free == st.capacity, st
    assert 0 <= st.largest_free <= st.bytes_free, st
    assert st.largest_free % GRANULE == 0 and st.bytes_used % GRANULE == 0, st


def process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


# ---- children (module level, for "spawn") ------------------------------------------------


def stream_producer(name, key, count, queue):
    """Send `count` 4 KiB messages; report ("sent", count) or where a send stalled."""
    rdv = shmrdv.Rendezvous(name, create=False)
    try:
        for i in range(count):
            t0 = time.monotonic()
            try:
                rdv.send(key, stream_message(i), timeout=SEND_TIMEOUT)
            except shmrdv.RendezvousTimeout:
                queue.put(("stalled", i, time.monotonic() - t0, rdv.stats()))
                return
        queue.put(("sent", count))
    finally:
        rdv.close()


def stream_consumer(name, key, count, queue):
    """Receive `count` stream messages and check each; report ("received", count, bad)."""
    rdv = shmrdv.Rendezvous(name, create=False)
    bad = []
    try:
        for i in range(count):
            try:
                view = rdv.recv(key, timeout=RECV_TIMEOUT)
            except shmrdv.RendezvousTimeout:
                queue.put(("starved", i, rdv.stats()))
                return
            if not np.array_equal(view, stream_message(i)):
                bad.append(i)
            del view
        queue.put(("received", count, bad))
    finally:
        rdv.close()


def alloc_and_wait(name, key, nbytes, inside, go, queue):
    """Open an alloc, write its first half, say so, wait for `go`, write the rest, publish."""
    rdv = shmrdv.Rendezvous(name, create=False)
    with rdv.alloc(key, (nbytes,), np.uint8, timeout=RECV_TIMEOUT) as buf:
        buf[: nbytes // 2] = 0xA5
        inside.set()
        if not go.wait(60):
            raise TimeoutError("never told to go on")
        buf[nbytes // 2 :] = 0x5A
    queue.put("published")
    rdv.close()


def consume_stream_in_parent(rdv, key, count, check_every=100, pending_floor=0, floor_blocks=0):
    """Receive `count` stream messages here, checking each and, now and then,
    that the stats add up and never fall below what is known to stay live."""
    for i in range(count):
        view = rdv.recv(key, timeout=RECV_TIMEOUT)
        assert np.array_equal(view, stream_message(i)), f"stream message {i} corrupted"
        del view
        if i % check_every == 0:
            st = rdv.stats()
            assert_consistent(st)
            assert st.bytes_used >= pending_floor and st.live_blocks >= floor_blocks, st


def expect(queue, first, timeout=120.0):
    report = queue.get(timeout=timeout)
    assert report[0] == first, report
    return report


# ---- (1) the issue: 65 pending messages no longer stall a stream ------------------------------


@pytest.mark.timeout(180)
def test_65_pending_messages_do_not_stall_a_stream(rdv_name, children):
    """The issue's reproduction: 65 messages left pending under distinct keys
    (one more island than the ring held), scattered over a 1 MiB arena with
    holes between them, then 2,000 4 KiB messages streamed between two
    processes (8 laps of the arena): every send gets through in seconds and
    the stats count the 65, not the capacity."""
    rdv = shmrdv.Rendezvous(rdv_name, size=1 * MiB, create=True)
    try:
        pending_bytes = 0
        for i in range(65):
            key = f"pending/{i:02d}"
            rdv.send(key, np.full(1000, i, dtype=np.uint8))
            pending_bytes += block_bytes(key, (1000,), np.uint8)
            rdv.send("filler", np.zeros(8192 - 128 * (i % 3), dtype=np.uint8))  # a hole, once received
        while rdv.try_recv("filler") is not None:
            pass
        st = rdv.stats()
        assert_consistent(st)
        assert (st.pending_messages, st.live_blocks, st.bytes_used) == (65, 65, pending_bytes)
        assert st.bytes_used < st.capacity // 8

        count = 2000
        assert count * STREAM_BLOCK > 8 * st.capacity  # several laps
        queue = children.context.Queue()
        children.start(stream_producer, rdv_name, "stream", count, queue)
        t0 = time.monotonic()
        consume_stream_in_parent(rdv, "stream", count, pending_floor=pending_bytes, floor_blocks=65)
        expect(queue, "sent", timeout=30)
        children.join(30)
        elapsed = time.monotonic() - t0

        st = rdv.stats()
        assert_consistent(st)
        assert (st.pending_messages, st.keys, st.live_blocks, st.bytes_used) == (65, 65, 65, pending_bytes), st
        assert st.bytes_free == st.capacity - pending_bytes
        for i in range(65):  # still there, intact, in any order
            key = f"pending/{64 - i:02d}"
            assert np.array_equal(rdv.recv(key, timeout=0), np.full(1000, 64 - i, dtype=np.uint8))
        st = rdv.stats()
        assert (st.bytes_used, st.live_blocks, st.largest_free) == (0, 0, st.capacity), st
        assert elapsed < 60, f"2000 messages took {elapsed:.1f} s"
    finally:
        rdv.close()
        rdv.unlink()


# ---- (2) a producer stopped inside alloc holds only its own block ---------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("then", ["cont", "kill"])
def test_a_stopped_producer_holds_only_its_block(rdv_name, children, then):
    """A child SIGSTOPped inside ``with rdv.alloc(...)``: two other processes
    stream 3,000 4 KiB messages (24 laps of a 512 KiB arena) past its block.
    SIGCONT: it finishes and its message arrives intact. SIGKILL instead: its
    block comes back once the dead are reclaimed (the next attach)."""
    rdv = shmrdv.Rendezvous(rdv_name, size=512 << 10, create=True)
    try:
        nbytes = 48 << 10
        held = block_bytes("stopped", (nbytes,), np.uint8)
        ctx = children.context
        inside, go, queue = ctx.Event(), ctx.Event(), ctx.Queue()
        rdv.send("ahead", np.zeros(200 << 10, dtype=np.uint8))  # so the held block lands mid-arena
        producer = children.start(alloc_and_wait, rdv_name, "stopped", nbytes, inside, go, queue)
        assert inside.wait(30), "the producer never got inside its alloc"
        rdv.recv("ahead", timeout=0)  # its view is dropped at once
        os.kill(producer.pid, signal.SIGSTOP)
        wait_for(lambda: process_state(producer.pid) == "T", "the producer to stop", 10)
        st = rdv.stats()
        assert (st.live_blocks, st.bytes_used, st.pending_messages) == (1, held, 0), st

        count = 3000
        assert count * STREAM_BLOCK > 20 * st.capacity
        results = ctx.Queue()
        t0 = time.monotonic()
        children.start(stream_producer, rdv_name, "stream", count, results)
        children.start(stream_consumer, rdv_name, "stream", count, results)
        reports = sorted([results.get(timeout=120), results.get(timeout=120)], key=lambda r: r[0])
        elapsed = time.monotonic() - t0
        assert reports[0] == ("received", count, []) and reports[1] == ("sent", count), reports
        assert process_state(producer.pid) == "T"  # stopped throughout

        st = rdv.stats()  # the stream's blocks are all back; the stopped one is still held
        assert_consistent(st)
        assert (st.live_blocks, st.bytes_used, st.pending_messages) == (1, held, 0), st
        me = {p.pid: p for p in rdv.processes()}
        assert me[producer.pid].alive and me[producer.pid].writing == 1  # stopped is not dead

        if then == "cont":
            os.kill(producer.pid, signal.SIGCONT)
            go.set()
            assert queue.get(timeout=30) == "published"
            got = rdv.recv("stopped", timeout=RECV_TIMEOUT)
            assert got.shape == (nbytes,)
            assert np.all(got[: nbytes // 2] == 0xA5) and np.all(got[nbytes // 2 :] == 0x5A)
            del got
            children.join(30)
        else:
            kill_process(producer)
            st = rdv.stats()
            assert (st.live_blocks, st.bytes_used) == (1, held), st  # nobody has looked yet
            with shmrdv.Rendezvous(rdv_name, create=False) as second:  # attaching reclaims the dead
                assert producer.pid in second.reclaimed_pids()
            assert rdv.try_recv("stopped") is None  # never published
        st = rdv.stats()
        assert_consistent(st)
        assert (st.bytes_used, st.live_blocks, st.pending_messages, st.largest_free) == (0, 0, 0, st.capacity), st
        assert elapsed < 90, f"the stream took {elapsed:.1f} s"
    finally:
        rdv.close()
        rdv.unlink()


# ---- (3) a bridge peer that goes silent mid-message ---------------------------------------------


def raw_link(bridge: BridgeProc, origin: int) -> socket.socket:
    """A socket authenticated to `bridge` the way a peer bridge's link is."""
    sock = socket.create_connection((bridge.host, bridge.port), timeout=10)
    reader = protocol.Reader(sock)
    _cap, server_nonce = protocol.parse_hello(reader.expect(Frame.HELLO))
    nonce = auth.nonce()
    proof = auth.client_proof(TOKEN.encode(), server_nonce, nonce, origin, 1)
    sock.sendall(protocol.auth(protocol.Role.LINK, origin, 1, nonce, proof))
    reader.expect(Frame.WELCOME)
    return sock


@pytest.mark.timeout(240)
def test_a_silent_bridge_peer_does_not_stall_local_traffic(rdv_name, children, tmp_path):
    """A peer announces a 4 MiB message, sends part of its first DATA frame
    and goes silent with the socket open. The bridge holds the 4 MiB block it
    reserved for it, and nothing else: 6,000 local 4 KiB messages (3 laps of
    the 8 MiB arena) flow past it, and another peer still gets through."""
    rdv = shmrdv.Rendezvous(rdv_name, size=8 * MiB, create=True)
    bridge = None
    sock = None
    try:
        bridge = BridgeProc(rdv_name, token_file=write_token(tmp_path / "token", TOKEN),
                            log_path=str(tmp_path / "bridge.log")).start()
        sock = raw_link(bridge, origin=0x51_1E_47)
        big = 4 * MiB
        held = block_bytes("stalled", (big,), np.uint8)
        rdv.send("ahead", np.zeros(2 * MiB, dtype=np.uint8))  # so the reserved block lands mid-arena
        sock.sendall(protocol.encode_meta(Frame.MSG, 1, b"stalled", b"|u1", (big,), big)
                     + protocol.header(Frame.DATA, protocol.CHUNK, 1) + b"\x11" * (protocol.CHUNK // 4))
        wait_for(lambda: rdv.stats().live_blocks == 2, "the bridge to reserve the announced block", 20)
        rdv.recv("ahead", timeout=0)  # its view is dropped at once
        st = rdv.stats()
        assert (st.bytes_used, st.pending_messages) == (held, 0), st
        writers = [p for p in rdv.processes() if p.writing]
        assert [p.pid for p in writers] == [bridge.proc.pid], writers

        count = 6000
        assert count * STREAM_BLOCK > 3 * st.capacity
        queue = children.context.Queue()
        children.start(stream_producer, rdv_name, "local", count, queue)
        t0 = time.monotonic()
        consume_stream_in_parent(rdv, "local", count, pending_floor=held, floor_blocks=1)
        expect(queue, "sent", timeout=30)
        children.join(30)
        elapsed = time.monotonic() - t0

        with shmrdv.connect(bridge.url, token=TOKEN) as other:  # another peer, meanwhile
            other.send("healthy", np.arange(5))
        assert np.array_equal(rdv.recv("healthy", timeout=RECV_TIMEOUT), np.arange(5))

        assert bridge.proc.poll() is None, bridge.logs()
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):  # the bridge neither answered nor hung up
            sock.recv(1)
        st = rdv.stats()  # the silent peer's block is still reserved, and only it
        assert_consistent(st)
        assert (st.live_blocks, st.bytes_used, st.pending_messages) == (1, held, 0), st
        assert elapsed < 150, f"6000 messages took {elapsed:.1f} s"

        sock.close()  # the peer hangs up: the bridge frees the half-received block
        sock = None
        wait_for(lambda: rdv.stats().bytes_used == 0, "the bridge to free the abandoned block", 20)
        assert rdv.try_recv("stalled") is None
    finally:
        if sock is not None:
            sock.close()
        if bridge is not None:
            bridge.kill()
        rdv.close()
        rdv.unlink()


# ---- (4) honest numbers under a random mix ------------------------------------------------------


def test_block_sizes_follow_the_core(rdv):
    """In an arena with one big free run every block is exactly its size:
    meta (header, shape and strides, key, position; rounded to 64 B) plus
    payload rounded to 64 B, at least 256 B."""
    cases = [("k", (), np.uint8), ("k", (0,), np.uint8), ("k", (1,), np.uint8), ("k", (64,), np.uint8),
             ("k", (65,), np.uint8), ("a" * 100, (10, 10), np.float32), ("b" * 23, (3, 4, 5), np.int16),
             ("c" * 24, (1,) * 32, np.uint8), ("d" * 4096, (1000,), np.uint8), ("e", (7, 1, 9), np.complex128)]
    used = rdv.stats().bytes_used
    for key, shape, dtype in cases:
        rdv.send(key, np.zeros(shape, dtype=dtype))
        st = rdv.stats()
        assert st.bytes_used - used == block_bytes(key, shape, dtype), (key[:8], shape, dtype)
        used = st.bytes_used
    assert block_bytes("k", (), np.uint8) == MIN_BLOCK
    assert block_bytes("d" * 4096, (1000,), np.uint8) == round_up(64 + 16 + 4096 + 8) + 1024


class Model:
    """What the test knows is live, with each block's measured size."""

    def __init__(self):
        self.pending = {}  # key -> [(tag, size)], oldest first
        self.held = []  # (view, tag, size)
        self.open = []  # (allocation, array, key, tag, size)

    def count(self):
        return sum(map(len, self.pending.values())), len(self.held), len(self.open)

    def bytes(self):
        return (sum(s for q in self.pending.values() for _, s in q) + sum(s for *_, s in self.held)
                + sum(s for *_, s in self.open))


def random_message(rng, tag):
    key = f"mix/{rng.randrange(6)}" + "x" * rng.choice([0, 0, 5, 40, 300])
    ndim = rng.choice([1, 1, 1, 2, 3])
    dtype = rng.choice([np.uint8, np.uint8, np.float32, np.int64])
    total = rng.choice([0, 1, 63, 64, 65, 200, 1000, 4096, rng.randrange(1, 30000), rng.randrange(1, 200000)])
    total = max(0, total // np.dtype(dtype).itemsize)
    shape = (total,) if ndim == 1 else ((1,) * (ndim - 1) + (total,))
    arr = np.full(shape, tag % 251, dtype=dtype)
    return key, arr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_stats_are_honest_under_a_random_mix(rdv_name, seed):
    """Random sends, receives (views held), view drops, open allocs, publishes
    and discards over a 1 MiB arena: after each step the stats add up, each
    block is the size the core's formula gives (plus the up to 192 B a block
    absorbs when its free block's remainder would be too small to list), and
    a message whose block fits the largest free run is never refused. More
    blocks are live at once than the old ring's 64 islands."""
    rng = random.Random(seed)
    rdv = shmrdv.Rendezvous(rdv_name, size=1 * MiB, create=True)
    model = Model()
    absorbed = refused = most_live = 0
    try:
        def check():
            st = rdv.stats()
            assert_consistent(st)
            pending, held, opened = model.count()
            assert st.pending_messages == pending, (st, model.count())
            assert st.live_blocks == pending + held + opened, (st, model.count())
            assert st.bytes_used == model.bytes(), (st, model.bytes())
            return st

        def sized(before, expected):
            """The new block's size, checked against the formula."""
            nonlocal absorbed
            size = rdv.stats().bytes_used - before.bytes_used
            assert expected <= size <= expected + 3 * GRANULE and size % GRANULE == 0, (size, expected)
            absorbed += size != expected
            return size

        st = check()
        for step in range(1500):
            op = rng.random()
            if op < 0.3:  # send
                key, arr = random_message(rng, step)
                need = block_bytes(key, arr.shape, arr.dtype)
                try:
                    rdv.send(key, arr, timeout=0)
                except shmrdv.RendezvousTimeout:
                    assert need > st.largest_free, (need, st)  # refused only when no free run fits
                    refused += 1
                else:
                    model.pending.setdefault(key, []).append((step, sized(st, need)))
            elif op < 0.45:  # open an alloc and keep it open
                key, arr = random_message(rng, step)
                need = block_bytes(key, arr.shape, arr.dtype)
                allocation = rdv.alloc(key, arr.shape, arr.dtype, timeout=0)
                try:
                    buf = allocation.__enter__()
                except shmrdv.RendezvousTimeout:
                    assert need > st.largest_free, (need, st)
                    refused += 1
                else:
                    buf[...] = step % 251
                    model.open.append((allocation, buf, key, step, sized(st, need)))
                    del buf
            elif op < 0.55 and model.open:  # publish one (or discard it)
                allocation, buf, key, tag, size = model.open.pop(rng.randrange(len(model.open)))
                del buf
                if rng.random() < 0.7:
                    allocation.__exit__(None, None, None)
                    model.pending.setdefault(key, []).append((tag, size))
                else:
                    allocation.__exit__(RuntimeError, RuntimeError("discard"), None)
                    assert rdv.stats().bytes_used == st.bytes_used - size
            elif op < 0.8:  # receive one and hold its view
                keys = [k for k, q in model.pending.items() if q]
                if keys:
                    key = rng.choice(keys)
                    tag, size = model.pending[key].pop(0)
                    view = rdv.recv(key, timeout=0)
                    assert view.size == 0 or view.flat[0] == tag % 251, "not the oldest message of its key"
                    model.held.append((view, tag, size))
                    del view  # the model's reference is the only one
            elif model.held:  # drop a view: its block goes back
                view, tag, size = model.held.pop(rng.randrange(len(model.held)))
                del view
                assert rdv.stats().bytes_used == st.bytes_used - size
            st = check()
            most_live = max(most_live, st.live_blocks)

        # "A message fits whenever a free run that large exists", at the edge,
        # in an arena made more crowded each round.
        key = "edge"
        meta = meta_bytes(1, len(key))
        for attempt in range(3):
            for i in range(20):
                small = f"crowd/{attempt}/{i}"
                before = check()
                if before.largest_free < 32 << 10:
                    break
                rdv.send(small, np.zeros(100 * i, dtype=np.uint8), timeout=0)
                model.pending.setdefault(small, []).append((0, sized(before, block_bytes(small, (100 * i,), np.uint8))))
            st = check()
            largest = st.largest_free
            assert st.live_blocks > 0 and largest >= MIN_BLOCK, st
            allocation = rdv.alloc(key, (largest - meta,), np.uint8, timeout=0)
            buf = allocation.__enter__()  # no waiting: exactly the largest free run
            assert rdv.stats().bytes_used - st.bytes_used == largest, (st, rdv.stats())
            del buf
            allocation.__exit__(RuntimeError, RuntimeError("discard"), None)
            assert check().largest_free == largest
            for extra in (1, GRANULE):
                with pytest.raises(shmrdv.RendezvousTimeout):
                    with rdv.alloc(key, (largest - meta + extra,), np.uint8, timeout=0):
                        pass
                with pytest.raises(shmrdv.RendezvousTimeout):
                    rdv.send(key, np.zeros(largest - meta + extra, dtype=np.uint8), timeout=0)
            assert check().largest_free == largest

        # Let everything go: all of it comes back as one free run.
        for allocation, buf, *_ in model.open:
            del buf
            allocation.__exit__(RuntimeError, RuntimeError("discard"), None)
        model.open.clear()
        model.held.clear()
        for key, q in model.pending.items():
            for _ in range(len(q)):
                rdv.recv(key, timeout=0)  # the view goes at once
        model.pending.clear()
        st = check()
        assert (st.bytes_used, st.live_blocks, st.largest_free) == (0, 0, st.capacity), st
        assert refused > 0, "the mix never filled the arena: it tested too little"
        assert most_live > 64, f"at most {most_live} blocks were ever live: no more than the old ring held"
    finally:
        model.held.clear()
        model.open.clear()
        rdv.close()
        rdv.unlink()
