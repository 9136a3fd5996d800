"""``shmrdv ls [--dir DIR]``: every named rendezvous segment in DIR, and
every private rendezvous (a memfd) of this user's processes, its size and use
(live bytes and blocks, free bytes, the largest free block),
and the processes attached to it, alive or dead. Looking attaches, and
attaching reclaims what dead processes held: those show as "dead, reclaimed"."""
import argparse
import os
from typing import Any

from ..segments import private_holders, private_pid, segment_dir, segment_names, segment_path
from ..units import human_bytes
from ._common import SEGMENT_ERRORS, add_dir_argument, attach, describe, others


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--dir DIR``: lists every DIR/shmrdv-* segment (default: $SHMRDV_DIR, else /dev/shm), then the private ones."""
    add_dir_argument(parser)


def run(args: argparse.Namespace) -> int:
    names = segment_names(args.dir)
    private = private_holders()
    if not names:
        print(f"no shmrdv segments in {segment_dir(args.dir)}")
    if not names and not private:
        return 0
    print(f"{'NAME':<32} {'FILE':>10} {'ARENA':>10} {'LIVE':>10} {'BLOCKS':>7} {'FREE':>10} {'LARGEST':>10} "
          f"{'PENDING':>8} {'KEYS':>6}  PROCESSES")
    for name in names:
        try:
            size = os.path.getsize(segment_path(name, args.dir))
            with attach(name, args.dir) as rdv:
                st, procs, dead = rdv.stats(), others(rdv.processes(), os.getpid()), rdv.reclaimed_pids()
        except SEGMENT_ERRORS as exc:
            print(f"{name:<32} unreadable: {describe(exc)}")
            continue
        _show(name, size, st, procs, dead)
    for name, pids in private.items():
        # In memory (a memfd), not in the directory: attachable while its creator offers it.
        pid = private_pid(name)
        try:
            with attach(name, None) as rdv:
                st, procs, dead = rdv.stats(), others(rdv.processes(), os.getpid()), rdv.reclaimed_pids()
                size = _memory_bytes(name)  # through our handle's own descriptor of it
        except FileNotFoundError:
            print(f"{name:<32} private, closed by its creator (process {pid}): still held by "
                  f"{', '.join(str(p) for p in pids)}, freed when they end")
            continue
        except SEGMENT_ERRORS as exc:
            print(f"{name:<32} private, unreadable: {describe(exc)}")
            continue
        _show(name, size, st, procs, dead, f"  PRIVATE (memory of process {pid})")
    return 0


def _memory_bytes(name: str) -> int:
    """The size of private rendezvous name's memory, through this process's own descriptor of it."""
    for entry in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{entry}") == f"/memfd:shmrdv-{name} (deleted)":
                return os.stat(f"/proc/self/fd/{entry}").st_size
        except OSError:
            continue
    return 0


def _show(name: str, size: int, st: Any, procs: Any, dead: Any, note: str = "") -> None:
    who = [f"{p.pid}{'' if p.alive else ' (dead)'}" for p in procs] + [f"{pid} (dead, reclaimed)" for pid in dead]
    print(f"{name:<32} {human_bytes(size):>10} {human_bytes(st.capacity):>10} {human_bytes(st.bytes_used):>10} "
          f"{st.live_blocks:>7} {human_bytes(st.bytes_free):>10} {human_bytes(st.largest_free):>10} "
          f"{st.pending_messages:>8} {st.keys:>6}  {', '.join(who) or 'none'}{'  ABORTED' if st.aborted else ''}"
          f"{'  HUGE PAGES: ' + human_bytes(st.huge_page_bytes) + ' mapped huge' if st.huge_pages else ''}{note}")
