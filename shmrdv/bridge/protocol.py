"""The bridge wire protocol, version 2 (docs/protocol.md is its description).

Every frame is a 16-byte header, ``type u8, flags u8, reserved u16, length
u32, stream u64`` (little-endian), then ``length`` bytes of body. A DATA
body is raw payload bytes, read straight into its destination; every other
body is a small fixed struct plus strings. Nothing here unpickles anything:
bodies are parsed with ``struct`` and every length, count and dtype is
checked against the limits below before anything is allocated.

A refusal or failure crosses as a ``Code`` plus a human-readable message
(ACK REFUSED, ERROR, REFUSED); ``refusal`` (``code_for``) turns the sender's
exception into its code and message, and ``error_for`` turns a received code
back into the exception, in this one place. The limits shared with the core come from ``shmrdv.limits``
(the C header), the dtype rule from ``shmrdv.codec``.
"""
import enum
import math
import socket
import struct
import sys
import time
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from .. import limits
from ..codec import BF16_CODE, dtype_sendable
from ..codec import fit_text
from ..tensors import BF16_MISSING, bfloat16
from ..errors import (  # noqa: F401 (AuthenticationError, ConnectionLost, ProtocolError re-exported)
    Aborted,
    AuthenticationError,
    ConnectionLost,
    InvalidArgument,
    InvalidType,
    MessageTooLarge,
    ProtocolError,
    RendezvousError,
    RendezvousTimeout,
    TooManyKeys,
)

VERSION = 2  # 2: refusals carry a Code (ACK, REFUSED)
MAGIC = b"SHMRDV"
HEADER = struct.Struct("<BBHIQ")
NONCE_LEN = 32
MAC_LEN = 32

MAX_BODY = 64 << 10  # every frame but DATA
CHUNK = 1 << 20  # DATA frames a sender writes
MAX_CHUNK = 4 << 20  # DATA frames a receiver accepts
# The core's limits (csrc/shmrdv.h), under the names the wire format uses.
MAX_KEY = limits.KEY_MAX
MAX_DTYPE = limits.DTYPE_MAX
MAX_NDIM = limits.NDIM_MAX
MAX_REASON = limits.REASON_MAX  # bytes of UTF-8 text in ABORT, ACK, ERROR and REFUSED
WINDOW = 64  # messages a link may have unacknowledged; the dedupe mark covers as many
MAX_MESSAGE = 1 << 46  # payload bytes any message may claim (a sanity bound: arenas stop at limits.MAX_ARENA_BYTES, 64 GiB)

Buffer = Union[bytes, bytearray, memoryview]


class Frame(enum.IntEnum):
    HELLO = 1  # server -> client: magic, version, capacity, nonce
    AUTH = 2  # client -> server: version, role, origin, nonce, proof
    WELCOME = 3  # server -> client: proof, the origin's dedupe window
    REFUSED = 4  # server -> client: a Code and why; the connection then closes
    MSG = 5  # a message begins on stream = seq: nbytes, key, dtype, shape
    DATA = 6  # payload bytes of the stream's message, in order
    ACK = 7  # server -> client: the message on stream = seq is committed (or refused, with a Code)
    ABORT = 8  # either way: abort the rendezvous, with a reason
    RECV = 9  # client -> server: take a message from a key, on stream = request
    ITEM = 10  # server -> client: the message a RECV took; DATA frames follow
    ERROR = 11  # server -> client: a RECV ended without a message, with a Code
    CANCEL = 12  # client -> server: withdraw the RECV on stream


class Role(enum.IntEnum):
    LINK = 1  # a bridge forwarding its host's messages
    CLIENT = 2  # shmrdv.connect()


class Ack(enum.IntEnum):
    COMMITTED = 0
    DUPLICATE = 1  # already committed earlier: the sender may forget it too
    REFUSED = 2  # can never be committed (too large, aborted): reason says why
    RETRY = 3  # no room in the arena now: the DATA is discarded, send it again later


