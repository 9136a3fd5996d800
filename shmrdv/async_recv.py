"""Receives in the background: ``recv_async`` futures, served by one
completion thread per handle however many are outstanding.

A ``recv_async`` that finds nothing queued puts an async waiter record in
line on its key (in shared memory: first come, first served with every
blocking ``recv`` of every process). A send hands its message to the oldest
waiter; for an async one it rings the handle's bell, and the completion
thread (``rdv_recv_poll``) takes the message and finishes the future. A
send made in this process finishes the futures it served itself, before it
returns, so in one process a served future is done when ``send`` returns.

The future is also awaitable. Cancelling an awaiting task withdraws the
waiter, or, if a message had been handed over already and its view not yet
made, puts the message back at the head of its key: nothing is lost."""
import errno
import os
import threading
import weakref
from concurrent.futures import CancelledError, Future
from concurrent.futures._base import FINISHED  # the state names wait()/as_completed() read
from typing import Any, Dict, Generator, List, Optional, Sequence

from ._binding import ffi, lib

_POLL_NS = 1_000_000_000  # the completion thread's wait slice: each ends with a look at every waiter
_BATCH = 256  # waiters taken per poll
_EMPTY_WHICH = ffi.NULL

# Completions with futures outstanding, in this process: a send made here
# finishes what it served before it returns (see Completions.after_send).
_busy: "weakref.WeakSet[Completions]" = weakref.WeakSet()
pending = [0]  # futures outstanding in this process; send reads it on its hot path
_pending_lock = threading.Lock()  # pending is one count for every handle's thread


def _count(n: int) -> None:
    with _pending_lock:
        pending[0] += n


class RecvFuture(Future):  # type: ignore[type-arg]
    """The future of ``Rendezvous.recv_async``: a ``concurrent.futures.Future``
    (``wait``, ``as_completed`` and ``add_done_callback`` see it finish or be
    cancelled) that can also be awaited.

    ``cancel()`` returns True, withdrawing the receiver from its key's line,
    if no message had been handed to it; otherwise False, and the future
    holds the message."""

    def __init__(self, comp: "Completions", keys: Optional[Sequence[str]]) -> None:
        super().__init__()
        self._comp = comp
        self._keys = keys  # recv_any: the result is (key, view)
        self._waiter = 0
        self._info: Any = None  # the taken message, until its view is made
        self._which = 0
        self._view: Any = None
        self._as_torch = False  # the view is a torch tensor (recv_async(..., as_torch=True))
        self._failed: Optional[BaseException] = None  # why the view could not be made
        self._given_back = False
        self._release: Any = None  # a finalizer releasing _info's message
        self._flags = 0  # the receive's RDV_RECV_LEASED, for every call that may take its message

    # ---- concurrent.futures ------------------------------------------------

    def cancel(self) -> bool:
        return self._comp.cancel(self)

    def result(self, timeout: Optional[float] = None) -> Any:
        try:
            super().result(timeout)  # waits; raises the error, or CancelledError
        except (KeyboardInterrupt, SystemExit):
            # Ctrl-C while waiting: as a cancelled await, leave the line or put
            # a message handed over meanwhile back, rather than keep taking
            # messages for a caller that has gone
            self._abandon()
            raise
        return self._comp.materialize(self)

    def _finish(self, exc: Optional[BaseException] = None) -> bool:
        """Finish the future (result or error) without running its callbacks:
        the caller runs them once it has let go of the completion lock."""
        with self._condition:
            if self._state != "PENDING":
                return False
            self._exception = exc
            self._state = FINISHED
            for waiter in self._waiters:
                if exc is None:
                    waiter.add_result(self)
                else:
                    waiter.add_exception(self)
            self._condition.notify_all()
        return True

    def _run_callbacks(self) -> None:
        self._invoke_callbacks()

    # ---- asyncio -----------------------------------------------------------

    def __await__(self) -> Generator[Any, None, Any]:
        import asyncio  # here: importing it loads socket and ssl, which plain use does not need

        if not self.done():
            loop = asyncio.get_running_loop()
            ready = loop.create_future()

            def wake(_: Future) -> None:  # type: ignore[type-arg]
                loop.call_soon_threadsafe(_resolve, ready)

            self.add_done_callback(wake)
            try:
                yield from ready.__await__()
            except BaseException:  # the task's cancellation, or a timeout around it
                self._abandon()
                raise
        try:
            return self.result()
        except CancelledError:
            raise asyncio.CancelledError() from None

    def _abandon(self) -> None:
        """The awaiting task was cancelled: leave the line, or put a message
        handed over meanwhile back at the head of its key."""
        if not self.cancel():
            self._comp.give_back(self)


