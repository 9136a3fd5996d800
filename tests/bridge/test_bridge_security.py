"""Who gets in, and what a hostile or broken peer can do: wrong tokens, TLS,
and malformed, truncated and oversized frames (hypothesis), none of which
may crash the bridge, corrupt its segment or disturb other peers."""
import re
import shutil
import socket
import struct
import subprocess
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shmrdv
from shmrdv.bridge import auth, protocol
from shmrdv.bridge.protocol import Frame

from .bridges import BridgeProc, write_token
from ..conftest import MiB, _new_name, _remove_segment
from .test_bridge import DEV_A, DEV_B, TOKEN, key

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One rendezvous and its bridge (with a token) for the whole module."""
    tmp = tmp_path_factory.mktemp("bridge")
    name = _new_name()
    rdv = shmrdv.Rendezvous(name, size=16 * MiB, create=True)
    bridge = BridgeProc(name, token_file=write_token(tmp / "token", TOKEN), log_path=str(tmp / "bridge.log")).start()
    yield rdv, bridge
    bridge.kill()
    rdv.close()
    _remove_segment(name)


def raw_session(bridge: BridgeProc, token: bytes = TOKEN.encode(), origin: int = 7, role=protocol.Role.CLIENT):
    """An authenticated raw socket, for speaking the protocol by hand."""
    sock = socket.create_connection((bridge.host, bridge.port), timeout=10)
    reader = protocol.Reader(sock)
    _cap, server_nonce = protocol.parse_hello(reader.expect(Frame.HELLO))
    nonce = auth.nonce()
    sock.sendall(protocol.auth(role, origin, 1, nonce, auth.client_proof(token, server_nonce, nonce, origin, 1)))
    reader.expect(Frame.WELCOME)
    return sock, reader


def still_serving(rdv: shmrdv.Rendezvous, bridge: BridgeProc) -> None:
    assert bridge.proc.poll() is None, bridge.logs()
    with shmrdv.connect(bridge.url, token=TOKEN) as remote:
        remote.send("health", np.arange(5))
    assert np.array_equal(rdv.recv("health", timeout=10), np.arange(5))
    st_ = rdv.stats()
    assert not st_.aborted and st_.bytes_used <= st_.capacity


def test_wrong_token_is_refused_and_logged(served):
    rdv, bridge = served
    with pytest.raises(shmrdv.AuthenticationError):
        shmrdv.connect(bridge.url, token="not the token")
    sock = socket.create_connection((bridge.host, bridge.port), timeout=10)
    with sock:
        reader = protocol.Reader(sock)
        _cap, server_nonce = protocol.parse_hello(reader.expect(Frame.HELLO))
        sock.sendall(protocol.auth(protocol.Role.LINK, 5, 1, auth.nonce(), b"\0" * 32))
        with pytest.raises(shmrdv.AuthenticationError, match="wrong token"):
            reader.expect(Frame.WELCOME)
    still_serving(rdv, bridge)
    assert "authentication failed" in bridge.logs()


def test_the_token_never_crosses_the_wire(served):
    """Every byte a client and the bridge exchange, recorded: the token is in none."""
    rdv, bridge = served
    sock, reader = raw_session(bridge)
    with sock:
        recorded = bytearray()
        hdr = protocol.encode_meta(Frame.MSG, 1, b"rec", b"<i8", (2,), 16)
        body = np.arange(2).tobytes()
        out = hdr + protocol.header(Frame.DATA, 16, 1) + body
        recorded += out
        sock.sendall(out)
        kind, length, _ = reader.header()
        recorded += reader.body(length)
        assert kind is Frame.ACK
    assert TOKEN.encode() not in recorded
    rdv.recv("rec", timeout=5)


_FRAME_KINDS = st.integers(0, 20)


@st.composite
def hostile_frames(draw):
    """A mix of valid-looking and broken frames, maybe cut short."""
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        choice = draw(st.integers(0, 5))
        seq = draw(st.integers(0, 200))
        if choice == 0:  # random header, random body
            body = draw(st.binary(max_size=64))
            parts.append(struct.pack("<BBHIQ", draw(_FRAME_KINDS), draw(st.integers(0, 3)), draw(st.integers(0, 3)),
                                     draw(st.one_of(st.just(len(body)), st.integers(0, 2**32 - 1))), seq) + body)
        elif choice == 1:  # a MSG with hostile metadata
            ndim = draw(st.integers(0, 40))
            shape = draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=ndim, max_size=ndim))
            k = draw(st.binary(min_size=0, max_size=20))
            dt = draw(st.sampled_from([b"<f4", b"|O", b"", b"V8", b"<f4\xff", b"x" * 30, b"<U0"]))
            nbytes = draw(st.one_of(st.integers(0, 64), st.integers(0, 2**64 - 1)))
            body = struct.pack("<QHBB", nbytes, len(k), len(dt) % 256, ndim % 256) + struct.pack(f"<{ndim}q", *shape) + k + dt
            parts.append(protocol.frame(Frame.MSG, body, seq))
        elif choice == 2:  # a sane MSG whose DATA overruns or never comes
            n = draw(st.integers(1, 64))
            parts.append(protocol.encode_meta(Frame.MSG, seq, b"fuzz", b"|u1", (n,), n))
            extra = draw(st.integers(-n, 64))
            data = b"\x01" * max(0, n + extra)
            if data:
                parts.append(protocol.header(Frame.DATA, len(data), seq) + data)
        elif choice == 3:  # oversized bodies
            parts.append(struct.pack("<BBHIQ", draw(st.sampled_from([2, 5, 6, 9])), 0, 0,
                                     draw(st.sampled_from([protocol.MAX_BODY + 1, protocol.MAX_CHUNK + 1, 2**32 - 1])), seq))
        elif choice == 4:  # a RECV, ACK or CANCEL of anything
            parts.append(protocol.frame(draw(st.sampled_from([Frame.RECV, Frame.ACK, Frame.CANCEL])), draw(st.binary(max_size=20)), seq))
        else:  # bytes that are no frame at all
            parts.append(draw(st.binary(min_size=1, max_size=40)))
    data = b"".join(parts)
    cut = draw(st.one_of(st.none(), st.integers(0, max(0, len(data) - 1))))
    return data if cut is None else data[:cut]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=hostile_frames(), authenticated=st.booleans())
def test_hostile_frames_never_hurt_the_bridge(served, data, authenticated):
    rdv, bridge = served
    if authenticated:
        sock, _ = raw_session(bridge, origin=99)
    else:
        sock = socket.create_connection((bridge.host, bridge.port), timeout=10)
    with sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(5)
            while sock.recv(65536):  # the bridge answers or hangs up; either is fine
                pass
        except OSError:
            pass
    assert bridge.proc.poll() is None, bridge.logs()
    while rdv.try_recv("fuzz") is not None:  # a frame sequence may be a valid message
        pass


def test_after_the_fuzz_everything_still_works(served):
    rdv, bridge = served
    still_serving(rdv, bridge)
    assert rdv.stats().pending_messages == 0
    rdv.collect_garbage()


def _openssl_cert(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("the TLS test makes its certificate with the openssl command, which is missing")
    cert, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(keyfile), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True, timeout=60)
    return str(cert), str(keyfile)


def test_tls_round_trip(tmp_path):
    cert, keyfile = _openssl_cert(tmp_path)
    token_file = write_token(tmp_path / "token", TOKEN)
    names = (_new_name(), _new_name())
    bridges = []
    try:
        for name in names:
            shmrdv.Rendezvous(name, size=16 * MiB, create=True).close()
            bridges.append(BridgeProc(name, token_file=token_file, extra=["--tls-cert", cert, "--tls-key", keyfile],
                                      log_path=str(tmp_path / f"{name}.log")).start())
        url_b = f"tls://127.0.0.1:{bridges[1].port}"
        with shmrdv.Rendezvous(names[0], routes={"/job:b": url_b}, token=TOKEN, tls_ca=cert) as a, \
                shmrdv.Rendezvous(names[1]) as b:
            x = np.random.default_rng(0).random(3 * MiB // 8)
            a.send(key(DEV_A, DEV_B, "secret"), x)
            assert np.array_equal(b.recv(key(DEV_A, DEV_B, "secret"), timeout=30), x)
            with shmrdv.connect(url_b, token=TOKEN, tls_ca=cert) as remote:
                remote.send("plain", x[:100])
                assert np.array_equal(b.recv("plain", timeout=10), x[:100])
                b.send("back", x[:7])
                assert np.array_equal(remote.recv("back", timeout=10), x[:7])
            with pytest.raises(shmrdv.AuthenticationError):  # a CA that did not sign it
                shmrdv.connect(url_b, token=TOKEN)
            with pytest.raises((shmrdv.ConnectionLost, shmrdv.ProtocolError)):  # plain TCP to a TLS bridge
                shmrdv.connect(f"tcp://127.0.0.1:{bridges[1].port}", token=TOKEN)
            assert bridges[1].proc.poll() is None
    finally:
        for bridge in bridges:
            bridge.kill()
        for name in names:
            _remove_segment(name)


@pytest.fixture(scope="module")
def tls_and_plain(tmp_path_factory):
    """A TLS bridge and a plain one, and the TLS bridge's certificate."""
    tmp = tmp_path_factory.mktemp("tls")
    cert, keyfile = _openssl_cert(tmp)
    token_file = write_token(tmp / "token", TOKEN)
    names, bridges = (_new_name(), _new_name()), []
    try:
        for name, extra in zip(names, (["--tls-cert", cert, "--tls-key", keyfile], [])):
            bridges.append(BridgeProc(name, token_file=token_file, size=4 * MiB, extra=extra,
                                      log_path=str(tmp / f"{name}.log")).start())
        yield bridges[0], bridges[1], cert
    finally:
        for bridge in bridges:
            bridge.kill()
        for name in names:
            _remove_segment(name)


