"""What every command shares: its errors (told in one line by ``main``) and
the argument types that turn bad input into usage errors (exit status 2)."""
import argparse
import re
from typing import Any

import posix_ipc

from .. import _binding
from ..errors import RendezvousError
from ..segments import DIR_ENV, SHM_DIR, arena_size, segment_dir
from ..units import parse_bytes

# The rule Rendezvous applies to a name, checked while parsing the arguments.
_NAME_MAX = int(_binding.lib.RDV_NAME_MAX)
_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,%d}\Z" % _NAME_MAX)


# What attaching to, reading or removing a segment may raise besides bugs: told in one line.
# (posix_ipc's errors, e.g. PermissionsError on another user's segment, are no OSError.)
SEGMENT_ERRORS = (RendezvousError, OSError, posix_ipc.Error)


class CommandError(Exception):
    """A command failed: ``main`` prints ``shmrdv COMMAND: <message>`` on stderr
    and exits with ``status`` (1: a runtime error)."""

    status = 1


class UsageError(CommandError):
    """The arguments cannot work together (exit status 2, like argparse's own errors)."""

    status = 2


def shown_key(name: str) -> str:
    """A key as the commands print it: as it is when printable, else quoted
    with escapes (a key is any string: one of control characters must not
    drive the terminal); shmrdv's own keys, which start with ESC so that no
    key of a user's is one, named as such."""
    if name[:1] == "\x1b" and name[1:].isprintable():
        return f"{name[1:]} (shmrdv's own)"
    return name if name.isprintable() else repr(name)


def rendezvous_name(text: str) -> str:
    """argparse type of a rendezvous name: what Rendezvous accepts, or a usage error."""
    if not _NAME_RE.match(text):
        raise argparse.ArgumentTypeError(
            f"invalid rendezvous name {text!r}: 1..{_NAME_MAX} characters of A-Z a-z 0-9 . _ -")
    return text


def add_dir_argument(parser: argparse.ArgumentParser) -> None:
    """``--dir DIR``: the directory of named rendezvous' files, as ``dir=``
    names it (default: $SHMRDV_DIR, else /dev/shm); ``args.dir`` is it, absolute."""
    parser.add_argument("--dir", type=_directory, default=None, metavar="DIR",
                        help=f"the directory of named rendezvous' files (default: ${DIR_ENV}, else {SHM_DIR})")


def attach(name: str, dir: "str | None") -> "Any":
    """``Rendezvous(name, create=False)``: a named one in ``dir`` (see
    add_dir_argument), a private one (a memfd, in no directory) wherever it is."""
    from ..rendezvous import Rendezvous
    from ..segments import private_pid

    return Rendezvous(name, create=False, dir=None if private_pid(name) is not None else dir)


def _directory(text: str) -> str:
    try:
        return segment_dir(text)
    except (ValueError, RendezvousError) as exc:  # InvalidArgument is both
        raise argparse.ArgumentTypeError(str(exc).replace("dir ", "--dir ")) from None


def positive_int(text: str) -> int:
    """argparse type of a count or size that must be at least 1."""
    return _int_at_least(text, 1)


def count(text: str) -> int:
    """argparse type of a count that may be 0."""
    return _int_at_least(text, 0)


def arena_bytes(text: str) -> int:
    """argparse type of an arena size: bytes, or with a unit ("64MiB", "1G"),
    a multiple of 4096 up to shmrdv.MAX_SIZE."""
    try:
        return arena_size(parse_bytes(text), "size")
    except (ValueError, RendezvousError) as exc:  # InvalidArgument is both
        raise argparse.ArgumentTypeError(str(exc).replace("size=", "--size ")) from None


def seconds_or_zero(text: str) -> float:
    """argparse type of a wait that may be 0: a finite number of seconds, at least 0."""
    value = _number(text)
    if not 0 <= value < 1e9:
        raise argparse.ArgumentTypeError(f"must be at least 0 and less than 1e9 seconds, got {text}")
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None


def seconds(text: str) -> float:
    """argparse type of a timeout: a positive, finite number of seconds."""
    value = _number(text)
    if not 0 < value < 1e9:
        raise argparse.ArgumentTypeError(f"must be more than 0 and less than 1e9 seconds, got {text}")
    return value


def _int_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def describe(exc: BaseException) -> str:
    """One line for an error: an OSError as its reason and file, anything else as its message."""
    if isinstance(exc, OSError) and exc.strerror:
        names = [repr(n) if isinstance(n, str) else str(n) for n in (exc.filename, exc.filename2) if n is not None]
        return f"{exc.strerror}: {' -> '.join(names)}" if names else exc.strerror
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def about(name: str, exc: BaseException) -> str:
    """`describe(exc)`, prefixed with the rendezvous name unless it already names it."""
    text = describe(exc)
    return text if repr(name) in text or f" {name}" in text else f"{name}: {text}"


# Creating more than this shows progress on stderr: it takes seconds (the pages are reserved
# and faulted in at creation, so that a full /dev/shm fails then and never later).
PROGRESS_ABOVE = 1 << 30


def open_showing_progress(name: str, size: "int | None", stream: "Any" = None, dir: "str | None" = None) -> "Any":
    """``Rendezvous(name, size=size, dir=dir)``, telling on stderr how far creating it has got
    when that creates a segment of more than PROGRESS_ABOVE bytes."""
    import os
    import sys
    import threading

    from ..rendezvous import Rendezvous
    from ..segments import segment_path
    from ..units import human_bytes

    stream = sys.stderr if stream is None else stream
    path = segment_path(name, dir)
    if size is None or size <= PROGRESS_ABOVE or os.path.exists(path):
        return Rendezvous(name, size=size, dir=dir)
    done = threading.Event()

    def report() -> None:
        while not done.wait(0.5):
            try:
                reserved = os.stat(path).st_blocks * 512
            except OSError:
                continue
            step = "reserving" if reserved < size else "mapping"
            stream.write(f"creating rendezvous {name!r}: {step}, {human_bytes(min(reserved, size))} of {human_bytes(size)}\n")
            stream.flush()

    reporter = threading.Thread(target=report, name="shmrdv-progress", daemon=True)
    reporter.start()
    try:
        rdv = Rendezvous(name, size=size, dir=dir)
    finally:
        done.set()
        reporter.join()
    stream.write(f"created rendezvous {name!r}: {human_bytes(size)}\n")
    return rdv


def pages_text(st: Any) -> str:
    """How a segment's pages are backed, for ``shmrdv stat``."""
    from ..units import human_bytes

    touch = "" if st.prefault else "; each faulted in by its first touch (prefault=False)"
    if not st.huge_pages:
        return "4 KiB (created without huge_pages)" + touch
    return (f"huge pages asked for (huge_pages=True): {human_bytes(st.huge_page_bytes)} of this process's mapping "
            f"is on huge pages{touch}")


def others(processes: Any, pid: int) -> Any:
    """The attached handles other than the inspecting process's own."""
    return [p for p in processes if p.pid != pid]
