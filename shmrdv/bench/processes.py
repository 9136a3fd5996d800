"""Pinned child processes with bounded lives, and the names of benchmark segments."""

from __future__ import annotations
import contextlib
import gc
import glob
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from .common import CHILD_LIFETIME_S, CLEANUP_GRACE_S, JOIN_TIMEOUT_S, STARTUP_TIMEOUT_S

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
SINGLE_THREADED_MATH = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@contextlib.contextmanager
def environment(variables: Dict[str, str]) -> Iterator[None]:
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


class BenchmarkFailed(AssertionError):
    """A measurement could not be made: a child failed, hung or answered wrong."""


class ChildFailed(BenchmarkFailed):
    """A child process ended before its work was done; the message says how
    (its exception, or the signal that killed it); ``child_traceback`` is the
    traceback of the child's exception, if it had one."""

    def __init__(self, message: str, child_traceback: Optional[str] = None) -> None:
        super().__init__(message)
        self.child_traceback = child_traceback


def _failure(process: BaseProcess, suffix: str = "") -> ChildFailed:
    """ChildFailed for `process`, which ended: how (``describe_exit``), and its traceback."""
    error = _child_error(process)
    return ChildFailed(describe_exit(process) + suffix, error[1] if error else None)


def _exception_line(exc: BaseException) -> str:
    """``Type: message (at file.py:12 in function)``: where an exception was raised, in one line."""
    text = str(exc).strip().replace("\n", " ")
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}{': ' + text if text else ''}{where}"