def test_tcp_to_a_tls_bridge_says_to_use_tls(tls_and_plain):
    tls_bridge, _, cert = tls_and_plain
    started = time.monotonic()
    with pytest.raises(shmrdv.ProtocolError, match=f"speaks TLS: connect to tls://127.0.0.1:{tls_bridge.port}"):
        shmrdv.connect(f"tcp://127.0.0.1:{tls_bridge.port}", token=TOKEN)
    assert time.monotonic() - started < 2.5, "it waited for the connect timeout"
    with shmrdv.connect(f"tls://127.0.0.1:{tls_bridge.port}", token=TOKEN, tls_ca=cert) as remote:
        remote.send("fine", np.arange(2))  # as told


def test_tls_to_a_plain_bridge_says_to_use_tcp(tls_and_plain):
    _, plain, cert = tls_and_plain
    started = time.monotonic()
    with pytest.raises(shmrdv.ProtocolError, match=f"does not speak TLS .*: connect to tcp://127.0.0.1:{plain.port}"):
        shmrdv.connect(f"tls://127.0.0.1:{plain.port}", token=TOKEN, tls_ca=cert)
    assert time.monotonic() - started < 2.5


def test_a_missing_tls_ca_is_named(tls_and_plain, tmp_path):
    tls_bridge, _, _ = tls_and_plain
    missing = str(tmp_path / "no-such-ca.pem")
    with pytest.raises(shmrdv.InvalidArgument, match=f"tls_ca '{re.escape(missing)}' does not exist: pass the PEM file"):
        shmrdv.connect(f"tls://127.0.0.1:{tls_bridge.port}", token=TOKEN, tls_ca=missing)
    with pytest.raises(shmrdv.InvalidArgument, match=re.escape(missing)):  # a sending process's routes, at once
        shmrdv.Rendezvous(routes={"/job:b": f"tls://127.0.0.1:{tls_bridge.port}"}, token=TOKEN, tls_ca=missing)


