"""pytest-only helpers of the benchmarks.

The transports, child processes, CPU pinning and measurement loops are in
``shmrdv.bench``, shared with the ``shmrdv bench`` command; what is here
bridges them to pytest-benchmark.
"""

from __future__ import annotations

from typing import Any

import pytest

from shmrdv.bench import MESSAGE_TIMEOUT_S, MiB, human_size  # noqa: F401  (re-exported for the benchmark modules)


def planned_calls(benchmark: Any, rounds: int, warmup_rounds: int) -> int:
    """How many times `benchmark.pedantic` will call its target.

    A child that answers the parent must know this count to end by itself:
    rounds + warmup rounds when benchmarking, a single call under
    ``--benchmark-disable``.
    """
    if not benchmark.enabled:
        return 1
    if benchmark.cprofile:
        pytest.skip("--benchmark-cprofile calls the target again; the child cannot expect it")
    return rounds + warmup_rounds


def timings(benchmark: Any) -> list[float] | None:
    """Per-round times in seconds, or None when benchmarks are disabled."""
    if not benchmark.enabled or not benchmark.stats:
        return None
    return list(benchmark.stats.stats.data)


# Under --benchmark-disable each body runs once, at most at this size (and with
# at most this many pending keys): the same code, without gigabytes to build.
DISABLED_MAX_BYTES = 1 << 20
DISABLED_MAX_PENDING_KEYS = 1000


def format_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    return f"{seconds * 1e3:.2f} ms"


def size_id(nbytes: int) -> str:
    """A test id for a message size: 64B, 4KiB, 16MiB."""
    return human_size(nbytes).replace(" ", "")
