"""``shmrdv.connect(url, token=...)``: a rendezvous on another host, through its bridge.

The returned ``RemoteRendezvous`` has the ``send``/``recv``/``try_recv``/
``recv_async``/``abort``/``close`` API of ``Rendezvous``. A send returns once
the remote bridge has committed the message; if the connection fails on the
way, it reconnects and sends again, and the bridge's dedupe window drops the
copy it may already have. A received array arrives in memory of its own
(it crossed a network: there is nothing to share).
"""
import threading
import time
from concurrent.futures import Future
from typing import Any, List, Optional, Tuple

import numpy as np

from . import auth, protocol
from .auth import Token
from .backoff import Backoff
from .link import LinkSettings, new_origin, open_socket
from ..errors import Aborted, InvalidArgument, InvalidType, MessageTooLarge, RendezvousError
from .protocol import Ack, Code, ConnectionLost, Frame, ProtocolError, Role
from ..codec import as_sendable
from ..codec import dtype_code as _dtype_code
from ..codec import key_bytes as _key_bytes
from ..codec import timeout_ns as _timeout_ns


class _Conn:
    def __init__(self, sock: Any, reader: protocol.Reader) -> None:
        self.sock, self.reader = sock, reader

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class RemoteRendezvous:
    """A remote rendezvous reached through its host's bridge (see ``connect``)."""

    def __init__(self, url: str, token: Token = None, *, tls_ca: Optional[str] = None,
                 settings: Optional[LinkSettings] = None) -> None:
        try:
            protocol.parse_url(url)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(str(exc)) from None
        self.url = url
        self._token = auth.normalize_token(token)
        self._ca = tls_ca
        self._settings = settings or LinkSettings(deadline=30.0)
        self._origin = new_origin()
        self._lock = threading.Condition()
        self._idle: List[_Conn] = []
        # Sequence numbers of sends, consecutive: the bridge's dedupe window
        # spans protocol.WINDOW numbers past the oldest uncommitted one, so a
        # number taken by anything but a send would be a gap it never fills.
        self._next = 1
        self._in_flight: List[int] = []
        self._next_request = 1  # ids of receives: a numbering of their own
        self._closed = False
        self.capacity = 0
        self._release(self._open())  # fails now on a wrong token or an unreachable bridge

    # ---- connections -------------------------------------------------------

    def _open(self) -> _Conn:
        with self._lock:
            first_seq = min(self._in_flight, default=self._next)
        sock, reader, capacity, _base, _bits = open_socket(self.url, self._token, Role.CLIENT, self._origin, first_seq, self._settings, self._ca)
        self.capacity = capacity
        return _Conn(sock, reader)

    def _take(self) -> _Conn:
        with self._lock:
            if self._closed:
                raise RendezvousError(f"connection to {self.url} is closed")
            if self._idle:
                return self._idle.pop()
        return self._open()

    def _release(self, conn: _Conn) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(conn)
                return
        conn.close()

    def _retrying(self, op: Any, deadline_s: Optional[float]) -> Any:
        """Run op(conn) and retry it on a fresh connection while the bridge
        is unreachable, with exponential backoff, up to the deadline."""
        backoff = Backoff(self._settings.backoff_initial, self._settings.backoff_max)
        limit = None if deadline_s is None else time.monotonic() + deadline_s
        while True:
            try:
                conn = self._take()
            except ConnectionLost as exc:
                err: Exception = exc
            else:
                try:
                    result = op(conn)
                except ConnectionLost as exc:
                    conn.close()
                    err = exc
                except BaseException:
                    conn.close()
                    raise
                else:
                    self._release(conn)
                    return result
            delay = backoff.next()
            if limit is not None and time.monotonic() + delay > limit:
                raise err
            time.sleep(delay)

    def _ticket(self) -> int:
        with self._lock:
            # The bridge's dedupe window spans protocol.WINDOW sends past the
            # oldest unfinished one.
            while self._in_flight and self._next - min(self._in_flight) >= protocol.WINDOW:
                self._lock.wait()
            n = self._next
            self._next += 1
            self._in_flight.append(n)
            return n

    def _done(self, n: int) -> None:
        with self._lock:
            self._in_flight.remove(n)
            self._lock.notify_all()

    # ---- the Rendezvous API -------------------------------------------------------

    def send(self, key: str, array: Any, *, timeout: Optional[float] = None) -> None:
        """Deliver ``array`` under ``key`` in the remote rendezvous; returns
        once it is committed there. Retries across connection failures for up
        to ``timeout`` seconds (None: the settings' deadline)."""
        kb = _key_bytes(key)
        t = _timeout_ns(timeout)
        arr = np.ascontiguousarray(as_sendable(array))  # a CPU torch tensor too, as a local send takes
        code = _dtype_code(arr.dtype)
        if arr.nbytes > self.capacity:
            raise protocol_too_large(arr.nbytes, self.capacity)
        seq = self._ticket()
        try:
            parts = protocol.message_frames(Frame.MSG, seq, kb, code, arr.shape, protocol.byte_view(arr))

            def op(conn: _Conn) -> None:
                protocol.send_all(conn.sock, parts)
                while True:
                    kind, length, stream = conn.reader.header()
                    body = conn.reader.body(length)
                    if kind is Frame.ABORT:
                        raise Aborted(protocol.parse_text(body))
                    if kind is not Frame.ACK or stream != seq:
                        raise ProtocolError(f"expected the ACK of {seq}, got {kind.name} {stream}")
                    status, code, message = protocol.parse_ack(body)
                    if status is Ack.REFUSED:
                        raise protocol.error_for(code, message)
                    return

            self._retrying(op, self._settings.deadline if t < 0 else t / 1e9)
        finally:
            self._done(seq)

    def recv(self, key: str, *, timeout: Optional[float] = None) -> np.ndarray:
        """Take the oldest message under ``key`` in the remote rendezvous,
        waiting up to ``timeout`` seconds (None: forever)."""
        arr = self._recv(key, _timeout_ns(timeout), None)
        assert arr is not None
        return arr

    def try_recv(self, key: str) -> Optional[np.ndarray]:
        return self._recv(key, 0, None)

    def recv_async(self, key: str) -> "Future[np.ndarray]":
        """A ``recv`` in the background. ``cancel()`` withdraws it and returns
        True, or returns False when the bridge had already taken a message
        for it (the future then resolves with that message)."""
        kb = _key_bytes(key)
        fut = _RemoteRecvFuture()

        def run() -> None:
            try:
                arr = self._recv(kb.decode("utf-8"), -1, fut.request, fut.cancelling)
            except BaseException as exc:  # delivered to the waiter, not lost in a thread
                fut.finish(None, exc)
                return
            fut.finish(arr, None)

        threading.Thread(target=run, name=f"shmrdv-remote-recv-{key[:40]}", daemon=True).start()
        return fut

    def abort(self, reason: str) -> None:
        """Abort the remote rendezvous (and, through the bridges, its peers)."""
        if not isinstance(reason, str):
            raise InvalidType(f"reason must be a str, not {type(reason).__name__}")
        self._retrying(lambda conn: protocol.send_all(conn.sock, [protocol.abort(reason)]), self._settings.deadline)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def __enter__(self) -> "RemoteRendezvous":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<RemoteRendezvous {self.url} {'closed' if self._closed else 'open'}>"

    # ---- receiving -------------------------------------------------------------

    def _recv(self, key: str, timeout_ns: int, holder: Optional[List[Tuple[_Conn, int]]],
              cancelled: Optional[threading.Event] = None) -> Optional[np.ndarray]:
        kb = _key_bytes(key)
        # A receive is not retried on another connection: the bridge puts an
        # unacknowledged message back, so a retry could reorder the key.
        conn = self._take()
        with self._lock:
            request = self._next_request
            self._next_request += 1
        if holder is not None:
            holder.append((conn, request))
        try:
            protocol.send_all(conn.sock, [protocol.recv_request(request, kb, timeout_ns)])
            if cancelled is not None and cancelled.is_set():
                protocol.send_all(conn.sock, [protocol.frame(Frame.CANCEL, b"", request)])
            while True:
                kind, length, stream = conn.reader.header()
                body = conn.reader.body(length) if kind is not Frame.DATA else b""
                if kind is Frame.ABORT:
                    continue  # the bridge's rendezvous is aborted: the ERROR follows
                if stream != request:
                    raise ProtocolError(f"reply for request {stream}, expected {request}")
                if kind is Frame.ERROR:
                    code, message = protocol.parse_error(body)
                    break
                if kind is not Frame.ITEM:
                    raise ProtocolError(f"expected ITEM or ERROR, got {kind.name}")
                meta = protocol.parse_meta(body, self.capacity)
                if meta.dtype is protocol.BF16_STANDIN:
                    raise protocol.standin_error(key)  # the connection closes: the bridge puts it back
                out = np.empty(meta.shape, meta.dtype)
                view = protocol.byte_view(out)
                filled = 0
                while filled < meta.nbytes:
                    kind, length, stream = conn.reader.header()
                    if kind is not Frame.DATA or stream != request or filled + length > meta.nbytes:
                        raise ProtocolError("bad DATA frame in a reply")
                    conn.reader.read_into(view[filled : filled + length])
                    filled += length
                protocol.send_all(conn.sock, [protocol.ack(request, Ack.COMMITTED)])
                self._release(conn)
                return out
        except BaseException:
            conn.close()
            raise
        self._release(conn)  # the bridge answered ERROR: the connection is fine
        if code is Code.EMPTY or (code is Code.CANCELLED and cancelled is not None and cancelled.is_set()):
            return None
        raise protocol.error_for(code, message)


