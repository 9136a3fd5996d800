"""The receiving half of a bridge: one thread per accepted connection.

A connection authenticates, then streams messages in: each MSG reserves its
block in the local arena at once (``alloc``) and its DATA frames are read
straight into that block, so a payload crosses from the socket into shared
memory with one copy. A completed message is committed together with its
sender's dedupe window and acknowledged. ``connect()`` clients may also take
messages out (RECV); a message handed out is held until the client
acknowledges it, and goes back to the head of its key, in place, if the
connection drops first.
"""
import fcntl
import logging
import socket
import struct
import termios
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import auth, protocol
from .dedupe import Origin, Origins
from ..codec import dtype_code
from ..errors import Aborted, InvalidArgument, InvalidType, MessageTooLarge, RendezvousError, RendezvousTimeout, TooManyKeys
from .protocol import Ack, Code, ConnectionLost, Frame, ProtocolError, Role
from ..rendezvous import Rendezvous

log = logging.getLogger("shmrdv.bridge")

HANDSHAKE_TIMEOUT_S = 10.0
"""Seconds a connection has to authenticate, TLS and AUTH together (--handshake-timeout)."""
IDLE_TIMEOUT_S = 60.0
"""Seconds an authenticated peer may go silent while it owes us bytes (a
message or frame begun, an item not acknowledged) or leave what we send
unread, before it is dropped and what it held is freed (--idle-timeout)."""
_CALLBACK_WAIT_S = 5.0  # how long a closing connection waits for the completion thread to finish its RECVs


def _unsent_bytes(sock: socket.socket) -> int:
    """Bytes in sock's send queue that the peer has not acknowledged yet."""
    try:
        out = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")  # SIOCOUTQ
    except OSError:
        return 0
    return struct.unpack("i", out)[0]


class _Incoming:
    """A message being received: its reserved block and how much has arrived."""

    __slots__ = ("seq", "key", "alloc", "buf", "filled", "nbytes", "skip")

    def __init__(self, seq: int, key: str, alloc: Any, buf: Optional[memoryview], nbytes: int, skip: bool) -> None:
        self.seq, self.key, self.alloc, self.buf, self.nbytes, self.skip = seq, key, alloc, buf, nbytes, skip
        self.filled = 0


