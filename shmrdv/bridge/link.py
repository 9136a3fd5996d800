"""The sending half of a bridge: one link per remote bridge URL.

Envelopes taken from the outbox get consecutive sequence numbers and are
written to the remote bridge straight from shared memory (``sendmsg`` over
the envelope's payload view: the one copy is the kernel's). Large payloads
go out in chunks, round-robin with every other message in flight, so a
small message never waits behind a huge one; two messages under the same
key never overlap, so they arrive in the order they were sent.

A message is held (its envelope view kept) until the remote bridge says it
committed it. When the link fails, the link reconnects with exponential
backoff and resends whatever the remote bridge's dedupe window (sent in
WELCOME) does not already hold: each message arrives exactly once.
"""
import collections
import logging
import os
import select
import socket
import ssl
import struct
import threading
import time
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from . import auth, backoff, outbox, protocol
from .backoff import Backoff
from .link_marks import LinkMark
from .outbox import Envelope
from ..errors import InvalidArgument, RendezvousError
from .protocol import Ack, ConnectionLost, Frame, ProtocolError, Role

log = logging.getLogger("shmrdv.bridge")


_DIRECT_MAX = 64 << 10  # messages the dispatcher may write itself when the link is idle
_ABORT_WAIT_S = 5.0  # how long an abort waits for the link's socket before using one of its own
_ABORT_CONNECT_S = 2.0  # how long an abort on a connection of its own waits to reach the bridge
_STABLE_S = 1.0  # a connection that lasted less than this does not reset the backoff
_RETRY_INITIAL_S = 0.01  # backoff of a message the remote turned away (ACK RETRY) ...
_RETRY_MAX_S = 0.5  # ... doubling up to this
# A plain bridge greets a connection at once; a tcp:// connection still
# without a byte after this long asks whether the bridge speaks TLS instead.
_TLS_PROBE_AFTER_S = 0.5


class LinkSettings:
    """Timeouts and retries of a link (and of ``connect()`` clients)."""

    def __init__(self, connect_timeout: float = 5.0, backoff_initial: float = 0.05, backoff_max: float = 5.0,
                 deadline: Optional[float] = 300.0) -> None:
        self.connect_timeout = connect_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.deadline = deadline  # seconds a message may wait for an unreachable bridge; None: forever


def new_origin() -> int:
    return struct.unpack("<Q", os.urandom(8))[0] | 1


def tls_client_context(tls_ca: Optional[str]) -> ssl.SSLContext:
    """The context tls:// connections verify a bridge's certificate with:
    tls_ca (a PEM file of CA certificates) or the system store.
    InvalidArgument, naming the file and what to pass instead, if tls_ca
    is missing, unreadable or holds no PEM certificate."""
    what = "pass the PEM file of the CA that signed the bridge's certificate (for a self-signed one, the certificate itself)"
    try:
        return ssl.create_default_context(cafile=tls_ca)
    except FileNotFoundError:
        raise InvalidArgument(f"tls_ca {tls_ca!r} does not exist: {what}") from None
    except ssl.SSLError as exc:  # an OSError too: before the plain OSErrors below
        raise InvalidArgument(f"tls_ca {tls_ca!r} is not a PEM certificate ({exc.reason or exc}): {what}, the text "
                              "from '-----BEGIN CERTIFICATE-----' to '-----END CERTIFICATE-----'") from None
    except OSError as exc:
        raise InvalidArgument(f"cannot read tls_ca {tls_ca!r}: {exc.strerror or exc}: {what}") from None


