"""The bridge service (``shmrdv bridge`` runs it): the process that joins this host's rendezvous to others.

It listens for other bridges and ``connect()`` clients (bridge_server), and
forwards the envelopes that routed sends leave in the outbox (bridge_link).
An abort travels both ways: a local abort is sent to every peer, and a
peer's abort aborts the local rendezvous.
"""
import ipaddress
import logging
import os
import resource
import select
import socket
import ssl
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple


from . import outbox
from .link import Link, LinkSettings
from .protocol import keep_alive
from .server import HANDSHAKE_TIMEOUT_S, IDLE_TIMEOUT_S, Inbound

MAX_CONNECTIONS = 1024
"""Connections a bridge serves at once, by default (--max-connections)."""
MAX_PER_ADDRESS = 64
"""Connections from one peer address a bridge serves at once, by default (--max-per-address)."""
from .dedupe import Origins
from .link_marks import INBOUND_MARKS, LinkMarks
from .. import limits
from ..codec import fit_text
from ..errors import Aborted, InvalidArgument, RendezvousError, RendezvousTimeout
from .protocol import ProtocolError
from ..rendezvous import Rendezvous

log = logging.getLogger("shmrdv.bridge")

MAX_HELD = 4096  # envelopes taken from the outbox and not yet acknowledged, over all links
_POLL_S = 0.2  # how often the dispatcher looks up from the outbox to check for a stop
_INBOUND_WAIT_S = 5.0  # how long stop() waits for closed connections to give back what they held
# File descriptors kept for the bridge's own use beside its connections: a
# socket per link, the short connections aborts and TLS probes make, logs.
_FD_MARGIN = 32
_EVICTING_MAX = 8  # evicted connections whose threads have not closed them yet, at most


def raise_file_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit, since every
    connection is a descriptor; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:  # the kernel's own ceiling is fs.nr_open
        try:
            with open("/proc/sys/fs/nr_open") as f:
                target = int(f.read())
        except (OSError, ValueError):
            return soft
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.info("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
        return soft
    return target


def _open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 3  # no /proc: stdin, stdout and stderr at least


class _Unauthenticated:
    """An accepted connection that has not authenticated yet: when the bridge
    is full, a new one evicts the oldest of these rather than be refused, so
    connections that never authenticate cannot lock clients out."""

    __slots__ = ("address", "sock", "evicted", "lock")

    def __init__(self, address: str, sock: socket.socket) -> None:
        self.address, self.sock, self.evicted = address, sock, False
        self.lock = threading.Lock()

    def wrapped(self, sock: socket.socket) -> None:
        """The connection is now sock (TLS wraps it in a new object)."""
        with self.lock:
            self.sock = sock
            evicted = self.evicted
        if evicted:
            self._cut(sock)

    def evict(self) -> None:
        with self.lock:
            self.evicted = True
            sock = self.sock
        self._cut(sock)

    @staticmethod
    def _cut(sock: socket.socket) -> None:
        # socket.socket's own shutdown: an SSLSocket's would also drop its
        # SSL object under the thread in the middle of the handshake. A
        # closed socket object has no descriptor left to cut (EBADF).
        try:
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tls_handshake(ctx: ssl.SSLContext, conn: socket.socket, deadline: float,
                  on_wrapped: Callable[[ssl.SSLSocket], None] = lambda tls: None) -> ssl.SSLSocket:
    """The server side of a TLS handshake, done by deadline (time.monotonic())
    however the peer paces its bytes: TimeoutError past it. on_wrapped gets
    the TLS socket, which replaces conn, before the handshake begins."""
    tls = ctx.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
    try:
        on_wrapped(tls)
        tls.setblocking(False)
        poller = select.poll()  # not select(): descriptors past 1023 are fine
        while True:
            try:
                tls.do_handshake()
                break
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError) as want:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("handshake deadline passed") from None
                poller.register(tls, select.POLLIN if isinstance(want, ssl.SSLWantReadError) else select.POLLOUT)
                poller.poll(left * 1000)
                poller.unregister(tls)
        tls.setblocking(True)
        return tls
    except BaseException:
        tls.close()
        raise


