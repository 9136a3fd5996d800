"""Sizes, timeouts and the size formats every part of the benchmark shares."""

from __future__ import annotations
import argparse
import numpy as np

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
# Stamps are float32: exact integers up to 2**24.
_STAMP_MODULO = 1 << 24

DATA_DTYPE = np.float32


def arena_bytes(nbytes: int) -> int:
    """Arena of the shmrdv rendezvous used for messages of `nbytes` (default size, or 4 messages)."""
    return max(64 * MiB, 4 * nbytes)


def human_size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:g} {unit}"
        nbytes //= 1024
    raise AssertionError("unreachable")


def parse_size(text: str) -> int:
    units = {"b": 1, "kib": KiB, "k": KiB, "mib": MiB, "m": MiB, "gib": 1024 * MiB, "g": 1024 * MiB}
    text = text.strip().lower().replace(" ", "")
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit) and text[: -len(unit)].isdigit():
            return int(text[: -len(unit)]) * units[unit]
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 64B, 4KiB, 16MiB)")