def _speaks_plain(host: str, port: int, timeout: float) -> bool:
    """Whether the server at host:port greets a plain TCP connection with a
    bridge's HELLO, on a connection of its own."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            protocol.parse_hello(protocol.Reader(raw).expect(Frame.HELLO))
            return True
    except (OSError, RendezvousError):
        return False


def _check_speaks_plain(sock: socket.socket, url: str, host: str, port: int, settings: LinkSettings) -> None:
    """tcp://: a plain bridge says HELLO as soon as it accepts, and a TLS one
    says nothing, waiting for a ClientHello. So a bridge still silent after
    _TLS_PROBE_AFTER_S is asked, on a connection of its own, whether it
    completes a TLS handshake (verifying nothing: it only asks which
    protocol), while sock goes on waiting for its HELLO: a plain bridge
    merely slow to accept is not kept waiting by the question."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    if poller.poll(int(min(_TLS_PROBE_AFTER_S, settings.connect_timeout) * 1000)):
        return
    deadline = time.monotonic() + settings.connect_timeout
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    raw = socket.socket(sock.family, socket.SOCK_STREAM)
    probe: Optional[ssl.SSLSocket] = None
    try:
        raw.setblocking(False)
        try:
            raw.connect(sock.getpeername())
        except BlockingIOError:
            pass
        step: socket.socket = raw  # connecting; then probe, in its handshake
        events = select.POLLOUT
        while True:
            poller.register(step, events)
            left = deadline - time.monotonic()
            ready = dict(poller.poll(left * 1000)) if left > 0 else {}
            poller.unregister(step)
            if sock.fileno() in ready or not ready:
                return  # sock's first bytes are the caller's to read; or the probe got no answer either
            if probe is None:
                if raw.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    return
                probe = step = ctx.wrap_socket(raw, server_hostname=host, do_handshake_on_connect=False)
            try:
                probe.do_handshake()
                break
            except ssl.SSLWantReadError:
                events = select.POLLIN
            except ssl.SSLWantWriteError:
                events = select.POLLOUT
    except (OSError, ssl.SSLError):
        return  # no TLS handshake there: a plain bridge (slow), or none at all
    finally:
        raw.close()  # detached once wrapped: then the probe holds the connection
        if probe is not None:
            probe.close()
    raise ProtocolError(f"bridge {url} speaks TLS: connect to tls://{host}:{port} "
                        "(with tls_ca= the CA that signed its certificate, unless the system trusts it)")


def open_socket(url: str, token: bytes, role: Role, origin: int, first_seq: int, settings: LinkSettings,
                tls_ca: Optional[str]) -> "tuple[socket.socket, protocol.Reader, int, int, int]":
    """Connect and authenticate as origin, which may still send sequence
    numbers from first_seq on; returns (socket, reader, capacity, base, bits).
    ConnectionLost when the bridge cannot be reached, AuthenticationError when
    the tokens differ or its certificate is not trusted, ProtocolError when it
    does not speak the URL's scheme, InvalidArgument when tls_ca is unusable."""
    scheme, host, port = protocol.parse_url(url)
    ctx = tls_client_context(tls_ca) if scheme == "tls" else None  # a bad tls_ca is no network failure: first
    try:
        sock = socket.create_connection((host, port), timeout=settings.connect_timeout)
    except OSError as exc:
        raise ConnectionLost(f"cannot reach bridge {url}: {exc}") from exc
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if ctx is None:
            _check_speaks_plain(sock, url, host, port, settings)
        else:
            try:
                sock = ctx.wrap_socket(sock, server_hostname=host)
            except ssl.SSLCertVerificationError as exc:
                raise protocol.AuthenticationError(
                    f"bridge {url}: its certificate is not trusted ({exc.verify_message}): pass tls_ca= the PEM file "
                    "of the CA that signed it (for a self-signed one, the certificate itself)") from None
            except (ssl.SSLError, ssl.CertificateError) as exc:
                if _speaks_plain(host, port, min(_TLS_PROBE_AFTER_S, settings.connect_timeout)):
                    raise ProtocolError(f"bridge {url} does not speak TLS (it answered in plain TCP): connect to "
                                        f"tcp://{host}:{port}, or serve TLS with --tls-cert and --tls-key") from None
                raise protocol.AuthenticationError(f"TLS handshake with {url} failed: {exc}") from exc
            except OSError as exc:
                raise ConnectionLost(f"TLS handshake with {url} failed: {exc}") from exc
        reader = protocol.Reader(sock)
        capacity, server_nonce = protocol.parse_hello(reader.expect(Frame.HELLO))
        client_nonce = auth.nonce()
        proof = auth.client_proof(token, server_nonce, client_nonce, origin, first_seq)
        protocol.send_all(sock, [protocol.auth(role, origin, first_seq, client_nonce, proof)])
        try:
            server_proof, base, bits = protocol.parse_welcome(reader.expect(Frame.WELCOME))
        except protocol.AuthenticationError as exc:
            if not token:  # a missing token is not a wrong one: say which
                raise protocol.AuthenticationError(
                    f"bridge {url} requires a token and none was given: pass token=... "
                    "(connect, Rendezvous routes) or --token-file (shmrdv bridge)") from None
            raise protocol.AuthenticationError(f"bridge {url} refused our token: {exc}") from None
        if not auth.matches(auth.server_proof(token, server_nonce, client_nonce), server_proof):
            raise protocol.AuthenticationError(f"bridge {url} does not hold our token")
        sock.settimeout(None)
        return sock, reader, capacity, base, bits
    except BaseException:
        sock.close()
        raise


