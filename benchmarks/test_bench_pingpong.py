"""64-byte round trip between two processes: shmrdv send/recv vs multiprocessing.Pipe.

The parent times one round trip per benchmark round (so pytest-benchmark's
median is the round-trip median) while a spawned child echoes. The child's
loop is bounded by the planned number of round trips and also ends on a stop
sentinel; both processes are pinned the same way for both transports.
"""

from __future__ import annotations

from collections.abc import Iterator
from multiprocessing.connection import Connection
from statistics import median
from types import ModuleType

import numpy as np
import pytest

from .harness import (
    MESSAGE_TIMEOUT_S,
    STARTUP_TIMEOUT_S,
    Children,
    Placement,
    format_time,
    p99,
    planned_calls,
    timings,
    wait_until_ready,
)

PAYLOAD_BYTES = 64
ROUNDS = 2000
WARMUP_ROUNDS = 200
# The first payload byte says whether the child should echo or stop.
ECHO, STOP = 0, 1
# A ping-pong has at most two messages in flight. The arena is small so that
# the warm-up rounds wrap around it (a 64 B message takes about 200 B): every
# page has been touched by both processes before the timed rounds, which would
# otherwise pay a first-touch fault every few round trips.
ARENA_BYTES = 64 * 1024


def _payload(flag: int) -> np.ndarray:
    payload = np.arange(PAYLOAD_BYTES, dtype=np.uint8)
    payload[0] = flag
    return payload


def _expected_messages(benchmark: object) -> int:
    """Messages the child receives: timed round trips, one checked round trip, the stop."""
    return planned_calls(benchmark, ROUNDS, WARMUP_ROUNDS) + 2


@pytest.fixture(scope="module")
def round_trip_times(report: list[str]) -> Iterator[dict[tuple[str, str], tuple[list[float], dict]]]:
    """Round-trip times by (placement, transport); the ratios are reported at module end."""
    recorded: dict[tuple[str, str], tuple[list[float], dict]] = {}
    yield recorded
    for placement in ("apart", "same"):
        if (placement, "shmrdv") not in recorded or (placement, "Pipe") not in recorded:
            continue
        ours, our_info = recorded[placement, "shmrdv"]
        theirs, _ = recorded[placement, "Pipe"]
        median_ratio = median(ours) / median(theirs)
        p99_ratio = p99(ours) / p99(theirs)
        our_info["median_ratio_vs_pipe"] = median_ratio
        our_info["p99_ratio_vs_pipe"] = p99_ratio
        report.append(
            f"pingpong-64B-{placement}: shmrdv median {format_time(median(ours))}, "
            f"p99 {format_time(p99(ours))} | Pipe median {format_time(median(theirs))}, "
            f"p99 {format_time(p99(theirs))} | shmrdv/Pipe median {median_ratio:.3f}x, "
            f"p99 {p99_ratio:.3f}x"
        )


def _record(benchmark, placement: Placement, transport: str, recorded: dict) -> None:
    data = timings(benchmark)
    if data is None:
        return
    benchmark.extra_info["median_us"] = median(data) * 1e6
    benchmark.extra_info["p99_us"] = p99(data) * 1e6
    recorded[placement.name, transport] = (data, benchmark.extra_info)


def _echo_shmrdv(name: str, max_messages: int) -> None:
    import shmrdv

    with shmrdv.Rendezvous(name, create=False) as rdv:
        rdv.send("ready", np.zeros(1, dtype=np.uint8))
        for _ in range(max_messages):
            message = rdv.recv("ping", timeout=MESSAGE_TIMEOUT_S)
            if message[0] == STOP:
                return
            rdv.send("pong", message)
            del message  # give the arena space back before waiting again
    raise RuntimeError(f"no stop sentinel within {max_messages} messages")


def test_pingpong_shmrdv(
    benchmark, shmrdv: ModuleType, placement: Placement, children: Children, rdv_name: str, round_trip_times: dict
) -> None:
    benchmark.group = f"pingpong-64B-{placement.name}"
    with shmrdv.Rendezvous(rdv_name, create=True, size=ARENA_BYTES) as rdv:
        child = children.start(_echo_shmrdv, rdv_name, _expected_messages(benchmark), cpu=placement.child_cpu)
        wait_until_ready(child, lambda timeout: rdv.recv("ready", timeout=timeout))
        ping = _payload(ECHO)

        def round_trip() -> None:
            rdv.send("ping", ping)
            rdv.recv("pong", timeout=MESSAGE_TIMEOUT_S)

        benchmark.pedantic(round_trip, rounds=ROUNDS, warmup_rounds=WARMUP_ROUNDS)

        rdv.send("ping", ping)
        echo = rdv.recv("pong", timeout=MESSAGE_TIMEOUT_S)
        assert echo.dtype == ping.dtype and np.array_equal(echo, ping)
        del echo
        rdv.send("ping", _payload(STOP))
        children.join(child)
        # every view is gone (the child's too), so all arena space must be back
        assert rdv.stats().bytes_used == 0
        rdv.unlink()
    _record(benchmark, placement, "shmrdv", round_trip_times)


def _echo_pipe(connection: Connection, max_messages: int) -> None:
    connection.send_bytes(b"ready")
    for _ in range(max_messages):
        message = connection.recv_bytes()
        if message[0] == STOP:
            return
        connection.send_bytes(message)
    raise RuntimeError(f"no stop sentinel within {max_messages} messages")


def test_pingpong_pipe(benchmark, placement: Placement, children: Children, round_trip_times: dict) -> None:
    benchmark.group = f"pingpong-64B-{placement.name}"
    ours, theirs = children.pipe()
    with ours:
        child = children.start(_echo_pipe, theirs, _expected_messages(benchmark), cpu=placement.child_cpu)
        # Only the child holds its end now: if it dies, our recv_bytes raises EOFError instead of hanging.
        theirs.close()
        assert ours.poll(STARTUP_TIMEOUT_S), "echo child did not start"
        assert ours.recv_bytes() == b"ready"
        ping = _payload(ECHO).tobytes()

        def round_trip() -> None:
            ours.send_bytes(ping)
            ours.recv_bytes()

        benchmark.pedantic(round_trip, rounds=ROUNDS, warmup_rounds=WARMUP_ROUNDS)

        ours.send_bytes(ping)
        assert ours.poll(MESSAGE_TIMEOUT_S) and ours.recv_bytes() == ping
        ours.send_bytes(_payload(STOP).tobytes())
        children.join(child)
    _record(benchmark, placement, "Pipe", round_trip_times)
