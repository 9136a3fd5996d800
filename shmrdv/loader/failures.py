"""What the trainer raises when a worker fails: the worker's own exception
(rebuilt from its type's name and message, never unpickled), or the death
of the worker's process."""
import builtins
import signal
from typing import Any, Dict, Optional


class WorkerError(RuntimeError):
    """An exception raised in a loader worker, re-raised in the trainer (when
    its type is not a builtin one; a builtin ``ValueError``, ``KeyError``...
    is re-raised as itself, as torch does). ``worker_id``, ``worker_pid``
    and ``batch_index`` (None: before the first batch) say where; the
    message holds the worker's traceback."""

    worker_id: int
    worker_pid: Optional[int]
    batch_index: Optional[int]
    exc_type: str


class WorkerDied(WorkerError):
    """A loader worker's process ended while the trainer needed it: killed
    by a signal (``signal`` is its number: SIGKILL for the OOM killer, SIGSEGV
    for a crash in native code) or exited (``exitcode``)."""

    signal: Optional[int]
    exitcode: Optional[int]


def _who(worker_id: int, pid: Optional[int]) -> str:
    return f"DataLoader worker {worker_id} (pid {pid})"


def _when(batch: Optional[int]) -> str:
    return "with no batch in hand" if batch is None else f"while producing batch {batch}"


def worker_exception(worker_id: int, pid: Optional[int], batch: Optional[int], meta: Dict[str, Any]) -> BaseException:
    """The exception a worker reported (an ERROR message's meta), to raise in the trainer."""
    name, module = str(meta.get("type", "Exception")), str(meta.get("module", ""))
    text = (f"Caught {name} in {_who(worker_id, pid)} {_when(batch)}.\nOriginal {meta.get('traceback', '')}"
            .rstrip("\n"))
    kind = getattr(builtins, name, None) if module == "builtins" else None
    exc: BaseException
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            exc = kind(text)
        except Exception:
            exc = WorkerError(text)
    else:
        exc = WorkerError(text)
    for attr, value in (("worker_id", worker_id), ("worker_pid", pid), ("batch_index", batch), ("exc_type", name)):
        try:
            setattr(exc, attr, value)
        except AttributeError:
            pass
    return exc


def worker_died(worker_id: int, pid: Optional[int], batch: Optional[int], exitcode: int) -> WorkerDied:
    if exitcode < 0:
        num = -exitcode
        try:
            name = signal.Signals(num).name
        except ValueError:
            name = f"signal {num}"
        hint = {"SIGKILL": ": the kernel's OOM killer (see dmesg) or kill -9",
                "SIGSEGV": ": a crash in native code", "SIGBUS": ": a memory-mapped file (or /dev/shm) ran out",
                "SIGABRT": ": an abort in native code"}.get(name, "")
        how = f"was killed by signal {num} ({name}{hint})"
    else:
        how = f"exited unexpectedly with exit code {exitcode}"
    err = WorkerDied(f"{_who(worker_id, pid)} {how} {_when(batch)}")
    err.worker_id, err.worker_pid, err.batch_index = worker_id, pid, batch
    err.exc_type = "WorkerDied"
    err.signal = -exitcode if exitcode < 0 else None
    err.exitcode = exitcode if exitcode >= 0 else None
    return err


class LoaderTimeout(RuntimeError, TimeoutError):
    """No batch came within the loader's ``timeout`` (the RuntimeError torch
    raises, and a TimeoutError); the iterator stays usable: the next call
    waits again."""