def tell_abort(url: str, token: bytes, tls_ca: Optional[str], frame: bytes) -> bool:
    """Send an abort frame to the bridge at url on a connection of its own,
    each step (connect, handshake, send) waiting at most _ABORT_CONNECT_S;
    False (and a warning) if it could not be told. Never raises: whatever
    the peer answers, the abort has already happened here."""
    try:
        s, *_ = open_socket(url, token, Role.LINK, new_origin(), 1, LinkSettings(connect_timeout=_ABORT_CONNECT_S), tls_ca)
        with s:
            s.settimeout(_ABORT_CONNECT_S)  # one small frame: the kernel takes it at once unless the peer is stuck
            protocol.send_all(s, [frame])
        return True
    except Exception as exc:  # a refusal of any code, a TLS or network error: all only logged
        log.warning("could not tell %s about the abort: %s", url, exc)
        return False


def tell_abort_all(targets: Sequence[Tuple[str, bytes, Optional[str]]], frame: bytes,
                   within: float = _ABORT_CONNECT_S) -> None:
    """tell_abort to every (url, token, tls_ca) at once, waiting at most
    `within` seconds in all: a bridge slower than that (a dead host, a name
    that does not resolve) is left to its thread, a daemon that gives up on
    its own socket timeouts."""
    threads = [threading.Thread(target=tell_abort, args=(*target, frame), name="shmrdv-abort", daemon=True)
               for target in targets]
    for thread in threads:
        thread.start()
    end = time.monotonic() + within
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))


class Outgoing:
    """One envelope on its way: the view that keeps its block alive, and
    how much of it the current connection has written."""

    __slots__ = ("seq", "key", "meta", "payload", "view", "offset", "meta_sent", "since", "writing", "retry", "retries", "not_before")

    def __init__(self, env: Envelope, view: Any) -> None:
        self.seq = 0
        self.key = env.key
        self.payload = env.payload
        self.view = view
        self.meta = b""
        self.meta_sent = False
        self.offset = 0
        self.since = time.monotonic()
        self.writing = False  # the link thread is writing a piece of it, outside the lock
        self.retry = False  # the remote turned it away (Ack.RETRY): send it again once written out
        self.retries = 0
        self.not_before = 0.0

    def prepare(self, env: Envelope) -> None:
        self.meta = protocol.encode_meta(Frame.MSG, self.seq, env.key, env.dtype_code, env.shape, self.payload.nbytes)


def _from_the_start(messages: Iterable[Outgoing]) -> None:
    """Every message to be written again from its first byte, on a new
    connection. A function of its own, so that its loop variable does not
    keep the last message (and its envelope's block) for the connection's
    life."""
    for out in messages:
        out.meta_sent, out.offset, out.retry, out.writing = False, 0, False, False


