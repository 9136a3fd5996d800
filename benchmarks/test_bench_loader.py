"""shmrdv.loader's DataLoader and torch's under pytest-benchmark, on the
cases of ``shmrdv bench --loader`` (which alternates them in one run and
states the ratios and goals; here each is timed on its own):

- an epoch of each case (``shmrdv.bench.loader.CASES``) with shmrdv's and
  torch's DataLoader (two persistent fork workers) and torch's in-process
  one (``num_workers=0``); the first round is the warm-up epoch. The
  trainer's CPU µs per batch and its VmRSS growth over the last epoch go
  into ``extra_info``;
- the time to the first batch of a fresh loader with two spawn workers
  (stopping them is not timed).

Under ``--benchmark-disable`` (how the test suite runs them) each body
runs once, on the smoke batch counts."""

from __future__ import annotations

import gc
from typing import Any

import pytest

pytest.importorskip("torch")

from shmrdv.bench import loader as bench_loader  # noqa: E402

ROUNDS = 5
FIRST_BATCH_ROUNDS = 3


def _collect() -> None:
    """Between rounds, untimed (a setup that returns nothing: pedantic would take it for arguments)."""
    gc.collect()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("library", bench_loader.LIBRARIES)
@pytest.mark.parametrize("case", bench_loader.CASES, ids=[c.key for c in bench_loader.CASES])
def test_loader_epoch(benchmark, shmrdv, case: bench_loader.Case, library: str) -> None:
    benchmark.group = f"loader-{case.name}"
    batches = case.batches if benchmark.enabled else case.smoke_batches
    before = bench_loader.child_pids()
    loader = bench_loader.make_loader(library, case, batches)
    last: dict[str, Any] = {}

    def one_epoch() -> None:
        last.update(bench_loader.epoch(loader, case, batches, collect=False))

    try:
        benchmark.pedantic(one_epoch, setup=_collect, rounds=ROUNDS if benchmark.enabled else 1,
                           warmup_rounds=1 if benchmark.enabled else 0, iterations=1)
    finally:
        bench_loader.close_loader(loader)
        del loader
        bench_loader.settle(before)
    assert last["batches"] == batches
    rss = last["rss_kib"]
    benchmark.extra_info.update(batches=batches, batch_bytes=case.batch_bytes,
                                cpu_us_per_batch=last["cpu_s"] / batches * 1e6,
                                rss_growth_kib=rss["end"]["VmRSS"] - rss["start"]["VmRSS"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("library", ["shmrdv", "torch"])
def test_loader_first_batch(benchmark, shmrdv, library: str) -> None:
    benchmark.group = "loader-first-batch-spawn"
    first = bench_loader.FirstBatch(library)
    try:
        # setup stops the previous round's workers, untimed; the last ones are stopped below
        benchmark.pedantic(first, setup=first.close, rounds=FIRST_BATCH_ROUNDS if benchmark.enabled else 1,
                           iterations=1)
    finally:
        first.close()
