"""Producer marks' arguments: which mark, and what a change of one sets
(see ``Rendezvous.mark``)."""
from typing import Tuple

from . import limits
from .codec import u64
from .errors import InvalidArgument, InvalidType

MAX_MARKS = limits.MAX_MARKS
"""Producer marks per rendezvous: ``Rendezvous.mark(idx)`` takes idx in [0, MAX_MARKS)."""
Mark = Tuple[int, int, int, int]
"""A producer mark change: (index, id, val0, val1)."""


def mark_index(idx: object) -> int:
    if isinstance(idx, bool) or not isinstance(idx, int):
        raise InvalidType(f"mark index must be an int, not {type(idx).__name__}")
    if not 0 <= idx < MAX_MARKS:
        raise InvalidArgument(f"mark index must be in [0, {MAX_MARKS}), got {idx}")
    return idx


def checked_mark(mark: object) -> Mark:
    """Check a mark=(idx, id, val0, val1) argument."""
    if not isinstance(mark, tuple) or len(mark) != 4:
        raise InvalidType(f"mark must be None or a tuple (idx, id, val0, val1), not {mark!r}")
    idx, id_, val0, val1 = mark
    return (mark_index(idx), u64(id_, "mark id"), u64(val0, "mark val0"), u64(val1, "mark val1"))
