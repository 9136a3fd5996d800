"""The asyncio face of a ``Rendezvous``: ``recv_async`` futures and the
``arecv``, ``arecv_any`` and ``asend`` coroutines, which wait without
blocking the event loop (or a thread of their own). Mixed into
``Rendezvous`` (shmrdv.rendezvous); the futures are ``async_recv``'s."""
import time
from typing import Any, Callable, Optional, Tuple

from . import async_recv, forms
from .codec import key_bytes as _key_bytes
from .codec import timeout_ns as _timeout_ns
from .errors import RendezvousTimeout
from .tensors import check_as_torch


async def with_timeout(start: Callable[[], Any], timeout: Optional[float], what: str) -> Any:
    """Await the future start() gives, at most timeout seconds (None, or
    one too large to end: forever). The timeout is checked before start()
    puts a receive in line: a bad one never leaves a receiver behind."""
    import asyncio  # here: it loads socket and ssl, which plain use does not need

    ns = _timeout_ns(timeout)
    fut = start()
    if ns < 0:
        return await fut
    seconds = ns / 1e9
    try:
        if hasattr(asyncio, "timeout"):  # Python 3.11+
            async with asyncio.timeout(seconds):
                return await fut
        # before 3.11: wait_for wraps fut in a task and cancels that, which
        # takes the receive out of line only if the task ever ran (with a
        # timeout of 0 it never does): leave the line here too
        try:
            return await asyncio.wait_for(fut, seconds)
        except asyncio.TimeoutError:
            fut._abandon()  # idempotent
            raise
    except (TimeoutError, asyncio.TimeoutError):  # one class from 3.11 on, two before
        raise RendezvousTimeout(f"{what}: timed out after {seconds:g} s") from None


class Awaiting:
    """``Rendezvous``'s asyncio methods (see there for the handle's state they use)."""

    def recv_async(self, key: str, *, lease: bool = False, as_torch: bool = False) -> "async_recv.RecvFuture":
        """Start a ``recv`` in the background: returns a ``concurrent.futures.Future``
        that is also awaitable (``await rdv.recv_async(key)``).

        The receiver takes its place in line at once, first come, first
        served with every other receiver of the key in every process; a
        send hands it the next message. No thread per call: one completion
        thread per handle finishes every future. A send made in this
        process finishes the future it served before it returns.

        ``cancel()`` returns True and leaves the line if no message was
        handed over yet (``wait``, ``as_completed`` and ``add_done_callback``
        see the future cancelled); otherwise it returns False and the future
        holds the message. A cancelled asyncio task that awaited it leaves
        the line too, or puts a message handed over meanwhile back at the
        head of its key. ``close()`` cancels every pending future.

        lease=True: the message is taken leased, as ``recv`` takes it.
        as_torch=True: the result is a torch tensor, as ``recv`` gives."""
        kb = _key_bytes(key)
        tensor = check_as_torch(as_torch, f"recv_async {key!r}")
        fut = self._async().start(forms.LEASED if lease else 0, kb, what=f"recv_async {key!r}")
        fut._as_torch = tensor  # read when the result is first asked for
        return fut

    def _async(self) -> "async_recv.Completions":
        comp = self._completions
        if comp is None:
            comp = self._completions = async_recv.Completions(self, self._handle())
        return comp

    async def arecv(self, key: str, *, timeout: Optional[float] = None, as_torch: bool = False) -> Any:
        """``recv`` for asyncio: waits without blocking the event loop (and
        without a thread of its own). Cancelling the task leaves the line,
        or puts a message handed over meanwhile back at the head of its key;
        ``RendezvousTimeout`` after ``timeout`` seconds (None: forever).
        as_torch=True: a torch tensor, as ``recv`` gives."""
        return await with_timeout(lambda: self.recv_async(key, as_torch=as_torch), timeout, f"arecv {key!r}")

    async def arecv_any(self, keys: Any, *, timeout: Optional[float] = None, as_torch: bool = False) -> Tuple[str, Any]:
        """``recv_any`` for asyncio: ``(key, view)`` of the first message
        under any of ``keys``, as ``arecv`` waits (as_torch as there)."""
        names, kb, lens = forms.any_keys(keys)
        tensor = check_as_torch(as_torch, f"arecv_any {names!r}")
        def start() -> "async_recv.RecvFuture":
            fut = self._async().start(0, kb, names, lens, what=f"arecv_any {names!r}")
            fut._as_torch = tensor
            return fut

        return await with_timeout(start, timeout, f"arecv_any {names!r}")  # type: ignore[no-any-return]

    async def asend(self, key: str, array: Any, *, timeout: Optional[float] = None) -> None:
        """``send`` for asyncio: while the arena is full it waits for space
        without blocking the event loop (retrying at 1 ms, doubling to 50 ms),
        up to ``timeout`` seconds (None: forever), then ``RendezvousTimeout``."""
        import asyncio  # here: it loads socket and ssl, which plain use does not need

        ns = _timeout_ns(timeout)
        deadline = None if ns < 0 else time.monotonic() + ns / 1e9  # < 0: forever
        pause = 0.001
        while True:
            try:
                self.send(key, array, timeout=0)
                return
            except RendezvousTimeout as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise RendezvousTimeout(f"asend {key!r}: no room after {timeout:g} s: {exc}") from None
            left = pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic()))
            await asyncio.sleep(left)
            pause = min(2 * pause, 0.05)
