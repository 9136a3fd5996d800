"""TensorFlow's rendezvous key format: ``src;incarnation;dst;name;frame:iter``,
accepted and refused exactly as ``Rendezvous::ParseKey`` does, with device
names read as ``DeviceNameUtils::ParseFullName`` reads them."""
from typing import NamedTuple, Optional, Tuple

from .errors import InvalidArgument, InvalidType

_FIELD_SEP = ";"
_HEX = frozenset("0123456789abcdefABCDEF")
_U64 = 1 << 64
DEFAULT_FRAME_ITER = (_U64 - 1, -1)
"""What ``CreateKey`` writes for a default ``FrameAndIter``: no frame (the
illegal frame id, unsigned) and no iteration (-1)."""


class DeviceName(NamedTuple):
    """A device name's parts; None where the name leaves one out or says ``*``."""

    job: Optional[str] = None
    replica: Optional[int] = None
    task: Optional[int] = None
    type: Optional[str] = None
    id: Optional[int] = None


class ParsedKey(NamedTuple):
    """The parts of a TF-style rendezvous key."""

    src_device: str
    src_incarnation: int
    dst_device: str
    edge_name: str
    frame_iter: str
    """As written: TensorFlow does not read it (``CreateKey`` writes ``frame:iter``)."""
    src: DeviceName
    dst: DeviceName


def _name_chars(text: str, i: int, stop: str) -> int:
    """The end of a job name or device type starting at i ([A-Za-z] then
    [A-Za-z0-9_]*, up to a character in stop); -1 if it is not one."""
    if i >= len(text) or not (text[i].isascii() and text[i].isalpha()):
        return -1
    j = i + 1
    while j < len(text) and text[j] not in stop:
        c = text[j]
        if not (c.isascii() and (c.isalnum() or c == "_")):
            return -1
        j += 1
    return j


def _number(text: str, i: int) -> Tuple[Optional[int], int]:
    """Leading decimal digits at i that fit 64 unsigned bits: (value, end), or (None, i)."""
    j = i
    while j < len(text) and "0" <= text[j] <= "9":
        j += 1
    if j == i or int(text[i:j]) >= _U64:
        return None, i
    return int(text[i:j]), j


def parse_device_name(name: str) -> Optional[DeviceName]:
    """``DeviceNameUtils::ParseFullName``: the parts of a device name such as
    ``/job:w/replica:0/task:1/device:GPU:0`` (any of the parts may be left out
    or be ``*``; ``/cpu:0``, ``/gpu:0`` are the legacy spellings; "" and "/"
    name nothing in particular), or None if it is not one."""
    parts = {"job": None, "replica": None, "task": None, "type": None, "id": None}
    if name == "/":
        return DeviceName()
    i = 0

    def consume(prefix: str) -> bool:
        nonlocal i
        if name.startswith(prefix, i):
            i += len(prefix)
            return True
        return False

    def number_or_star(field: str) -> bool:
        nonlocal i
        if consume("*"):
            parts[field] = None
            return True
        parts[field], i = _number(name, i)
        return parts[field] is not None

    while i < len(name):
        progress = False
        if consume("/job:"):
            if not consume("*"):
                end = _name_chars(name, i, "/")
                if end < 0:
                    return None
                parts["job"], i = name[i:end], end
            else:
                parts["job"] = None
            progress = True
        for field in ("replica", "task"):
            if consume(f"/{field}:"):
                if not number_or_star(field):
                    return None
                progress = True
        if consume("/device:"):
            if consume("*"):
                parts["type"] = None
            else:
                end = _name_chars(name, i, "/:")
                if end < 0:
                    return None
                parts["type"], i = name[i:end], end
            if not consume(":"):
                parts["id"] = None
            elif not number_or_star("id"):
                return None
            progress = True
        for legacy, kind in (("/cpu:", "CPU"), ("/CPU:", "CPU"), ("/gpu:", "GPU"), ("/GPU:", "GPU")):
            if consume(legacy):
                parts["type"] = kind
                if not number_or_star("id"):
                    return None
                progress = True
        if not progress:
            return None
    return DeviceName(**parts)


