"""TensorFlow's rendezvous key format: ``src;incarnation;dst;name;frame:iter``."""
from typing import NamedTuple, Tuple

_FIELD_SEP = ";"


class ParsedKey(NamedTuple):
    """The parts of a TF-style rendezvous key."""

    src_device: str
    src_incarnation: int
    dst_device: str
    edge_name: str
    frame_iter: Tuple[int, int]


def _check_part(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not value or _FIELD_SEP in value:
        raise ValueError(f"{what} must be non-empty and contain no ';': {value!r}")
    return value


def create_key(
    src_device: str,
    src_incarnation: int,
    dst_device: str,
    name: str,
    frame_iter: Tuple[int, int] = (0, 0),
) -> str:
    """Build a key in TensorFlow's wire format, e.g.
    ``/job:w/replica:0/task:0/device:CPU:0;0000000000000001;/job:w/replica:0/task:1/device:CPU:0;edge_5_y;0:0``.
    The incarnation is written as 16 lowercase hex digits."""
    _check_part(src_device, "src_device")
    _check_part(dst_device, "dst_device")
    _check_part(name, "name")
    if not isinstance(src_incarnation, int) or isinstance(src_incarnation, bool):
        raise TypeError(f"src_incarnation must be an int, not {type(src_incarnation).__name__}")
    if not 0 <= src_incarnation < 1 << 64:
        raise ValueError(f"src_incarnation must fit in 64 unsigned bits: {src_incarnation}")
    frame, it = _check_frame_iter(frame_iter)
    return f"{src_device};{src_incarnation:016x};{dst_device};{name};{frame}:{it}"


def _check_frame_iter(frame_iter: object) -> Tuple[int, int]:
    if not isinstance(frame_iter, tuple) or len(frame_iter) != 2:
        raise TypeError(f"frame_iter must be a (frame_id, iter_id) tuple, not {frame_iter!r}")
    for part in frame_iter:
        if not isinstance(part, int) or isinstance(part, bool):
            raise TypeError(f"frame_iter parts must be ints: {frame_iter!r}")
        if part < 0:
            raise ValueError(f"frame_iter parts must be non-negative: {frame_iter!r}")
    return frame_iter[0], frame_iter[1]


def parse_key(key: str) -> ParsedKey:
    """Split a TF-style key into its parts; ``ValueError`` names what is malformed."""
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    parts = key.split(_FIELD_SEP)
    if len(parts) != 5:
        raise ValueError(f"key must have 5 ';'-separated parts, found {len(parts)}: {key!r}")
    src, inc, dst, name, fi = parts
    for value, what in ((src, "src_device"), (dst, "dst_device"), (name, "edge name")):
        if not value:
            raise ValueError(f"key has an empty {what}: {key!r}")
    if len(inc) != 16 or any(c not in "0123456789abcdefABCDEF" for c in inc):
        raise ValueError(f"key incarnation must be 16 hex digits, found {inc!r}")
    frame, sep, it = fi.partition(":")
    if not sep or not frame.isdigit() or not it.isdigit() or not frame.isascii() or not it.isascii():
        raise ValueError(f"key frame:iter must be two non-negative integers, found {fi!r}")
    return ParsedKey(src, int(inc, 16), dst, name, (int(frame), int(it)))
