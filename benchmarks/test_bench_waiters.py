"""Receivers in line, at scale: cancelling N pending ``recv_async`` futures
of one key, and ``close()`` with N pending, against cancelling N plain
``concurrent.futures.Future`` objects (the floor: no shared memory at all),
measured in the same run; then 100,000 outstanding futures: threads and
memory. Every cancel withdraws one waiter record from the key's line in
O(1) (the line is doubly linked), so N cancels cost O(N). Under
``--benchmark-disable`` each body runs once with N = 1,000."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from statistics import median

import pytest

from .harness import format_time

N_ENABLED = 10_000
N_DISABLED = 1_000
OUTSTANDING_ENABLED = 100_000
ROUNDS = 5


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.benchmark(group="waiters-cancel")
@pytest.mark.timeout(600)
def test_cancel_pending_futures(benchmark, shmrdv, single_cpu: int, rdv_name: str, report: list[str]) -> None:
    n = N_ENABLED if benchmark.enabled else N_DISABLED
    with shmrdv.Rendezvous(rdv_name, size=64 << 20, create=True) as rdv:
        futures: list = []
        floor: list[float] = []

        def setup() -> None:  # untimed: N waiters in line, and the floor measured just before
            plain = [Future() for _ in range(n)]
            begin = time.perf_counter()
            for f in plain:
                f.cancel()
            floor.append(time.perf_counter() - begin)
            futures[:] = [rdv.recv_async("line") for _ in range(n)]
            assert rdv.stats().waiters == n

        def cancel_all() -> None:
            for f in futures:
                assert f.cancel()

        benchmark.pedantic(cancel_all, setup=setup, rounds=ROUNDS if benchmark.enabled else 1, iterations=1)
        assert rdv.stats().waiters == 0
        if benchmark.enabled:
            ours = median(benchmark.stats.stats.data)
            report.append(f"waiters: cancelling {n} pending recv_async futures of one key: {format_time(ours)} "
                          f"(median of {ROUNDS}), {ours / median(floor):.1f}x plain Future.cancel "
                          f"({format_time(median(floor))})")


@pytest.mark.benchmark(group="waiters-close")
@pytest.mark.timeout(600)
def test_close_with_pending_futures(benchmark, shmrdv, single_cpu: int, rdv_name: str, report: list[str]) -> None:
    n = N_ENABLED if benchmark.enabled else N_DISABLED
    state: dict = {}

    def setup() -> None:
        if "rdv" in state:
            state["rdv"].unlink()  # the last round's
        state["rdv"] = rdv = shmrdv.Rendezvous(rdv_name, size=64 << 20, create=True)
        state["futures"] = [rdv.recv_async(f"close-{i % 10}") for i in range(n)]

    def close() -> None:
        state["rdv"].close()

    try:
        benchmark.pedantic(close, setup=setup, rounds=ROUNDS if benchmark.enabled else 1, iterations=1)
        assert all(f.cancelled() for f in state["futures"])
    finally:
        state["rdv"].close()
        state["rdv"].unlink()
    if benchmark.enabled:
        report.append(f"waiters: close() with {n} pending recv_async futures on 10 keys: "
                      f"{format_time(median(benchmark.stats.stats.data))} (median of {ROUNDS})")


@pytest.mark.timeout(600)
def test_outstanding_futures_cost_no_threads(shmrdv, rdv_name: str, report: list[str], request) -> None:
    enabled = bool(request.config.getoption("benchmark_enable", False))
    n = OUTSTANDING_ENABLED if enabled else N_DISABLED
    with shmrdv.Rendezvous(rdv_name, size=64 << 20, create=True) as rdv:
        threads, rss = threading.active_count(), rss_bytes()
        futures = [rdv.recv_async(f"k{i % 1000}") for i in range(n)]
        grown = rss_bytes() - rss
        extra = threading.active_count() - threads
        st = rdv.stats()
        assert extra <= 1 and st.waiters == n
        begin = time.perf_counter()
        for f in futures:
            f.cancel()
        cancelled = time.perf_counter() - begin
        report.append(f"waiters: {n} outstanding recv_async futures: {extra} thread(s) more, process memory "
                      f"+{grown / 2**20:.1f} MiB ({grown / n:.0f} B a future), waiter slabs "
                      f"{st.waiter_bytes / 2**20:.1f} MiB of arena; all cancelled in {format_time(cancelled)}")