class Code(enum.IntEnum):
    """Why a request was refused or failed: ACK (with status REFUSED), ERROR
    and REFUSED frames carry one, then a message for humans. A receiver maps
    an unknown code to FAILED."""

    NONE = 0  # not a refusal: ACK COMMITTED, DUPLICATE, RETRY
    TIMEOUT = 1  # RendezvousTimeout
    ABORTED = 2  # Aborted: the message is the abort reason
    INVALID = 3  # InvalidArgument
    EMPTY = 4  # a RECV that must not wait found nothing (try_recv)
    FAILED = 5  # anything else: RendezvousError
    TOO_LARGE = 6  # MessageTooLarge: can never fit the arena
    TOO_MANY_KEYS = 7  # TooManyKeys: the key index is full
    INVALID_TYPE = 8  # InvalidType (e.g. a dtype shmrdv does not send)
    CANCELLED = 9  # the RECV was withdrawn (CANCEL) before it took a message
    UNAUTHENTICATED = 10  # AuthenticationError: the handshake failed


# The one mapping between refusals and exceptions, both ways: code_for on the
# side that refuses, error_for on the side that receives the refusal.
# Subclasses before their bases (RendezvousTimeout is a TimeoutError, etc.).
_CODES: Tuple[Tuple[type, Code], ...] = (
    (Aborted, Code.ABORTED),
    (RendezvousTimeout, Code.TIMEOUT),
    (MessageTooLarge, Code.TOO_LARGE),
    (TooManyKeys, Code.TOO_MANY_KEYS),
    (InvalidType, Code.INVALID_TYPE),
    (InvalidArgument, Code.INVALID),
    (AuthenticationError, Code.UNAUTHENTICATED),
)
_ERRORS = {code: cls for cls, code in _CODES}


def code_for(exc: BaseException) -> Code:
    """The code that tells a peer about exc (FAILED when no code fits)."""
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return Code.FAILED


def refusal(exc: BaseException) -> Tuple[Code, str]:
    """The code and message that tell a peer about exc; an abort's message is
    its reason alone (``Aborted.reason``), as ``abort`` was given it."""
    code = code_for(exc)
    return code, exc.reason if isinstance(exc, Aborted) else str(exc)


def error_for(code: Code, message: str) -> RendezvousError:
    """The exception a received refusal stands for (RendezvousError when no
    exception has that code: FAILED, EMPTY, CANCELLED)."""
    return _ERRORS.get(code, RendezvousError)(message)


def _code(value: int) -> Code:
    try:
        return Code(value)
    except ValueError:
        return Code.FAILED


_HELLO = struct.Struct("<6sHQ32s")
_AUTH = struct.Struct("<HBxxxxxQQ32s32s")
_WELCOME = struct.Struct("<32sQQ")
_META = struct.Struct("<QHBB")
_ACK = struct.Struct("<BB")  # status, code
_CODE = struct.Struct("<B")
_RECV = struct.Struct("<q")


def header(kind: Frame, length: int, stream: int = 0) -> bytes:
    return HEADER.pack(kind, 0, 0, length, stream)


def frame(kind: Frame, body: bytes = b"", stream: int = 0) -> bytes:
    return HEADER.pack(kind, 0, 0, len(body), stream) + body


def check_header(kind: int, flags: int, reserved: int, length: int) -> Frame:
    try:
        k = Frame(kind)
    except ValueError:
        raise ProtocolError(f"unknown frame type {kind}") from None
    if flags or reserved:
        raise ProtocolError(f"frame {k.name} has nonzero reserved bits")
    limit = MAX_CHUNK if k is Frame.DATA else MAX_BODY
    if length > limit:
        raise ProtocolError(f"frame {k.name} body of {length} bytes exceeds the limit of {limit}")
    return k


# ---- handshake ----------------------------------------------------------------


def hello(capacity: int, nonce: bytes) -> bytes:
    return frame(Frame.HELLO, _HELLO.pack(MAGIC, VERSION, capacity, nonce))


def parse_hello(body: bytes) -> Tuple[int, bytes]:
    if len(body) != _HELLO.size:
        raise ProtocolError(f"HELLO of {len(body)} bytes, expected {_HELLO.size}")
    magic, version, capacity, nonce = _HELLO.unpack(body)
    if magic != MAGIC:
        raise ProtocolError("not a shmrdv bridge (bad magic)")
    if version != VERSION:
        raise ProtocolError(f"bridge speaks protocol version {version}, this shmrdv speaks {VERSION}")
    return capacity, nonce


