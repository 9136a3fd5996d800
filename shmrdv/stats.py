"""Snapshots of a rendezvous: ``Stats``, ``ProcessInfo``, ``KeyInfo``."""
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Stats:
    """Taken without stopping other processes, so fields may be mutually a
    moment apart."""

    pending_messages: int
    """Messages sent and not yet received, over all keys."""
    keys: int
    """Keys that currently have pending messages or waiting receivers."""
    waiters: int
    """Receivers waiting in line (in ``recv``, a pending ``recv_async``), over
    all processes, once per key they wait on (a ``recv_any`` on three keys
    counts three)."""
    bytes_used: int
    """Arena bytes in message blocks: pending messages, messages being written
    (a send in progress, an open ``alloc``), and received views still held.
    A block is its message plus its header, rounded up to 64 bytes (256 at
    the least), and up to 192 bytes more when the free run it is cut from
    would leave less than 256 bytes behind."""
    bytes_free: int
    """Arena bytes in free blocks: ``bytes_used + waiter_bytes + bytes_free == capacity``."""
    largest_free: int
    """The largest free block: a message whose block needs more does not fit
    now (it waits for space), one that needs at most this fits at once."""
    live_blocks: int
    """Message blocks in use: pending messages, messages being written, held views."""
    capacity: int
    """Arena size in bytes."""
    max_keys: int
    """How many keys may be live at once: a send that would make one more
    raises ``TooManyKeys``."""
    aborted: bool
    """Whether the rendezvous has been aborted."""
    waiter_bytes: int = 0
    """Arena bytes holding the records of receivers that wait in line: each
    handle that has waited keeps slabs of 4 KiB (62 receivers each) until it
    closes."""
    leases_dropped: int = 0
    """Leased messages (``recv(..., lease=True)``) of dead receivers that
    could not go back to their key because the key index was full, and were
    freed instead."""
    keys_counted: int = 0
    """Live keys as ``max_keys`` counts them (a crash-safe count kept beside
    the index): equal to ``keys`` whenever no send or receive is creating or
    deleting a key."""
    huge_pages: bool = False
    """Whether the rendezvous was created with ``huge_pages=True`` (every
    process maps it asking for transparent huge pages)."""
    huge_page_bytes: int = 0
    """How many bytes of this process's mapping of the segment are backed by
    huge pages now (the kernel's ``ShmemPmdMapped``); the mapping is
    ``capacity`` plus about 1 % for the header and the key index."""
    prefault: bool = True
    """Whether each process faults the whole segment in when it maps it
    (a segment created with ``prefault=False`` leaves each page to its
    first touch, in every process)."""


@dataclass(frozen=True)
class ProcessInfo:
    """One handle attached to a rendezvous, as ``Rendezvous.processes()`` sees it."""

    entry: int
    """Its slot in the segment's process table."""
    pid: int
    """The process id it registered with (as seen from its own pid namespace)."""
    alive: bool
    """Whether the process still holds its entry's kernel lock (dead ones get reclaimed)."""
    reclaiming: bool
    """Whether another process is reclaiming what it held right now."""
    attached_at: float
    """When it attached, in seconds since the epoch."""
    views: int
    """Received messages whose views it still holds."""
    view_bytes: int
    """Arena bytes those views pin."""
    writing: int
    """Blocks it is filling (a send in progress, an open ``alloc``)."""
    waits: int
    """Receives it is blocked in."""


@dataclass(frozen=True)
class KeyInfo:
    """One live key, as ``Rendezvous.keys()`` sees it."""

    name: Optional[str]
    """The key, read from its oldest pending message (None when it has only waiters);
    cut at 256 bytes, with ``...`` appended, when longer."""
    pending: int
    """Messages queued under it."""
    waiters: int
    """Receivers blocked on it."""
