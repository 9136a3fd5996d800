"""``shmrdv gc [NAME...] [--unlink-orphans]``: reclaim what dead processes
held in every (or the named) rendezvous; with --unlink-orphans, also remove
segments that no live process has attached (their pending messages go too).
Without names it also removes the files of private rendezvous that older
versions left in /dev/shm, whose creator is gone and that nobody has attached, and the segments of groups whose joining never
completed and whose rank 0 is gone. Other users' segments are never
attached: without names they are passed by (named, status 0); named, they
are an error (status 1)."""
import argparse
import os
import sys

from ..group import sweep_stale_groups
from ..segments import foreign_owner, segment_dir, segment_names, sweep_dead_private, unlink_segment
from ._common import SEGMENT_ERRORS, about, add_dir_argument, attach, others, rendezvous_name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="NAME", type=rendezvous_name,
                        help="rendezvous to collect (default: all)")
    parser.add_argument("--unlink-orphans", action="store_true",
                        help="remove segments no live process has attached, pending messages included")
    add_dir_argument(parser)


def run(args: argparse.Namespace) -> int:
    failed = 0
    if not args.names:
        for name in sweep_dead_private():
            print(f"{name}: private, its creator is gone and nobody has it attached: removed")
    passed_by = []
    names = args.names or segment_names(args.dir)
    if not names:
        print(f"no shmrdv segments in {segment_dir(args.dir)}: nothing to collect")
    for name in names:
        owner = foreign_owner(name, args.dir)
        if owner is not None:
            if not args.names:
                passed_by.append(f"{name} ({owner})")
                continue
            print(f"shmrdv gc: {name}: owned by {owner}, not by this user: only its owner can collect it",
                  file=sys.stderr)
            failed = 1
            continue
        try:
            with attach(name, args.dir) as rdv:
                reclaimed = rdv.collect_garbage()
                live = [p for p in others(rdv.processes(), os.getpid()) if p.alive]
                pending = rdv.stats().pending_messages
        except SEGMENT_ERRORS as exc:
            # One name's failure does not stop the others: told here, status 1 at the end.
            print(f"shmrdv gc: {about(name, exc)}", file=sys.stderr)
            failed = 1
            continue
        # Attaching has already reclaimed the dead it found; count those too.
        line = f"{name}: {len(live)} live process(es) attached; dead reclaimed now: {reclaimed}"
        if args.unlink_orphans and not live:
            try:
                unlink_segment(name, args.dir)
            except SEGMENT_ERRORS as exc:
                print(f"{line}; not removed", flush=True)
                print(f"shmrdv gc: {about(name, exc)}", file=sys.stderr)
                failed = 1
                continue
            line += f"; no live process attached: removed ({pending} pending message(s) dropped)"
        print(line)
    if not args.names:
        for name in sweep_stale_groups():
            print(f"group {name}: never completed and its rank 0 is gone: removed")
    if passed_by:
        print(f"other users' segments, left to their owners: {', '.join(passed_by)}")
    return failed
