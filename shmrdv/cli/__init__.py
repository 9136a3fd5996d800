"""Command line: ``shmrdv COMMAND`` (also ``python -m shmrdv COMMAND``).

Each command lives in its own module of this package, which provides
``add_arguments(parser)`` and ``run(args) -> int``; the entry point imports
only the command it runs."""
import argparse
import importlib
import sys
from typing import Dict, List, Optional

COMMANDS: Dict[str, str] = {
    "demo": "two processes exchange tensors; prints what moved and how fast",
    "ls": "list rendezvous segments: size, use, attached processes (alive or dead)",
    "stat": "one rendezvous in detail: keys, pending bytes, waiters, what each process holds",
    "rm": "remove rendezvous segments",
    "gc": "reclaim what dead processes held; --unlink-orphans removes segments nobody live uses",
    "bridge": "serve this host's rendezvous to other hosts and forward routed sends to theirs",
    "bench": "shmrdv side by side with multiprocessing, shared_memory, pyzmq and torch: Markdown table, JSON, plot",
}


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="shmrdv", description="Tensors between processes through shared memory.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    module = None
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = importlib.import_module(f"{__name__}.{name}")
            module.add_arguments(p)
    args = parser.parse_args(argv)
    assert module is not None
    return int(module.run(args))
