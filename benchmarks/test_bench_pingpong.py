"""Round trips of 64 B and 4 KiB float32 arrays between two processes, every
transport that can echo, side by side: groups ``pingpong-<size>-<placement>``.

The pinned parent times one round trip per benchmark round (so the median is
the round-trip median) while the transport's child echoes exactly the planned
number of messages; each echo is checked (its number in the first and last
element). "apart": the two processes on different CPUs; "same": on one.
"""

from __future__ import annotations

import itertools
from statistics import median

import numpy as np
import pytest

from shmrdv import bench

from .harness import planned_calls, size_id, timings

ROUNDS = 1000
WARMUP_ROUNDS = 100


@pytest.mark.parametrize("nbytes", bench.ROUND_TRIP_SIZES, ids=size_id)
@pytest.mark.parametrize("transport", [name for name, t in bench.TRANSPORTS.items() if t.round_trip])
def test_pingpong(benchmark, peers, placement, transport: str, nbytes: int, results: bench.Results) -> None:
    benchmark.group = f"pingpong-{size_id(nbytes)}-{placement.name}"
    peer = peers.get(transport, placement.child_cpu)
    peer.resize(nbytes)
    payload = np.zeros(nbytes // 4, dtype=bench.DATA_DTYPE)
    numbers = itertools.count()
    peer.start_echo(planned_calls(benchmark, ROUNDS, WARMUP_ROUNDS))

    def round_trip() -> None:
        number = next(numbers)
        bench.stamp(payload, number)
        bench.check(peer.ping(payload), number, nbytes)

    benchmark.pedantic(round_trip, rounds=ROUNDS, warmup_rounds=WARMUP_ROUNDS)
    data = timings(benchmark)
    if data is not None:
        row = bench.round_trip_row(transport, placement.name, nbytes, data)
        benchmark.extra_info.update({"median_us": median(data) * 1e6, "p99_us": row["p99_us"]})
        results.round_trip.append(row)