class Bridge:
    """One host's bridge: ``start()``, then ``stop()`` (or ``serve_forever``)."""

    def __init__(self, rdv: Rendezvous, listen: Tuple[str, int], token: bytes = b"",
                 tls: Optional[ssl.SSLContext] = None, tls_ca: Optional[str] = None,
                 routes: Optional[Dict[str, str]] = None, settings: Optional[LinkSettings] = None,
                 drain_timeout: float = 10.0, handshake_timeout: float = HANDSHAKE_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS, max_per_address: int = MAX_PER_ADDRESS,
                 idle_timeout: float = IDLE_TIMEOUT_S) -> None:
        host, _port = listen
        if not token and not is_loopback(host):
            raise InvalidArgument(f"refusing to listen on {host}, which is not loopback, without a token")
        self.rdv = rdv
        self._listen = listen
        self._token = token
        self._tls = tls
        self._tls_ca = tls_ca
        self._settings = settings or LinkSettings()
        self._drain_timeout = drain_timeout
        self._handshake_timeout = handshake_timeout
        self._idle_timeout = idle_timeout
        # accepted connections, in all and per peer address (limits against
        # a flood of connections that never authenticate)
        self._max_connections, self._max_per_address = max_connections, max_per_address
        self._connections: Dict[str, int] = {}
        self._connected = 0
        self._unauthenticated: Dict[int, _Unauthenticated] = {}  # by accept number: oldest first
        self._accepted = 0
        self._evicting = 0  # evicted, not closed yet
        self._evicted = 0
        self._refused = 0
        self._refused_logged = 0.0
        self._origins = Origins(rdv, INBOUND_MARKS)
        self._link_marks = LinkMarks(rdv)
        self._recovered: Dict[Tuple[str, bytes, Optional[str]], List[Tuple[outbox.Envelope, Any]]] = {}
        self.leftover: List[Any] = []  # unacknowledged envelopes still held after stop()
        self._links: Dict[Tuple[str, bytes, Optional[str]], Link] = {}
        self._inbound: List[Inbound] = []
        self._lock = threading.Lock()
        self._held = threading.BoundedSemaphore(MAX_HELD)
        self._stop = threading.Event()
        self._aborted = threading.Event()
        self._threads: List[threading.Thread] = []
        self._sock: Optional[socket.socket] = None
        self._extra_routes = dict(routes or {})
        self.address: Tuple[str, int] = listen

    # ---- lifecycle ---------------------------------------------------------

    def start(self) -> "Bridge":
        self._fit_connections_to_file_limit()
        host, port = self._listen
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)  # a burst of connects waits in line, not in SYN retries
        self._sock = sock
        self.address = sock.getsockname()[:2]
        for target, name in ((self._accept_loop, "accept"), (self._dispatch_loop, "dispatch")):
            t = threading.Thread(target=target, name=f"shmrdv-bridge-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        log.info("bridge for rendezvous %r listening on %s:%d%s", self.rdv.name, self.address[0], self.address[1],
                 " (TLS)" if self._tls else "")
        return self

    def _fit_connections_to_file_limit(self) -> None:
        """Raise the open-file limit as far as it goes, and serve no more
        connections than it leaves room for: past it, accept() fails and a
        connection waits in the listen queue, unseen by the eviction of
        unauthenticated ones, until it gives up."""
        limit = raise_file_limit()
        if limit == resource.RLIM_INFINITY:
            return
        in_use = _open_descriptors() + 1  # and the listening socket, opened next
        room = max(1, limit - in_use - _FD_MARGIN)
        if room < self._max_connections:
            log.warning("serving at most %d connections, not %d (--max-connections): this process may open %d files "
                        "(RLIMIT_NOFILE, raised to its hard limit), %d are open and %d are kept for the bridge's own use; raise the "
                        "hard limit (ulimit -Hn, systemd LimitNOFILE=) to serve more",
                        room, self._max_connections, limit, in_use, _FD_MARGIN)
            self._max_connections = room

    def stop(self) -> None:
        """Stop serving. Envelopes already taken from the outbox are given
        up to drain_timeout to be acknowledged; the rest go back to the
        outbox, for the next bridge."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        for t in self._threads:
            t.join(timeout=5)
        deadline = time.monotonic() + self._drain_timeout
        with self._lock:
            links = list(self._links.values())
        while any(link.pending() for link in links) and time.monotonic() < deadline and not self._aborted.is_set():
            time.sleep(0.02)
        for link in links:
            left = link.take_unacked()
            if left:
                # Held, leased: they go back to the head of the outbox, in
                # order and with their numbers, when this process exits.
                log.warning("leaving %d unacknowledged message(s) for %s to the next bridge", len(left), link.url)
                self.leftover += left
            link.stop()
        with self._lock:
            inbound = list(self._inbound)
        for conn in inbound:
            conn.close()
        # Each connection's thread gives back what its client had not
        # acknowledged: let it, before the caller closes the rendezvous.
        deadline = time.monotonic() + _INBOUND_WAIT_S
        while time.monotonic() < deadline:
            with self._lock:
                if not self._inbound:
                    break
            time.sleep(0.01)
        log.info("bridge for rendezvous %r stopped", self.rdv.name)

    # ---- inbound -----------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, addr = self._sock.accept()
            except OSError:
                if self._stop.is_set():
                    return
                time.sleep(0.05)  # e.g. out of file descriptors: back off, keep serving
                continue
            peer = f"{addr[0]}:{addr[1]}"
            pending = _Unauthenticated(addr[0], conn)
            number = self._admit(pending)
            if number is None:
                conn.close()
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keep_alive(conn)
            deadline = time.monotonic() + self._handshake_timeout
            threading.Thread(target=self._serve_counted, args=(conn, peer, number, pending, deadline),
                             name=f"shmrdv-peer-{peer}", daemon=True).start()

    def _admit(self, pending: _Unauthenticated) -> Optional[int]:
        """Count a new connection in, as its accept number. One too many from
        its address is refused (None); one too many in all evicts the
        oldest connection that has not authenticated yet, or, with none, is
        refused. Refusals and evictions are logged at most once a second."""
        address = pending.address
        victim = None
        with self._lock:
            connected, from_there = self._connected, self._connections.get(address, 0)
            over_all, over_there = connected >= self._max_connections, from_there >= self._max_per_address
            full = over_all or over_there
            if full:
                if not over_there and self._evicting < _EVICTING_MAX:  # each holds a descriptor until it is closed
                    victim = next((u for u in self._unauthenticated.values() if not u.evicted), None)
                if victim is None:
                    self._refused += 1
                else:
                    victim.evicted = True  # chosen under our lock, once; evict() below cuts it
                    self._evicting += 1
                    self._evicted += 1
            if victim is not None or not full:
                self._connected += 1
                self._connections[address] = self._connections.get(address, 0) + 1
                self._accepted += 1
                number: Optional[int] = self._accepted
                self._unauthenticated[self._accepted] = pending
            else:
                number = None
            now = time.monotonic()
            tell = full and now - self._refused_logged >= 1.0
            if tell:
                self._refused_logged = now
            refused, evicted = self._refused, self._evicted
        if victim is not None:
            victim.evict()
        if tell:
            what = (f"evicting the oldest unauthenticated connection from {victim.address} for one from {address}"
                    if victim is not None else f"refusing a connection from {address}")
            log.warning("%s: %d open from there (at most %d), %d in all (at most %d); %d refused, %d evicted so far",
                        what, from_there, self._max_per_address, connected, self._max_connections, refused, evicted)
        return number

    def _authenticated(self, number: int) -> None:
        with self._lock:
            self._unauthenticated.pop(number, None)

    def _serve_counted(self, conn: socket.socket, peer: str, number: int, pending: _Unauthenticated,
                       deadline: float) -> None:
        try:
            self._serve_one(conn, peer, number, pending, deadline)
        finally:
            with self._lock:
                self._unauthenticated.pop(number, None)
                if pending.evicted:
                    self._evicting -= 1
                self._connected -= 1
                left = self._connections[pending.address] - 1
                if left:
                    self._connections[pending.address] = left
                else:
                    del self._connections[pending.address]

    def _serve_one(self, conn: socket.socket, peer: str, number: int, pending: _Unauthenticated,
                   deadline: float) -> None:
        if self._tls is not None:
            try:
                conn = tls_handshake(self._tls, conn, deadline, pending.wrapped)
            except (OSError, ssl.SSLError) as exc:
                log.warning("dropped %s: TLS handshake failed: %s", peer, exc)
                conn.close()
                return
        handler = Inbound(conn, peer, self.rdv, self._origins, self._token, self._peer_abort, self.rdv.capacity,
                          deadline, self._idle_timeout, on_authenticated=lambda: self._authenticated(number))
        with self._lock:
            self._inbound.append(handler)
        try:
            handler.serve()
        finally:
            with self._lock:
                self._inbound.remove(handler)

    # ---- outbound ----------------------------------------------------------

    def _take(self, timeout: float) -> Any:
        """The next envelope, leased: if this process dies before its link
        has it acknowledged, it goes back to the head of the outbox."""
        return self.rdv.recv(outbox.OUTBOX_KEY, timeout=timeout, lease=True, writable=True)

    def _recover(self) -> Optional[Tuple[outbox.Envelope, Any]]:
        """Envelopes a dead bridge had numbered came back to the head of the
        outbox (leased receives): gather them, so that each link starts with
        them, under their old numbers, before it numbers anything new.
        Returns the first envelope that was not numbered, if one was taken."""
        first = None
        while not self._stop.is_set():
            if not self._held.acquire(timeout=_POLL_S):
                continue
            try:
                view = self._take(0)
            except RendezvousError:
                self._held.release()
                break
            env = self._read(view)
            if env is None:
                continue
            if env.seq == 0:
                first = (env, view)  # numbered once the links exist
                break
            key = (env.url, env.token, env.tls_ca or self._tls_ca)
            self._recovered.setdefault(key, []).append((env, view))
        count = sum(len(v) for v in self._recovered.values())
        if count:
            log.warning("resending %d message(s) a previous bridge had not had acknowledged", count)
        for url in sorted(set(self._extra_routes.values())):
            self._link(url, self._token, None)
        return first

    def _read(self, view: Any) -> Optional[outbox.Envelope]:
        try:
            return outbox.read(view)
        except ProtocolError as exc:
            self._held.release()
            log.error("dropped a damaged outbox entry: %s", exc)
            return None

    def _dispatch(self, env: outbox.Envelope, view: Any) -> None:
        link = self._link(env.url, env.token, env.tls_ca)
        if env.key == outbox.ANNOUNCE_KEY:
            self._held.release()
        elif env.seq and env.origin == link.origin:
            # Numbered by a bridge that died after the recovery above.
            link.submit_recovered(env, view)
        else:
            if env.seq:
                log.warning("an envelope numbered for an unknown link to %s is sent under a new number", env.url)
            link.submit(env, view)

    def _dispatch_loop(self) -> None:
        first = self._recover()
        if first is not None:
            self._dispatch(*first)
            del first
        while not self._stop.is_set():
            if not self._held.acquire(timeout=_POLL_S):
                continue
            try:
                view = self._take(_POLL_S)
            except RendezvousTimeout:
                self._held.release()
                continue
            except Aborted as exc:
                self._held.release()
                self._local_abort(exc.reason)
                return
            except RendezvousError as exc:
                self._held.release()
                if self._stop.is_set():
                    return
                log.error("outbox: %s", exc)
                time.sleep(_POLL_S)
                continue
            env = self._read(view)
            if env is not None:
                self._dispatch(env, view)
            # The link frees the envelope's block on its ACK by dropping the
            # last reference to it: none may stay here while we wait for the next.
            del view, env

    def _link(self, url: str, token: bytes, tls_ca: Optional[str]) -> Link:
        key = (url, token, tls_ca or self._tls_ca)
        with self._lock:
            link = self._links.get(key)
            if link is None:
                link = self._links[key] = Link(url, token, key[2], self._link_marks.for_link(url, token), self._settings,
                                               self._peer_abort, self._fatal, self._release_held,
                                               self._recovered.pop(key, ()))
            return link

    def _release_held(self, n: int) -> None:
        for _ in range(n):
            self._held.release()

    # ---- abort, both ways --------------------------------------------------

    def _peer_abort(self, reason: str) -> None:
        reason = fit_text(reason, limits.REASON_MAX)  # a peer's text or an exception's may be longer
        try:
            self.rdv.abort(reason)
        except RendezvousError as exc:
            log.error("could not abort the local rendezvous: %s", exc)
        self._local_abort(reason)

    def _fatal(self, reason: str) -> None:
        log.error("%s: aborting the rendezvous", reason)
        self._peer_abort(reason)

    def _local_abort(self, reason: str) -> None:
        """The local rendezvous is aborted: say so to every peer, once."""
        with self._lock:
            if self._aborted.is_set():
                return
            self._aborted.set()
            inbound = list(self._inbound)
        log.warning("rendezvous %r aborted: %s", self.rdv.name, reason)
        for conn in inbound:
            conn.abort(reason)
        with self._lock:
            links = list(self._links.values())
        for link in links:
            link.send_abort(reason)
