"""alloc/recv cost per message at 4 KiB and 64 MiB, in one process.

One message: alloc, write one element, publish (clean exit of the ``with``),
recv, check that element, drop the view. No byte is copied or required to be
touched, so the cost must not depend on the size: the ratio 64 MiB / 4 KiB
should stay near 1.
"""

from __future__ import annotations

from collections.abc import Iterator
from statistics import median

import numpy as np
import pytest

from .harness import MESSAGE_TIMEOUT_S, MiB, format_time, timings

SIZES = {"4KiB": 4096, "64MiB": 64 * MiB}
# Both sizes use arenas of this size, big enough for one 64 MiB message.
ARENA_BYTES = 128 * MiB
# The spec guarantees that one message of the arena size minus a few KiB fits.
ARENA_MARGIN_BYTES = 16 * 1024
ROUNDS = 2000
WARMUP_ROUNDS = 500
KEY = "tensor"


@pytest.fixture(scope="module")
def message_costs(report: list[str]) -> Iterator[dict[str, tuple[float, dict]]]:
    """Median cost per message by size; the 64 MiB / 4 KiB ratio is reported at module end."""
    recorded: dict[str, tuple[float, dict]] = {}
    yield recorded
    if len(recorded) == len(SIZES):
        small, _ = recorded["4KiB"]
        large, info = recorded["64MiB"]
        info["ratio_vs_4KiB"] = large / small
        report.append(
            f"alloc-recv-1proc: 64MiB vs 4KiB per message: {large / small:.2f}x "
            f"({format_time(large)} vs {format_time(small)})"
        )


def _touch_whole_arena(rdv) -> None:
    """Write every page of the arena once, as in a rendezvous that has run a while.

    Otherwise every few 4 KiB messages land on a page never touched before and
    pay a first-touch fault that 64 MiB messages, reusing the same few pages
    for their one written element, do not.
    """
    with rdv.alloc(KEY, (ARENA_BYTES - ARENA_MARGIN_BYTES,), np.uint8) as buffer:
        buffer[...] = 0
    rdv.recv(KEY, timeout=MESSAGE_TIMEOUT_S)


@pytest.mark.benchmark(group="alloc-recv-1proc")
@pytest.mark.parametrize("size", list(SIZES))
def test_alloc_recv(benchmark, shmrdv, single_cpu: int, rdv_name: str, size: str, message_costs: dict) -> None:
    shape = (SIZES[size] // 4,)
    with shmrdv.Rendezvous(rdv_name, create=True, size=ARENA_BYTES) as rdv:
        _touch_whole_arena(rdv)

        def one_message() -> None:
            with rdv.alloc(KEY, shape, np.float32) as buffer:
                buffer[0] = 1.0
            tensor = rdv.recv(KEY, timeout=MESSAGE_TIMEOUT_S)
            if tensor.shape != shape or tensor[0] != 1.0:
                raise AssertionError(f"received {tensor.shape} starting with {tensor[0]}")
            del tensor

        benchmark.pedantic(one_message, rounds=ROUNDS, warmup_rounds=WARMUP_ROUNDS)
        stats = rdv.stats()
        assert stats.pending_messages == 0 and stats.bytes_used == 0
        rdv.unlink()
    data = timings(benchmark)
    if data is not None:
        benchmark.extra_info["median_us"] = median(data) * 1e6
        message_costs[size] = (median(data), benchmark.extra_info)
