"""Two rendezvous joined by two bridges over loopback: TF-keyed sends in both
directions, many keys at once, sizes from empty to 256 MiB, a sender that
exits at once, aborts that cross, and the connect() client."""
import multiprocessing
import threading
import warnings
import zlib

import numpy as np
import pytest

import shmrdv
from shmrdv.bridge.outbox import OUTBOX_KEY

from .bridges import BridgeProc, run_threads, write_token
from ..conftest import MiB, _new_name, _remove_segment, free_port, wait_for

pytestmark = pytest.mark.timeout(180)

TOKEN = "correct horse battery staple"
DEV_A = "/job:a/replica:0/task:0/device:CPU:0"
DEV_B = "/job:b/replica:0/task:0/device:CPU:0"


def key(src: str, dst: str, name: str, it: int = 0) -> str:
    return shmrdv.create_key(src, 1, dst, name, (0, it))


class Hosts:
    """Rendezvous A and B, each with its bridge, each routing the other's job."""

    def __init__(self, tmp_path, size: int = 64 * MiB, listen=("127.0.0.1:0", "127.0.0.1:0"), netns=(None, None)) -> None:
        self.names = (_new_name(), _new_name())
        self.token_file = write_token(tmp_path / "token", TOKEN)
        self.size = size
        self.bridges = []
        self.local = []
        for i, name in enumerate(self.names):
            shmrdv.Rendezvous(name, size=size, create=True).close()
            bridge = BridgeProc(name, listen[i], token_file=self.token_file, netns=netns[i], log_path=str(tmp_path / f"bridge{i}.log"))
            self.bridges.append(bridge.start())
        self.a = self.attach(0)
        self.b = self.attach(1)

    def attach(self, i: int) -> shmrdv.Rendezvous:
        other = self.bridges[1 - i]
        job = "/job:b" if i == 0 else "/job:a"
        rdv = shmrdv.Rendezvous(self.names[i], routes={job: other.url}, token=TOKEN)
        self.local.append(rdv)
        return rdv

    def close(self) -> None:
        for rdv in self.local:
            rdv.close()
        for bridge in self.bridges:
            bridge.kill()
        for name in self.names:
            _remove_segment(name)


@pytest.fixture
def hosts(tmp_path):
    h = Hosts(tmp_path)
    yield h
    h.close()


def checksum(arr: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(arr).view(np.uint8).reshape(-1))


def test_tf_keys_cross_both_ways(hosts):
    k_ab = key(DEV_A, DEV_B, "grad")
    k_ba = key(DEV_B, DEV_A, "weights")
    x = np.arange(1000, dtype=np.float32).reshape(10, 100)
    hosts.a.send(k_ab, x)
    hosts.b.send(k_ba, x * 2)
    got = hosts.b.recv(k_ab, timeout=30)
    assert got.dtype == x.dtype and got.shape == x.shape and np.array_equal(got, x)
    assert not got.flags.writeable  # an ordinary local view on the receiving host
    assert np.array_equal(hosts.a.recv(k_ba, timeout=30), x * 2)
    del got
    assert hosts.a.try_recv(k_ab) is None  # it left host A's rendezvous


def test_local_keys_stay_local(hosts):
    local = key(DEV_A, "/job:a/replica:0/task:0/device:GPU:0", "local")
    hosts.a.send(local, np.ones(3))
    hosts.a.send("plain-key", np.ones(3))
    assert np.array_equal(hosts.a.recv(local, timeout=5), np.ones(3))
    assert np.array_equal(hosts.a.recv("plain-key", timeout=5), np.ones(3))
    assert hosts.b.try_recv(local) is None


@pytest.mark.parametrize("nbytes", [0, 1, 4096, 3 * MiB + 7])
def test_sizes_and_dtypes(hosts, nbytes):
    rng = np.random.default_rng(nbytes)
    for dtype in ("u1", "<f8", "<c8", "?", "<M8[ns]", "<U3"):
        dt = np.dtype(dtype)
        n = nbytes // dt.itemsize
        raw = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8)
        if dt.kind == "b":
            raw = raw & 1
        if dt.kind == "U":
            raw = raw.view("<u4") % 0x7F + 0x20 if n else raw
            raw = raw.astype("<u4").view(np.uint8)
        x = raw.view(dt)
        k = key(DEV_A, DEV_B, f"t{dtype}{nbytes}")
        hosts.a.send(k, x)
        got = hosts.b.recv(k, timeout=60)
        assert got.dtype == x.dtype and got.shape == x.shape
        assert checksum(got) == checksum(x), dtype


