"""``shmrdv rm [--force] [--group] NAME...``: remove rendezvous segments
(with ``--group``, the segments of groups: see ``_remove_groups``).

A segment that live processes have attached is left alone (status 1, naming
them) unless ``--force``: then the rendezvous is aborted first, so that every
process waiting in it wakes with ``Aborted("removed by shmrdv rm --force")``
rather than waiting on a segment nobody can reach any more, and then removed.
Processes still attached keep their mapping until they close; nothing is left
in the directory after (``--dir``, default $SHMRDV_DIR, else /dev/shm). A
private rendezvous is no file: it goes when the handle that created it closes. A segment that cannot be attached (damaged, or of another
layout version) is removed without asking. Another user's segment is never
attached: only root may remove it, and only once no live process has it
attached (with ``--force``, also when one has: its waits are not woken)."""
import argparse
import os
import sys
from typing import List, Optional

from ..group import remove_group
from ..segments import foreign_owner, private_pid, segment_in_use, segment_path, unlink_segment
from ._common import SEGMENT_ERRORS, about, add_dir_argument, attach, others, rendezvous_name

ABORT_REASON = "removed by shmrdv rm --force"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="+", metavar="NAME", type=rendezvous_name, help="rendezvous to remove")
    parser.add_argument("--force", action="store_true",
                        help="also remove segments live processes use: abort the rendezvous first (their waits "
                             "raise Aborted), then remove it")
    parser.add_argument("--group", action="store_true",
                        help="the names are groups' (shmrdv.Group): remove /dev/shm/shmrdv.group-NAME, which a "
                             "group has while it joins, or a job killed while joining leaves")
    add_dir_argument(parser)


def _live_pids(name: str, dir: Optional[str], force: bool) -> Optional[List[int]]:
    """The live processes attached to `name` (aborting it with --force), or None if it cannot be attached."""
    try:
        with attach(name, dir) as rdv:
            live = [p.pid for p in others(rdv.processes(), os.getpid()) if p.alive]
            if live and force:
                rdv.abort(ABORT_REASON)
            return live
    except FileNotFoundError:
        raise
    except SEGMENT_ERRORS as exc:
        print(f"shmrdv rm: {about(name, exc)}; removing it anyway", file=sys.stderr)
        return None


def _remove_foreign(name: str, dir: Optional[str], owner: str, force: bool) -> bool:
    """Remove another user's segment without attaching to it; whether it was removed."""
    if os.geteuid() != 0:
        print(f"shmrdv rm: {name}: owned by {owner}, not by this user: only its owner or root can remove it",
              file=sys.stderr)
        return False
    try:
        in_use = segment_in_use(name, dir)
        if in_use and not force:
            print(f"shmrdv rm: {name}: owned by {owner} and in use by live process(es); not removed (--force "
                  f"removes it, but cannot wake their waits: another user's segment is never attached)",
                  file=sys.stderr)
            return False
        unlink_segment(name, dir)
    except SEGMENT_ERRORS as exc:
        print(f"shmrdv rm: {about(name, exc)}", file=sys.stderr)
        return False
    print(f"{name}: owned by {owner}: removed" + (" (still in use: its processes were not aborted)" if in_use else ""))
    return True


def _remove_groups(names: List[str], force: bool) -> int:
    """``--group``: remove group segments. One whose join is under way (its
    rank 0 alive) is left alone (status 1, naming it) unless ``--force``:
    its join is then refused first (every member raises Aborted "removed by
    shmrdv rm --force"). Whatever else is at the name (left by a killed job,
    of another mode, a symbolic link) is removed."""
    failed = 0
    for name in names:
        try:
            live = remove_group(name, force)
        except SEGMENT_ERRORS as exc:
            print(f"shmrdv rm: {about(name, exc)}", file=sys.stderr)
            failed = 1
            continue
        pids = ", ".join(str(pid) for pid in live)
        if live and not force:
            print(f"shmrdv rm: group {name}: joining, its rank 0 is live process {pids}; not removed (--force "
                  f"refuses its join and removes it)", file=sys.stderr)
            failed = 1
            continue
        print(f"group {name}: removed" + (f" (its join refused first: rank 0 is live process {pids})" if live else ""))
    return failed


def run(args: argparse.Namespace) -> int:
    if args.group:
        return _remove_groups(args.names, args.force)
    failed = 0
    for name in args.names:
        if private_pid(name) is not None:
            print(f"shmrdv rm: {name}: a private rendezvous is in memory, not in a file: it is removed when the "
                  f"handle that created it closes, or its process ends", file=sys.stderr)
            failed = 1
            continue
        owner = foreign_owner(name, args.dir)
        if owner is not None:
            failed |= not _remove_foreign(name, args.dir, owner, args.force)
            continue
        try:
            if not os.path.exists(segment_path(name, args.dir)):
                raise FileNotFoundError(2, "no such rendezvous", name)
            live = _live_pids(name, args.dir, args.force)
        except FileNotFoundError as exc:
            print(f"shmrdv rm: {about(name, exc)}", file=sys.stderr)
            failed = 1
            continue
        pids = ", ".join(str(pid) for pid in sorted(set(live or ())))
        if live and not args.force:
            print(f"shmrdv rm: {name}: in use by live process(es) {pids}; not removed "
                  f"(--force aborts their waits and removes it)", file=sys.stderr)
            failed = 1
            continue
        try:
            unlink_segment(name, args.dir)
        except SEGMENT_ERRORS as exc:
            print(f"shmrdv rm: {about(name, exc)}", file=sys.stderr)
            failed = 1
            continue
        print(f"{name}: removed" + (f" (aborted first: live process(es) {pids})" if live else ""))
    return failed
