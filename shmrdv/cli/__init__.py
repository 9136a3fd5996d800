"""Command line: ``shmrdv COMMAND`` (also ``python -m shmrdv COMMAND``).

Each command lives in its own module of this package, which provides
``add_arguments(parser)`` and ``run(args) -> int``; the entry point imports
only the command it runs.

Errors are told here, once, in one line on stderr: argparse's usage errors
and ``UsageError`` exit with status 2; a runtime error (``CommandError``, a
``RendezvousError``, an ``OSError`` such as a missing segment or file, a
``ValueError``) with status 1. A reader that stops reading (``shmrdv ls |
head -1``) ends the command quietly, with status 141 as if by SIGPIPE."""
import argparse
import importlib
import os
import select
import signal
import sys
from typing import Dict, List, Optional

from ._common import SEGMENT_ERRORS, CommandError, describe

COMMANDS: Dict[str, str] = {
    "demo": "two processes exchange tensors; prints what moved and how fast",
    "ls": "list rendezvous segments: size, use, attached processes (alive or dead)",
    "stat": "one rendezvous in detail: keys, pending bytes, waiters, what each process holds",
    "rm": "remove rendezvous segments (--force: also those live processes use, aborting them)",
    "gc": "reclaim what dead processes held; --unlink-orphans removes segments nobody live uses",
    "bridge": "serve this host's rendezvous to other hosts and forward routed sends to theirs",
    "bench": "shmrdv side by side with multiprocessing, shared_memory, pyzmq and torch: Markdown table, JSON, plot",
}

# Exit status of a command whose stdout was closed under it (128 + SIGPIPE, as a shell reports it).
EXIT_BROKEN_PIPE = 141


def _version() -> str:
    from .. import __version__

    return f"shmrdv {__version__}"


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="shmrdv", description="Tensors between processes through shared memory.")
    parser.add_argument("--version", action="version", version=_version())
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
    try:
        status = int(module.run(args))
        sys.stdout.flush()  # here, where a closed stdout is caught, rather than at exit
        return status
    except BrokenPipeError as exc:
        if not _stdout_closed():
            return _fail(args.command, exc, 1)
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt as exc:  # Ctrl-C, or a signal a command turned into one (KeyboardInterrupt("SIGTERM"))
        signum = getattr(signal.Signals, str(exc), signal.SIGINT) if str(exc).startswith("SIG") else signal.SIGINT
        print(f"shmrdv {args.command}: interrupted ({signum.name})", file=sys.stderr)
        return 128 + signum
    except CommandError as exc:
        return _fail(args.command, exc, exc.status)
    except SEGMENT_ERRORS + (ValueError,) as exc:  # anything else is a bug: its traceback tells it
        return _fail(args.command, exc, 1)


def _fail(command: str, exc: BaseException, status: int) -> int:
    print(f"shmrdv {command}: {describe(exc)}", file=sys.stderr)
    return status


def _stdout_closed() -> bool:
    """Whether stdout is a pipe nobody reads any more (rather than a socket or pipe of the command's own)."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit fails no more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