class Inbound:
    """One accepted connection, served on its own thread until it closes."""

    def __init__(self, sock: socket.socket, peer: str, rdv: Rendezvous, origins: Origins, token: bytes,
                 on_abort: Callable[[str], None], max_message: int,
                 handshake_deadline: Optional[float] = None, idle_timeout: float = IDLE_TIMEOUT_S,
                 on_authenticated: Callable[[], None] = lambda: None) -> None:
        self.sock, self.peer, self.rdv = sock, peer, rdv
        # time.monotonic() by which the handshake must be done
        self._handshake_deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S if handshake_deadline is None else handshake_deadline
        self._idle_timeout = idle_timeout
        self._owed_since = 0.0  # when we last handed out an item (an ACK is owed from then)
        # Bytes we sent that the peer has not yet taken (SIOCOUTQ), and when
        # that last changed: a peer still taking our bytes is not stalled.
        self._unsent, self._unsent_moved = 0, 0.0
        self._sending = 0  # sends in progress (their own timeout covers a peer that stops reading)
        self._origins, self._token, self._on_abort = origins, token, on_abort
        self._on_authenticated = on_authenticated
        self._max_message = max_message
        self._send_lock = threading.Lock()
        self._incoming: Dict[int, _Incoming] = {}
        self._retry_keys: Dict[str, int] = {}  # key -> the message of it that was turned away
        # RECV request -> (order, key, view), until the client acks; guarded by _out_lock
        self._handed_out: Dict[int, Tuple[int, str, np.ndarray]] = {}
        self._out_lock = threading.Lock()
        self._out_cond = threading.Condition(self._out_lock)
        self._waiting: Dict[int, Future] = {}  # type: ignore[type-arg]  # RECVs not served yet; _out_lock
        self._recv_order = 0  # RECVs so far, on the serve thread
        self._replies: Optional[ThreadPoolExecutor] = None  # sends the answers of RECVs that waited
        self._replies_open = True  # answers may still be queued; _out_lock
        self._origin: Optional[Origin] = None
        self._closed = threading.Event()

    # ---- running -----------------------------------------------------------

    def serve(self) -> None:
        try:
            self._handshake()
            self._loop()
        except ConnectionLost as exc:
            log.info("connection from %s closed: %s", self.peer, exc)
        except (ProtocolError, protocol.AuthenticationError) as exc:
            log.warning("dropped %s: %s", self.peer, exc)
        except Exception:  # a bug must not take the bridge down: drop this peer only
            log.exception("dropped %s after an unexpected error", self.peer)
        finally:
            self._cleanup()

    def send(self, data: Any, *more: Any) -> None:
        with self._send_lock:
            self._sending += 1
            try:
                protocol.send_all(self.sock, [data, *more])
            except ConnectionLost:
                # A send cut short may have left part of a frame on the wire:
                # nothing more may follow it on this connection.
                self.close()
                raise
            finally:
                self._sending -= 1

    def abort(self, reason: str) -> None:
        try:
            self.send(protocol.abort(reason))
        except ConnectionLost:
            pass

    def close(self) -> None:
        self._closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # ---- handshake ---------------------------------------------------------

    def _handshake(self) -> None:
        # One deadline for the whole handshake, not a timeout per read: a peer
        # that trickles its AUTH a byte at a time is dropped all the same.
        self.sock.settimeout(max(self._handshake_deadline - time.monotonic(), 0.001))
        reader = self._reader = protocol.Reader(self.sock)
        reader.deadline = self._handshake_deadline
        server_nonce = auth.nonce()
        self.send(protocol.hello(self._max_message, server_nonce))
        role, origin, first_seq, client_nonce, proof = protocol.parse_auth(reader.expect(Frame.AUTH))
        if not auth.matches(auth.client_proof(self._token, server_nonce, client_nonce, origin, first_seq), proof):
            try:
                self.send(protocol.refused(Code.UNAUTHENTICATED, "authentication failed: wrong token"))
            except ConnectionLost:
                pass
            raise protocol.AuthenticationError("authentication failed: wrong token")
        o = self._origin = self._origins.acquire(origin, first_seq)
        self.role = role
        self.send(protocol.welcome(auth.server_proof(self._token, server_nonce, client_nonce), o.base, o.bits))
        self._on_authenticated()  # no longer one a newer connection may evict
        reader.deadline = None
        self.sock.settimeout(None)
        protocol.set_io_timeouts(self.sock, self._idle_timeout)
        reader.on_quiet = self._stalled
        log.info("%s connected as %s (origin %016x)", self.peer, role.name.lower(), origin)

    def _stalled(self) -> bool:
        """Whether the peer has gone silent for the idle timeout while it
        owes us bytes. One that owes nothing may wait as long as it likes
        (a link with nothing to send, a client in a blocking RECV): it holds
        only its connection, and keepalive finds it if its host is gone."""
        reader = self._reader
        if self._sending or not (reader.mid_frame or self._incoming or self._handed_out):
            return False  # (a peer slow to read what we send is the send's timeout to judge)
        now = time.monotonic()
        unsent = _unsent_bytes(self.sock)
        if unsent != self._unsent:  # it is still reading what we sent (an item, say)
            self._unsent, self._unsent_moved = unsent, now
        silent = now - max(reader.last_byte, self._owed_since, self._unsent_moved)
        if silent < self._idle_timeout:
            return False
        half = sum(1 for inc in self._incoming.values() if inc.alloc is not None)
        log.warning("dropped %s: silent for %.0f s in the middle of a message; %d half-received message(s) "
                    "discarded, their space freed", self.peer, silent, half)
        return True

    # ---- frames ------------------------------------------------------------

    def _loop(self) -> None:
        reader = self._reader
        while True:
            kind, length, stream = reader.header()
            if kind is Frame.DATA:
                self._data(stream, length)
            elif kind is Frame.MSG:
                self._begin(stream, reader.body(length))
            elif kind is Frame.ABORT:
                reason = protocol.parse_text(reader.body(length))
                log.warning("%s aborts the rendezvous: %s", self.peer, reason)
                self._on_abort(reason)
            elif kind is Frame.RECV and self.role is Role.CLIENT:
                key, timeout_ns = protocol.parse_recv(reader.body(length))
                self._start_recv(stream, key, timeout_ns)
            elif kind is Frame.ACK and self.role is Role.CLIENT:
                protocol.parse_ack(reader.body(length))
                with self._out_lock:
                    self._handed_out.pop(stream, None)  # the client has it: free the block
            elif kind is Frame.CANCEL and self.role is Role.CLIENT:
                reader.body(length)
                with self._out_lock:
                    fut = self._waiting.get(stream)
                if fut is not None:
                    fut.cancel()
            else:
                raise ProtocolError(f"unexpected {kind.name} frame from a {self.role.name.lower()}")

    def _begin(self, seq: int, body: bytes) -> None:
        meta = protocol.parse_meta(body, protocol.MAX_MESSAGE)
        if seq in self._incoming:
            raise ProtocolError(f"message {seq} begun twice")
        if len(self._incoming) >= protocol.WINDOW:
            raise ProtocolError(f"more than {protocol.WINDOW} messages in flight")
        o = self._origin
        assert o is not None
        with o.lock:
            duplicate = o.has(seq)
            if not duplicate:
                o.after(seq)  # ProtocolError if seq is outside the window
        if duplicate:
            self._incoming[seq] = _Incoming(seq, meta.key, None, None, meta.nbytes, True)
            self.send(protocol.ack(seq, Ack.DUPLICATE))
        elif meta.nbytes > self._max_message:
            self._refuse(seq, meta.key, meta.nbytes,
                         MessageTooLarge(f"{meta.nbytes} bytes can never fit the {self._max_message}-byte arena here"))
        elif meta.dtype is protocol.BF16_STANDIN:
            self._refuse(seq, meta.key, meta.nbytes, protocol.standin_error(meta.key))
        elif self._retry_keys.get(meta.key, seq) != seq:
            self._retry(seq, meta.key, meta.nbytes)  # an earlier message of this key must go first
        else:
            # Wait for room only when no message of this connection is half
            # received: those hold arena space that only their DATA, queued
            # behind this frame, can turn into messages a receiver can free.
            partial = any(not inc.skip for inc in self._incoming.values())
            try:
                alloc = self.rdv.alloc(meta.key, meta.shape, meta.dtype, timeout=0 if partial else None)
                arr = alloc.open()
            except RendezvousTimeout:
                self._retry(seq, meta.key, meta.nbytes)
            except TooManyKeys as exc:
                self._key_index_full(seq, meta.key, meta.nbytes, exc)
            except (InvalidArgument, InvalidType, MessageTooLarge, Aborted) as exc:
                self._refuse(seq, meta.key, meta.nbytes, exc)
            else:
                if self._retry_keys.get(meta.key) == seq:
                    del self._retry_keys[meta.key]
                buf = protocol.byte_view(arr)
                self._incoming[seq] = _Incoming(seq, meta.key, alloc, buf, meta.nbytes, False)
        if meta.nbytes == 0:
            self._finish(self._incoming.pop(seq))

    def _refuse(self, seq: int, key: str, nbytes: int, exc: Exception, data_follows: bool = True) -> None:
        """A message that can never be delivered: tell the sender why (its
        code), discard its DATA, and count it as done so it is not sent again."""
        log.warning("%s: refused message for %r: %s", self.peer, key, exc)
        self._settle(seq, None)
        if data_follows:
            self._incoming[seq] = _Incoming(seq, key, None, None, nbytes, True)
        self.send(protocol.ack(seq, Ack.REFUSED, *protocol.refusal(exc)))

    def _retry(self, seq: int, key: str, nbytes: int, data_follows: bool = True) -> None:
        """Turn a message away for now; later messages of its key too, until
        it comes back, so the key's order holds."""
        if len(self._retry_keys) >= 4 * protocol.WINDOW and key not in self._retry_keys:
            raise ProtocolError("too many keys waiting for a retry")
        self._retry_keys.setdefault(key, seq)
        if data_follows:
            self._incoming[seq] = _Incoming(seq, key, None, None, nbytes, True)
        self.send(protocol.ack(seq, Ack.RETRY))

    def _key_index_full(self, seq: int, key: str, nbytes: int, exc: TooManyKeys, data_follows: bool = True) -> None:
        """No room for another key now. A client's send fails as a local one
        would (TOO_MANY_KEYS); a link's send has returned already, so it
        comes back after a backoff (within the link's deadline)."""
        if self.role is Role.CLIENT:
            self._refuse(seq, key, nbytes, exc, data_follows)
        else:
            self._retry(seq, key, nbytes, data_follows)

    def _data(self, seq: int, length: int) -> None:
        inc = self._incoming.get(seq)
        if inc is None:
            raise ProtocolError(f"DATA for message {seq}, which is not open")
        if length == 0 or inc.filled + length > inc.nbytes:
            raise ProtocolError(f"DATA of {length} bytes overruns message {seq} ({inc.filled} of {inc.nbytes} arrived)")
        if inc.skip:
            self._reader.skip(length)
        else:
            assert inc.buf is not None
            self._reader.read_into(inc.buf[inc.filled : inc.filled + length])
        inc.filled += length
        if inc.filled == inc.nbytes:
            self._finish(self._incoming.pop(seq))

    def _finish(self, inc: _Incoming) -> None:
        if inc.skip:
            return
        inc.buf = None
        try:
            committed = self._settle(inc.seq, inc.alloc)
        except TooManyKeys as exc:  # the key is created at the commit, which freed the block
            self._key_index_full(inc.seq, inc.key, inc.nbytes, exc, data_follows=False)
            return
        except Aborted as exc:
            self._refuse(inc.seq, inc.key, inc.nbytes, exc, data_follows=False)
            return
        self.send(protocol.ack(inc.seq, Ack.COMMITTED if committed else Ack.DUPLICATE))

    def _settle(self, seq: int, alloc: Any) -> bool:
        """Record seq in the origin's window: with the commit of alloc, or
        alone for a message refused for good. False, alloc discarded, if the
        window has seq already: the origin's other connection committed it
        since this one began it (a link that reconnected while its old
        connection was still being read, each with the same message)."""
        o = self._origin
        assert o is not None
        with o.lock:
            if o.has(seq):
                if alloc is not None:
                    alloc.discard()
                return False
            mark = o.mark(seq)
            if alloc is None:
                self.rdv.set_mark(*mark)
            else:
                alloc.publish(mark)
            o.base, o.bits = mark[2], mark[3]
        return True

    # ---- RECV for connect() clients -------------------------------------------
    #
    # A message is taken leased (if the bridge dies holding it, it goes back
    # to the head of its key) and held until the client acknowledges it; if
    # the connection ends first it is given back to the head of its key in
    # place (Rendezvous.give_back: no copy, no arena room, no wait). A RECV
    # that waits is finished on the handle's completion thread, which
    # finishes every RECV of the bridge: it only hands the future to this
    # connection's replies thread, which does the sending, and may block.

    def _start_recv(self, request: int, key: str, timeout_ns: int) -> None:
        with self._out_lock:
            if request in self._waiting or request in self._handed_out:
                raise ProtocolError(f"request {request} is already open")
            if len(self._waiting) + len(self._handed_out) >= protocol.WINDOW:
                raise ProtocolError(f"more than {protocol.WINDOW} receives open")
        # Messages of one key are handed out in the order their RECVs came
        # (the core serves its line first come, first served): that order
        # puts them back in order.
        self._recv_order += 1
        order = self._recv_order
        if timeout_ns == 0:
            try:
                view = self.rdv.try_recv(key, lease=True)
            except RendezvousError as exc:
                self._recv_failed(request, exc)
                return
            if view is None:
                self.send(protocol.error(request, Code.EMPTY, f"try_recv {key!r}: nothing queued"))
            else:
                self._hand_out(request, order, key, view)
            return
        if self._replies is None:
            self._replies = ThreadPoolExecutor(1, thread_name_prefix=f"shmrdv-replies-{self.peer}")
        fut = self.rdv.recv_async(key, lease=True)
        with self._out_lock:
            self._waiting[request] = fut
        timer = None
        if timeout_ns > 0:
            timer = threading.Timer(timeout_ns / 1e9, fut.cancel)
            timer.daemon = True
            timer.start()

        def done(f: "Future[np.ndarray]") -> None:  # on the completion thread, or whoever cancelled f
            nonlocal timer
            if timer is not None:
                timer.cancel()
                # f keeps this callback, and the timer keeps f (f.cancel): a
                # cycle that would hold the message's view until a gc runs.
                timer = None
            with self._out_lock:
                if self._replies_open:
                    assert self._replies is not None
                    self._replies.submit(self._answer, request, order, key, timeout_ns, f)
                    late = False
                else:
                    late = True
                del self._waiting[request]
                self._out_cond.notify_all()
            if late and not f.cancelled() and f.exception() is None:
                # The cleanup gave up waiting for this one: back it goes, now.
                try:
                    view = f.result()
                except RendezvousError:
                    return  # no view could be made of it: the core put it back already
                self._put_back(key, view)

        fut.add_done_callback(done)

    def _answer(self, request: int, order: int, key: str, timeout_ns: int, f: "Future[np.ndarray]") -> None:
        """On the replies thread: answer a RECV whose future has finished."""
        try:
            if f.cancelled():
                if self._closed.is_set():
                    return
                if timeout_ns > 0:
                    self._send_quietly(protocol.error(request, Code.TIMEOUT, f"recv {key!r}: timed out"))
                else:
                    self._send_quietly(protocol.error(request, Code.CANCELLED, f"recv {key!r}: cancelled"))
                return
            try:
                view = f.result()  # the view is made here (a message it cannot be made of goes back to its key)
            except RendezvousError as exc:
                self._recv_failed(request, exc)
                return
            self._hand_out(request, order, key, view)
        except Exception:  # a bug must not go unseen in an executor's future
            log.exception("%s: answering request %d failed", self.peer, request)

    def _recv_failed(self, request: int, exc: BaseException) -> None:
        self._send_quietly(protocol.error(request, *protocol.refusal(exc)))

    def _hand_out(self, request: int, order: int, key: str, view: np.ndarray) -> None:
        with self._out_lock:
            self._handed_out[request] = (order, key, view)
            if self._closed.is_set():
                return  # too late to send: the cleanup puts it back, in order with the others
            self._owed_since = time.monotonic()
        code = dtype_code(view.dtype)
        parts = protocol.message_frames(Frame.ITEM, request, b"", code, view.shape, protocol.byte_view(view))
        try:
            self.send(*parts)
        except ConnectionLost:
            pass  # the cleanup puts it back

    def _put_back(self, key: str, *views: np.ndarray) -> None:
        """Messages of key, oldest first, back to its head (or to its waiters)."""
        try:
            self.rdv.give_back(*views)
            log.warning("%s: connection lost before %d message(s) for %r were acknowledged; put back at the head "
                        "of its key", self.peer, len(views), key)
        except RendezvousError as exc:  # aborted (freed, as everything queued), or the key index full
            log.error("%s: could not put back %d message(s) for %r: %s", self.peer, len(views), key, exc)

    def _send_quietly(self, data: bytes) -> None:
        try:
            self.send(data)
        except ConnectionLost:
            pass

    # ---- teardown ------------------------------------------------------------

    def _cleanup(self) -> None:
        self.close()  # a send in progress on the replies thread fails now rather than at its timeout
        for inc in self._incoming.values():
            if inc.alloc is not None:
                inc.buf = None
                inc.alloc.discard()  # frees the half-received block
        self._incoming.clear()
        with self._out_lock:
            waiting = list(self._waiting.values())
        for fut in waiting:
            fut.cancel()  # withdrawn, or it holds a message: either way its callback runs
        with self._out_lock:
            # A future that was served as it was cancelled is finished by the
            # completion thread: wait for its callback to queue its answer.
            self._out_cond.wait_for(lambda: not self._waiting, _CALLBACK_WAIT_S)
            self._replies_open = False
        if self._replies is not None:
            self._replies.shutdown(wait=True)  # every answer queued is done: its message is in _handed_out
        with self._out_lock:
            unacked, self._handed_out = sorted(self._handed_out.values(), key=lambda item: item[0]), {}
        by_key: Dict[str, List[np.ndarray]] = {}
        for _order, key, view in unacked:
            by_key.setdefault(key, []).append(view)
        for key, views in by_key.items():
            self._put_back(key, *views)
        if self._origin is not None:
            self._origins.release(self._origin)
            self._origin = None
        try:
            self.sock.close()
        except OSError:
            pass
