"""Opening a big rendezvous: creating a 4 GiB one, and attaching to it, against
the floor of any shared-memory segment of the same size: a bare
``posix_fallocate`` of a /dev/shm file plus the first touch of every page.

Creating reserves every page of the file (so a full /dev/shm fails there,
never later with SIGBUS) and faults them in (so the first messages do not pay
a fault per page); the header, process table, key index and side table are
left as the zeros tmpfs gives and only a few words are written. The target:
creation within 2x of the floor. Under ``--benchmark-disable`` each body runs
once at 16 MiB.
"""

from __future__ import annotations

import mmap
import os
import time
from statistics import median

import numpy as np
import pytest

from shmrdv import bench

from .harness import MiB

GiB = 1024 * MiB
SIZE_ENABLED = 4 * GiB
SIZE_DISABLED = 16 * MiB
ROUNDS = 3
PAGE = 4096


def segment_bytes(arena: int) -> int:
    """The file size of a rendezvous with this arena and the default max_keys
    (the plan in csrc/rdv_segment.c), checked against the real file below."""
    max_keys = max(1024, min(arena // PAGE, 1 << 20))
    slots = 64
    while slots < 2 * max_keys:
        slots *= 2
    up = lambda n: -(-n // PAGE) * PAGE  # noqa: E731
    return 2 * PAGE + 128 * 256 + up(slots * 64) + up(arena // 64 * 4) + arena + 128 * PAGE  # home slabs last


def bare_segment(path: str, nbytes: int) -> float:
    """Seconds to fallocate a /dev/shm file of nbytes, map it and touch each page once."""
    begin = time.perf_counter()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, nbytes)
        os.posix_fallocate(fd, 0, nbytes)
        with mmap.mmap(fd, nbytes) as mapping:
            pages = np.frombuffer(mapping, np.uint8)
            pages[::PAGE] = 1
            elapsed = time.perf_counter() - begin
            del pages
    finally:
        os.close(fd)
        os.unlink(path)
    return elapsed


@pytest.mark.benchmark(group="open-big")
@pytest.mark.timeout(900)
def test_create_big_rendezvous(benchmark, shmrdv, single_cpu: int, rdv_name: str, report: list[str]) -> None:
    """Rendezvous(size=4 GiB, create=True) against fallocate + first touch of its file's size, interleaved."""
    arena = SIZE_ENABLED if benchmark.enabled else SIZE_DISABLED
    nbytes = segment_bytes(arena)
    bare_path = f"/dev/shm/shmrdv-{rdv_name}-bare"
    path = f"/dev/shm/shmrdv-{rdv_name}"
    bare: list[float] = []
    create: list[float] = []
    attach: list[float] = []

    def floor_first() -> None:  # untimed by pytest-benchmark: the floor, measured just before each creation
        bare.append(bare_segment(bare_path, nbytes))

    def create_one() -> None:
        begin = time.perf_counter()
        rdv = shmrdv.Rendezvous(rdv_name, size=arena, create=True)
        create.append(time.perf_counter() - begin)
        try:
            assert os.path.getsize(path) == nbytes
            begin = time.perf_counter()
            other = shmrdv.Rendezvous(rdv_name, create=False)  # a second handle: maps and faults it in again
            attach.append(time.perf_counter() - begin)
            other.close()
        finally:
            rdv.close()
            rdv.unlink()

    benchmark.pedantic(create_one, setup=floor_first, rounds=ROUNDS if benchmark.enabled else 1)
    ratio = median(create) / median(bare)
    benchmark.extra_info.update({"segment_bytes": nbytes, "create_s": median(create), "attach_s": median(attach),
                                 "fallocate_touch_s": median(bare), "ratio_create_vs_floor": ratio})
    report.append(
        f"open-big: Rendezvous(size={bench.human_size(arena)}) ({nbytes:,} B file): create {median(create):.3f} s, "
        f"attach {median(attach):.3f} s; fallocate + first touch of as many bytes {median(bare):.3f} s; "
        f"create / floor {ratio:.2f}x (target <= 2x; medians of {len(create)})")