def test_a_tls_ca_that_is_no_pem_certificate_is_named(tls_and_plain, tmp_path):
    tls_bridge, _, cert = tls_and_plain
    der = tmp_path / "ca.der"
    subprocess.run(["openssl", "x509", "-in", cert, "-outform", "DER", "-out", str(der)], check=True,
                   capture_output=True, timeout=60)
    with pytest.raises(shmrdv.InvalidArgument, match=f"tls_ca '{re.escape(str(der))}' is not a PEM certificate"):
        shmrdv.connect(f"tls://127.0.0.1:{tls_bridge.port}", token=TOKEN, tls_ca=str(der))


def test_a_bridge_with_a_missing_tls_ca_does_not_start(rdv_name, tmp_path):
    import sys

    missing = str(tmp_path / "no-such-ca.pem")
    out = subprocess.run([sys.executable, "-m", "shmrdv", "bridge", "--name", rdv_name, "--listen", "127.0.0.1:0",
                          "--tls-ca", missing], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and f"'{missing}' does not exist" in out.stderr, out.stderr


def test_an_untrusted_certificate_says_to_pass_its_ca(tls_and_plain):
    tls_bridge, _, _ = tls_and_plain
    with pytest.raises(shmrdv.AuthenticationError, match="certificate is not trusted .*: pass tls_ca="):
        shmrdv.connect(f"tls://127.0.0.1:{tls_bridge.port}", token=TOKEN)


def _trickle(sock, data):
    """Send data a byte every 0.2 s, never its last byte (it must be the
    deadline that ends the handshake); after 5 s, well past a 1 s deadline,
    whether the bridge has closed its side."""
    for i in range(len(data) - 1):
        try:
            sock.sendall(data[i:i + 1])
        except OSError:
            return True
        time.sleep(0.2)
        if i >= 25:
            sock.settimeout(2)
            try:
                return sock.recv(1) == b""
            except OSError:
                return True
    return False


def test_a_handshake_trickled_a_byte_at_a_time_is_dropped_at_its_deadline(tmp_path):
    """The handshake has one deadline, not a timeout per read: a peer that
    sends its AUTH one byte every 0.2 s (each read well within any per-read
    timeout) is dropped once --handshake-timeout has passed."""
    name = _new_name()
    shmrdv.Rendezvous(name, size=4 * MiB, create=True).close()
    bridge = BridgeProc(name, token_file=write_token(tmp_path / "token", TOKEN), log_path=str(tmp_path / "bridge.log"),
                        extra=["--handshake-timeout", "1"]).start()
    try:
        sock = socket.create_connection((bridge.host, bridge.port), timeout=10)
        reader = protocol.Reader(sock)
        _cap, server_nonce = protocol.parse_hello(reader.expect(Frame.HELLO))
        nonce = auth.nonce()
        frame = protocol.auth(protocol.Role.CLIENT, 7, 1, nonce, auth.client_proof(TOKEN.encode(), server_nonce, nonce, 7, 1))
        dropped = _trickle(sock, frame)
        sock.close()
        assert dropped, "a trickled handshake outlived its deadline"
        assert "deadline passed" in bridge.logs()
        still_serving_name(name, bridge)
    finally:
        bridge.kill()
        _remove_segment(name)


def test_a_tls_handshake_trickled_a_byte_at_a_time_is_dropped_at_its_deadline(tmp_path):
    """The TLS handshake counts against the same deadline: a ClientHello sent
    a byte every 0.2 s is dropped once --handshake-timeout (1 s) has passed."""
    cert, keyfile = _openssl_cert(tmp_path)
    name = _new_name()
    shmrdv.Rendezvous(name, size=4 * MiB, create=True).close()
    bridge = BridgeProc(name, token_file=write_token(tmp_path / "token", TOKEN), log_path=str(tmp_path / "bridge.log"),
                        extra=["--tls-cert", cert, "--tls-key", keyfile, "--handshake-timeout", "1"]).start()
    try:
        import ssl

        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        client = ssl.create_default_context(cafile=cert).wrap_bio(incoming, outgoing, server_hostname="localhost")
        with pytest.raises(ssl.SSLWantReadError):
            client.do_handshake()
        hello = outgoing.read()
        sock = socket.create_connection((bridge.host, bridge.port), timeout=10)
        started = time.monotonic()
        dropped = _trickle(sock, hello)
        sock.close()
        assert dropped and time.monotonic() - started < 8, "a trickled TLS handshake outlived its deadline"
        assert "handshake deadline passed" in bridge.logs()
    finally:
        bridge.kill()
        _remove_segment(name)


def still_serving_name(name, bridge):
    with shmrdv.Rendezvous(name, create=False) as rdv:
        still_serving(rdv, bridge)


def test_a_thousand_silent_connections_do_not_lock_a_client_out(tmp_path):
    """1,000 connections that never authenticate, 50 from each of 20
    addresses, all held open: a client is still served within 1 s, and one
    connection more from an address already at --max-per-address is closed
    at once."""
    name = _new_name()
    shmrdv.Rendezvous(name, size=4 * MiB, create=True).close()
    bridge = BridgeProc(name, token_file=write_token(tmp_path / "token", TOKEN), log_path=str(tmp_path / "bridge.log"),
                        extra=["--max-per-address", "50", "--handshake-timeout", "60"]).start()
    hostile = []
    try:
        for address in range(2, 22):
            for _ in range(50):
                s = socket.socket()
                s.bind((f"127.0.0.{address}", 0))  # other loopback addresses than the client's
                s.connect((bridge.host, bridge.port))
                hostile.append(s)
        extra = []
        for _ in range(10):
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.connect((bridge.host, bridge.port))
            extra.append(s)
        hostile += extra
        started = time.monotonic()
        with shmrdv.connect(f"tcp://127.0.0.1:{bridge.port}", token=TOKEN) as remote:
            remote.send("served", np.arange(3))
        served_in = time.monotonic() - started
        with shmrdv.Rendezvous(name, create=False) as rdv:
            assert np.array_equal(rdv.recv("served", timeout=10), np.arange(3))
        print(f"flood: a client served in {served_in * 1000:.0f} ms beside 1,000 silent connections")
        assert served_in < 1.0, f"a client waited {served_in:.2f} s behind 1,000 silent connections"
        for s in extra:  # one too many from 127.0.0.2: closed at accept
            s.settimeout(5)
            assert s.recv(1) == b""
        still_open = 0
        for s in hostile[:1000]:
            s.settimeout(5)
            protocol.parse_hello(protocol.Reader(s).expect(Frame.HELLO))  # served, until its deadline
            s.setblocking(False)
            try:
                s.recv(1)
            except BlockingIOError:
                still_open += 1
        assert still_open == 1000
        assert "refusing a connection from 127.0.0.2" in bridge.logs()
    finally:
        for s in hostile:
            s.close()
        bridge.kill()
        _remove_segment(name)


def test_a_low_file_limit_caps_connections_and_silent_ones_make_room(tmp_path):
    """Under ulimit -n 64 (hard too) the bridge serves fewer connections than
    --max-connections, with room to spare for its own descriptors: 80 idle
    connections that never authenticate cannot exhaust them, and a client
    still connects (the oldest idle one is evicted for it) and works."""
    name = _new_name()
    shmrdv.Rendezvous(name, size=4 * MiB, create=True).close()
    bridge = BridgeProc(name, token_file=write_token(tmp_path / "token", TOKEN), log_path=str(tmp_path / "bridge.log"),
                        extra=["--handshake-timeout", "60"], max_files=64).start()
    idle = []
    try:
        for _ in range(80):
            idle.append(socket.create_connection((bridge.host, bridge.port), timeout=10))
        started = time.monotonic()
        with shmrdv.connect(bridge.url, token=TOKEN) as remote:
            remote.send("served", np.arange(3))
            with shmrdv.Rendezvous(name, create=False) as rdv:
                assert np.array_equal(rdv.recv("served", timeout=10), np.arange(3))
                rdv.send("back", np.arange(4))
            assert np.array_equal(remote.recv("back", timeout=10), np.arange(4))
        assert time.monotonic() - started < 3, "the client waited behind the idle connections"
        logs = (tmp_path / "bridge.log").read_text()
        capped = re.search(r"serving at most (\d+) connections, not 1024", logs)
        assert capped and 1 <= int(capped.group(1)) < 64 - 32, logs
        assert "evicting the oldest unauthenticated connection" in logs
        assert "Too many open files" not in logs and bridge.proc.poll() is None
    finally:
        for s in idle:
            s.close()
        bridge.kill()
        _remove_segment(name)


def test_the_soft_file_limit_is_raised_to_the_hard_one():
    import sys

    code = ("import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (64, 256)); "
            "from shmrdv.bridge.service import raise_file_limit; "
            "print(raise_file_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["256", "256", "256"]
