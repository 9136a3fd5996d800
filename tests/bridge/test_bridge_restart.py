"""Exactly once across failures: the receiving bridge is SIGKILLed in the
middle of a stream and restarted on the same port, and the link is cut;
every message whose send returned arrives once, none twice."""
import re
import threading
import time

import numpy as np
import pytest

import shmrdv
from shmrdv.bridge import protocol
from shmrdv.bridge.protocol import Ack, Frame

from .bridges import BridgeProc, write_token
from ..conftest import MiB, _new_name, _remove_segment, free_port, wait_for
from .test_bridge import DEV_A, DEV_B, TOKEN, Hosts, key
from .test_bridge_security import raw_session

pytestmark = pytest.mark.timeout(240)


def _stream(h: Hosts, count: int, sizes, received: list, errors: list) -> threading.Thread:
    def consume():
        try:
            for i in range(count):
                got = h.b.recv(key(DEV_A, DEV_B, "stream"), timeout=90)
                assert got.size >= 1 and (got == got[0]).all(), "torn message"
                received.append(int(got[0]))
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=consume)
    t.start()
    return t


@pytest.mark.parametrize("kill_signal", ["SIGKILL", "SIGTERM"])
def test_receiving_bridge_killed_and_restarted_mid_stream(tmp_path, kill_signal):
    h = Hosts(tmp_path)
    try:
        count = 600
        sizes = [8, 4096, 1 * MiB, 64]
        received, errors = [], []
        consumer = _stream(h, count, sizes, received, errors)
        kills = 0
        for i in range(count):
            n = sizes[i % len(sizes)]
            h.a.send(key(DEV_A, DEV_B, "stream"), np.full(n // 8, i, np.int64))
            if i % 150 == 75:
                bridge = h.bridges[1]
                if kill_signal == "SIGKILL":
                    bridge.kill()
                else:
                    assert bridge.stop() == 0
                kills += 1
                time.sleep(0.2)  # sends go on while it is down: they wait on host A
                bridge.start()
        consumer.join(120)
        assert not consumer.is_alive(), f"received {len(received)} of {count}"
        assert not errors, errors[0]
        assert kills == 4
        assert received == list(range(count)), "lost, duplicated or reordered"
        assert h.b.try_recv(key(DEV_A, DEV_B, "stream")) is None
    finally:
        h.close()


def test_sending_bridge_stopped_cleanly_hands_over(tmp_path):
    """SIGTERM on the sending host's bridge: what it had taken goes back to
    the outbox, and the next bridge there delivers it."""
    h = Hosts(tmp_path)
    try:
        for i in range(200):
            h.a.send(key(DEV_A, DEV_B, "handover"), np.full(1024, i, np.int64))
            if i == 100:
                assert h.bridges[0].stop() == 0
                h.bridges[0].start()
        got = [int(h.b.recv(key(DEV_A, DEV_B, "handover"), timeout=60)[0]) for _ in range(200)]
        assert sorted(got) == list(range(200))
        assert h.b.try_recv(key(DEV_A, DEV_B, "handover")) is None
    finally:
        h.close()


def test_unreachable_bridge_aborts_after_the_deadline(tmp_path, rdv_name):
    """A route to a bridge that never answers: after --deadline the sending
    host's rendezvous is aborted with a reason naming the route."""
    shmrdv.Rendezvous(rdv_name, size=4 * MiB, create=True).close()
    bridge = BridgeProc(rdv_name, extra=["--deadline", "1"], log_path=str(tmp_path / "b.log")).start()
    try:
        rdv = shmrdv.Rendezvous(rdv_name, routes={"/job:b": "tcp://127.0.0.1:9"}, token=TOKEN)
        try:
            rdv.send(key(DEV_A, DEV_B, "x"), np.ones(4))
            with pytest.raises(shmrdv.Aborted, match="127.0.0.1:9"):
                rdv.recv("anything", timeout=30)
        finally:
            rdv.close()
    finally:
        bridge.kill()


def test_sending_bridge_killed_mid_stream(tmp_path):
    """kill -9 on the sending host's bridge: the envelopes it had taken come
    back to the outbox (leased receives), keep their numbers, and the next
    bridge sends them again; the far side drops what it already had."""
    h = Hosts(tmp_path)
    try:
        count = 600
        received, errors = [], []
        consumer = _stream(h, count, None, received, errors)
        for i in range(count):
            h.a.send(key(DEV_A, DEV_B, "stream"), np.full((8, 4096, 1024 * 1024 // 8, 64)[i % 4] // 8, i, np.int64))
            if i % 150 == 75:
                h.bridges[0].kill()
                h.bridges[0].start()
        consumer.join(120)
        assert not consumer.is_alive(), f"received {len(received)} of {count}"
        assert not errors, errors[0]
        assert received == list(range(count)), "lost, duplicated or reordered"
        wait_for(lambda: h.a.stats().pending_messages == 0, "host A's outbox to drain")
    finally:
        h.close()


@pytest.mark.parametrize("seq", [1, 2])
def test_one_message_on_two_connections_of_its_origin_is_committed_once(tmp_path, rdv_name, seq):
    """A link reconnects while the bridge is still reading its old
    connection (that one was waiting for arena room, say): the message both
    carry is begun on each before either is complete. The one completed
    second is a duplicate, answered ACK 1 and discarded: not committed
    again (seq 2, past a gap in the window), nor the end of the connection
    (seq 1, the window's next)."""
    rdv = shmrdv.Rendezvous(rdv_name, size=4 * MiB, create=True)
    bridge = BridgeProc(rdv_name, token_file=write_token(tmp_path / "token", TOKEN), log_path=str(tmp_path / "b.log")).start()
    old, new = (raw_session(bridge, origin=4242, role=protocol.Role.LINK) for _ in range(2))
    try:
        payload = np.arange(512, dtype=np.int64)
        for sock, _reader in (old, new):
            sock.sendall(protocol.encode_meta(Frame.MSG, seq, b"twice", b"<i8", payload.shape, payload.nbytes))
        answers = []
        for sock, reader in (old, new):
            sock.sendall(protocol.header(Frame.DATA, payload.nbytes, seq) + payload.tobytes())
            kind, length, stream = reader.header()
            assert (kind, stream) == (Frame.ACK, seq)
            answers.append(protocol.parse_ack(reader.body(length))[0])
        assert answers == [Ack.COMMITTED, Ack.DUPLICATE]
        assert np.array_equal(rdv.recv("twice", timeout=10), payload)
        assert rdv.try_recv("twice") is None
        wait_for(lambda: rdv.stats().bytes_used == 0, "the duplicate's block to be freed")
    finally:
        for sock, _reader in (old, new):
            sock.close()
        bridge.kill()
        rdv.close()


def test_a_link_down_is_news_until_it_has_been_up(tmp_path):
    """A bridge whose peer is still starting logs its refused connects at
    INFO; once the link has been up, losing it is a WARNING."""
    url = f"tcp://127.0.0.1:{free_port()}"  # nobody listens there until B starts
    names = (_new_name(), _new_name())
    token_file = write_token(tmp_path / "token", TOKEN)
    a = BridgeProc(names[0], token_file=token_file, extra=["--route", f"/job:b={url}"], log_path=str(tmp_path / "a.log"))
    b = BridgeProc(names[1], url[len("tcp://"):], token_file=token_file, size=4 * MiB, log_path=str(tmp_path / "b.log"))
    down = re.compile(r" (INFO|WARNING) link to " + re.escape(url) + " is down")
    try:
        shmrdv.Rendezvous(names[0], size=4 * MiB, create=True).close()
        a.start()
        wait_for(lambda: down.search(a.logs()), "the link to be found down", timeout=20)
        b.start()
        wait_for(lambda: f"link to {url} is up" in a.logs(), "the link to come up", timeout=20)
        b.kill()
        wait_for(lambda: len(down.findall(a.logs())) == 2, "the link to be found down again", timeout=20)
        assert down.findall(a.logs()) == ["INFO", "WARNING"], a.logs()
    finally:
        a.kill()
        b.kill()
        for name in names:
            _remove_segment(name)
