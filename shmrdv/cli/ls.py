"""``shmrdv ls [--dir DIR]``: every named rendezvous segment in DIR, its size and use
(live bytes and blocks, free bytes, the largest free block),
and the processes attached to it, alive or dead. Looking attaches, and
attaching reclaims what dead processes held: those show as "dead, reclaimed"."""
import argparse
import os

from ..segments import segment_dir, segment_names, segment_path
from ..units import human_bytes
from ._common import SEGMENT_ERRORS, add_dir_argument, attach, describe, others


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--dir DIR``: lists every DIR/shmrdv-* segment (default: $SHMRDV_DIR, else /dev/shm)."""
    add_dir_argument(parser)


def run(args: argparse.Namespace) -> int:
    names = segment_names(args.dir)
    if not names:
        print(f"no shmrdv segments in {segment_dir(args.dir)}")
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
        who = [f"{p.pid}{'' if p.alive else ' (dead)'}" for p in procs] + [f"{pid} (dead, reclaimed)" for pid in dead]
        print(f"{name:<32} {human_bytes(size):>10} {human_bytes(st.capacity):>10} {human_bytes(st.bytes_used):>10} "
              f"{st.live_blocks:>7} {human_bytes(st.bytes_free):>10} {human_bytes(st.largest_free):>10} "
              f"{st.pending_messages:>8} {st.keys:>6}  {', '.join(who) or 'none'}{'  ABORTED' if st.aborted else ''}"
              f"{'  HUGE PAGES: ' + human_bytes(st.huge_page_bytes) + ' mapped huge' if st.huge_pages else ''}")
    return 0
