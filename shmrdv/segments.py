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
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def others(processes, pid: int):
    """The attached handles other than the inspecting process's own."""
    return [p for p in processes if p.pid != pid]