def auth(role: Role, origin: int, first_seq: int, nonce: bytes, proof: bytes) -> bytes:
    return frame(Frame.AUTH, _AUTH.pack(VERSION, role, origin, first_seq, nonce, proof))


def parse_auth(body: bytes) -> Tuple[Role, int, int, bytes, bytes]:
    if len(body) != _AUTH.size:
        raise ProtocolError(f"AUTH of {len(body)} bytes, expected {_AUTH.size}")
    version, role, origin, first_seq, nonce, proof = _AUTH.unpack(body)
    if version != VERSION:
        raise ProtocolError(f"client speaks protocol version {version}, this bridge speaks {VERSION}")
    try:
        r = Role(role)
    except ValueError:
        raise ProtocolError(f"unknown role {role}") from None
    if origin == 0 or first_seq == 0:
        raise ProtocolError("origin id and first sequence number 0 are reserved")
    return r, origin, first_seq, nonce, proof


def welcome(proof: bytes, base: int, bits: int) -> bytes:
    return frame(Frame.WELCOME, _WELCOME.pack(proof, base, bits))


def parse_welcome(body: bytes) -> Tuple[bytes, int, int]:
    if len(body) != _WELCOME.size:
        raise ProtocolError(f"WELCOME of {len(body)} bytes, expected {_WELCOME.size}")
    proof, base, bits = _WELCOME.unpack(body)
    return proof, base, bits


# ---- messages ------------------------------------------------------------------


class Meta(NamedTuple):
    """What a MSG or ITEM frame says about the payload that follows."""

    key: str
    dtype: np.dtype
    shape: Tuple[int, ...]
    nbytes: int