class Link:
    """Everything bound for one remote bridge."""

    def __init__(self, url: str, token: bytes, tls_ca: Optional[str], mark: LinkMark, settings: LinkSettings,
                 on_abort: Callable[[str], None], on_fatal: Callable[[str], None], release: Callable[[int], None],
                 recovered: Sequence[Tuple[Envelope, Any]] = ()) -> None:
        self.url, self._token, self._ca = url, token, tls_ca
        self._mark, self._settings = mark, settings
        self._on_abort, self._on_fatal, self._release = on_abort, on_fatal, release
        self._cond = threading.Condition()
        state = mark.load()
        self._origin, self._next_seq = state if state is not None else (new_origin(), 1)
        self._unacked: Dict[int, Outgoing] = {}  # every message not yet acknowledged
        self._queue: Deque[Outgoing] = collections.deque()  # not yet begun on this connection
        self._active: Deque[Outgoing] = collections.deque()  # begun, payload still going out
        self._busy_keys: Set[bytes] = set()
        self._key_waiters: Dict[bytes, Deque[Outgoing]] = {}
        self._acked_base = 0  # every seq <= this is acknowledged
        self._acked_bits = 0
        self._sock: Optional[socket.socket] = None
        self._writer_busy = False  # a thread is writing to the socket, outside the lock
        self._broken = False
        self._lost_because: Optional[Exception] = None  # why the ACK reader ended the connection
        self._stopping = False
        for env, view in sorted(recovered, key=lambda item: item[0].seq):
            self._take_recovered(env, view)
        mark.store(self._origin, self._next_seq)
        self._thread = threading.Thread(target=self._run, name=f"shmrdv-link-{url}", daemon=True)
        self._thread.start()

    # ---- the dispatcher's side --------------------------------------------------

    @property
    def origin(self) -> int:
        return self._origin

    def submit(self, env: Envelope, view: Any) -> None:
        """Number a fresh envelope and queue it. The number is written into
        the envelope before the mark moves past it, so after a crash either
        the mark is below it or the envelope carries it (see outbox.stamp)."""
        out = Outgoing(env, view)
        with self._cond:
            out.seq = self._next_seq
            self._next_seq += 1
            outbox.stamp(view, self._origin, out.seq)
            self._mark.store(self._origin, self._next_seq)
            out.prepare(env)
            self._unacked[out.seq] = out
            sock = self._sock
            # Idle: nothing queued, going out or waiting behind its key.
            direct = (sock is not None and not self._broken and not self._stopping and not self._writer_busy
                      and not self._queue and not self._active and not self._busy_keys
                      and out.payload.nbytes <= _DIRECT_MAX
                      and out.seq - self._acked_base <= protocol.WINDOW)
            if not direct:
                self._queue.append(out)
                self._cond.notify_all()
                return
            # The link is idle: write this small message from here, saving
            # the hand-off to the link thread (a wake-up, tens of µs).
            self._writer_busy = True
            out.writing, out.meta_sent, out.offset = True, True, out.payload.nbytes
        assert sock is not None
        parts: List[Any] = [out.meta]
        if out.payload.nbytes:
            parts += [protocol.header(Frame.DATA, out.payload.nbytes, out.seq), out.payload]
        try:
            protocol.send_all(sock, parts)
            failed = False
        except ConnectionLost:
            failed = True  # it stays unacknowledged: the reconnect sends it again
        with self._cond:
            self._writer_busy = False
            out.writing = False
            if failed:
                self._broken = True
            elif out.retry:
                self._requeue(out)
            self._cond.notify_all()
        if failed:
            self._drop_socket()

    def submit_recovered(self, env: Envelope, view: Any) -> None:
        with self._cond:
            self._take_recovered(env, view)
            self._mark.store(self._origin, self._next_seq)
            self._queue = collections.deque(sorted(self._queue, key=lambda o: o.seq))
            self._cond.notify_all()

    def _take_recovered(self, env: Envelope, view: Any) -> None:
        """An envelope a dead bridge had numbered: it keeps its number."""
        out = Outgoing(env, view)
        out.seq = env.seq
        out.prepare(env)
        self._unacked[out.seq] = out
        self._queue.append(out)
        self._next_seq = max(self._next_seq, env.seq + 1)

    def pending(self) -> int:
        with self._cond:
            return len(self._unacked)

    def take_unacked(self) -> List[Outgoing]:
        """Stop and hand back what was never acknowledged, oldest first."""
        with self._cond:
            self._stopping = True
            left = [self._unacked[s] for s in sorted(self._unacked)]
            self._unacked.clear()
            self._queue.clear()
            self._active.clear()
            self._cond.notify_all()
        self._drop_socket()
        return left

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._drop_socket()
        self._thread.join(timeout=5)

    def send_abort(self, reason: str) -> None:
        """Tell the remote bridge, on the open connection or a short-lived one."""
        frame = protocol.abort(reason)
        with self._cond:
            # The socket has one writer at a time: frames of a message in
            # flight must not be cut by this one.
            give_up = time.monotonic() + _ABORT_WAIT_S
            while self._sock is not None and self._writer_busy and time.monotonic() < give_up:
                self._cond.wait(0.05)
            sock = None if self._writer_busy else self._sock
            if sock is not None:
                self._writer_busy = True
        if sock is not None:
            try:
                protocol.send_all(sock, [frame])
                return
            except ConnectionLost:
                pass  # tell it on a connection of our own
            finally:
                with self._cond:
                    self._writer_busy = False
                    self._cond.notify_all()
        tell_abort(self.url, self._token, self._ca, frame)

    # ---- the link thread -------------------------------------------------------

    def _run(self) -> None:
        reconnect = Backoff(self._settings.backoff_initial, self._settings.backoff_max)
        down_since: Optional[float] = None
        # Until the link has been up once, its peer may just be starting
        # (bridges start in any order): a refused connect is news, not trouble.
        ever_up = False
        while True:
            with self._cond:
                if self._stopping:
                    return
            with self._cond:
                first_seq = min(self._unacked, default=self._next_seq)
            try:
                sock, reader, _cap, base, bits = open_socket(self.url, self._token, Role.LINK, self._origin, first_seq, self._settings, self._ca)
            except (protocol.AuthenticationError, InvalidArgument) as exc:  # a wrong token or tls_ca: no retry mends it
                self._on_fatal(f"bridge link to {self.url}: {exc}")
                return
            except (ConnectionLost, ProtocolError) as exc:
                now = time.monotonic()
                if down_since is None:
                    down_since = now
                    log.log(logging.WARNING if ever_up else logging.INFO, "link to %s is down: %s", self.url, exc)
                waited = self._oldest_wait(now)
                if self._settings.deadline is not None and waited > self._settings.deadline:
                    self._on_fatal(f"bridge {self.url} unreachable: a message for it has waited {waited:.0f} s, past "
                                   f"the deadline of {self._settings.deadline:g} s (--deadline): {exc}")
                    return
                with self._cond:
                    self._cond.wait(reconnect.next())
                continue
            log.info("link to %s is up", self.url)
            down_since, ever_up = None, True
            # A remote host cut off now fails this connection once the
            # deadline passes without an answer from its TCP, and the
            # reconnects that follow find its messages past the deadline.
            # Otherwise TCP would retransmit for a quarter of an hour.
            protocol.keep_alive(sock)
            if self._settings.deadline is not None:
                protocol.drop_when_unanswered(sock, self._settings.deadline)
            started = time.monotonic()
            self._serve(sock, reader, base, bits)
            if time.monotonic() - started < _STABLE_S:
                # Dropped at once (a peer that keeps hanging up): back off
                # as for a failed connect, or the link would spin.
                with self._cond:
                    self._cond.wait(reconnect.next())
            else:
                reconnect.reset()

    def _oldest_wait(self, now: float) -> float:
        """How long the oldest message not yet acknowledged has waited (0: none)."""
        with self._cond:
            oldest = min((o.since for o in self._unacked.values()), default=now)
        return now - oldest

    def _serve(self, sock: socket.socket, reader: protocol.Reader, base: int, bits: int) -> None:
        with self._cond:
            self._sock = sock
            # What the remote committed before (WELCOME): done. The rest goes
            # out again from scratch, in order.
            self._acked_base, self._acked_bits = base, bits
            for seq in [s for s in self._unacked if protocol.window_has(base, bits, s)]:
                self._done(seq)
            self._queue = collections.deque(self._unacked[s] for s in sorted(self._unacked))
            _from_the_start(self._queue)
            self._active.clear()
            self._busy_keys.clear()
            self._key_waiters.clear()
            self._broken = False
            self._lost_because = None
        acks = threading.Thread(target=self._read_acks, args=(reader,), name=f"shmrdv-acks-{self.url}", daemon=True)
        acks.start()
        try:
            self._write(sock)
        except ConnectionLost as exc:
            if not self._stopping:
                log.warning("link to %s lost: %s", self.url, self._lost_because or exc)
        finally:
            self._drop_socket()
            acks.join()

    def _write(self, sock: socket.socket) -> None:
        while True:
            self._write_piece(sock)

    def _write_piece(self, sock: socket.socket) -> None:
        """Wait for a message to write and write its next piece. One piece
        per call: a message's envelope block is freed when the ACK drops the
        last reference to it, so none may outlive its turn in a local."""
        with self._cond:
            while True:
                if self._stopping or self._broken:
                    raise ConnectionLost("link closed")
                wait = self._admit()
                if self._active and not self._writer_busy:
                    break
                self._cond.wait(wait)
            out = self._active.popleft()
            out.writing = True
            self._writer_busy = True
        parts: List[Any] = []
        if not out.meta_sent:
            parts.append(out.meta)
            out.meta_sent = True
        n = min(protocol.CHUNK, out.payload.nbytes - out.offset)
        if n:
            parts += [protocol.header(Frame.DATA, n, out.seq), out.payload[out.offset : out.offset + n]]
            out.offset += n
        try:
            protocol.send_all(sock, parts)
        except ConnectionLost:
            with self._cond:
                self._writer_busy = out.writing = False
                self._cond.notify_all()
            raise
        # One hold of the lock from here on: between freeing the socket
        # and passing the key to its next message, an idle-looking link
        # would let submit() write a later message of the key first.
        with self._cond:
            self._writer_busy = out.writing = False
            self._cond.notify_all()  # send_abort may be waiting for the socket
            if out.offset < out.payload.nbytes:
                self._active.append(out)
                return
            waiting = self._key_waiters.get(out.key)
            if waiting:
                self._active.append(waiting.popleft())
            else:
                self._key_waiters.pop(out.key, None)
                self._busy_keys.discard(out.key)
            if out.retry:
                self._requeue(out)

    def _admit(self) -> Optional[float]:
        """Move queued messages into the active set while the window allows;
        a message whose key is already going out waits behind it. Returns
        how long to wait for a message that must not go yet (None: no such)."""
        while self._queue and self._queue[0].seq - self._acked_base <= protocol.WINDOW:
            delay = self._queue[0].not_before - time.monotonic()
            if delay > 0:
                return delay
            out = self._queue.popleft()
            if out.key in self._busy_keys:
                self._key_waiters.setdefault(out.key, collections.deque()).append(out)
            else:
                self._busy_keys.add(out.key)
                self._active.append(out)
        return None

    def _requeue(self, out: Outgoing) -> None:
        """Send a message the remote turned away again, from the start and in
        sequence order, after a backoff (10 ms doubling to 0.5 s)."""
        out.retry, out.meta_sent, out.offset = False, False, 0
        out.retries += 1
        out.not_before = time.monotonic() + backoff.delay(out.retries, _RETRY_INITIAL_S, _RETRY_MAX_S)
        i = 0
        while i < len(self._queue) and self._queue[i].seq < out.seq:
            i += 1
        self._queue.insert(i, out)
        self._cond.notify_all()

    def _read_acks(self, reader: protocol.Reader) -> None:
        try:
            while True:
                kind, length, stream = reader.header()
                body = reader.body(length)
                if kind is Frame.ACK:
                    self._on_ack(stream, body)
                elif kind is Frame.ABORT:
                    self._on_abort(protocol.parse_text(body))
                else:
                    raise ProtocolError(f"unexpected {kind.name} frame from bridge {self.url}")
        except (ConnectionLost, ProtocolError) as exc:
            if not isinstance(exc, ConnectionLost):
                log.warning("link to %s: %s", self.url, exc)
            self._lost_because = exc  # the writer says why it stopped
        finally:
            with self._cond:
                self._broken = True
                self._cond.notify_all()
            self._drop_socket()

    def _on_ack(self, stream: int, body: bytes) -> None:
        """The remote's answer to message `stream`. A method of its own so
        that no reference to the message outlives it: the envelope's block
        is freed when _done drops the last one."""
        status, code, message = protocol.parse_ack(body)
        if status is Ack.REFUSED:
            # A send that returned can never be delivered: fail
            # the step, as TensorFlow does, rather than drop it
            # quietly. (A refusal because the remote rendezvous
            # is aborted just repeats that abort.)
            out = self._unacked.get(stream)
            what = out.key.decode("utf-8", "replace") if out is not None else f"message {stream}"
            why = type(protocol.error_for(code, message)).__name__
            self._on_fatal(f"bridge {self.url} refused {what!r} for good: {why}: {message}")
        with self._cond:
            out = self._unacked.get(stream)
            if out is None:
                return
            if status is Ack.RETRY:
                # Resent once fully written out (the remote is
                # discarding its DATA until then).
                out.retry = True
                if not out.writing and out.meta_sent and out.offset == out.payload.nbytes and out not in self._active:
                    self._requeue(out)
                return
            self._done(stream)
            self._cond.notify_all()

    def _done(self, seq: int) -> None:
        out = self._unacked.pop(seq)
        out.view = None  # frees the envelope's block
        self._release(1)
        self._acked_base, self._acked_bits = protocol.window_add(self._acked_base, self._acked_bits, seq) \
            if seq > self._acked_base else (self._acked_base, self._acked_bits)

    def _drop_socket(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
