"""The core's limits, in one place: read from the compiled C header
(``csrc/shmrdv.h``, which is also the cffi cdef), never copied.

Every layer that checks one of these (the core's arguments, the bridge's
wire format, the outbox's envelopes, the benchmarks) imports it from here,
so a limit changed in the header changes everywhere at the next build.
"""
from ._binding import lib

KEY_MAX = int(lib.RDV_KEY_MAX)
"""Bytes of UTF-8 in a key (at least 1)."""

NDIM_MAX = int(lib.RDV_NDIM_MAX)
"""Dimensions of an array that can be sent."""

DTYPE_MAX = int(lib.RDV_DTYPE_MAX)
"""Bytes of a dtype's descriptor (numpy ``dtype.str``, ASCII)."""

REASON_MAX = int(lib.RDV_REASON_MAX)
"""Bytes of UTF-8 in an abort reason (a longer one is refused)."""

NAME_MAX = int(lib.RDV_NAME_MAX)
"""Characters of a rendezvous name."""

MAX_MARKS = int(lib.RDV_MAX_MARKS)
"""Producer marks per rendezvous: indexes are in [0, MAX_MARKS)."""

MAX_ARENA_BYTES = int(lib.RDV_MAX_ARENA_BYTES)
"""The largest arena a rendezvous can have (2**36 - 4096 bytes); arenas are whole 4096-byte pages."""

MAX_KEYS = int(lib.RDV_MAX_KEYS)
"""The largest max_keys a rendezvous can have: keys live at once."""

MAX_PROCS = int(lib.RDV_MAX_PROCS)
"""Handles attached to one rendezvous at once (its process table)."""

LAYOUT_VERSION = int(lib.RDV_LAYOUT_VERSION)
"""The shared layout's version: a segment of another version is refused."""

FOREVER_NS = int(lib.RDV_FOREVER_NS)
"""A timeout this long or longer (2**62 ns, about 146 years) waits forever."""

__all__ = ["KEY_MAX", "NDIM_MAX", "DTYPE_MAX", "REASON_MAX", "NAME_MAX", "MAX_MARKS", "MAX_ARENA_BYTES", "MAX_KEYS",
           "MAX_PROCS", "LAYOUT_VERSION", "FOREVER_NS"]
