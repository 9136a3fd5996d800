"""``shmrdv rm NAME...``: remove rendezvous segments. Processes still attached
keep their mapping until they close; nothing is left in /dev/shm after."""
import argparse
import os

from ..rendezvous import unlink_segment
from ..segments import segment_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="+", metavar="NAME", help="rendezvous to remove")


def run(args: argparse.Namespace) -> int:
    failed = 0
    for name in args.names:
        if not os.path.exists(segment_path(name)):
            print(f"{name}: no such rendezvous")
            failed = 1
            continue
        unlink_segment(name)
        print(f"{name}: removed")
    return failed
