"""Sizes, timeouts and the size formats every part of the benchmark shares."""

from __future__ import annotations
import argparse
import json
from typing import Any, Callable, Dict
import numpy as np

from ..limits import MAX_ARENA_BYTES
from ..units import human_bytes, parse_bytes

KiB = 1024
MiB = 1024 * KiB
SIZES = [64, 4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
ROUND_TRIP_SIZES = [64, 4 * KiB]

# How long a benchmark waits for one message (or for space) before calling its peer dead.
MESSAGE_TIMEOUT_S = 30.0
# Spawning a child imports numpy (and torch for its transport): allow for a slow, busy machine.
STARTUP_TIMEOUT_S = 60.0
JOIN_TIMEOUT_S = 30.0
CLEANUP_GRACE_S = 5.0
# A child that outlives this is killed by its own SIGALRM, even when the parent is stuck.
CHILD_LIFETIME_S = 900

# Messages a transport may have in flight (Queue maxsize, zmq high-water marks,
# slots of the hand-rolled ring in each direction).
DEPTH = 8
# Source arrays a producer cycles through: more than DEPTH can hold, so none is
# rewritten while a transport may still read it.
POOL = DEPTH + 3
# Batched transports (send_many, put_many) send this many messages per call;
# their consumers take up to BATCH_MAX per call.
BATCH = 64
BATCH_MAX = 256
BATCH_BYTES = 16 * 1024 * 1024  # at most this much per batch: fewer, larger messages per call
# Stamps are float32: exact integers up to 2**24.
_STAMP_MODULO = 1 << 24

DATA_DTYPE = np.float32


# Rendezvous(size=...) takes whole pages of this many bytes.
SIZE_ALIGN = 4096


def whole_pages(nbytes: int) -> int:
    """`nbytes` rounded up to a size a rendezvous takes (a multiple of SIZE_ALIGN)."""
    return -(-nbytes // SIZE_ALIGN) * SIZE_ALIGN


def arena_bytes(nbytes: int) -> int:
    """Arena of the shmrdv rendezvous used for messages of `nbytes` (default size, or 4 messages)."""
    return max(64 * MiB, 4 * nbytes)


# The largest message size measured: one whose arena (4 messages) a rendezvous can have.
MAX_MESSAGE_BYTES = MAX_ARENA_BYTES // 4 // SIZE_ALIGN * SIZE_ALIGN


# The one byte format of the command line; "human_size" is its name here and in benchmarks/.
human_size = human_bytes


def parse_size(text: str) -> int:
    """A message size: a whole number of bytes, or of one of B, K, KiB, M, MiB, G, GiB
    (case-insensitive; K and KiB are both 1024 bytes): "64", "64B", "4k", "16MiB".
    It must be a positive multiple of the arrays' element size (float32: 4 bytes).
    Anything else is an argparse.ArgumentTypeError telling what is accepted."""
    try:
        nbytes = parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    item = np.dtype(DATA_DTYPE).itemsize
    if nbytes <= 0 or nbytes % item:
        raise argparse.ArgumentTypeError(
            f"size {text.strip()!r} is {nbytes} bytes: messages are {np.dtype(DATA_DTYPE).name} arrays, "
            f"so a size must be a positive multiple of {item} bytes")
    if nbytes > MAX_MESSAGE_BYTES:
        raise argparse.ArgumentTypeError(
            f"size {text.strip()!r} is more than the bench measures: at most {MAX_MESSAGE_BYTES:,} bytes (its "
            f"rendezvous holds 4 messages, and a rendezvous's arena at most {MAX_ARENA_BYTES:,} bytes)")
    return nbytes


def write_outputs(results: Dict[str, Any], args: argparse.Namespace, plot: Callable[[Dict[str, Any], str], None]) -> None:
    """What --json and --plot ask for, from a command's results."""
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)
    if args.plot:
        plot(results, args.plot)