def _device(value: object, what: str) -> Tuple[str, DeviceName]:
    if not isinstance(value, str):
        raise InvalidType(f"{what} must be a str, not {type(value).__name__}")
    parsed = parse_device_name(value)
    if parsed is None:
        raise InvalidArgument(f"{what} is not a device name (such as /job:w/replica:0/task:0/device:CPU:0): "
                              f"{value!r}")
    return value, parsed


def create_key(
    src_device: str,
    src_incarnation: int,
    dst_device: str,
    name: str,
    frame_iter: Tuple[int, int] = DEFAULT_FRAME_ITER,
) -> str:
    """Build a key as TensorFlow's ``Rendezvous::CreateKey`` does, e.g.
    ``/job:w/replica:0/task:0/device:CPU:0;0000000000000001;/job:w/replica:0/task:1/device:CPU:0;edge_5_y;0:0``:
    the incarnation as 16 lowercase hex digits, ``frame:iter`` as the frame id
    (unsigned 64 bits) and the iteration (signed 64 bits); by default, as for a
    default ``FrameAndIter``, ``18446744073709551615:-1``. The devices must be
    device names and the name non-empty, none of them containing ``;``, so
    that ``parse_key`` reads back what was given (``InvalidArgument``)."""
    _device(src_device, "src_device")
    _device(dst_device, "dst_device")
    if not isinstance(name, str):
        raise InvalidType(f"name must be a str, not {type(name).__name__}")
    if not name or _FIELD_SEP in name:
        raise InvalidArgument(f"name must be non-empty and contain no ';': {name!r}")
    if not isinstance(src_incarnation, int) or isinstance(src_incarnation, bool):
        raise InvalidType(f"src_incarnation must be an int, not {type(src_incarnation).__name__}")
    if not 0 <= src_incarnation < _U64:
        raise InvalidArgument(f"src_incarnation must fit in 64 unsigned bits: {src_incarnation}")
    frame, it = _check_frame_iter(frame_iter)
    return f"{src_device};{src_incarnation:016x};{dst_device};{name};{frame}:{it}"


def _check_frame_iter(frame_iter: object) -> Tuple[int, int]:
    if not isinstance(frame_iter, tuple) or len(frame_iter) != 2:
        raise InvalidType(f"frame_iter must be a (frame_id, iter_id) tuple, not {frame_iter!r}")
    frame, it = frame_iter
    for part in frame_iter:
        if not isinstance(part, int) or isinstance(part, bool):
            raise InvalidType(f"frame_iter parts must be ints: {frame_iter!r}")
    if not 0 <= frame < _U64:
        raise InvalidArgument(f"frame_id must fit in 64 unsigned bits: {frame}")
    if not -(1 << 63) <= it < 1 << 63:
        raise InvalidArgument(f"iter_id must fit in 64 signed bits: {it}")
    return frame, it


def parse_key(key: str) -> ParsedKey:
    """Split a TF-style key into its parts, as ``Rendezvous::ParseKey`` does:
    five ``;``-separated parts, the devices device names (empty allowed), the
    incarnation hex digits (read modulo 2**64, as TensorFlow does), the edge
    name non-empty, the fifth part non-empty but not read further.
    ``InvalidArgument`` names what is malformed."""
    if not isinstance(key, str):
        raise InvalidType(f"key must be a str, not {type(key).__name__}")
    parts = key.split(_FIELD_SEP)
    if len(parts) != 5:
        raise InvalidArgument(f"invalid rendezvous key: {len(parts)} ';'-separated parts, not 5: {key!r}")
    src, inc, dst, name, fi = parts
    src_name = parse_device_name(src)
    if src_name is None:
        raise InvalidArgument(f"invalid rendezvous key: its source {src!r} is not a device name: {key!r}")
    if not inc or not set(inc) <= _HEX:
        raise InvalidArgument(f"invalid rendezvous key: its incarnation {inc!r} is not hex digits: {key!r}")
    dst_name = parse_device_name(dst)
    if dst_name is None:
        raise InvalidArgument(f"invalid rendezvous key: its destination {dst!r} is not a device name: {key!r}")
    if not name:
        raise InvalidArgument(f"invalid rendezvous key: its edge name is empty: {key!r}")
    if not fi:
        # TensorFlow counts a key with an empty frame:iter part as having four parts.
        raise InvalidArgument(f"invalid rendezvous key: its frame:iter part is empty: {key!r}")
    return ParsedKey(src, int(inc, 16) % _U64, dst, name, fi, src_name, dst_name)
