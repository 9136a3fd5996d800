"""The rendezvous segments on this machine, for the operations commands
(``shmrdv ls``, ``stat``, ``rm``, ``gc``)."""
import os
from typing import List

from .rendezvous import SEGMENT_PREFIX

SHM_DIR = "/dev/shm"
_FILE_PREFIX = SEGMENT_PREFIX.lstrip("/")


def segment_names() -> List[str]:
    """Names of the rendezvous whose segments exist, sorted."""
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted(e[len(_FILE_PREFIX) :] for e in entries if e.startswith(_FILE_PREFIX))


def segment_path(name: str) -> str:
    return os.path.join(SHM_DIR, _FILE_PREFIX + name)


def human_bytes(n: float) -> str:
    """A byte count for people, in binary units (1 KiB = 1024 B): "64 B",
    "4 KiB", "1.5 MiB". A whole number of its unit has no decimals ("16 MiB"),
    anything else one ("1.0 KiB" is 1025 to 1075 bytes). The one byte format of
    the command line (ls, stat, demo, bench)."""
    value = float(n)
    for unit in _UNITS:
        if unit == "B":
            if abs(value) < 1024:
                return f"{value:.0f} B"
        else:
            shown = round(value, 1)
            if abs(shown) < 1024 or unit == _UNITS[-1]:
                return f"{value:.0f} {unit}" if value == int(value) else f"{shown:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def others(processes, pid: int):
    """The attached handles other than the inspecting process's own."""
    return [p for p in processes if p.pid != pid]
