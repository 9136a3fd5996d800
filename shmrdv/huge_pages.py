"""Huge pages for a rendezvous: what this machine offers, and how much of a
mapping got them.

A named rendezvous is a file in a tmpfs (``/dev/shm``, or the directory
``dir=`` names), a private one a memfd (the kernel's own tmpfs, set by
``shmem_enabled`` below). tmpfs gives transparent huge
pages (2 MiB) when the mount says so (``huge=always``, ``within_size``, or
``advise`` with ``MADV_HUGEPAGE``, which the core gives every mapping of a
segment created with ``huge_pages=True``), or when
``/sys/kernel/mm/transparent_hugepage/shmem_enabled`` is ``force``; never
with ``deny``, without the ``huge=`` option, or without transparent huge
pages in the kernel. Big copies into 4 KiB pages lose about a quarter of
their speed to TLB misses, which huge pages take away.
"""

from __future__ import annotations
import os
from dataclasses import dataclass
from typing import Optional

SHM_DIR = "/dev/shm"
_THP = "/sys/kernel/mm/transparent_hugepage"
_GIVES = ("always", "within_size", "advise")


@dataclass(frozen=True)
class Offer:
    """Whether segments created in SHM_DIR can get huge pages, and why (not)."""

    available: bool
    why: str


def _selected(path: str) -> Optional[str]:
    """The bracketed choice of a sysfs setting such as ``always [never]``, or None."""
    try:
        with open(path) as setting:
            text = setting.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def _mount_huge(directory: str) -> Optional[str]:
    """The ``huge=`` option of the tmpfs mounted at (or holding) directory;
    "" for a tmpfs without it; None if it is no tmpfs or cannot be read."""
    directory = os.path.realpath(directory)
    best, option, fstype = "", None, None
    try:
        with open("/proc/self/mountinfo") as mounts:
            for line in mounts:
                left, _, right = line.partition(" - ")
                fields, tail = left.split(), right.split()
                if len(fields) < 5 or len(tail) < 3:
                    continue
                point = fields[4].replace("\\040", " ")
                inside = directory == point or directory.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, fstype = point, tail[0]
                    options = dict(item.partition("=")[::2] for item in tail[2].split(","))
                    option = options.get("huge", "")
    except OSError:
        return None
    return option if fstype == "tmpfs" else None


def offered(directory: Optional[str] = SHM_DIR) -> Offer:
    """What creating a segment with huge pages would get on this machine:
    a file in ``directory``, or (None) a private rendezvous' memfd."""
    if not os.path.isdir(_THP):
        return Offer(False, "this kernel has no transparent huge pages (no /sys/kernel/mm/transparent_hugepage)")
    forced = _selected(os.path.join(_THP, "shmem_enabled"))
    if directory is None:
        if forced in _GIVES + ("force",):
            return Offer(True, f"{_THP}/shmem_enabled is {forced!r}")
        return Offer(False, f"a private rendezvous is a memfd, which gets huge pages as {_THP}/shmem_enabled says, "
                            f"and it says {forced!r}. An administrator can turn them on (echo advise > "
                            f"{_THP}/shmem_enabled), or create a named rendezvous in a tmpfs mounted "
                            f"huge=within_size (dir=)")
    if forced == "deny":
        return Offer(False, f"{_THP}/shmem_enabled is 'deny': no tmpfs gets huge pages")
    if forced == "force":
        return Offer(True, f"{_THP}/shmem_enabled is 'force'")
    option = _mount_huge(directory)
    if option is None:
        return Offer(False, f"{directory} is not a tmpfs whose mount options can be read")
    if option in _GIVES:
        return Offer(True, f"{directory} is a tmpfs mounted with huge={option}")
    said = f"huge={option}" if option else "no huge= option"
    return Offer(False, f"{directory} is a tmpfs mounted with {said}, so its files get 4 KiB pages only. An "
                        f"administrator can turn them on: mount -o remount,huge=within_size {directory}")


def mapped_huge_bytes(base: int, length: int) -> int:
    """Bytes of this process's mapping [base, base + length) backed by huge
    pages (ShmemPmdMapped and FilePmdMapped in /proc/self/smaps); 0 if unknown."""
    total, inside = 0, False
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                if not line.strip():
                    continue
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    start, _, end = head.partition("-")
                    inside = base <= int(start, 16) and int(end, 16) <= base + length
                elif inside and head in ("ShmemPmdMapped:", "FilePmdMapped:"):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return total