class _RemoteRecvFuture(Future):  # type: ignore[type-arg]
    """The future of a remote recv_async: cancel() asks the bridge to
    withdraw the receive and waits for its answer."""

    CANCEL_WAIT_S = 10.0

    def __init__(self) -> None:
        super().__init__()
        self.request: List[Tuple[_Conn, int]] = []  # filled once the RECV is sent
        self.cancelling = threading.Event()
        self._finished = threading.Event()

    def finish(self, arr: Optional[np.ndarray], exc: Optional[BaseException]) -> None:
        if exc is not None:
            self.set_exception(exc)
        elif arr is None:
            super().cancel()  # the bridge withdrew it: nothing was taken
        else:
            self.set_result(arr)
        self._finished.set()

    def cancel(self) -> bool:
        if self.done():
            return self.cancelled()
        self.cancelling.set()
        if self.request:
            conn, request = self.request[0]
            try:
                protocol.send_all(conn.sock, [protocol.frame(Frame.CANCEL, b"", request)])
            except ConnectionLost:
                pass
        self._finished.wait(self.CANCEL_WAIT_S)
        return self.cancelled()


def protocol_too_large(nbytes: int, capacity: int) -> RendezvousError:
    return MessageTooLarge(f"a {nbytes}-byte message can never fit the remote arena of {capacity} bytes")


def connect(url: str, token: Token = None, *, tls_ca: Optional[str] = None,
            settings: Optional[LinkSettings] = None) -> RemoteRendezvous:
    """Open the rendezvous served by the bridge at ``url`` (``tcp://HOST:PORT``
    or ``tls://HOST:PORT``). Raises ``AuthenticationError`` at once when the
    token is wrong or the bridge's certificate is not trusted,
    ``ProtocolError`` when the bridge does not speak the URL's protocol
    (tcp:// to a TLS bridge, tls:// to a plain one), ``InvalidArgument``
    when ``tls_ca`` is missing or not a PEM certificate, ``ConnectionLost``
    when the bridge cannot be reached."""
    return RemoteRendezvous(url, token, tls_ca=tls_ca, settings=settings)

