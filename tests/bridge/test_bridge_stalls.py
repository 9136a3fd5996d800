"""Authenticated peers that stall: one silent in the middle of a message is
dropped after --idle-timeout and its half-received block freed; one that
takes an item and never acknowledges it is dropped and the item put back;
one that owes nothing (idle, or blocked in a RECV) may wait as long as it
likes."""
import threading
import time

import numpy as np
import pytest

import shmrdv
from shmrdv.bridge import protocol
from shmrdv.bridge.protocol import Ack, Frame

from .bridges import BridgeProc, write_token
from ..conftest import MiB, _new_name, _remove_segment
from .test_bridge import TOKEN
from .test_bridge_security import raw_session, still_serving

pytestmark = pytest.mark.timeout(120)

IDLE_S = 1.0


@pytest.fixture
def served(tmp_path):
    name = _new_name()
    rdv = shmrdv.Rendezvous(name, size=4 * MiB, create=True)
    bridge = BridgeProc(name, token_file=write_token(tmp_path / "token", TOKEN), log_path=str(tmp_path / "bridge.log"),
                        extra=["--idle-timeout", str(IDLE_S)]).start()
    yield rdv, bridge
    bridge.kill()
    rdv.close()
    _remove_segment(name)


def _closed_by_bridge(sock, within):
    sock.settimeout(within)
    try:
        while True:
            if sock.recv(1 << 16) == b"":
                return True
    except OSError:
        return False


def _wait_for(predicate, within):
    end = time.monotonic() + within
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _begin(seq, key, nbytes):
    return protocol.encode_meta(Frame.MSG, seq, key.encode(), b"|u1", (nbytes,), nbytes)


def test_a_peer_silent_in_the_middle_of_a_message_is_dropped_and_its_block_freed(served):
    rdv, bridge = served
    sock, _reader = raw_session(bridge)
    sock.sendall(_begin(1, "half", 1000) + protocol.header(Frame.DATA, 10, 1) + b"x" * 10)
    assert _wait_for(lambda: rdv.stats().bytes_used > 0, 5)  # its block is reserved
    started = time.monotonic()
    assert _closed_by_bridge(sock, 10 * IDLE_S), "a peer stalled mid-message was never dropped"
    assert IDLE_S * 0.9 <= time.monotonic() - started <= 4 * IDLE_S
    sock.close()
    assert _wait_for(lambda: rdv.stats().bytes_used == 0, 5), rdv.stats()
    assert rdv.try_recv("half") is None  # discarded, never delivered
    assert "silent for" in bridge.logs() and "1 half-received message(s) discarded" in bridge.logs()
    for i in range(300):  # local traffic is untouched
        rdv.send("local", np.full(512, i, dtype=np.int64), timeout=5)
        assert rdv.recv("local", timeout=5)[0] == i
    still_serving(rdv, bridge)


def test_a_peer_silent_in_the_middle_of_a_frame_header_is_dropped(served):
    rdv, bridge = served
    sock, _reader = raw_session(bridge)
    sock.sendall(_begin(1, "k", 8)[:5])
    assert _closed_by_bridge(sock, 10 * IDLE_S)
    sock.close()
    still_serving(rdv, bridge)


@pytest.mark.slow
def test_a_peer_that_owes_nothing_may_stay_silent(served):
    rdv, bridge = served
    sock, reader = raw_session(bridge)
    time.sleep(3 * IDLE_S)
    sock.sendall(_begin(1, "late", 4) + protocol.header(Frame.DATA, 4, 1) + b"abcd")
    kind, length, stream = reader.header()
    assert (kind, stream) == (Frame.ACK, 1)
    assert protocol.parse_ack(reader.body(length))[0] is Ack.COMMITTED
    assert bytes(rdv.recv("late", timeout=5)) == b"abcd"
    sock.close()


@pytest.mark.slow
def test_a_client_blocked_in_recv_outlives_the_idle_timeout(served):
    rdv, bridge = served
    with shmrdv.connect(bridge.url, token=TOKEN) as remote:
        got = []
        t = threading.Thread(target=lambda: got.append(remote.recv("later", timeout=30)))
        t.start()
        time.sleep(3 * IDLE_S)
        rdv.send("later", np.arange(4))
        t.join(30)
        assert len(got) == 1 and np.array_equal(got[0], np.arange(4))


