"""Command line: ``shmrdv demo`` (also ``python -m shmrdv demo``)."""
import argparse
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="shmrdv", description="Tensors between processes through shared memory.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="two processes exchange tensors; prints what moved and how fast")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import main as demo

        return demo()
    return 2


if __name__ == "__main__":
    sys.exit(main())
