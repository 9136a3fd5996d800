"""The outbox: how a message bound for another host waits on this one.

``send`` to a key routed to a remote bridge writes one *envelope* into the
local rendezvous under OUTBOX_KEY: a small header naming the route, the
credentials and the real key, then the payload, with the one copy a local
send makes. The message is then in shared memory and survives the sending
process; this host's bridge takes envelopes from the outbox and forwards
them. The header is checked field by field when read back: a damaged or
foreign envelope is refused, never trusted.
"""
import math
import struct
from typing import Any, NamedTuple, Optional, Tuple

import numpy as np

from ..errors import InvalidArgument
from .protocol import MAX_DTYPE, MAX_KEY, MAX_NDIM, ProtocolError, check_dtype

OUTBOX_KEY = "\x1bshmrdv/outbox"
"""The key envelopes wait under; the escape character keeps it out of any TF key."""

ANNOUNCE_KEY = b"\x1bshmrdv/route"
"""An envelope under this key carries no message: a Rendezvous opened with
routes announces each route to this host's bridge, which links to it at once
(so aborts cross before any message has)."""

_MAGIC = b"SRDO"
_VERSION = 1
_HEAD = struct.Struct("<4sHHHHHBBQIQQ")
_STAMP = struct.Struct("<QQ")
_STAMP_OFF = 28  # origin and seq, after payload_off: 0 until a bridge takes the envelope
_ALIGN = 64
MAX_URL = 1024
MAX_TOKEN = 4096
MAX_PATH = 4096


class Envelope(NamedTuple):
    """An envelope read back from the outbox; payload is a view into it."""

    url: str
    token: bytes
    tls_ca: Optional[str]
    key: bytes
    dtype_code: bytes
    shape: Tuple[int, ...]
    payload: memoryview
    origin: int  # the link that numbered it, or 0 ...
    seq: int  # ... and its sequence number there: set once a bridge has taken it


def head(url: bytes, token: bytes, tls_ca: bytes, key: bytes, dtype_code: bytes, shape: Tuple[int, ...], nbytes: int) -> Tuple[bytes, int]:
    """The envelope header, and the payload's offset behind it."""
    if len(url) > MAX_URL or len(token) > MAX_TOKEN or len(tls_ca) > MAX_PATH:
        raise InvalidArgument("route URL, token or CA path too long")
    var = struct.pack(f"<{len(shape)}q", *shape) + url + token + tls_ca + key + dtype_code
    size = _HEAD.size + len(var)
    payload_off = -(-size // _ALIGN) * _ALIGN
    fixed = _HEAD.pack(_MAGIC, _VERSION, len(url), len(token), len(tls_ca), len(key), len(dtype_code), len(shape), nbytes, payload_off, 0, 0)
    return fixed + var, payload_off


def read(view: Any) -> Envelope:
    """Parse an envelope (a uint8 array from the outbox); ProtocolError if damaged."""
    mem = memoryview(view).cast("B")
    total = mem.nbytes
    if total < _HEAD.size:
        raise ProtocolError(f"outbox entry of {total} bytes is too short")
    magic, version, url_len, token_len, ca_len, key_len, dtype_len, ndim, nbytes, payload_off, origin, seq = _HEAD.unpack_from(mem)
    if magic != _MAGIC or version != _VERSION:
        raise ProtocolError("outbox entry has a bad magic or version")
    if url_len > MAX_URL or token_len > MAX_TOKEN or ca_len > MAX_PATH or not 0 < key_len <= MAX_KEY:
        raise ProtocolError("outbox entry lengths out of range")
    if not 0 < dtype_len <= MAX_DTYPE or ndim > MAX_NDIM:
        raise ProtocolError("outbox entry dtype or ndim out of range")
    var_len = 8 * ndim + url_len + token_len + ca_len + key_len + dtype_len
    if payload_off < _HEAD.size + var_len or payload_off % _ALIGN or payload_off > total or total - payload_off != nbytes:
        raise ProtocolError("outbox entry payload does not fit it")
    var = bytes(mem[_HEAD.size : _HEAD.size + var_len])
    shape = struct.unpack_from(f"<{ndim}q", var)
    off = 8 * ndim
    fields = []
    for n in (url_len, token_len, ca_len, key_len, dtype_len):
        fields.append(var[off : off + n])
        off += n
    url, token, ca, key, code = fields
    dtype = check_dtype(code)
    if any(n < 0 for n in shape) or math.prod(shape) * dtype.itemsize != nbytes:
        raise ProtocolError("outbox entry shape does not match its payload")
    try:
        url_s = url.decode("ascii")
        ca_s = ca.decode("utf-8") if ca else None
        key.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("outbox entry has a non-text URL, key or CA path") from None
    if (origin == 0) != (seq == 0):
        raise ProtocolError("outbox entry has half a stamp")
    return Envelope(url_s, token, ca_s, key, code, tuple(shape), mem[payload_off:], origin, seq)


def stamp(view: Any, origin: int, seq: int) -> None:
    """Number an envelope taken from the outbox, in place: if the bridge dies
    before it is acknowledged and it comes back to the outbox (a leased
    receive), the next bridge sends it under the same number, and the far
    side recognises it if it already committed it."""
    view[_STAMP_OFF : _STAMP_OFF + _STAMP.size] = np.frombuffer(_STAMP.pack(origin, seq), np.uint8)


def payload_array(buf: np.ndarray, payload_off: int, dtype: np.dtype, shape: Tuple[int, ...]) -> np.ndarray:
    """The typed array over an envelope buffer's payload."""
    nbytes = math.prod(shape) * dtype.itemsize
    part = buf[payload_off : payload_off + nbytes]
    return part.view(dtype).reshape(shape)
