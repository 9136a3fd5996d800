"""Pinned child processes with bounded lives, and the names of benchmark segments."""

from __future__ import annotations
import contextlib
import glob
import multiprocessing
import os
import signal
import time
import uuid
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Callable, Dict, Iterator, List, Sequence, Tuple

from .common import *  # noqa: F403

# ---------------------------------------------------------------------------
# CPUs, environment and child processes
# ---------------------------------------------------------------------------


def allowed_cpus() -> List[int]:
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
    """Where the measuring parent and its peer child run.

    "apart": parent and child on two different CPUs; "same": both on one CPU.
    Every transport of a comparison is measured with the same placement,
    since placement alone changes a round trip by 3x on 2-vCPU VMs.
    """

    name: str
    parent_cpu: int
    child_cpu: int


def placement(name: str) -> Placement:
    """"apart": first and second allowed CPU; "same": the first for both. ValueError on one CPU for "apart"."""
    cpus = allowed_cpus()
    if name == "apart":
        if len(cpus) < 2:
            raise ValueError("placement 'apart' needs 2 CPUs")
        return Placement("apart", cpus[0], cpus[1])
    if name == "same":
        return Placement("same", cpus[0], cpus[0])
    raise ValueError(f"unknown placement {name!r}")


# Without these, numpy's OpenBLAS starts a worker thread in every child that
# busy-waits (sched_yield) for a while after import; os.sched_setaffinity pins
# only the main thread, so that thread would spin on the parent's CPU.
_SINGLE_THREADED_MATH = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@contextlib.contextmanager
def _environment(variables: Dict[str, str]) -> Iterator[None]:
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
    # The default SIGALRM action ends the process: a bounded life at no cost inside the measured loops.
    signal.alarm(lifetime_s)
    os.sched_setaffinity(0, {cpu})
    target(*args)


class Children:
    """Spawned child processes; each is joined with a timeout.

    `join` checks that a child ended by itself and succeeded; `cleanup` kills
    whatever is still alive, so no child outlives its benchmark even when the
    benchmark failed half-way.
    """

    def __init__(self, lifetime_s: int = CHILD_LIFETIME_S) -> None:
        self.context = multiprocessing.get_context("spawn")
        self._lifetime_s = lifetime_s
        self._processes: List[BaseProcess] = []

    def pipe(self) -> Tuple[Connection, Connection]:
        """A duplex pipe; close the child's end in the parent after `start`."""
        return self.context.Pipe(duplex=True)

    def start(self, target: Callable[..., None], *args: Any, cpu: int) -> BaseProcess:
        """Start `target(*args)` in a spawned child pinned to `cpu` (a module-level function)."""
        process = self.context.Process(target=_child_main, args=(cpu, self._lifetime_s, target, args), daemon=True)
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


def _kill(process: BaseProcess) -> None:
    process.terminate()
    process.join(2.0)
    if process.is_alive():
        process.kill()
        process.join(2.0)


def wait_until_ready(child: BaseProcess, receive: Callable[[float], Any]) -> Any:
    """Return `receive(timeout)` once it succeeds; fail at once if `child` dies first.

    `receive` must raise TimeoutError (``shmrdv.RendezvousTimeout`` is one)
    when its timeout passes; it is retried in short slices for at most
    STARTUP_TIMEOUT_S.
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


def _reply(control: Connection, child: BaseProcess, timeout: float = STARTUP_TIMEOUT_S) -> Any:
    """The child's next control message; fail early if it died."""
    deadline = time.monotonic() + timeout
    while not control.poll(0.2):
        if not child.is_alive():
            raise AssertionError(f"child {child.pid} exited with code {child.exitcode}")
        if time.monotonic() > deadline:
            raise AssertionError(f"child {child.pid} did not answer within {timeout} s")
    return control.recv()


# ---------------------------------------------------------------------------
# Shared-memory names
# ---------------------------------------------------------------------------


def segment_prefix() -> str:
    """Prefix of every rendezvous name this process creates: ``bench-<pid>-``."""
    return f"bench-{os.getpid()}-"


def unique_name(kind: str = "") -> str:
    return f"{segment_prefix()}{kind}{uuid.uuid4().hex[:12]}"


def sweep_segments() -> List[str]:
    """Unlink every segment this process's benchmarks left in /dev/shm; returns their paths."""
    leftovers = glob.glob(f"/dev/shm/shmrdv-{segment_prefix()}*")
    for path in leftovers:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return leftovers


def _ring_segment(name: str, create: bool, size: int = 0) -> Any:
    """A ``multiprocessing.shared_memory.SharedMemory`` for the hand-rolled ring.

    The creator unlinks it itself, explicitly. (Spawned children share their
    parent's resource tracker, where attaching only repeats the creator's
    registration, and ``unlink()`` withdraws it.)
    """
    from multiprocessing import shared_memory

    return shared_memory.SharedMemory(name, create=create, size=size)