@pytest.mark.slow
def test_256_mib_both_ways(tmp_path):
    h = Hosts(tmp_path, size=520 * MiB)  # B sends back while it still holds the view
    try:
        x = np.random.default_rng(1).integers(0, 2**31, (256 * MiB) // 4, dtype=np.int32)
        want = checksum(x)
        h.a.send(key(DEV_A, DEV_B, "big"), x)
        got = h.b.recv(key(DEV_A, DEV_B, "big"), timeout=120)
        assert got.nbytes == 256 * MiB and checksum(got) == want
        h.b.send(key(DEV_B, DEV_A, "big"), got)
        del got
        back = h.a.recv(key(DEV_B, DEV_A, "big"), timeout=120)
        assert checksum(back) == want
    finally:
        h.close()


def test_many_keys_concurrently_in_order(hosts):
    """8 producer threads x 20 keys x 5 rounds, 2 MiB messages mixed with
    small ones (more than the receiving arena holds at once), each drained by
    its own consumer thread: every message arrives once, and each key's
    messages in the order sent."""
    threads_n, keys_n, rounds = 8, 20, 5
    sizes = [16, 1024, 2 * MiB]
    errors = []

    def producer(t):
        for m in range(rounds):
            for k in range(keys_n):
                n = sizes[(t + k + m) % len(sizes)]
                hosts.a.send(key(DEV_A, DEV_B, f"k{t}-{k}"), np.full(n // 8, t * 1_000_000 + k * 1000 + m, np.int64))

    def consumer(t):
        try:
            for m in range(rounds):
                for k in range(keys_n):
                    got = hosts.b.recv(key(DEV_A, DEV_B, f"k{t}-{k}"), timeout=60)
                    assert (got == t * 1_000_000 + k * 1000 + m).all(), (t, k, m, got[:1])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    run_threads([threading.Thread(target=f, args=(t,)) for t in range(threads_n) for f in (producer, consumer)])
    assert not errors, errors[0]
    assert hosts.b.stats().pending_messages == 0
    wait_for(lambda: hosts.a.stats().pending_messages == 0, "every envelope to be acknowledged")


def _send_and_exit(name, routes, k):
    rdv = shmrdv.Rendezvous(name, routes=routes, token=TOKEN)
    rdv.send(k, np.arange(100_000, dtype=np.int64))
    # exits at once: no close, no waiting for the bridge


def test_sender_exits_right_after_send(hosts):
    k = key(DEV_A, DEV_B, "fire-and-forget")
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_send_and_exit, args=(hosts.names[0], {"/job:b": hosts.bridges[1].url}, k))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert np.array_equal(hosts.b.recv(k, timeout=30), np.arange(100_000, dtype=np.int64))


def test_alloc_on_a_routed_key(hosts):
    k = key(DEV_A, DEV_B, "alloc")
    with hosts.a.alloc(k, (4, 5), np.float32) as buf:
        buf[:] = 7
    assert np.array_equal(hosts.b.recv(k, timeout=30), np.full((4, 5), 7, np.float32))


def test_torch_tensors_and_bfloat16_cross(hosts):
    torch = pytest.importorskip("torch")
    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    x = torch.linspace(-2, 2, 12, dtype=torch.bfloat16).reshape(3, 4)
    k = key(DEV_A, DEV_B, "bf16")
    hosts.a.send(k, x.t())  # a non-contiguous tensor: through the outbox and both bridges
    got = hosts.b.recv(k, timeout=30, as_torch=True)
    assert got.dtype == torch.bfloat16 and torch.equal(got, x.t())
    k = key(DEV_A, DEV_B, "alloc-bf16")
    with hosts.a.alloc(k, (2, 2), torch.bfloat16) as buf:
        assert isinstance(buf, torch.Tensor)
        buf.fill_(1.5)
    assert torch.equal(hosts.b.recv(k, timeout=30, as_torch=True), torch.full((2, 2), 1.5, dtype=torch.bfloat16))
    remote = shmrdv.connect(hosts.bridges[1].url, token=TOKEN)
    try:
        w = x.float().requires_grad_(True)
        remote.send("grad", w)  # its data
        assert np.array_equal(hosts.b.recv("grad", timeout=10), w.detach().numpy())
        remote.send("bf16", x)
        got = hosts.b.recv("bf16", timeout=10)
        assert got.dtype == bf16 and got.tobytes() == x.view(torch.int16).numpy().tobytes()
        hosts.b.send("back", x[1:])
        got = remote.recv("back", timeout=10)  # an ITEM frame of bfloat16
        assert got.dtype == bf16 and got.tobytes() == x[1:].view(torch.int16).numpy().tobytes()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own, about complex32
            half = torch.zeros(2, dtype=torch.complex32)
        with pytest.raises(shmrdv.InvalidType, match="complex32"):
            remote.send("bad", half)  # said before anything crosses
    finally:
        remote.close()


def test_abort_crosses_both_ways(tmp_path):
    for first in (0, 1):
        h = Hosts(tmp_path)
        try:
            src, dst = (h.a, h.b) if first == 0 else (h.b, h.a)
            waiter = dst.recv_async("never-sent")
            src.abort(f"step failed on host {first}")
            with pytest.raises(shmrdv.Aborted, match=f"step failed on host {first}"):
                waiter.result(timeout=30)
            wait_for(lambda: dst.stats().aborted, "the abort to cross")
        finally:
            h.close()


def test_abort_crosses_with_this_hosts_bridge_down(tmp_path):
    """The aborting process tells its routes' bridges itself: here no bridge
    on its host reads the announcement, and the abort still reaches B."""
    h = Hosts(tmp_path)
    try:
        h.bridges[0].stop()
        waiter = h.b.recv_async("never-sent")
        h.a.abort("host A gave up")
        with pytest.raises(shmrdv.Aborted, match="host A gave up"):
            waiter.result(timeout=30)
    finally:
        h.close()


def test_the_bridges_are_told_the_reason_that_won(tmp_path):
    h = Hosts(tmp_path)
    try:
        h.bridges[0].stop()
        waiter = h.b.recv_async("never-sent")
        with shmrdv.Rendezvous(h.names[0]) as plain:  # no routes: tells nobody itself
            plain.abort("the first reason")
        h.a.abort("a later one")
        with pytest.raises(shmrdv.Aborted, match="the first reason"):
            waiter.result(timeout=30)
    finally:
        h.close()


@pytest.mark.slow
@pytest.mark.timeout(20)  # told one after another, the silent ones would take 2 s each per step
def test_abort_with_unreachable_and_silent_routes_still_aborts_here():
    import socket

    closed = free_port()  # nobody listens there
    silent = []
    for _ in range(4):  # they accept, and never say HELLO
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        silent.append(s)
    routes = {"/job:b": f"tcp://127.0.0.1:{closed}"}
    routes.update({f"/job:s{i}": f"tcp://127.0.0.1:{s.getsockname()[1]}" for i, s in enumerate(silent)})
    name = _new_name()
    rdv = shmrdv.Rendezvous(name, size=MiB, create=True, routes=routes, token=TOKEN)
    try:
        for _ in range(2):  # a repeated abort tells them again, just as boundedly
            rdv.abort("nobody to tell")
        assert rdv.stats().aborted
        with pytest.raises(shmrdv.Aborted, match="nobody to tell"):
            rdv.recv("x", timeout=1)
    finally:
        rdv.close()
        _remove_segment(name)
        for s in silent:
            s.close()


def test_messages_wait_in_the_outbox_until_the_bridge_comes(tmp_path):
    """No bridge on the sending host yet: the message is queued there, and is
    delivered once a bridge starts."""
    h = Hosts(tmp_path)
    try:
        h.bridges[0].stop()
        k = key(DEV_A, DEV_B, "late")
        h.a.send(k, np.arange(10))
        assert h.a.stats().pending_messages == 1
        assert h.b.try_recv(k) is None
        h.bridges[0].start()
        assert np.array_equal(h.b.recv(k, timeout=30), np.arange(10))
        wait_for(lambda: h.a.stats().pending_messages == 0, "the envelope to be freed")
    finally:
        h.close()


# ---- connect() ------------------------------------------------------------------


def test_connect_send_recv(hosts):
    remote = shmrdv.connect(hosts.bridges[1].url, token=TOKEN)
    try:
        x = np.arange(3 * MiB // 8, dtype=np.float64)
        remote.send("plain", x)
        assert np.array_equal(hosts.b.recv("plain", timeout=10), x)
        hosts.b.send("back", x[:10])
        got = remote.recv("back", timeout=10)
        assert got.flags.writeable and np.array_equal(got, x[:10])
        assert remote.try_recv("back") is None
        fut = remote.recv_async("later")
        hosts.b.send("later", np.int8(5))
        assert fut.result(timeout=10) == 5
        with pytest.raises(shmrdv.RendezvousTimeout):
            remote.recv("nothing", timeout=0.2)
        withdrawn = remote.recv_async("withdrawn")  # cancelled before or after the bridge waits: both withdraw it
        assert withdrawn.cancel() and withdrawn.cancelled()
        hosts.b.send("withdrawn", np.int8(9))  # stays queued for the next receiver
        assert remote.recv("withdrawn", timeout=10) == 9
    finally:
        remote.close()


def test_a_client_alternating_send_and_recv_keeps_its_connection(hosts, monkeypatch):
    """1,000 round trips of send then recv on one client: receives have their
    own numbering, so the sends' sequence numbers have no gaps and the
    bridge's dedupe window never drops the client (it used to every ~33)."""
    from shmrdv.bridge import connect as connect_module

    opened = []
    real_open = connect_module.open_socket
    monkeypatch.setattr(connect_module, "open_socket", lambda *a, **k: opened.append(1) or real_open(*a, **k))
    bridge = hosts.bridges[1]
    with shmrdv.connect(bridge.url, token=TOKEN) as remote:
        for i in range(1000):
            remote.send("ping", np.int64(i), timeout=10)
            assert hosts.b.recv("ping", timeout=10) == i
            hosts.b.send("pong", np.int64(i))
            assert remote.recv("pong", timeout=10) == i
    assert len(opened) == 1, f"the client reconnected {len(opened) - 1} time(s): {bridge.logs()}"
    assert " WARNING " not in bridge.logs(), bridge.logs()


def test_connect_wrong_token_fails_at_once(hosts):
    with pytest.raises(shmrdv.AuthenticationError, match="refused our token"):
        shmrdv.connect(hosts.bridges[1].url, token="wrong")
    with pytest.raises(shmrdv.AuthenticationError, match="requires a token and none was given"):
        shmrdv.connect(hosts.bridges[1].url)
    assert issubclass(shmrdv.AuthenticationError, shmrdv.RendezvousError)
    # and the bridge still serves everyone else
    with shmrdv.connect(hosts.bridges[1].url, token=TOKEN.encode()) as remote:
        remote.send("ok", np.ones(1))
    assert hosts.b.recv("ok", timeout=10)[0] == 1


def test_connect_abort_reaches_both_hosts(hosts):
    with shmrdv.connect(hosts.bridges[1].url, token=TOKEN) as remote:
        pending = remote.recv_async("x")
        remote.abort("client gave up")
        with pytest.raises(shmrdv.Aborted, match="client gave up"):
            pending.result(timeout=30)
    wait_for(lambda: hosts.b.stats().aborted, "host B to abort")
    wait_for(lambda: hosts.a.stats().aborted, "host A to abort")


def test_bridge_refuses_non_loopback_without_token(rdv_name):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "shmrdv", "bridge", "--name", rdv_name, "--listen", "0.0.0.0:0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "without --token-file" in out.stderr


def test_outbox_key_is_not_a_tf_key():
    with pytest.raises(ValueError):
        shmrdv.parse_key(OUTBOX_KEY)


def test_small_messages_pass_a_huge_one(tmp_path):
    """A 384 MiB tensor is on its way when a small one is sent on another
    key: the small one arrives while the big one is still crossing."""
    h = Hosts(tmp_path, size=420 * MiB)
    try:
        big = np.ones(384 * MiB, np.uint8)
        h.a.send(key(DEV_A, DEV_B, "huge"), big)
        h.a.send(key(DEV_A, DEV_B, "small"), np.arange(3))
        assert np.array_equal(h.b.recv(key(DEV_A, DEV_B, "small"), timeout=60), np.arange(3))
        assert h.b.try_recv(key(DEV_A, DEV_B, "huge")) is None, "the small message waited for the huge one"
        got = h.b.recv(key(DEV_A, DEV_B, "huge"), timeout=120)
        assert got.nbytes == big.nbytes and got[-1] == 1
    finally:
        h.close()


def test_a_message_the_remote_can_never_take_aborts_the_step(tmp_path):
    """Host B's arena is 4 MiB; a 16 MiB tensor routed there can never be
    delivered: host A's rendezvous is aborted with a reason saying so (and
    the abort reaches B), instead of the message vanishing."""
    names = (_new_name(), _new_name())
    token_file = write_token(tmp_path / "token", TOKEN)
    bridges = []
    try:
        for name, size in zip(names, (64 * MiB, 4 * MiB)):
            shmrdv.Rendezvous(name, size=size, create=True).close()
            bridges.append(BridgeProc(name, token_file=token_file, log_path=str(tmp_path / f"{name}.log")).start())
        with shmrdv.Rendezvous(names[0], routes={"/job:b": bridges[1].url}, token=TOKEN) as a, \
                shmrdv.Rendezvous(names[1]) as b:
            a.send(key(DEV_A, DEV_B, "too-big"), np.zeros(16 * MiB, np.uint8))
            with pytest.raises(shmrdv.Aborted, match="too-big.*(can never fit|MessageTooLarge|exceeds)"):
                a.recv("anything", timeout=30)
            wait_for(lambda: b.stats().aborted, "the abort to reach host B")
    finally:
        for bridge in bridges:
            bridge.kill()
        for name in names:
            _remove_segment(name)
