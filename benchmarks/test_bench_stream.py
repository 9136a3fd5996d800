"""One-way streaming of 16 MiB float32 arrays, in GB/s.

- shmrdv send/recv: a producer child sends; the parent recv's, checks the first
  and last element (message number, so order and both ends are checked) and
  drops the view. One copy, made by the producer.
- shmrdv alloc/recv: the producer only writes the first and last element into
  the alloc buffer; this is the zero-copy path, so its figure is the message
  overhead, not a copy rate.
- np.copyto in one process into preallocated destinations (as many as messages
  fit the arena, used in turn): the physical limit of the one copy send/recv
  has to make, with the same memory footprint.

A benchmark round is a batch of MESSAGES_PER_ROUND messages, so one round's time
covers steady-state pipelining rather than a single, jittery hand-off.
The producer runs on the other CPU ("apart"); np.copyto runs on the parent's CPU.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from statistics import median
from types import ModuleType

import numpy as np
import pytest

from .harness import (
    MESSAGE_TIMEOUT_S,
    Children,
    MiB,
    Placement,
    planned_calls,
    timings,
    wait_until_ready,
)

MESSAGE_SHAPE = (4 * MiB,)  # float32: 16 MiB
MESSAGE_BYTES = MESSAGE_SHAPE[0] * 4
MESSAGES_PER_ROUND = 4
ROUNDS = 150
# Warm-up spans several passes over the arena, so every page of it has been
# touched (by the producer and mapped by the parent) before timing starts.
WARMUP_ROUNDS = 6
ARENA_BYTES = 64 * MiB
KEY = "stream"
READY_KEY = "ready"

pytestmark = [
    pytest.mark.benchmark(group="stream-16MiB"),
    pytest.mark.parametrize("placement", ["apart"], indirect=True),
]


@dataclass
class _Throughput:
    median_gbps: float
    best_gbps: float
    info: dict


@pytest.fixture(scope="module")
def throughputs(report: list[str]) -> Iterator[dict[str, _Throughput]]:
    """GB/s by transport; the ratios to np.copyto are reported at module end."""
    recorded: dict[str, _Throughput] = {}
    yield recorded
    if "np.copyto" not in recorded:
        return
    limit = recorded["np.copyto"]
    for transport in ("send/recv", "alloc/recv"):
        if transport in recorded:
            ours = recorded[transport]
            ratio = ours.median_gbps / limit.median_gbps
            best_ratio = ours.best_gbps / limit.best_gbps
            ours.info["median_ratio_vs_copyto"] = ratio
            ours.info["best_ratio_vs_copyto"] = best_ratio
            report.append(
                f"stream-16MiB: {transport} vs np.copyto: {ratio:.2f}x "
                f"({ours.median_gbps:.2f} vs {limit.median_gbps:.2f} GB/s median; "
                f"best rounds {best_ratio:.2f}x: {ours.best_gbps:.2f} vs {limit.best_gbps:.2f} GB/s)"
            )


def _record(benchmark, transport: str, recorded: dict) -> None:
    data = timings(benchmark)
    if data is None:
        return
    round_bytes = MESSAGES_PER_ROUND * MESSAGE_BYTES
    figures = _Throughput(round_bytes / median(data) / 1e9, round_bytes / min(data) / 1e9, benchmark.extra_info)
    benchmark.extra_info["GB/s (median)"] = figures.median_gbps
    benchmark.extra_info["GB/s (best)"] = figures.best_gbps
    recorded[transport] = figures


def _produce_by_send(name: str, messages: int) -> None:
    import shmrdv

    with shmrdv.Rendezvous(name, create=False) as rdv:
        source = np.ones(MESSAGE_SHAPE, dtype=np.float32)
        rdv.send(READY_KEY, np.zeros(1, dtype=np.uint8))
        for number in range(messages):
            source[0] = source[-1] = number
            rdv.send(KEY, source, timeout=MESSAGE_TIMEOUT_S)


def _produce_by_alloc(name: str, messages: int) -> None:
    import shmrdv

    with shmrdv.Rendezvous(name, create=False) as rdv:
        rdv.send(READY_KEY, np.zeros(1, dtype=np.uint8))
        for number in range(messages):
            with rdv.alloc(KEY, MESSAGE_SHAPE, np.float32) as buffer:
                buffer[0] = buffer[-1] = number


def _stream_from(producer, benchmark, shmrdv: ModuleType, placement: Placement, children: Children, name: str) -> None:
    messages = planned_calls(benchmark, ROUNDS, WARMUP_ROUNDS) * MESSAGES_PER_ROUND
    with shmrdv.Rendezvous(name, create=True, size=ARENA_BYTES) as rdv:
        child = children.start(producer, name, messages, cpu=placement.child_cpu)
        wait_until_ready(child, lambda timeout: rdv.recv(READY_KEY, timeout=timeout))
        expected = itertools.count()

        def receive_round() -> None:
            for _ in range(MESSAGES_PER_ROUND):
                number = next(expected)
                tensor = rdv.recv(KEY, timeout=MESSAGE_TIMEOUT_S)
                if tensor[0] != number or tensor[-1] != number:
                    raise AssertionError(f"message {number}: got first {tensor[0]}, last {tensor[-1]}")
                del tensor

        benchmark.pedantic(receive_round, rounds=ROUNDS, warmup_rounds=WARMUP_ROUNDS)
        children.join(child)
        assert next(expected) == messages
        assert rdv.try_recv(KEY) is None
        # every view is gone, so all arena space must be back
        assert rdv.stats().bytes_used == 0
        rdv.unlink()


def test_stream_send_recv(benchmark, shmrdv, placement, children, rdv_name, throughputs) -> None:
    _stream_from(_produce_by_send, benchmark, shmrdv, placement, children, rdv_name)
    _record(benchmark, "send/recv", throughputs)


def test_stream_alloc_recv(benchmark, shmrdv, placement, children, rdv_name, throughputs) -> None:
    _stream_from(_produce_by_alloc, benchmark, shmrdv, placement, children, rdv_name)
    _record(benchmark, "alloc/recv", throughputs)


def test_stream_copyto(benchmark, placement, throughputs) -> None:
    source = np.ones(MESSAGE_SHAPE, dtype=np.float32)
    # As many preallocated destinations as messages fit the shmrdv arena, used
    # in turn like its ring, so both move the same memory footprint: a single
    # 16 MiB destination plus its source can stay in the 32 MiB L3 of the
    # development VMs and set a limit no 64 MiB arena can reach.
    destinations = [np.empty_like(source) for _ in range(ARENA_BYTES // MESSAGE_BYTES)]
    for destination in destinations:
        destination[...] = 0  # touch every page now, not inside the timing
    numbers = itertools.count()
    turns = itertools.cycle(destinations)

    def copy_round() -> None:
        for _ in range(MESSAGES_PER_ROUND):
            source[0] = source[-1] = next(numbers)
            np.copyto(next(turns), source)

    benchmark.pedantic(copy_round, rounds=ROUNDS, warmup_rounds=WARMUP_ROUNDS)
    assert any(destination[-1] == source[-1] for destination in destinations)
    _record(benchmark, "np.copyto", throughputs)
