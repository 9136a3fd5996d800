"""Refusals cross the bridge as numeric codes (protocol version 2), mapped to
exceptions in one place (``protocol.code_for`` / ``protocol.error_for``); the
text is only a message for humans. And the bridge's limits and dtype rule are
the core's own (``shmrdv.limits``, ``shmrdv.codec``)."""
import socket
import time
from pathlib import Path

import numpy as np
import pytest

import shmrdv
from shmrdv import codec, limits
from shmrdv.bridge import auth, backoff, protocol
from shmrdv.bridge.protocol import Ack, Code, Frame

from .bridges import BridgeProc, write_token
from ..conftest import MiB, _new_name, _remove_segment

TOKEN = "codes, not strings"

EXCEPTIONS = [
    (shmrdv.Aborted("the step failed"), Code.ABORTED),
    (shmrdv.RendezvousTimeout("recv 'k': timed out"), Code.TIMEOUT),
    (shmrdv.MessageTooLarge("never fits"), Code.TOO_LARGE),
    (shmrdv.TooManyKeys("index full"), Code.TOO_MANY_KEYS),
    (shmrdv.InvalidType("object dtype"), Code.INVALID_TYPE),
    (shmrdv.InvalidArgument("bad shape"), Code.INVALID),
    (shmrdv.AuthenticationError("wrong token"), Code.UNAUTHENTICATED),
    (shmrdv.RendezvousError("something else"), Code.FAILED),
]


@pytest.mark.parametrize("exc, code", EXCEPTIONS, ids=lambda v: type(v).__name__ if isinstance(v, Exception) else None)
def test_every_exception_has_a_code_and_comes_back_as_itself(exc, code):
    assert protocol.code_for(exc) is code
    back = protocol.error_for(code, str(exc))
    assert type(back) is type(exc) and str(back) == str(exc)
    if isinstance(exc, shmrdv.Aborted):
        assert back.reason == exc.reason


def test_an_abort_crosses_as_its_reason_alone():
    exc = shmrdv.Aborted("the step failed", name="host-a")
    assert protocol.refusal(exc) == (Code.ABORTED, "the step failed")
    assert protocol.error_for(*protocol.refusal(exc)).reason == "the step failed"
    assert protocol.refusal(shmrdv.TooManyKeys("full")) == (Code.TOO_MANY_KEYS, "full")


def test_codes_without_an_exception_are_plain_rendezvous_errors():
    for code in (Code.FAILED, Code.EMPTY, Code.CANCELLED, Code.NONE):
        assert type(protocol.error_for(code, "x")) is shmrdv.RendezvousError
    assert protocol.code_for(KeyError("k")) is Code.FAILED


def test_ack_error_and_refused_carry_the_code_and_the_message():
    body = protocol.ack(7, Ack.REFUSED, Code.TOO_LARGE, "16 MiB can never fit")[protocol.HEADER.size :]
    assert body[:2] == bytes([Ack.REFUSED, Code.TOO_LARGE])
    assert protocol.parse_ack(body) == (Ack.REFUSED, Code.TOO_LARGE, "16 MiB can never fit")
    assert protocol.parse_ack(protocol.ack(7, Ack.COMMITTED)[protocol.HEADER.size :]) == (Ack.COMMITTED, Code.NONE, "")
    body = protocol.error(3, Code.ABORTED, "reason")[protocol.HEADER.size :]
    assert protocol.parse_error(body) == (Code.ABORTED, "reason")
    body = protocol.refused(Code.UNAUTHENTICATED, "wrong token")[protocol.HEADER.size :]
    assert protocol.parse_refused(body) == (Code.UNAUTHENTICATED, "wrong token")


def test_unknown_codes_read_as_failed_and_the_message_is_bounded():
    assert protocol.parse_error(bytes([200]) + b"new")[0] is Code.FAILED
    assert protocol.parse_ack(bytes([Ack.REFUSED, 200]) + b"new")[:2] == (Ack.REFUSED, Code.FAILED)
    with pytest.raises(protocol.ProtocolError):
        protocol.parse_ack(bytes([Ack.COMMITTED]))  # version 1's ACK: no code byte
    with pytest.raises(protocol.ProtocolError):
        protocol.parse_ack(bytes([9, 0]))  # no such status
    with pytest.raises(protocol.ProtocolError):
        protocol.parse_error(bytes([1]) + b"x" * (protocol.MAX_REASON + 1))
    long = protocol.error(1, Code.FAILED, "é" * protocol.MAX_REASON)[protocol.HEADER.size :]
    assert len(long) <= 1 + protocol.MAX_REASON


def test_version_2_refuses_version_1():
    assert protocol.VERSION == 2
    hello = protocol.hello(1 << 20, b"\0" * protocol.NONCE_LEN)[protocol.HEADER.size :]
    assert protocol.parse_hello(hello) == (1 << 20, b"\0" * protocol.NONCE_LEN)
    old = hello[:6] + (1).to_bytes(2, "little") + hello[8:]
    with pytest.raises(protocol.ProtocolError, match="version 1"):
        protocol.parse_hello(old)


def test_the_wire_limits_are_the_cores():
    assert (protocol.MAX_KEY, protocol.MAX_DTYPE, protocol.MAX_NDIM, protocol.MAX_REASON) == \
        (limits.KEY_MAX, limits.DTYPE_MAX, limits.NDIM_MAX, limits.REASON_MAX)
    header = (Path(__file__).resolve().parent.parent.parent / "csrc" / "shmrdv.h").read_text()
    for name, value in vars(limits).items():
        if name.isupper():
            c_name = "RDV_" + name
            assert f"#define {c_name} {value}\n" in header, (name, c_name)


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.bool_, "M8[ns]", "m8[s]", "S5", "<U3", np.complex128,
                                   object, "V8", [("a", "<i4")], ("<i4", (2,)), "S0"])
