"""One-way throughput of float32 arrays between two processes, every transport
side by side, one group per message size (``throughput-<size>``).

A spawned child produces (one per transport, kept for the session), the
pinned parent receives and checks each message's number in its first and last
element. One benchmark round is a batch of messages, so a round's time covers
steady-state pipelining rather than one jittery hand-off. ``np.copyto`` in the
parent alone is the physical limit of the one copy ``send`` makes; shmrdv
``alloc``/``recv`` makes no copy, so its figure is the per-message overhead.
"""

from __future__ import annotations

import math
from statistics import median

import pytest

from shmrdv import bench

from .harness import DISABLED_MAX_BYTES, size_id, timings

pytestmark = pytest.mark.parametrize("placement", ["apart"], indirect=True)


def messages_per_round(nbytes: int) -> int:
    return max(1, min(1000, 4 * bench.MiB // nbytes))


def rounds_for(nbytes: int) -> int:
    return 30 if nbytes <= bench.MiB else 10 if nbytes <= 16 * bench.MiB else 5


def warmup_rounds_for(nbytes: int) -> int:
    """Two rounds, and for 64 KiB and up two passes over the shmrdv arena (every page touched by both ends)."""
    per_round = messages_per_round(nbytes)
    passes = 2 * bench.arena_bytes(nbytes) // nbytes if nbytes >= 64 * bench.KiB else 0
    return max(2, math.ceil(passes / per_round))


@pytest.mark.parametrize("nbytes", bench.SIZES, ids=size_id)
@pytest.mark.parametrize("transport", list(bench.TRANSPORTS))
def test_throughput(benchmark, peers, placement, transport: str, nbytes: int, results: bench.Results) -> None:
    benchmark.group = f"throughput-{size_id(nbytes)}"
    if not benchmark.enabled:
        nbytes = min(nbytes, DISABLED_MAX_BYTES)
    if not bench.TRANSPORTS[transport].measures(nbytes):
        pytest.skip(f"{bench.TRANSPORTS[transport].label} carries messages of at most "
                    f"{bench.TRANSPORTS[transport].max_bytes} bytes")
    peer = peers.get(transport, placement.child_cpu)
    peer.resize(nbytes, prebuild=benchmark.enabled)
    per_round = messages_per_round(nbytes) if benchmark.enabled else 1
    benchmark.pedantic(peer.stream, args=(per_round,), rounds=rounds_for(nbytes), warmup_rounds=warmup_rounds_for(nbytes))
    data = timings(benchmark)
    if data is not None:
        row = bench.throughput_row(transport, placement.name, nbytes, per_round, median(data))
        benchmark.extra_info.update({"GB/s": row["gbps"], "messages/s": row["msgs_per_s"], "messages/round": per_round})
        results.throughput.append(row)
