"""The Work a collective returns, and the one thread that runs a process
group's collectives.

Every rank must run a group's collectives in the same order. torch calls
them in program order, but some return before they are done
(``async_op=True``, DistributedDataParallel's buckets): each process group
therefore hands its calls to one worker thread, first in first out, and
the caller gets a ``Work`` at once.

A synchronous call (torch sets ``opts.asyncOp`` False, then waits at once)
runs on the caller's own thread when nothing is queued before it: the
hand-off to the worker and back (two thread switches, an Event) cost more
than a small collective itself. Whoever runs a call, the worker or such a
caller, holds the worker's turn, so calls never overlap and keep their
order.
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
        self._done = False
        self._value: List[torch.Tensor] = []
        self._error: Optional[BaseException] = None
        # held until done: a waiter acquires it and lets go at once (a
        # plain Lock costs far less than an Event, on every call)
        self._latch = threading.Lock()
        self._latch.acquire()
        # the Futures, made by the first get_future (most Works are only
        # waited on): _guard orders that against the completion
        self._guard = threading.Lock()
        self._source: Optional[torch.futures.Future] = None
        self._future: Optional[torch.futures.Future] = None

    def _finish(self, value: List[torch.Tensor]) -> None:
        self._value = value
        self._complete()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._complete()

    def _complete(self) -> None:
        with self._guard:
            self._done = True
            source = self._source
        self._latch.release()
        if source is not None:
            self._settle(source)

    def _settle(self, source: torch.futures.Future) -> None:
        if self._error is not None:
            source.set_exception(self._error)
        else:
            source.set_result(self._value)

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        """Block until the collective is done (at most timeout, when it is
        not zero); raise its error."""
        if not self._done:
            seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout or 0)
            if self._worker is not None and self._worker.is_current():
                # waited on inside a callback the worker runs (a comm hook's
                # .then): nobody else would run what is queued before us
                self._worker.run_until(self)
            if not self._latch.acquire(timeout=seconds if seconds > 0 else -1):
                raise RendezvousTimeout(f"the collective did not complete within {seconds} s")
            self._latch.release()  # for the next waiter
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future:
        with self._guard:
            if self._future is not None:
                return self._future
            source = self._source = torch.futures.Future()
            future = self._future = source.then(lambda f: f.value())
            done = self._done
        if done:
            self._settle(source)
        return future

    def is_completed(self) -> bool:
        return self._done

    def is_success(self) -> bool:
        return self._done and self._error is None

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
        # Calls submitted and not yet finished, queued or running (under
        # _state); the thread running a call holds _turn meanwhile.
        self._state = threading.Lock()
        self._pending = 0
        self._turn = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, run: Callable[[], None], value: List[torch.Tensor], *, waited: bool = False) -> Work:
        """Queue run(); its Work's value is ``value`` once run() returns.
        ``waited``: the caller waits for it at once (torch's asyncOp is
        False); then, with nothing pending, it runs here and now."""
        if self._closed:
            raise RendezvousError("the process group is shut down")
        work = Work(self)
        if self.is_current():
            # issued by a completion callback (a comm hook's .then), which
            # runs on this thread right after the call before it: run it now,
            # at that same place in the order on every rank, since the
            # callback may wait for it and nothing else would run it
            self._run(run, value, work)
            return work
        here = counted = queued = False
        try:  # the count and the turn stay right whatever raises (Ctrl-C)
            with self._state:
                self._pending += 1
                counted = True
                # Nothing pending: nobody holds the turn (the worker lets go
                # of it before it counts its call done), so this does not
                # block; taken under _state, before a later call is queued.
                here = waited and self._pending == 1 and self._turn.acquire(blocking=False)
            if here:
                # in the caller's grad mode, unlike the worker's (off): the
                # calls write only into tensors the backend has detached
                self._run(run, value, work)
            else:
                # its Futures now, on this thread: DistributedDataParallel
                # asks for them at once, and the worker may be running it by then
                work.get_future()
                self._queue.put((run, value, work))
                queued = True
        finally:
            if here:
                self._turn.release()
            if counted and not queued:
                self._done_one()
        return work

    def _done_one(self) -> None:
        with self._state:
            self._pending -= 1

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
            self._done_one()

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
            with self._turn:  # a caller running its own call finishes it first
                self._run(*item)
            self._done_one()

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