def test_the_bridge_admits_exactly_the_dtypes_the_core_sends(dtype):
    dt = np.dtype(dtype)
    code = dt.str.encode("ascii")
    if codec.dtype_sendable(dt):
        assert protocol.check_dtype(code) == dt
    else:
        with pytest.raises(protocol.ProtocolError):
            protocol.check_dtype(code)


def test_one_backoff_rule():
    waits = backoff.Backoff(0.05, 0.3)
    assert [waits.next() for _ in range(5)] == [0.05, 0.1, 0.2, 0.3, 0.3]
    waits.reset()
    assert waits.next() == 0.05
    assert [backoff.delay(n, 0.01, 0.5) for n in (1, 2, 7, 1000)] == [0.01, 0.02, 0.5, 0.5]
    with pytest.raises(ValueError):
        backoff.delay(0, 0.01, 0.5)


# ---- through a real bridge -------------------------------------------------------


@pytest.fixture
def few_keys(tmp_path):
    """A rendezvous with room for few keys, served by a bridge with a token."""
    name = _new_name()
    shmrdv.Rendezvous(name, size=4 * MiB, max_keys=8, create=True).close()
    bridge = BridgeProc(name, token_file=write_token(tmp_path / "token", TOKEN), log_path=str(tmp_path / "bridge.log")).start()
    try:
        yield name, bridge
    finally:
        bridge.kill()
        _remove_segment(name)


@pytest.mark.timeout(120)
def test_codes_become_the_same_exceptions_as_local_calls(few_keys):
    name, bridge = few_keys
    with shmrdv.connect(bridge.url, token=TOKEN) as remote, shmrdv.Rendezvous(name) as local:
        # TIMEOUT (over ERROR), EMPTY
        with pytest.raises(shmrdv.RendezvousTimeout, match="timed out"):
            remote.recv("nothing-here", timeout=0.2)
        assert remote.try_recv("nothing-here") is None
        # TOO_MANY_KEYS over ACK: the index fills up; the client's send fails as a local send does
        with pytest.raises(shmrdv.TooManyKeys):
            for i in range(10_000):
                remote.send(f"key-{i}", np.zeros(4, np.float32), timeout=10)
        with pytest.raises(shmrdv.TooManyKeys):
            local.send("one-more", np.zeros(4, np.float32), timeout=1)
        # ... and over ERROR: a receive that would have to create a key
        with pytest.raises(shmrdv.TooManyKeys):
            remote.recv("one-more", timeout=1)
        # ABORTED: the reason alone, not prefixed by an exception's name
        local.abort("the step failed")
        with pytest.raises(shmrdv.Aborted) as info:
            remote.recv("key-0", timeout=5)
        assert info.value.reason == "the step failed"


@pytest.mark.timeout(60)
def test_a_wrong_proof_is_refused_with_its_code(few_keys):
    _name, bridge = few_keys
    with socket.create_connection((bridge.host, bridge.port), timeout=10) as sock:
        reader = protocol.Reader(sock)
        _cap, _nonce = protocol.parse_hello(reader.expect(Frame.HELLO))
        sock.sendall(protocol.auth(protocol.Role.CLIENT, 5, 1, auth.nonce(), b"\0" * 32))
        kind, length, _ = reader.header()
        assert kind is Frame.REFUSED
        code, message = protocol.parse_refused(reader.body(length))
        assert code is Code.UNAUTHENTICATED and "wrong token" in message


@pytest.mark.timeout(120)
def test_a_full_key_index_delays_a_links_messages_without_losing_them(tmp_path):
    """Through a link the send has returned already: a key index that is full
    at the commit is answered ACK RETRY (not a refusal that would abort the
    step), and the messages all arrive, each once, as keys are freed. A
    message being retried may be overtaken by those of other keys (only each
    key's order is kept: docs/protocol.md), so the receiver takes whichever
    key has a message rather than insist on one whose key cannot be made
    while the index is full."""
    from .test_bridge import DEV_A, DEV_B, key

    names = (_new_name(), _new_name())
    token_file = write_token(tmp_path / "token", TOKEN)
    bridges = []
    try:
        shmrdv.Rendezvous(names[0], size=16 * MiB, create=True).close()
        shmrdv.Rendezvous(names[1], size=16 * MiB, max_keys=8, create=True).close()
        for name in names:
            bridges.append(BridgeProc(name, token_file=token_file, log_path=str(tmp_path / f"{name}.log")).start())
        with shmrdv.Rendezvous(names[0], routes={"/job:b": bridges[1].url}, token=TOKEN) as a, \
                shmrdv.Rendezvous(names[1]) as b:
            keys = [key(DEV_A, DEV_B, f"t{i}") for i in range(40)]
            for i, k in enumerate(keys):
                a.send(k, np.full(4, i, np.int32))
            arrived, deadline = {}, time.monotonic() + 60
            while len(arrived) < len(keys) and time.monotonic() < deadline:
                for i, k in enumerate(keys):
                    got = b.try_recv(k) if i not in arrived else None
                    if got is not None:
                        arrived[i] = int(got[0])
                        del got
                time.sleep(0.005)
            assert arrived == {i: i for i in range(len(keys))}
            assert all(b.try_recv(k) is None for k in keys)  # each once
            assert not a.stats().aborted and not b.stats().aborted
        # turned away and sent again, not dropped with the connection
        assert "unexpected error" not in bridges[1].logs(), bridges[1].logs()
    finally:
        for bridge in bridges:
            bridge.kill()
        for name in names:
            _remove_segment(name)