def _resolve(ready: Any) -> None:
    if not ready.done():
        ready.set_result(None)


class Completions:
    """The async waiters of one handle and the thread that finishes them."""

    def __init__(self, rdv: Any, handle: Any) -> None:
        self._rdv = rdv
        self._h = handle
        self._lock = threading.Lock()
        self._futures: Dict[int, RecvFuture] = {}
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self._refs = ffi.new("uint32_t[]", _BATCH)
        self._n = ffi.new("uint32_t *")  # under the lock
        self._wait_n = ffi.new("uint32_t *")  # the thread's wait, outside it
        self._start_out = ffi.new("uint32_t[2]")  # waiter, which

    def start(self, flags: int, kb: bytes, keys: Optional[Sequence[str]] = None,
              key_lens: Any = None, what: str = "recv_async") -> RecvFuture:
        """A receive in the background on key kb (or, keys given, on any of
        them: kb is their bytes concatenated, key_lens their lengths)."""
        fut = RecvFuture(self, keys)
        fut._flags = flags & lib.RDV_RECV_LEASED
        info = ffi.new("struct rdv_msg_info *")
        out = self._start_out
        with self._lock:
            if self._closed:
                raise self._rdv._closed_error()
            flags |= lib.RDV_RECV_ASYNC
            if keys is None:
                rc = lib.rdv_recv_start(self._h, kb, len(kb), 0, flags, out, info)
            else:
                rc = lib.rdv_recv_any_start(self._h, kb, key_lens, len(keys), 0, flags, out, out + 1, info)
            if rc == -errno.EINPROGRESS:
                fut._waiter = int(out[0])
                self._futures[fut._waiter] = fut
                _count(1)
                _busy.add(self)
                self._ensure_thread()
                return fut
            if rc == 0:
                self._hold(fut, info, int(out[1]))
        # a failure to start (the key index full, abort) is the future's, as a receive's is
        fut._finish(self._rdv._error(rc, what) if rc < 0 else None)
        fut._run_callbacks()
        return fut

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"shmrdv-completions-{self._rdv.name[:40]}",
                                            daemon=True)
            self._thread.start()

    def _take_served(self, timeout_ns: int) -> List[RecvFuture]:
        """Wait up to timeout_ns for a send to serve one of our waiters, then
        take what was served: the futures finished. The taking is under the
        lock, so a send of ours that finds nothing to take knows the thread
        has finished what it served."""
        if timeout_ns:
            rc = lib.rdv_recv_poll(self._h, timeout_ns, ffi.NULL, 0, self._wait_n)  # waits only
            if rc < 0 and rc != -errno.ECONNABORTED:
                return []  # nothing served (or a signal): the caller polls again
        done: List[RecvFuture] = []
        with self._lock:
            while True:
                rc = lib.rdv_recv_poll(self._h, 0, self._refs, _BATCH, self._n)
                if rc == -errno.ECONNABORTED:
                    for fut in list(self._futures.values()):
                        self._end_locked(fut, rc)
                        done.append(fut)
                    return done
                if rc < 0:
                    return done
                for i in range(self._n[0]):
                    fut = self._futures.get(int(self._refs[i]))
                    if fut is not None:
                        self._take_locked(fut, done)
                if self._n[0] < _BATCH:
                    return done

    def _take_locked(self, fut: RecvFuture, done: List[RecvFuture]) -> None:
        info = ffi.new("struct rdv_msg_info *")
        which = ffi.new("uint32_t *")
        waiter = ffi.new("uint32_t *", fut._waiter)
        rc = lib.rdv_recv_wait(self._h, waiter, 0, fut._flags, which, info)
        if waiter[0]:
            return  # still waiting: a stale hint
        self._settle_locked(fut, rc, rc == 0, info, which)
        done.append(fut)

    def _settle_locked(self, fut: RecvFuture, rc: int, got: bool, info: Any, which: Any) -> None:
        """fut's waiter has ended: forget it, and finish fut with the message
        it took (got) or with rc's error (rc < 0); neither: it was withdrawn."""
        del self._futures[fut._waiter]
        _count(-1)
        if got:
            self._hold(fut, info, int(which[0]))
            fut._finish()
        elif rc < 0:
            fut._finish(self._rdv._error(rc, self._what(fut)))

    def _what(self, fut: RecvFuture) -> str:
        return "recv_any" if fut._keys is not None else "recv_async"

    def _end_locked(self, fut: RecvFuture, rc_if_withdrawn: int) -> None:
        """Withdraw fut's waiter; a message handed over meanwhile is freed,
        since fut fails with rc_if_withdrawn's error (abort, close)."""
        info = ffi.new("struct rdv_msg_info *")
        rc = lib.rdv_recv_cancel(self._h, ffi.new("uint32_t *", fut._waiter), fut._flags, _EMPTY_WHICH, info)
        if rc == 1:
            lib.rdv_release_payload(self._h, info.payload)
        del self._futures[fut._waiter]
        _count(-1)
        fut._finish(self._rdv._error(rc_if_withdrawn, self._what(fut)))

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed or not self._futures:
                    self._thread = None
                    return
            for fut in self._take_served(_POLL_NS):
                fut._run_callbacks()

    def after_send(self) -> None:
        """Finish, before a send of this process returns, the futures it served."""
        for fut in self._take_served(0):
            fut._run_callbacks()

    def cancel(self, fut: RecvFuture) -> bool:
        with self._lock:
            if fut.cancelled():
                return True
            if fut.done() or fut._waiter not in self._futures or self._futures[fut._waiter] is not fut:
                return False
            info = ffi.new("struct rdv_msg_info *")
            which = ffi.new("uint32_t *")
            rc = lib.rdv_recv_cancel(self._h, ffi.new("uint32_t *", fut._waiter), fut._flags, which, info)
            self._settle_locked(fut, rc, rc == 1, info, which)
        if rc != 0:
            fut._run_callbacks()
            return False
        # Withdrawn: cancelled, and told to wait() and as_completed() too.
        Future.cancel(fut)
        fut.set_running_or_notify_cancel()
        return True

    def _hold(self, fut: RecvFuture, info: Any, which: int) -> None:
        """fut holds a taken message until its view is made (result()) or it
        goes back (give_back); if neither happens, the message is released
        with the future."""
        fut._info, fut._which = info, which
        fut._release = weakref.finalize(fut, lib.rdv_release_payload, self._h, info.payload)

    def materialize(self, fut: RecvFuture) -> Any:
        with self._lock:
            if fut._given_back:
                raise CancelledError("the awaiting task was cancelled; its message went back to its key")
            if fut._view is None:
                if fut._failed is not None:
                    raise fut._failed
                fut._release.detach()  # the view's own release takes over
                info, fut._info = fut._info, None
                try:
                    view = self._rdv._view(info, False, fut._as_torch)
                except BaseException as exc:  # the message went back to its key, or was freed
                    fut._failed = exc
                    raise
                fut._view = view if fut._keys is None else (fut._keys[fut._which], view)
            return fut._view

    def give_back(self, fut: RecvFuture) -> None:
        with self._lock:
            if fut._info is None or fut._given_back:
                return  # its view was made: the caller has it
            info, fut._info = fut._info, None
            fut._given_back = True
            fut._release.detach()
            lib.rdv_give_back(self._h, info.payload)

    def close(self) -> None:
        """Cancel every outstanding future (their waiters leave the line) and
        stop the thread."""
        with self._lock:
            self._closed = True
            futs = list(self._futures.values())
        for fut in futs:
            fut.cancel()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            lib.rdv_recv_interrupt(self._h)
            thread.join(5)


def _forget_in_child() -> None:
    # a forked child has none of its parent's waiters or threads
    global _pending_lock
    _busy.clear()
    pending[0] = 0
    _pending_lock = threading.Lock()  # a fork may have copied it held


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def after_send() -> None:
    """Called by a send of this process when futures are outstanding."""
    for comp in list(_busy):
        comp.after_send()
