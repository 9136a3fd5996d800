"""Leave nothing behind: a benchmark run's child processes and its
shared-memory segments, also when the run is interrupted (Ctrl-C, SIGTERM).

- ``InterruptCleanup.install()`` turns SIGTERM into KeyboardInterrupt, as
  Ctrl-C already is, so the run unwinds through its ``finally`` blocks and
  fixture teardowns. On the first of either signal it first sends SIGTERM to
  every process the run started (children and their children, found in
  /proc), so no teardown waits on a peer that is still streaming. Further
  signals are ignored while the cleanup runs. At exit (``atexit``, and
  ``finish()``) whatever is still running is stopped (SIGTERM, then SIGKILL)
  and the segments of this process are unlinked.
- ``sweep_stale_segments()`` unlinks the segments of earlier runs whose
  process is gone (killed by SIGKILL or the OOM killer, which no cleanup can
  intercept): every benchmark segment is named after the pid that created it.

Children are never reaped here (``waitpid``): their owners (multiprocessing,
subprocess) do that. A child that has exited and not been reaped yet (a
zombie) counts as gone.
"""

from __future__ import annotations
import atexit
import contextlib
import glob
import os
import re
import signal
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Set

__all__ = ["descendants", "alive", "stop_processes", "sweep_stale_segments", "InterruptCleanup"]

_STAT_STATE = re.compile(rb"\) (\S) (-?\d+) ")
_BENCH_SEGMENT = re.compile(r"shmrdv-bench-(\d+)-")


def _state_and_parent(pid: int) -> Optional[tuple]:
    """(state letter, parent pid) of a process, from /proc; None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    match = _STAT_STATE.search(text, text.rfind(b")"))  # the command name may hold ") "
    if match is None:
        return None
    return match.group(1).decode(), int(match.group(2))


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited and not reaped yet, does not)."""
    info = _state_and_parent(pid)
    return info is not None and info[0] not in ("Z", "X")


def descendants(pid: Optional[int] = None) -> List[int]:
    """Every live process below `pid` (default: this one): children, their children..."""
    root = os.getpid() if pid is None else pid
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _state_and_parent(int(entry))
            if info is not None and info[0] not in ("Z", "X"):
                children.setdefault(info[1], []).append(int(entry))
    found, todo = [], list(children.get(root, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def _exempt() -> Set[int]:
    """Helpers that end by themselves when this process ends, and whose early
    death would only make it start them again: multiprocessing's resource tracker."""
    pids = set()
    with contextlib.suppress(Exception):
        from multiprocessing import resource_tracker

        pid = getattr(resource_tracker._resource_tracker, "_pid", None)  # type: ignore[attr-defined]
        if pid:
            pids.add(pid)
    return pids


def _signal_all(pids: List[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def stop_processes(pids: List[int], grace_s: float = 3.0) -> List[int]:
    """SIGTERM to each of `pids`, SIGKILL to those still running after `grace_s`; returns the killed ones."""
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    left = [pid for pid in pids if alive(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [pid for pid in left if alive(pid)]
    _signal_all(left, signal.SIGKILL)
    return left


def sweep_stale_segments(shm_dir: str = "/dev/shm") -> List[str]:
    """Unlink the benchmark segments (``shmrdv-bench-<pid>-*``) whose creating process is gone."""
    removed = []
    for path in glob.glob(os.path.join(shm_dir, "shmrdv-bench-*")):
        match = _BENCH_SEGMENT.match(os.path.basename(path))
        if match is None or alive(int(match.group(1))):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(path)
    return removed


class InterruptCleanup:
    """Stop this run's children and unlink its segments on SIGTERM, Ctrl-C and exit.

    `sweep` unlinks this process's segments and returns their paths (e.g.
    ``shmrdv.bench.sweep_segments``). Install from the main thread.
    """

    def __init__(self, sweep: Callable[[], List[str]], grace_s: float = 3.0) -> None:
        self._sweep = sweep
        self._grace_s = grace_s
        self._previous: Dict[int, Any] = {}
        self._pid = 0
        self.interrupted: Optional[int] = None  # the first signal, once one came

    @property
    def installed(self) -> bool:
        return self._pid == os.getpid()

    def install(self) -> None:
        if self.installed:
            return
        self._pid = os.getpid()
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._on_signal)
        atexit.register(self.finish)

    def uninstall(self) -> None:
        """Restore the previous handlers; after an interrupt ours stay, so the cleanup runs to its end."""
        if not self.installed or self.interrupted is not None:
            return
        for signum, handler in self._previous.items():
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid:  # a forked child that inherited the handler
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self.interrupted is not None:
            print(f"\n{signal.Signals(signum).name}: still stopping the benchmark's processes and unlinking "
                  "its segments (a few seconds)", file=sys.stderr, flush=True)
            return
        self.interrupted = signum
        self.terminate_children()
        raise KeyboardInterrupt(signal.Signals(signum).name)

    def terminate_children(self) -> None:
        """SIGTERM to every process below this one now, without waiting (they are expected to go:
        nothing must report their deaths as failures any more)."""
        if self.installed and signal.getsignal(signal.SIGCHLD) not in (signal.SIG_DFL, signal.SIG_IGN, None):
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        exempt = _exempt()
        _signal_all([pid for pid in descendants() if pid not in exempt], signal.SIGTERM)

    def finish(self) -> Dict[str, List[Any]]:
        """Stop what still runs below this process and unlink its segments;
        returns ``{"killed": pids, "stopped": pids, "segments": paths}``."""
        if not self.installed:
            return {"stopped": [], "killed": [], "segments": []}
        exempt = _exempt()
        running = [pid for pid in descendants() if pid not in exempt]
        if running and signal.getsignal(signal.SIGCHLD) not in (signal.SIG_DFL, signal.SIG_IGN, None):
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # stopping them is no failure to report
        killed = stop_processes(running, self._grace_s) if running else []
        try:
            segments = self._sweep()
        except Exception as error:  # at exit: say so, never raise
            print(f"could not sweep the benchmark's segments: {error}", file=sys.stderr)
            segments = []
        return {"stopped": running, "killed": killed, "segments": segments}