def test_an_item_never_acknowledged_is_put_back_when_its_taker_stalls(served):
    rdv, bridge = served
    rdv.send("taken", np.arange(100))
    sock, reader = raw_session(bridge)
    sock.sendall(protocol.recv_request(1, b"taken", -1))
    kind, length, stream = reader.header()
    assert (kind, stream) == (Frame.ITEM, 1)  # handed out; we never read its DATA nor ACK it
    assert _closed_by_bridge(sock, 10 * IDLE_S)
    sock.close()
    assert np.array_equal(rdv.recv("taken", timeout=10), np.arange(100))  # back under its key


def test_a_tls_peer_silent_in_the_middle_of_a_message_is_dropped(tmp_path):
    """The same over TLS, whose sockets time out in Python rather than in
    the kernel."""
    import socket
    import ssl

    from shmrdv.bridge import auth

    from .test_bridge_security import _openssl_cert

    cert, keyfile = _openssl_cert(tmp_path)
    name = _new_name()
    rdv = shmrdv.Rendezvous(name, size=4 * MiB, create=True)
    bridge = BridgeProc(name, token_file=write_token(tmp_path / "token", TOKEN), log_path=str(tmp_path / "bridge.log"),
                        extra=["--idle-timeout", str(IDLE_S), "--tls-cert", cert, "--tls-key", keyfile]).start()
    try:
        raw = socket.create_connection((bridge.host, bridge.port), timeout=10)
        sock = ssl.create_default_context(cafile=cert).wrap_socket(raw, server_hostname="127.0.0.1")
        reader = protocol.Reader(sock)
        _cap, server_nonce = protocol.parse_hello(reader.expect(Frame.HELLO))
        nonce = auth.nonce()
        sock.sendall(protocol.auth(protocol.Role.CLIENT, 7, 1, nonce, auth.client_proof(TOKEN.encode(), server_nonce, nonce, 7, 1)))
        reader.expect(Frame.WELCOME)
        sock.sendall(_begin(1, "half", 1000) + protocol.header(Frame.DATA, 10, 1) + b"x" * 10)
        assert _wait_for(lambda: rdv.stats().bytes_used > 0, 5)
        started = time.monotonic()
        assert _closed_by_bridge(sock, 10 * IDLE_S), "a TLS peer stalled mid-message was never dropped"
        assert time.monotonic() - started <= 4 * IDLE_S
        sock.close()
        assert _wait_for(lambda: rdv.stats().bytes_used == 0, 5), rdv.stats()
        assert "silent for" in bridge.logs()
    finally:
        bridge.kill()
        rdv.close()
        _remove_segment(name)


def test_an_item_slower_to_send_than_the_idle_timeout_is_not_cut_short(served):
    """A client that reads a large item steadily, but for longer than
    --idle-timeout in all, then acknowledges it: served, not dropped (the
    ACK is owed only once the whole item is out)."""
    rdv, bridge = served
    payload = np.arange(3 * MiB // 8, dtype=np.int64)
    rdv.send("big", payload)
    sock, reader = raw_session(bridge)
    sock.setsockopt(__import__("socket").SOL_SOCKET, __import__("socket").SO_RCVBUF, 64 << 10)
    sock.sendall(protocol.recv_request(1, b"big", -1))
    kind, length, stream = reader.header()
    assert (kind, stream) == (Frame.ITEM, 1)
    meta = protocol.parse_meta(reader.body(length), protocol.MAX_MESSAGE)
    got = bytearray(meta.nbytes)
    view, filled, started = memoryview(got), 0, time.monotonic()
    while filled < meta.nbytes:
        kind, length, stream = reader.header()
        assert kind is Frame.DATA
        for off in range(0, length, 64 << 10):  # 64 KiB every 40 ms: ~2 s for 3 MiB
            n = min(64 << 10, length - off)
            reader.read_into(view[filled:filled + n])
            filled += n
            time.sleep(0.04)
    assert time.monotonic() - started > 1.5 * IDLE_S
    sock.sendall(protocol.ack(1, Ack.COMMITTED))
    assert np.array_equal(np.frombuffer(got, dtype=np.int64), payload)
    sock.sendall(protocol.recv_request(2, b"none", 0))  # still served
    kind, length, stream = reader.header()
    assert (kind, stream) == (Frame.ERROR, 2)
    assert rdv.try_recv("big") is None  # delivered once, not put back
    sock.close()
