"""TensorFlow's rendezvous_test.cc LocalRendezvous cases, ported: each runs
with its peer in a thread of this process and in another process."""
import concurrent.futures as cf
import random
import threading
import time

import numpy as np
import pytest

import shmrdv

from .. import workers
from ..conftest import wait_for

pytestmark = pytest.mark.timeout(120)

FOO = "/job:mnt/replica:1/task:2/cpu:0;0000000000000001;/job:mnt/replica:1/task:2/device:GPU:0;foo;0:0"
BAR = "/job:mnt/replica:1/task:2/cpu:0;0000000000000001;/job:mnt/replica:1/task:2/device:GPU:0;bar;0:0"


def v(x):
    return np.array([x], dtype=np.int64)


class Peer:
    """Runs a script of (op, key, value) steps in a thread or another process
    (workers.peer_serve), reporting received values on a queue."""

    def __init__(self, kind, rdv, children):
        self.kind, self.rdv, self.children = kind, rdv, children
        self.queue = children.context.Queue() if kind == "process" else __import__("queue").Queue()

    def run(self, script):
        if self.kind == "process":
            self.children.start(workers.peer_serve, self.rdv.name, script, self.queue)
        else:
            threading.Thread(target=self._thread, args=(script,), daemon=True).start()

    def _thread(self, script):
        for op, key, value in script:
            if op == "send":
                self.rdv.send(key, v(value))
            elif op == "recv":
                try:
                    self.queue.put(("recv", key, int(self.rdv.recv(key, timeout=30)[0])))
                except shmrdv.Aborted as error:
                    self.queue.put(("aborted", key, error.reason))
            elif op == "sleep":
                time.sleep(value)
            elif op == "abort":
                self.rdv.abort(value)
        self.queue.put(("done", None, None))

    def results(self):
        out = []
        while True:
            item = self.queue.get(timeout=60)
            if item[0] == "done":
                return out
            out.append(item)


@pytest.fixture(params=["thread", "process"])
def peer(request, rdv, children):
    return Peer(request.param, rdv, children)


def test_send_recv(rdv, peer):
    peer.run([("send", FOO, 7)])
    assert int(rdv.recv(FOO, timeout=30)[0]) == 7
    assert peer.results() == []


def test_recv_send(rdv, peer):
    peer.run([("sleep", None, 0.1), ("send", FOO, 8)])
    assert int(rdv.recv(FOO, timeout=30)[0]) == 8
    peer.results()


def test_ping_pong(rdv, peer):
    peer.run([("recv", FOO, None), ("send", BAR, 2)])
    rdv.send(FOO, v(1))
    assert int(rdv.recv(BAR, timeout=30)[0]) == 2
    assert peer.results() == [("recv", FOO, 1)]


def test_cancel_before_recv(rdv, peer):
    fut = rdv.recv_async(FOO)
    assert fut.cancel() and fut.cancelled()
    peer.run([("send", FOO, 3)])
    peer.results()
    assert rdv.stats().pending_messages == 1  # the withdrawn receiver took nothing


def test_cancel_after_recv(rdv, peer):
    fut = rdv.recv_async(FOO)
    time.sleep(0.05)
    assert fut.cancel()
    with pytest.raises(cf.CancelledError):
        fut.result()
    peer.run([("send", FOO, 4)])
    peer.results()
    assert int(rdv.recv(FOO, timeout=5)[0]) == 4


def test_cancel_empty_queue(rdv, peer):
    fut = rdv.recv_async(FOO)
    peer.run([("send", FOO, 5)])
    peer.results()
    wait_for(fut.done, "the hand-off")
    assert fut.cancel() is False  # handed over before the cancel: delivered
    assert int(fut.result()[0]) == 5


def test_cancel_multiple(rdv, peer):
    keys = [f"{FOO}-{i}" for i in range(6)]
    futs = [rdv.recv_async(k) for k in keys]
    peer.run([("send", keys[i], i) for i in (0, 2, 4)])
    peer.results()
    for i in (0, 2, 4):
        wait_for(futs[i].done, f"future {i}")
    for i, f in enumerate(futs):
        assert f.cancel() is (i % 2 == 1)
    assert [int(futs[i].result()[0]) for i in (0, 2, 4)] == [0, 2, 4]
    assert rdv.stats().waiters == 0


def test_random_send_recv(rdv, peer):
    rng = random.Random(1)
    n = 200
    script = []
    for i in range(n):
        if rng.random() < 0.1:
            script.append(("sleep", None, rng.random() * 0.002))
        script.append(("send", f"{FOO}-{i}", i))
    peer.run(script)
    order = list(range(n))
    rng.shuffle(order)
    for i in order:
        assert int(rdv.recv(f"{FOO}-{i}", timeout=30)[0]) == i
    peer.results()


def test_multi_sends(rdv, peer):
    peer.run([("send", FOO, i) for i in range(100)])
    assert [int(rdv.recv(FOO, timeout=30)[0]) for _ in range(100)] == list(range(100))
    peer.results()


def test_recv_abort(rdv, peer):
    peer.run([("recv", FOO, None)])
    wait_for(lambda: rdv.stats().waiters == 1, "the peer in line")
    rdv.abort("a worker failed")
    assert peer.results() == [("aborted", FOO, "a worker failed")]


def test_recv_sleep_abort(rdv, peer):
    peer.run([("sleep", None, 0.1), ("abort", None, "stop")])
    with pytest.raises(shmrdv.Aborted, match="stop"):
        rdv.recv(FOO, timeout=30)
    peer.results()


def test_abort_then_recv_or_send(rdv, peer):
    rdv.abort("done with it")
    with pytest.raises(shmrdv.Aborted):
        rdv.send(FOO, v(1))
    with pytest.raises(shmrdv.Aborted):
        rdv.recv(FOO, timeout=1)
    fut = rdv.recv_async(FOO)
    with pytest.raises(shmrdv.Aborted):
        fut.result(timeout=5)
    peer.run([("recv", FOO, None)])
    assert peer.results() == [("aborted", FOO, "done with it")]
