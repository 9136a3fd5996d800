"""Waiting in slices: every blocking call into the core is cut into slices
(10 ms doubling to 1 s), so that Python's signal handlers (Ctrl-C) run
within one, and a receive keeps its place in line between them."""
import errno
import time
from typing import Any, Callable

from ._binding import fast, ffi, lib

FIRST_SLICE_NS = int(fast.FIRST_SLICE_NS)  # how soon a wait runs signal handlers (Ctrl-C) first
MAX_SLICE_NS = 1_000_000_000
RETRY = (-errno.ETIMEDOUT, -errno.EINTR)  # a receive's slice ran out, or a signal came


def blocking(call: Callable[[int], int], timeout_ns: int) -> int:
    """Run a blocking core call, ``call(timeout_ns)``, for up to timeout_ns
    (-1: forever) and return its code.

    A signal interrupts a futex sleep (-EINTR) and its Python handler then runs
    here, between calls, and may raise (Ctrl-C: KeyboardInterrupt). A signal
    that lands just before the sleep begins cannot interrupt it, so a wait is
    cut into slices (10 ms doubling to 1 s) and the handler runs within one."""
    deadline = None if timeout_ns < 0 else time.monotonic_ns() + timeout_ns
    slice_ns = FIRST_SLICE_NS
    left = timeout_ns
    while True:
        step = slice_ns if left < 0 or left > slice_ns else left
        rc = call(step)
        if rc != -errno.EINTR and not (rc == -errno.ETIMEDOUT and step != left):
            return rc
        if deadline is not None:
            left = max(0, deadline - time.monotonic_ns())
        slice_ns = min(2 * slice_ns, MAX_SLICE_NS)


def first_step(timeout_ns: int) -> int:
    """The timeout of a blocking call's first attempt: the whole wait, or its first slice."""
    return timeout_ns if 0 <= timeout_ns <= FIRST_SLICE_NS else FIRST_SLICE_NS


def keep_waiting(rc: int, step: int, timeout_ns: int) -> bool:
    """Whether a first attempt ended early: a signal, or a slice that ran out."""
    return rc == -errno.EINTR or (rc == -errno.ETIMEDOUT and step != timeout_ns)


def time_left(timeout_ns: int, step: int) -> int:
    # A first attempt cut short by a signal may have waited less than step: the
    # caller then waits up to step less than it asked, never more.
    return timeout_ns if timeout_ns < 0 else max(0, timeout_ns - step)


def in_line(start: Callable[[int], int], h: Any, waiter: Any, timeout_ns: int, flags: int, which: Any,
            info: Any, waited: int) -> int:
    """After a receive's first call (``start(ns)``, which waited up to
    ``waited`` ns), keep its place in line in slices, so that signal
    handlers run (Ctrl-C), and leave the line at the deadline. A start
    that ran out of its slice before it got in line (waiting for arena
    room for its record) is called again. The caller leaves the line if
    this raises (``leave_line``): the core clears *waiter once the
    waiter has ended, so wherever the exception lands it is known
    whether we are still in line."""
    deadline = None if timeout_ns < 0 else time.monotonic_ns() + max(0, timeout_ns - waited)
    slice_ns = 2 * FIRST_SLICE_NS
    while True:
        left = -1 if deadline is None else max(0, deadline - time.monotonic_ns())
        step = slice_ns if left < 0 or left > slice_ns else left
        if waiter[0]:
            rc = lib.rdv_recv_wait(h, waiter, step, flags, which, info)
            if not waiter[0]:
                return rc  # served (0), or out of line (abort)
            if rc == -errno.ETIMEDOUT and step == left:
                rc = lib.rdv_recv_cancel(h, waiter, flags, which, info)
                return 0 if rc == 1 else (-errno.ETIMEDOUT if rc == 0 else rc)
            if rc not in RETRY:
                # the handle was closed by another thread (its unmapping
                # took our place out of line) or the segment was cut:
                # nothing to wait for, no line to leave
                waiter[0] = 0
                return rc
        else:
            if left == 0:
                return -errno.ETIMEDOUT
            rc = start(step)
            if rc == 0 or (rc not in RETRY and not waiter[0]):
                return rc
        slice_ns = min(2 * slice_ns, MAX_SLICE_NS)


def leave_line(h: Any, waiter: Any, flags: int, which: Any, info: Any) -> None:
    """Leave the line if still in it; put back a message handed over
    meanwhile, or taken and not yet made a view (info.payload is cleared
    once a view owns it)."""
    if waiter[0] and lib.rdv_recv_cancel(h, waiter, flags, which, info) == 1 or info.payload != ffi.NULL:
        payload, info.payload = info.payload, ffi.NULL
        lib.rdv_give_back(h, payload)
