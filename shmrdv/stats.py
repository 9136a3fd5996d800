"""Snapshots of a rendezvous: ``Stats``, ``ProcessInfo``, ``KeyInfo``, and
reading each from the core."""
from dataclasses import dataclass
from typing import Any, List, Optional

from . import huge_pages, limits
from ._binding import ffi, lib, raise_rc


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


def read_stats(h: Any) -> Stats:
    """The core's stats of handle ``h`` (``Rendezvous.stats``)."""
    out = ffi.new("struct rdv_stats *")
    rc = lib.rdv_stats(h, out)
    if rc < 0:
        raise_rc(rc, "stats")
    huge = out.flags & lib.RDV_CREATE_HUGE_PAGES
    return Stats(
        pending_messages=out.pending_messages,
        keys=out.keys,
        waiters=out.waiters,
        bytes_used=out.bytes_used,
        bytes_free=out.bytes_free,
        largest_free=out.largest_free,
        live_blocks=out.live_blocks,
        waiter_bytes=out.waiter_bytes,
        capacity=out.capacity,
        max_keys=out.max_keys,
        aborted=bool(out.aborted),
        leases_dropped=out.leases_dropped,
        keys_counted=out.keys_counted,
        huge_pages=bool(huge),
        huge_page_bytes=_huge_page_bytes(h) if huge else 0,
        prefault=not out.flags & lib.RDV_CREATE_NO_PREFAULT,
    )


def _huge_page_bytes(h: Any) -> int:
    base, length = ffi.new("uint64_t *"), ffi.new("uint64_t *")
    lib.rdv_mapping(h, base, length)
    return huge_pages.mapped_huge_bytes(int(base[0]), int(length[0]))


def read_processes(h: Any) -> List[ProcessInfo]:
    """The process table of handle ``h``'s segment (``Rendezvous.processes``)."""
    out = ffi.new("struct rdv_proc_info[]", limits.MAX_PROCS)
    n = ffi.new("uint32_t *")
    rc = lib.rdv_procs(h, out, limits.MAX_PROCS, n)
    if rc < 0:
        raise_rc(rc, "processes")
    return [
        ProcessInfo(
            entry=p.entry, pid=p.pid, alive=bool(p.alive), reclaiming=p.state == 2,
            attached_at=p.attached_ns / 1e9, views=p.views, view_bytes=p.view_bytes,
            writing=p.writing, waits=p.waits,
        )
        for p in out[0 : n[0]]
    ]


def read_keys(h: Any, limit: int) -> List[KeyInfo]:
    """Up to ``limit`` live keys of handle ``h``'s segment (``Rendezvous.keys``)."""
    # no more keys than the index holds can be live: room for those only
    limit = min(limit, 4 * int(read_stats(h).max_keys))  # more than its index has slots for
    out = ffi.new("struct rdv_key_info[]", limit)
    n = ffi.new("uint32_t *")
    rc = lib.rdv_keys(h, out, limit, n)
    if rc < 0:
        raise_rc(rc, "keys")
    result = []
    for k in out[0 : n[0]]:
        name = ffi.unpack(k.key, k.key_len).decode("utf-8", "replace") if k.key_len else None
        if name is not None and k.full_len > k.key_len:
            name += "..."
        result.append(KeyInfo(name=name, pending=k.pending, waiters=k.waiters))
    return result