def _child_main(cpu: int, lifetime_s: int, target: Callable[..., None], args: Sequence[Any], errors: Connection) -> None:
    """Entry point of every child: hard lifetime limit, CPU pinning, then `target`.

    An exception of `target` goes to the parent through `errors` (its line and
    its traceback), which tells it (``ChildFailed``); the child exits with
    status 1 without printing it."""
    # The default SIGALRM action ends the process: a bounded life at no cost inside the measured loops.
    signal.alarm(lifetime_s)
    os.sched_setaffinity(0, {cpu})
    try:
        target(*args)
    except KeyboardInterrupt:  # Ctrl-C reached the whole process group: the parent tells it
        sys.exit(128 + signal.SIGINT)
    except Exception as exc:
        with contextlib.suppress(Exception):
            errors.send((_exception_line(exc), "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))))
        sys.exit(1)
    finally:
        errors.close()


def describe_exit(process: BaseProcess) -> str:
    """How a child started by ``Children.start`` ended, in one line: its exception, its signal, or its code."""
    label = _label(process)
    try:
        code = process.exitcode
    except ValueError:  # closed by Children.cleanup
        code = getattr(process, "_bench_exitcode", None)
    if code is None:
        return f"{label} is still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            name = signal.Signals(-code).name
            return f"{label} was killed by {name}" + (" (its lifetime limit)" if -code == signal.SIGALRM else "")
        return f"{label} was killed by signal {-code}"
    error = _child_error(process)
    if error is not None:
        return f"{label} failed: {error[0]}"
    if code == 128 + signal.SIGINT:
        return f"{label} was interrupted (SIGINT)"
    return f"{label} exited with code {code}"


def _label(process: BaseProcess) -> str:
    return f"child {process.pid} ({getattr(process, '_bench_label', 'benchmark child')})"


def _child_error(process: BaseProcess) -> Optional[Tuple[str, str]]:
    """The (line, traceback) a child sent before it exited on an exception, if it did."""
    if getattr(process, "_bench_error", None) is None:
        errors = getattr(process, "_bench_errors", None)
        with contextlib.suppress(OSError, EOFError, ValueError):
            if errors is not None and errors.poll(0):
                process._bench_error = errors.recv()  # type: ignore[attr-defined]
    return getattr(process, "_bench_error", None)


# The Children whose unexpected deaths are watched for (SIGCHLD, main thread only),
# and the SIGCHLD handler there was before the first of them.
_watched: List["Children"] = []
_previous_sigchld: Any = None


def _told_already() -> bool:
    """Whether the main thread is already being stopped (Ctrl-C, SIGTERM, exit) or told of a
    failed child: then that is the reason the run ends. (A symptom of a dead child, such as an
    EOFError from its pipe, gives way to ChildFailed, which says why.)"""
    return isinstance(sys.exc_info()[1], (KeyboardInterrupt, SystemExit, ChildFailed))


# Failures of children that were found while nothing could be interrupted to tell them
# (an exception already on its way, a cleanup under way): ``untold_failure`` has them.
_untold: List[ChildFailed] = []


def untold_failure() -> Optional[ChildFailed]:
    """The first child failure found but not raised since the last call (then forgotten), if any:
    the reason behind a symptom such as an EOFError or a timeout of a wait on that child."""
    failure = _untold[0] if _untold else None
    _untold.clear()
    return failure


# Functions in which an exception raised from the SIGCHLD handler could cut a
# cleanup short (and leak a child, a segment, a socket): a failure found while
# one of them is running waits in _untold for its symptom.
_UNINTERRUPTIBLE = frozenset({"cleanup", "close", "__exit__", "__del__", "start", "join", "_kill", "_launch"})


def _interruptible(frame: Any) -> bool:
    if sys.exc_info()[1] is not None:
        return False
    # A handler can also run inside a gc callback (hypothesis installs one),
    # whose exceptions Python prints and drops: the failure would be lost.
    in_gc = {cb.__code__ for cb in gc.callbacks if hasattr(cb, "__code__")}
    while frame is not None:
        if frame.f_code.co_name in _UNINTERRUPTIBLE or frame.f_code in in_gc:
            return False
        frame = frame.f_back
    return True


def _on_sigchld(signum: int, frame: Any) -> None:
    """A child ended: if it is one of ours that failed while nobody was joining
    it, raise ChildFailed in the main thread, which is then waiting (for a
    message, for space, for an answer) on a child that will never answer.
    Where raising could cut a cleanup short, keep it for ``untold_failure``
    (the wait it leaves still ends: at its timeout, or at an EOF)."""
    if not _told_already():
        for children in list(_watched):
            failure = children._unexpected_failure()
            if failure is None:
                continue
            if _interruptible(frame):
                raise failure
            _untold.append(failure)
    if callable(_previous_sigchld):
        _previous_sigchld(signum, frame)


def _watch(children: "Children") -> None:
    global _previous_sigchld
    if children in _watched or threading.current_thread() is not threading.main_thread():
        return  # elsewhere than in the main thread, every wait is still bounded by its timeout
    if not _watched:
        _previous_sigchld = signal.signal(signal.SIGCHLD, _on_sigchld)
    _watched.append(children)


def _unwatch(children: "Children") -> None:
    if children not in _watched:
        return
    _watched.remove(children)
    if not _watched and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, _previous_sigchld if _previous_sigchld is not None else signal.SIG_DFL)


class Children:
    """Spawned child processes; each is joined with a timeout.

    `join` checks that a child ended by itself and succeeded; `cleanup` kills
    whatever is still alive, so no child outlives its benchmark even when the
    benchmark failed half-way. A child that fails while the parent is not
    joining it (it died on an exception, or was killed) raises ``ChildFailed``
    in the parent's main thread at once (SIGCHLD), whatever it is waiting for:
    a dead peer ends the run with its reason instead of a wait for a timeout.
    """

    def __init__(self, lifetime_s: int = CHILD_LIFETIME_S) -> None:
        self.context = multiprocessing.get_context("spawn")
        self._lifetime_s = lifetime_s
        self._processes: List[BaseProcess] = []
        self._settled: List[BaseProcess] = []  # joined, being joined, or already told

    def pipe(self) -> Tuple[Connection, Connection]:
        """A duplex pipe; close the child's end in the parent after `start`."""
        return self.context.Pipe(duplex=True)

    def start(self, target: Callable[..., None], *args: Any, cpu: int) -> BaseProcess:
        """Start `target(*args)` in a spawned child pinned to `cpu` (a module-level function)."""
        errors, child_errors = self.context.Pipe(duplex=False)
        process = self.context.Process(target=_child_main, args=(cpu, self._lifetime_s, target, args, child_errors),
                                       daemon=True)
        process._bench_label = target.__name__.lstrip("_") + (f" {args[0]}" if args and isinstance(args[0], str) else "")  # type: ignore[attr-defined]
        process._bench_errors = errors  # type: ignore[attr-defined]
        _watch(self)
        try:
            with environment(SINGLE_THREADED_MATH):
                process.start()
            self._processes.append(process)
        finally:
            child_errors.close()
        return process

    def join(self, process: BaseProcess, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Wait for `process` to end by itself; fail if it hangs or failed."""
        self._settled.append(process)
        process.join(timeout)
        if process.is_alive():
            _kill(process)
            raise BenchmarkFailed(f"{_label(process)} still running after {timeout} s: killed")
        if process.exitcode != 0 and not _told_already():
            raise _failure(process)

    def _unexpected_failure(self) -> Optional[ChildFailed]:
        """The first child that failed and that nobody joins, told once (in the SIGCHLD handler)."""
        for process in self._processes:
            if process in self._settled:
                continue
            with contextlib.suppress(ValueError):
                if process.exitcode not in (None, 0):
                    self._settled.append(process)
                    return _failure(process)
        return None

    def cleanup(self) -> None:
        """Stop and release every child (never raises for one that failed: ``untold_failure`` has it)."""
        ended_by_themselves = [p for p in self._processes if p not in self._settled]
        self._settled.extend(self._processes)
        try:
            for process in self._processes:
                process.join(CLEANUP_GRACE_S)
                if process.is_alive():
                    _kill(process)
                    continue  # stopped by us: no failure of its own
                if process in ended_by_themselves and process.exitcode != 0 and not _told_already():
                    _untold.append(_failure(process))
            for process in self._processes:
                if process.exitcode is not None:
                    _child_error(process)  # read before its pipe closes
                    process._bench_exitcode = process.exitcode  # type: ignore[attr-defined]
                    process._bench_errors.close()  # type: ignore[attr-defined]
                    process.close()
            self._processes.clear()
            self._settled.clear()
        finally:
            _unwatch(self)


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
                raise _failure(child, " before it was ready") from None
            if time.monotonic() > deadline:
                raise


def _reply(control: Connection, child: BaseProcess, timeout: float = STARTUP_TIMEOUT_S) -> Any:
    """The child's next control message; fail early if it died."""
    deadline = time.monotonic() + timeout
    while not control.poll(0.2):
        if not child.is_alive():
            raise _failure(child)
        if time.monotonic() > deadline:
            raise BenchmarkFailed(f"{_label(child)} did not answer within {timeout} s")
    try:
        return control.recv()
    except (EOFError, OSError):  # its end closed: it is gone, or going
        child.join(CLEANUP_GRACE_S)
        raise _failure(child) from None


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
