"""Process, CPU and statistics helpers shared by the benchmarks.

Children are started with the ``spawn`` context and run functions defined in
this package, which a child imports as ``benchmarks.<module>``: that is why
``benchmarks/`` is a package (no clash with the modules of ``tests/``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import pytest

# A child that outlives this is killed by its own SIGALRM, even when the
# parent is stuck and never joins it.
CHILD_LIFETIME_S = 180
# How long a benchmark waits for one message (or for arena space) before
# calling its peer dead.
MESSAGE_TIMEOUT_S = 10.0
# Spawning a child imports numpy (and shmrdv): allow for a slow, busy machine.
STARTUP_TIMEOUT_S = 60.0
JOIN_TIMEOUT_S = 30.0
# At teardown a child still running is given this long before being killed.
CLEANUP_GRACE_S = 5.0

MiB = 1024 * 1024


def allowed_cpus() -> list[int]:
    """CPUs this process may run on, lowest first."""
    return sorted(os.sched_getaffinity(0))


@contextlib.contextmanager
def pinned(cpu: int) -> Iterator[None]:
    """Run the calling thread on `cpu` only; restore its affinity on exit."""
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)


@dataclass(frozen=True)
class Placement:
    """Where the benchmarking parent and its peer child run.

    "apart": parent and child on two different CPUs; "same": both on one CPU.
    Every transport of a comparison is measured with the same placement,
    since placement alone changes a round trip by 3x on the 2-vCPU VMs.
    """

    name: str
    parent_cpu: int
    child_cpu: int


# Without these, numpy's OpenBLAS starts a worker thread in every child that
# busy-waits (sched_yield) for a while after import; os.sched_setaffinity pins
# only the main thread, so that thread would spin on the parent's CPU.
_SINGLE_THREADED_MATH = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@contextlib.contextmanager
def _environment(variables: dict[str, str]) -> Iterator[None]:
    """Set environment variables (inherited by children started meanwhile), then restore them."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def _child_main(cpu: int, lifetime_s: int, target: Callable[..., None], args: Sequence[Any]) -> None:
    """Entry point of every child: hard lifetime limit, CPU pinning, then `target`."""
    # Default SIGALRM action terminates the process: a bounded life without
    # any cost inside the measured loop.
    signal.alarm(lifetime_s)
    os.sched_setaffinity(0, {cpu})
    target(*args)


class Children:
    """Spawned child processes of one benchmark; each is joined with a timeout.

    `join` checks that a child ended by itself and succeeded; `cleanup` (run at
    fixture teardown) kills whatever is still alive, so no child outlives its
    benchmark even when the benchmark failed half-way.
    """

    def __init__(self) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._processes: list[BaseProcess] = []

    def pipe(self) -> tuple[Connection, Connection]:
        """A duplex pipe; close the child's end in the parent after `start`."""
        return self._context.Pipe(duplex=True)

    def start(self, target: Callable[..., None], *args: Any, cpu: int) -> BaseProcess:
        """Start `target(*args)` in a spawned child pinned to `cpu`.

        `target` must be a module-level function of an importable module.
        """
        process = self._context.Process(
            target=_child_main, args=(cpu, CHILD_LIFETIME_S, target, args), daemon=True
        )
        with _environment(_SINGLE_THREADED_MATH):
            process.start()
        self._processes.append(process)
        return process

    def join(self, process: BaseProcess, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Wait for `process` to end by itself; fail if it hangs or failed."""
        process.join(timeout)
        if process.is_alive():
            _kill(process)
            raise AssertionError(f"child {process.pid} still running after {timeout} s: killed")
        if process.exitcode != 0:
            raise AssertionError(f"child {process.pid} failed with exit code {process.exitcode}")

    def cleanup(self) -> None:
        for process in self._processes:
            process.join(CLEANUP_GRACE_S)
            if process.is_alive():
                _kill(process)
            if process.exitcode is not None:
                process.close()
        self._processes.clear()


def wait_until_ready(child: BaseProcess, receive: Callable[[float], Any]) -> Any:
    """Return `receive(timeout)` once it succeeds; fail at once if `child` dies first.

    `receive` must raise TimeoutError (``shmrdv.RendezvousTimeout`` is one)
    when its timeout passes; it is retried in short slices for at most
    STARTUP_TIMEOUT_S, so a child that crashed while starting fails the
    benchmark in a fraction of a second instead of after the whole timeout.
    """
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        try:
            return receive(0.2)
        except TimeoutError:
            if not child.is_alive():
                raise AssertionError(f"child {child.pid} exited with code {child.exitcode} before it was ready") from None
            if time.monotonic() > deadline:
                raise


def _kill(process: BaseProcess) -> None:
    process.terminate()
    process.join(2.0)
    if process.is_alive():
        process.kill()
        process.join(2.0)


def planned_calls(benchmark: Any, rounds: int, warmup_rounds: int) -> int:
    """How many times `benchmark.pedantic` will call its target.

    A child that feeds the parent must know this count to end by itself:
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


def p99(data: Sequence[float]) -> float:
    """99th percentile."""
    return statistics.quantiles(data, n=100)[98]


def format_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    return f"{seconds * 1e3:.2f} ms"