def byte_view(arr: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, without a copy (any dtype, even
    datetimes, which have no buffer protocol of their own)."""
    return memoryview(arr.reshape(-1).view(np.uint8))  # type: ignore[arg-type]


def message_frames(kind: Frame, stream: int, key: bytes, dtype_code: bytes, shape: Sequence[int], payload: memoryview) -> List[Buffer]:
    """A whole message as the pieces to gather into one write: its MSG or
    ITEM header, then DATA frames of CHUNK bytes over the payload itself."""
    parts: List[Buffer] = [encode_meta(kind, stream, key, dtype_code, shape, payload.nbytes)]
    for off in range(0, payload.nbytes, CHUNK):
        chunk = payload[off : off + CHUNK]
        parts += [header(Frame.DATA, chunk.nbytes, stream), chunk]
    return parts


def encode_meta(kind: Frame, stream: int, key: bytes, dtype_code: bytes, shape: Sequence[int], nbytes: int) -> bytes:
    body = b"".join((_META.pack(nbytes, len(key), len(dtype_code), len(shape)), struct.pack(f"<{len(shape)}q", *shape), key, dtype_code))
    return frame(kind, body, stream)


_dtypes: dict = {}  # code -> dtype, for codes that passed the checks below
BF16_STANDIN = np.dtype([("bfloat16", "<u2")])
"""What check_dtype gives for bfloat16 on a host without ml_dtypes: two
bytes an item, enough to move the payload (a bridge forwarding envelopes
needs no more), and no dtype a rendezvous takes: a receiver that needs the
real one refuses the message with ``standin_error``."""


def standin_error(key: str) -> InvalidType:
    return InvalidType(f"a bfloat16 message for {key!r} reached a host without ml_dtypes: {BF16_MISSING} there")


def check_dtype(code: bytes) -> np.dtype:
    """The dtype a frame or envelope names; ProtocolError unless it is one
    shmrdv sends (``codec.dtype_sendable``, the core's own rule): its
    ``dtype.str``, or ``codec.BF16_CODE`` for bfloat16 (``BF16_STANDIN``
    when ml_dtypes is not installed)."""
    dtype = _dtypes.get(code)
    if dtype is not None:
        return dtype
    if code == BF16_CODE:
        dtype = bfloat16()
        return BF16_STANDIN if dtype is None else _dtypes.setdefault(code, dtype)
    if not 0 < len(code) <= MAX_DTYPE:
        raise ProtocolError(f"dtype of {len(code)} bytes")
    try:
        dtype = np.dtype(code.decode("ascii"))
    except (TypeError, ValueError, UnicodeDecodeError):
        raise ProtocolError(f"unreadable dtype {code!r}") from None
    if not dtype_sendable(dtype):
        raise ProtocolError(f"dtype {code!r} is not one shmrdv sends")
    if len(_dtypes) < 1024:
        _dtypes[code] = dtype
    return dtype


def parse_meta(body: bytes, max_nbytes: int) -> Meta:
    """A MSG/ITEM body, every field checked; max_nbytes bounds the payload."""
    if len(body) < _META.size:
        raise ProtocolError(f"message header of {len(body)} bytes is truncated")
    nbytes, key_len, dtype_len, ndim = _META.unpack_from(body)
    if ndim > MAX_NDIM:
        raise ProtocolError(f"{ndim} dimensions, at most {MAX_NDIM}")
    if dtype_len == 0 or dtype_len > MAX_DTYPE:
        raise ProtocolError(f"dtype of {dtype_len} bytes")
    if key_len > MAX_KEY:
        raise ProtocolError(f"key of {key_len} bytes, at most {MAX_KEY}")
    if len(body) != _META.size + 8 * ndim + key_len + dtype_len:
        raise ProtocolError("message header length does not match its counts")
    off = _META.size
    shape = struct.unpack_from(f"<{ndim}q", body, off)
    off += 8 * ndim
    try:
        key = body[off : off + key_len].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("key is not UTF-8") from None
    dtype = check_dtype(body[off + key_len :])
    if any(n < 0 for n in shape):
        raise ProtocolError(f"negative dimension in {shape}")
    if nbytes > max_nbytes:
        raise ProtocolError(f"message of {nbytes} bytes exceeds the limit of {max_nbytes}")
    if math.prod(shape) * dtype.itemsize != nbytes:
        raise ProtocolError(f"shape {shape} of {dtype} is not {nbytes} bytes")
    return Meta(key, dtype, tuple(shape), nbytes)


def _text(message: str) -> bytes:
    return fit_text(message, MAX_REASON).encode("utf-8")


def _fields_and_text(layout: struct.Struct, body: bytes, what: str) -> Tuple[Tuple[int, ...], str]:
    """The body of ACK, ERROR and REFUSED: fixed fields, then UTF-8 text."""
    if not layout.size <= len(body) <= layout.size + MAX_REASON:
        raise ProtocolError(f"{what} of {len(body)} bytes")
    return layout.unpack_from(body), body[layout.size :].decode("utf-8", "replace")


def ack(seq: int, status: Ack, code: Code = Code.NONE, message: str = "") -> bytes:
    """ACK of message seq; a REFUSED one says why with code and message."""
    return frame(Frame.ACK, _ACK.pack(status, code) + _text(message), seq)


def parse_ack(body: bytes) -> Tuple[Ack, Code, str]:
    (status, code), message = _fields_and_text(_ACK, body, "ACK")
    try:
        return Ack(status), _code(code), message
    except ValueError:
        raise ProtocolError(f"unknown ACK status {status}") from None


def refused(code: Code, message: str) -> bytes:
    """REFUSED: the handshake failed (the connection then closes)."""
    return frame(Frame.REFUSED, _CODE.pack(code) + _text(message))


def parse_refused(body: bytes) -> Tuple[Code, str]:
    (code,), message = _fields_and_text(_CODE, body, "REFUSED")
    return _code(code), message


def abort(reason: str) -> bytes:
    return frame(Frame.ABORT, _text(reason))


def parse_text(body: bytes) -> str:
    if len(body) > MAX_REASON + 1:
        raise ProtocolError(f"text of {len(body)} bytes")
    return body.decode("utf-8", "replace")


def recv_request(request: int, key: bytes, timeout_ns: int) -> bytes:
    return frame(Frame.RECV, _RECV.pack(timeout_ns) + key, request)


def parse_recv(body: bytes) -> Tuple[str, int]:
    if len(body) <= _RECV.size or len(body) > _RECV.size + MAX_KEY:
        raise ProtocolError(f"RECV of {len(body)} bytes")
    (timeout_ns,) = _RECV.unpack_from(body)
    try:
        key = body[_RECV.size :].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("key is not UTF-8") from None
    if timeout_ns < 0 or timeout_ns >= limits.FOREVER_NS:
        timeout_ns = -1  # clamped: as long as forever (a timer that long cannot even be armed)
    return key, timeout_ns


def error(request: int, code: Code, message: str) -> bytes:
    """ERROR: the RECV on stream = request ended without a message."""
    return frame(Frame.ERROR, _CODE.pack(code) + _text(message), request)


def parse_error(body: bytes) -> Tuple[Code, str]:
    (code,), message = _fields_and_text(_CODE, body, "ERROR")
    return _code(code), message


# ---- the dedupe window -----------------------------------------------------------
# A receiver remembers which of a sender's sequence numbers it committed as
# (base, bits): every seq <= base, and base + 1 + i for each bit i set. A
# sender never has more than WINDOW messages past its oldest unacknowledged
# one, so 64 bits are enough.


def window_has(base: int, bits: int, seq: int) -> bool:
    return seq <= base or (seq - base <= WINDOW and bool(bits >> (seq - base - 1) & 1))


def window_add(base: int, bits: int, seq: int) -> Tuple[int, int]:
    if seq - base > WINDOW:
        raise ProtocolError(f"sequence {seq} is beyond the window after {base}")
    bits |= 1 << (seq - base - 1)
    while bits & 1:
        base += 1
        bits >>= 1
    return base, bits


# ---- socket I/O ---------------------------------------------------------------------



class Reader:
    """Reads frames from one socket: headers and small bodies into its own
    buffer, DATA straight into the caller's memory."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._hdr = bytearray(HEADER.size)
        self._hdr_view = memoryview(self._hdr)
        # time.monotonic() by which every read must be done (the handshake's),
        # or None: a peer trickling bytes cannot stretch a per-read timeout
        self.deadline: Optional[float] = None
        # Asked whenever a receive timeout set on the socket (SO_RCVTIMEO)
        # passes with nothing read: True drops the connection, False waits on.
        self.on_quiet: Optional[Callable[[], bool]] = None
        self.last_byte = time.monotonic()  # when a byte last arrived
        self.mid_frame = False  # a frame has begun and not all of it arrived

    def read_into(self, view: memoryview) -> None:
        sock = self._sock
        while view.nbytes:
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise ConnectionLost("deadline passed while reading")
                sock.settimeout(left)
            try:
                n = sock.recv_into(view)
            except OSError as exc:
                if self.deadline is not None and isinstance(exc, SOCKET_TIMEOUT):
                    raise ConnectionLost("deadline passed while reading") from exc
                if _timed_out(exc, "SSLWantReadError") and self.on_quiet is not None:
                    if self.on_quiet():
                        raise ConnectionLost("the peer stalled") from None
                    continue
                raise ConnectionLost(f"connection failed: {exc}") from exc
            if n == 0:
                raise ConnectionLost("connection closed by peer")
            self.last_byte = time.monotonic()
            view = view[n:]
            self.mid_frame = view.nbytes > 0

    def header(self) -> Tuple[Frame, int, int]:
        self.read_into(self._hdr_view)
        kind, flags, reserved, length, stream = HEADER.unpack(self._hdr)
        frame = check_header(kind, flags, reserved, length)
        self.mid_frame = length > 0  # its body or DATA is still owed
        return frame, length, stream

    def body(self, length: int) -> bytes:
        buf = bytearray(length)
        self.read_into(memoryview(buf))
        return bytes(buf)

    def skip(self, length: int) -> None:
        scratch = memoryview(bytearray(min(length, 1 << 16)))
        while length:
            n = min(length, scratch.nbytes)
            self.read_into(scratch[:n])
            length -= n

    def expect(self, kind: Frame) -> bytes:
        got, length, _ = self.header()
        if got is Frame.REFUSED:
            code, message = parse_refused(self.body(length))
            raise error_for(code, f"refused by the bridge: {message}")
        if got is not kind:
            raise ProtocolError(f"expected {kind.name}, got {got.name}")
        return self.body(length)


def send_all(sock: socket.socket, parts: List[Buffer]) -> None:
    """Write parts in order with as few syscalls as the socket allows:
    ``sendmsg`` gathers them (no joining copy); TLS sockets take them one
    by one. Raises ConnectionLost."""
    try:
        if not hasattr(sock, "sendmsg") or _is_tls(sock):
            for part in parts:
                sock.sendall(part)
            return
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        while views:
            sent = sock.sendmsg(views[:512])
            while sent:
                if sent >= views[0].nbytes:
                    sent -= views[0].nbytes
                    views.pop(0)
                else:
                    views[0] = views[0][sent:]
                    sent = 0
    except OSError as exc:
        if _timed_out(exc, "SSLWantWriteError"):
            raise ConnectionLost("the peer stopped reading: nothing could be sent for its idle timeout") from None
        raise ConnectionLost(f"connection failed: {exc}") from exc


# A socket's Python-level timeout: socket.timeout, which is TimeoutError
# from Python 3.10 on and only an OSError before.
SOCKET_TIMEOUT = (TimeoutError, socket.timeout)


def _timed_out(exc: OSError, tls_error: str) -> bool:
    """Whether exc is an idle timeout set by set_io_timeouts passing: a
    blocking socket's SO_RCVTIMEO or SO_SNDTIMEO (EAGAIN), a TLS socket's
    Python-level timeout (TimeoutError), or on TLS the ssl error named
    tls_error (want-read, want-write)."""
    if isinstance(exc, (BlockingIOError, SOCKET_TIMEOUT)):
        return True
    ssl = sys.modules.get("ssl")  # no TLS socket exists unless ssl was loaded
    return ssl is not None and isinstance(exc, getattr(ssl, tls_error))


def set_io_timeouts(sock: socket.socket, seconds: float) -> None:
    """Kernel timeouts on a blocking socket: a receive with nothing to read,
    or a send that can queue nothing, returns EAGAIN after seconds; no extra
    system call per read or write, as a Python-level timeout would make. A
    TLS socket retries EAGAIN inside its own read and write loops, so it
    gets a Python-level timeout instead (TimeoutError)."""
    if _is_tls(sock):
        sock.settimeout(seconds)
        return
    whole = int(seconds)
    tv = struct.pack("@ll", whole, int((seconds - whole) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


# Keepalive probes find a peer whose host vanished even while it owes us
# nothing: 30 s of silence, then 3 probes 10 s apart.
_KEEPALIVE = ((socket.TCP_KEEPIDLE, 30), (socket.TCP_KEEPINTVL, 10), (socket.TCP_KEEPCNT, 3))


def keep_alive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in _KEEPALIVE:
        sock.setsockopt(socket.IPPROTO_TCP, option, value)


def drop_when_unanswered(sock: socket.socket, seconds: float) -> None:
    """Have the kernel fail sock (ETIMEDOUT) once bytes it sent have gone
    unacknowledged by the peer's TCP for `seconds`, keepalive probes
    included (TCP_USER_TIMEOUT). Without it, a peer whose host is cut off
    mid-connection leaves it retransmitting for the quarter of an hour of
    tcp_retries2. A peer that acknowledges but does not read (a zero
    window) counts as unanswered too."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, max(1, round(seconds * 1000)))


def _is_tls(sock: socket.socket) -> bool:
    import ssl

    return isinstance(sock, ssl.SSLSocket)


def parse_url(url: str) -> Tuple[str, str, int]:
    """``tcp://host:port`` or ``tls://host:port`` -> (scheme, host, port)."""
    if not isinstance(url, str):
        raise TypeError(f"bridge address must be a str, not {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("tcp", "tls"):
        raise ValueError(f"bridge address must look like tcp://HOST:PORT or tls://HOST:PORT: {url!r}")
    host, port = split_host_port(rest, url)
    return scheme, host, port


def split_host_port(text: str, whole: Optional[str] = None, allow_any_port: bool = False) -> Tuple[str, int]:
    """HOST:PORT (IPv6 hosts in brackets); port 0 only with allow_any_port."""
    host, sep, port_s = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    low = 0 if allow_any_port else 1
    if not sep or not host or not port_s.isdigit() or not low <= int(port_s) < 65536:
        raise ValueError(f"expected HOST:PORT with a port in {low}..65535: {whole or text!r}")
    return host, int(port_s)
