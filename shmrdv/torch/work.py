"""The Work a collective returns, and the one thread that runs a process
group's collectives.

Every rank must run a group's collectives in the same order. torch calls
them in program order, but some return before they are done
(``async_op=True``, DistributedDataParallel's buckets): each process group
therefore hands its calls to one worker thread, first in first out, and
the caller gets a ``Work`` at once. A synchronous call is the same call
followed by ``wait()``.
"""
import datetime
import queue
import threading
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist

from ..errors import RendezvousError, RendezvousTimeout


class Work(dist.Work):
    """One collective's completion: ``wait()`` blocks until it is done and
    raises what it raised (a shmrdv error such as PeerLost keeps its type).

    ``get_future()`` is what DistributedDataParallel and comm hooks chain
    on; its value is the list of result tensors. It is the continuation of
    a Future this Work completes, not that Future itself: an error set on a
    plain Python Future and read from C++ brings the process down, while
    one raised by a continuation reaches C++ as an ordinary exception."""

    def __init__(self, worker: Optional["Worker"] = None) -> None:
        super().__init__()
        self._worker = worker
        self._done = threading.Event()
        self._value: List[torch.Tensor] = []
        self._error: Optional[BaseException] = None
        self._source = torch.futures.Future()
        self._future = self._source.then(lambda f: f.value())

    def _finish(self, value: List[torch.Tensor]) -> None:
        self._value = value
        self._done.set()
        self._source.set_result(value)

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._done.set()
        self._source.set_exception(error)

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        """Block until the collective is done (at most timeout, when it is
        not zero); raise its error."""
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout or 0)
        if self._worker is not None and self._worker.is_current():
            # waited on inside a callback the worker runs (a comm hook's
            # .then): nobody else would run what is queued before us
            self._worker.run_until(self)
        if not self._done.wait(seconds if seconds > 0 else None):
            raise RendezvousTimeout(f"the collective did not complete within {seconds} s")
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error

    def result(self) -> List[torch.Tensor]:
        self.wait()
        return self._value

    def synchronize(self) -> None:
        """Nothing to do: the results are in CPU memory once done."""


class Worker:
    """The thread that runs one process group's collectives in call order.

    ``on_error(exc)`` runs (on the worker) when a collective fails, before
    its Work is failed: there the group tells its peers, so that none waits
    for a rank that has given up."""

    def __init__(self, name: str, on_error: Callable[[BaseException], None]) -> None:
        self._queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._on_error = on_error
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, run: Callable[[], None], value: List[torch.Tensor]) -> Work:
        """Queue run(); its Work's value is ``value`` once run() returns."""
        if self._closed:
            raise RendezvousError("the process group is shut down")
        work = Work(self)
        if self.is_current():
            # issued by a completion callback (a comm hook's .then), which
            # runs on this thread right after the call before it: run it now,
            # at that same place in the order on every rank, since the
            # callback may wait for it and nothing else would run it
            self._run(run, value, work)
        else:
            self._queue.put((run, value, work))
        return work

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    def run_until(self, work: Work) -> None:
        """On the worker itself: run queued calls until work is done (it is
        queued behind them); they are next in call order anyway."""
        while not work.is_completed():
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                raise RendezvousError("a collective waited on itself from its own completion callback") from None
            if item is None:  # shut down: leave the marker for the loop
                self._queue.put(None)
                raise RendezvousError("the process group is shut down")
            self._run(*item)

    def _run(self, run: Callable[[], None], value: List[torch.Tensor], work: Work) -> None:
        try:
            run()
        except BaseException as exc:  # every error is the caller's to see, in wait()
            try:
                self._on_error(exc)
            except Exception:  # telling the peers is best effort: the caller's error comes first
                pass
            work._fail(exc)
        else:
            work._finish(value)

    def _loop(self) -> None:
        torch.set_grad_enabled(False)  # results are written in place, also into tensors that require grad
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._run(*item)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout: Optional[float] = None) -> None:
        """Run what is queued, then stop (waiting at most timeout seconds)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)


__all__ = ["Work", "Worker"]
