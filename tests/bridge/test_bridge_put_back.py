"""Receiving through a client that fails: a message the bridge handed to a
client that drops before acknowledging it goes back to the head of its key
in place, whatever the free space, and in order; and no client, however
slow, holds up the RECVs of the others.

A client is "killed" by resetting its socket (SO_LINGER 0), as the kernel
does for a process killed with unread data: the bridge sees the same thing.
SHMRDV_BRIDGE_KILLS sets how many (default 100; 1000 for the soak)."""
import os
import random
import re
import socket
import struct
import threading
import time

import numpy as np
import pytest

import shmrdv
from shmrdv.bridge import protocol
from shmrdv.bridge.protocol import Frame

from .bridges import BridgeProc, write_token
from ..conftest import MiB, _new_name, _remove_segment, wait_for
from .test_bridge import TOKEN
from .test_bridge_security import raw_session

KILLS = int(os.environ.get("SHMRDV_BRIDGE_KILLS", "100"))
MESSAGE_BYTES = 600 * 1024  # in a 1 MiB arena: while the bridge holds one, the next cannot be sent

pytestmark = pytest.mark.timeout(60 + KILLS // 2)


@pytest.fixture
def served(tmp_path):
    """A 1 MiB rendezvous and its bridge; the bridge's log path."""
    name = _new_name()
    rdv = shmrdv.Rendezvous(name, size=1 * MiB, create=True)
    log_path = tmp_path / "bridge.log"
    bridge = BridgeProc(name, token_file=write_token(tmp_path / "token", TOKEN), log_path=str(log_path)).start()
    yield rdv, bridge, log_path
    bridge.kill()
    rdv.close()
    _remove_segment(name)


def _reset(sock: socket.socket) -> None:
    """Close with a reset, unread bytes and all: a killed client."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _download_and_die(bridge: BridgeProc, rng: random.Random) -> str:
    """RECV the key's next message on a raw connection, then reset it at a
    random point of the download; what it got to ("empty": nothing was queued)."""
    sock, reader = raw_session(bridge)
    try:
        sock.sendall(protocol.recv_request(1, b"k", rng.choice([-1, -1, 0])))
        if rng.random() < 0.2:
            return "before the item"
        kind, length, _ = reader.header()
        body = reader.body(length)
        if kind is Frame.ERROR:
            assert protocol.parse_error(body)[0] is protocol.Code.EMPTY
            return "empty"
        assert kind is Frame.ITEM
        nbytes = protocol.parse_meta(body, protocol.MAX_MESSAGE).nbytes
        want = rng.choice([0, rng.randrange(1, nbytes), nbytes])  # a part of it, or all of it and no ACK
        got = memoryview(bytearray(nbytes))
        filled = 0
        while filled < want:
            kind, length, _ = reader.header()
            assert kind is Frame.DATA
            n = min(length, want - filled)
            reader.read_into(got[filled:filled + n])
            filled += n
            if n < length:
                break
        return "whole, unacknowledged" if filled == nbytes else "in the middle"
    finally:
        _reset(sock)


@pytest.mark.slow
def test_clients_killed_mid_download_lose_nothing(served):
    """KILLS clients die in the middle of downloading a 600 KiB message from
    a 1 MiB arena while the sender waits for room: each message goes back to
    the head of its key with no room to spare, and a live client then
    receives every message exactly once, in order."""
    rdv, bridge, log_path = served
    messages = max(10, KILLS // 4)
    produced, errors = [], []

    def produce():
        try:
            for i in range(messages):
                rdv.send("k", np.full(MESSAGE_BYTES // 8, i, np.int64), timeout=30)
                produced.append(i)
        except BaseException as exc:
            errors.append(exc)

    producer = threading.Thread(target=produce)
    producer.start()
    rng = random.Random(39)
    ends, received = {}, []
    started = time.monotonic()
    try:
        with shmrdv.connect(bridge.url, token=TOKEN) as remote:
            for i in range(messages):
                for _ in range(KILLS // messages + (i < KILLS % messages)):
                    end = "empty"
                    while end == "empty":
                        end = _download_and_die(bridge, rng)
                    ends[end] = ends.get(end, 0) + 1
                got = remote.recv("k", timeout=10)
                assert (got == got[0]).all(), "a torn message"
                received.append(int(got[0]))
    finally:
        producer.join(40)
    took = time.monotonic() - started
    assert not producer.is_alive() and not errors, errors
    put_back = sum(int(n) for n in re.findall(r"before (\d+) message\(s\) for .k. were acknowledged", log_path.read_text()))
    lost, duplicated = messages - len(set(received)), len(received) - len(set(received))
    print(f"\nclients killed mid-download: {sum(ends.values())} kills ({ends}), {messages} messages of "
          f"{MESSAGE_BYTES // 1024} KiB in a 1 MiB arena, {put_back} put back, {len(received)} received, "
          f"{lost} lost, {duplicated} duplicated, in {took:.1f} s")
    assert received == list(range(messages)), "lost, duplicated or reordered"
    assert rdv.try_recv("k") is None
    assert sum(ends.values()) == KILLS
    assert "could not put back" not in log_path.read_text() and "Traceback" not in log_path.read_text()
    wait_for(lambda: rdv.stats().bytes_used == 0, "the bridge to free the last message acknowledged", timeout=10)


def test_a_client_that_stops_reading_holds_up_no_other_client(tmp_path):
    """A client takes a 16 MiB item and reads none of it: the bridge's send
    to it blocks, but on that connection's thread, not on the completion
    thread that finishes every RECV of the bridge: another client waiting
    in a RECV is served at once."""
    name = _new_name()
    rdv = shmrdv.Rendezvous(name, size=32 * MiB, create=True)
    bridge = BridgeProc(name, token_file=write_token(tmp_path / "token", TOKEN),
                        log_path=str(tmp_path / "bridge.log")).start()
    try:
        stuck, reader = raw_session(bridge)
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        stuck.sendall(protocol.recv_request(1, b"big", -1))
        with shmrdv.connect(bridge.url, token=TOKEN) as remote:
            waiting = remote.recv_async("small")
            time.sleep(0.2)  # both RECVs wait on the bridge's completion thread
            rdv.send("big", np.zeros(16 * MiB, np.uint8))
            kind, _, _ = reader.header()
            assert kind is Frame.ITEM  # handed out; its 16 MiB of DATA are never read
            time.sleep(0.2)
            rdv.send("small", np.arange(3))
            assert np.array_equal(waiting.result(timeout=5), np.arange(3))
        _reset(stuck)
        assert np.array_equal(rdv.recv("big", timeout=10)[:4], np.zeros(4, np.uint8))  # put back
    finally:
        bridge.kill()
        rdv.close()
        _remove_segment(name)


def test_items_of_one_key_go_back_in_their_order(served):
    """Three RECVs of one key open on one connection, each handed its item,
    none acknowledged: they go back to the key in the order the key had
    them, the first to a receiver waiting in line."""
    rdv, bridge, _ = served
    sock, reader = raw_session(bridge)
    for request in (1, 2, 3):
        sock.sendall(protocol.recv_request(request, b"o", -1))
    time.sleep(0.2)  # all three wait in line
    for v in range(3):
        rdv.send("o", np.full(1000, v, np.int64))
    items = 0
    while items < 3:
        kind, length, _ = reader.header()
        reader.skip(length)
        items += kind is Frame.ITEM
    rdv.send("o", np.full(1000, 3, np.int64))
    waiting = rdv.recv_async("o")  # a receiver in line takes 3, then the first given back
    assert int(waiting.result(timeout=10)[0]) == 3
    after = rdv.recv_async("o")
    _reset(sock)
    assert int(after.result(timeout=10)[0]) == 0
    assert [int(rdv.recv("o", timeout=10)[0]) for _ in range(2)] == [1, 2]


def test_a_bridge_killed_holding_an_item_gives_it_back(served):
    """The bridge takes a client's message leased: killed while the client
    downloads it, the message goes back to the head of its key."""
    rdv, bridge, _ = served
    rdv.send("k", np.full(MESSAGE_BYTES // 8, 7, np.int64))
    sock, reader = raw_session(bridge)
    sock.sendall(protocol.recv_request(1, b"k", -1))
    kind, _, _ = reader.header()
    assert kind is Frame.ITEM
    bridge.kill()
    _reset(sock)
    assert rdv.collect_garbage() == 1
    assert (rdv.recv("k", timeout=10) == 7).all()
