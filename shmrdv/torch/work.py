"""The Work a collective returns, and the one thread that runs a process
group's collectives.

Every rank must run a group's collectives in the same order. torch calls
them in program order, but some return before they are done
(``async_op=True``, DistributedDataParallel's buckets): each process group
therefore hands its calls to one worker thread, first in first out, and
the caller gets a ``Work`` at once.

A synchronous call (torch sets ``opts.asyncOp`` False, then waits at once)
runs on the caller's own thread when nothing is queued or running before
it: the hand-off to the worker and back (two thread switches) costs more
than a small collective itself. Whoever runs a call, the worker or such a
caller, holds the worker's turn, so calls never overlap and keep their
order. What that changes for the caller: an exception raised into the
call while it waits (Ctrl-C, a signal handler's) ends it, and the group
is aborted on every rank, as for ``shmrdv.Group``'s own calls (the others
must not wait for a call this rank gave up); and a signal handler that
waits for a collective of the same group while the interrupted thread
runs one gets an error at once, since that one cannot finish before the
handler returns.
"""
import datetime
import queue
import threading
import time
from typing import Any, Callable, List, Optional, Tuple

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
    one raised by a continuation reaches C++ as an ordinary exception.

    The Event a waiter sleeps on and the Futures are made when first asked
    for (under _guard, against the completion): a call run on its caller's
    thread is done before anyone could ask, and needs neither."""

    def __init__(self, worker: Optional["Worker"] = None) -> None:
        super().__init__()
        self._worker = worker
        self._done = False
        self._value: List[torch.Tensor] = []
        self._error: Optional[BaseException] = None
        # Nothing is called while _guard is held: a signal handler that ran
        # there and waited for this Work, or for a call the worker runs after
        # it (the worker completes it under _guard), would wait for itself.
        self._guard = threading.Lock()
        self._event: Optional[threading.Event] = None
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
            event, source = self._event, self._source
        if event is not None:
            event.set()
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
            if self._worker is not None:
                self._worker.before_wait(self)
            fresh = threading.Event() if self._event is None else None  # made outside _guard: see _guard
            with self._guard:
                if self._event is None:
                    self._event = fresh
                event, done = self._event, self._done
            if not done:
                try:
                    finished = event.wait(seconds if seconds > 0 else None)
                except BaseException as exc:  # Ctrl-C, a signal handler's error: the caller gives the call up
                    if self._worker is not None and not self._done:
                        self._worker.abandoned(exc)
                    raise
                if not finished:
                    raise RendezvousTimeout(f"the collective did not complete within {seconds} s")
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future:
        if self._future is not None:
            return self._future
        source = torch.futures.Future()  # made outside _guard: see _guard
        future = source.then(lambda f: f.value())
        with self._guard:
            mine = self._future is None
            if mine:
                self._source, self._future = source, future
            done = self._done
        if not mine:  # another thread's came first
            return self._future
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


class Done(dist.Work):
    """A call that finished before it returned (an eager send): nothing to
    wait for, and cheaper to make than a ``Work``."""

    def __init__(self, value: List[torch.Tensor]) -> None:
        super().__init__()
        self._value = value

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        future = torch.futures.Future()
        future.set_result(self._value)
        return future

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Optional[BaseException]:
        return None

    def result(self) -> List[torch.Tensor]:
        return self._value

    def synchronize(self) -> None:
        """Nothing to do: the call is done."""


class Worker:
    """The thread that runs one process group's collectives in call order,
    and the turn that whoever runs one of them holds.

    ``on_error(exc)`` runs (where the collective ran) when it fails, before
    its Work is failed: there the group tells its peers, so that none waits
    for a rank that has given up. ``on_abandon(exc)`` runs when an exception
    (Ctrl-C) ends a wait for a call still pending: it aborts the group, as
    the same exception in a call run on its caller's thread does, so that
    neither this rank's worker nor the peers wait on for it.

    Signal handlers (Python runs them on the main thread only, at a
    function's entry and after a call returns) may interrupt a caller
    anywhere, and may make calls of their own: so every change of the
    count, the turn and the queue is made under _state, an RLock, in steps
    that call nothing until the state is whole again (a handler that runs
    in there finds it whole, and may take the lock too); the turn is given
    back in a ``finally`` that calls nothing before it is; and whoever
    waits for the turn also looks again every TURN_LOOK_S, so that a wake
    lost to a Ctrl-C costs that long, never a hang."""

    TURN_LOOK_S = 0.05

    def __init__(self, name: str, on_error: Callable[[BaseException], None],
                 on_abandon: Optional[Callable[[BaseException], None]] = None) -> None:
        self._queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._on_error = on_error
        self._on_abandon = on_abandon
        # Under _state: closed; calls submitted and not finished (queued or
        # running); the call that holds the turn (runs) and its thread.
        self._state = threading.RLock()
        self._closed = False
        self._pending = 0
        self._owner: Optional[Work] = None
        self._owner_thread: Optional[int] = None
        self._turn_free = threading.Event()  # set when a caller gives the turn back
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, run: Callable[[], None], value: List[torch.Tensor], *, waited: bool = False) -> Work:
        """Queue run(); its Work's value is ``value`` once run() returns.
        ``waited``: the caller waits for it at once (torch's asyncOp is
        False); then, with nothing pending, it runs here and now."""
        work = Work(self)
        if self.is_current():
            # issued by a completion callback (a comm hook's .then), which
            # runs on this thread right after the call before it: run it now,
            # at that same place in the order on every rank, since the
            # callback may wait for it and nothing else would run it
            if self._closed:
                raise RendezvousError("the process group is shut down")
            self._run(run, value, work)
            return work
        me = threading.get_ident()
        if waited and self._owner_thread == me:
            raise self._nested()
        item = (run, value, work, torch.is_inference_mode_enabled())
        inline = False
        try:
            with self._state:
                if self._closed:
                    raise RendezvousError("the process group is shut down")
                self._pending += 1
                if waited and self._pending == 1 and self._owner is None:
                    self._owner, self._owner_thread = work, me
                    inline = True  # with the turn, no call between: a signal finds both or neither
                else:
                    self._queue.put(item)  # counted and queued: whole, whatever runs next
            if not inline:
                return work
            # in the caller's grad mode, unlike the worker's (off): the
            # calls write only into tensors the backend has detached. _run's
            # body written out, not called: an interrupt at _run's entry
            # would skip on_error (the peers not told)
            try:
                run()
            except BaseException as exc:  # every error is the caller's to see, in wait()
                self._failed(work, exc)
            else:
                work._finish(value)
        finally:
            # The turn and the count back, before anything is called (a
            # function's entry is where a signal handler may run); a handler
            # may also raise while this thread waits for _state, which the
            # worker takes now and then: the stores are made or not at all,
            # so they are retried until made, then the first such error
            # raised (a second handler raising as the retry turns could
            # still leave with the turn held: the one window left).
            interrupted: Optional[BaseException] = None
            while inline and self._owner is work:
                try:
                    with self._state:  # nothing called in here
                        self._pending -= 1
                        self._owner = self._owner_thread = None
                except BaseException as exc:
                    interrupted = interrupted or exc
            if inline:
                self._turn_free.set()
            if interrupted is not None:
                raise interrupted
        return work

    @staticmethod
    def _nested() -> RendezvousError:
        return RendezvousError(
            "a collective was waited for on a thread that is running another collective of the same process "
            "group (from a signal handler?): that one cannot finish before this returns; make the call after it")

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    def before_wait(self, work: Work) -> None:
        """Before a thread blocks on work: on the worker itself (a callback
        the worker runs, such as a comm hook's .then) run what is queued up
        to it, which nothing else would; on a thread that runs another call,
        or holds _state (a signal handler that ran in submit's lock hold,
        which the worker needs), refuse rather than hang."""
        if self.is_current():
            self.run_until(work)
        elif self._owner_thread == threading.get_ident() or self._state._is_owned():
            raise self._nested()

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
            self._run_item(item)
            with self._state:
                self._pending -= 1

    def _run_item(self, item: Tuple[Callable[[], None], List[torch.Tensor], Work, bool]) -> None:
        """A queued call, in its caller's inference mode (so that it may
        write in place into inference tensors, as its caller could)."""
        run, value, work, inference = item
        if inference:
            with torch.inference_mode():
                self._run(run, value, work)
        else:
            self._run(run, value, work)

    def _run(self, run: Callable[[], None], value: List[torch.Tensor], work: Work) -> None:
        try:
            run()
        except BaseException as exc:  # every error is the caller's to see, in wait()
            self._failed(work, exc)
        else:
            work._finish(value)

    def abandoned(self, exc: BaseException) -> None:
        """An exception ended a wait for a call still pending (see on_abandon)."""
        if self._on_abandon is not None:
            try:
                self._on_abandon(exc)
            except Exception:  # best effort, as for on_error: the caller's exception comes first
                pass

    def _failed(self, work: Work, exc: BaseException) -> None:
        try:
            self._on_error(exc)
        except Exception:  # telling the peers is best effort: the caller's error comes first
            pass
        work._fail(exc)

    def _take(self, work: Work, thread: int) -> bool:
        """The turn for work, if it is free (under _state)."""
        if self._owner is not None:
            return False
        self._owner, self._owner_thread = work, thread
        return True

    def _wait_turn(self, free: Callable[[], bool], deadline: Optional[float] = None) -> bool:
        """Wait until free() (read under _state) or the deadline (monotonic)."""
        while True:
            self._turn_free.clear()
            with self._state:
                if free():
                    return True
            left = self.TURN_LOOK_S if deadline is None else min(self.TURN_LOOK_S, deadline - time.monotonic())
            if left <= 0:
                return False
            self._turn_free.wait(left)

    def _loop(self) -> None:
        torch.set_grad_enabled(False)  # results are written in place, also into tensors that require grad
        me = threading.get_ident()
        while True:
            item = self._queue.get()
            if item is None:
                return
            work = item[2]
            with self._state:
                took = self._take(work, me)
            if not took:  # a caller runs its own call: it goes first
                self._wait_turn(lambda: self._take(work, me))
            try:
                self._run_item(item)
            finally:
                with self._state:
                    self._pending -= 1
                    self._owner = self._owner_thread = None

    @property
    def running(self) -> bool:
        """Whether a call may still be running: on the worker, or on a caller's thread."""
        return self._thread.is_alive() or self._owner is not None

    def close(self, timeout: Optional[float] = None) -> None:
        """Run what is queued, then stop (waiting at most timeout seconds,
        also for a call that a caller runs on its own thread)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._state:
            if not self._closed:
                self._closed = True
                self._queue.put(None)  # behind every call counted before
        me = threading.get_ident()
        # the worker may be waiting for a turn that this thread holds (a
        # signal handler of a caller running its own call): it cannot end first
        if self._thread.ident != me and self._owner_thread != me:
            self._thread.join(timeout)
        # not for ourselves: a signal handler of the thread that runs a call
        self._wait_turn(lambda: self._owner_thread in (None, me), deadline)


__all__ = ["Work", "Worker"]
