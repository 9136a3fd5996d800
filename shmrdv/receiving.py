"""The receive side of a ``Rendezvous``: ``recv``, ``try_recv``,
``recv_many`` and ``recv_any``, and the views they make of what they take.
Mixed into ``Rendezvous`` (shmrdv.rendezvous), whose handle they use."""
import errno
from functools import partial
from typing import Any, List, Optional, Tuple

import numpy as np

from . import batches, explain, forms
from ._binding import address, fast, ffi, lib
from .codec import _key_cache
from .codec import key_bytes as _key_bytes
from .codec import timeout_ns as _timeout_ns
from .errors import InvalidType
from .forms import no_tensor_of, size_mismatch
from .tensors import as_tensor, check_as_torch, tensor_dtype_ok
from .waits import FIRST_SLICE_NS, RETRY, first_step, in_line, leave_line


class Receiving:
    """``Rendezvous``'s receiving methods (see there for the handle's state they use)."""

    def _view(self, info: Any, writable: bool = False, as_torch: bool = False, info_bytes: Any = None) -> Any:
        """The view of the message taken into info: an array, or with as_torch
        a torch tensor (over writable memory: torch has no read-only tensors,
        and warns about read-only arrays). A message this process cannot
        represent (bfloat16 without ml_dtypes; for a tensor, a dtype torch
        lacks) goes back to the head of its key, and InvalidType says why."""
        desc = (ffi.buffer(info) if info_bytes is None else info_bytes)[forms.DESC_OFFSET : forms.DESC_OFFSET + 40 + 16 * info.ndim]
        parsed = forms.descs.get(desc)
        if parsed is None:
            try:
                parsed = forms.parse_descriptor(info, desc)
            except InvalidType:
                self._put_back(info)
                raise
            except BaseException:
                raw, info.payload = info.payload, ffi.NULL  # unreadable: freed, as its view would be
                self._release(raw)
                raise
        return self._view_parsed(info, parsed, writable, as_torch)

    def _view_parsed(self, info: Any, parsed: Tuple[np.dtype, Tuple[int, ...], int], writable: bool,
                     as_torch: bool, made: Optional[List[Any]] = None, info_addr: Optional[int] = None) -> Any:
        """_view once the descriptor is parsed; `made` collects the payload's
        owner for a caller that may give it back; info_addr is info's
        address, when the caller has it."""
        dtype, shape, nbytes = parsed
        if as_torch and not tensor_dtype_ok(dtype):
            self._put_back(info)
            raise no_tensor_of(dtype)
        if nbytes != info.nbytes:
            raw, info.payload = info.payload, ffi.NULL  # unreadable: freed, as its view would be
            self._release(raw)
            raise size_mismatch(shape, dtype, info.nbytes)
        # The array's base owns the payload (fast.view clears info's): it is
        # released when the last view of it goes. A read-only array cannot be
        # made writable: its base has no buffer to write through.
        arr = fast.view(self._h_addr, address(info) if info_addr is None else info_addr, dtype, shape,
                        writable or as_torch)
        if made is not None:
            made.append(arr.base)
        return as_tensor(arr) if as_torch else arr

    def _put_back(self, info: Any) -> None:
        """Give the message taken into info back to the head of its key, unviewed."""
        raw, info.payload = info.payload, ffi.NULL
        self._give_back(raw)

    def _recv(self, key: str, timeout: Optional[float], empty_ok: bool = False, lease: bool = False,
              writable: bool = False, as_torch: bool = False, started: Optional[int] = None,
              handle: Any = None) -> Any:
        """A view (a tensor with as_torch); None if empty_ok and nothing is
        queued. ``started``: the code recv's hot path (fast.recv_method) got,
        its first call into the core made already with ``handle`` (the
        thread's scratch as it left it)."""
        kb = _key_cache.get(key) if type(key) is str else None
        if kb is None:
            kb = _key_bytes(key)
        t = -1 if timeout is None else _timeout_ns(timeout)
        h = self._h if handle is None else handle
        if h is None:
            h = self._handle()
        info, waiter, info_bytes, info_addr, waiter_addr = forms.thread_scratch()
        flags = forms.LEASED if lease else 0
        step = t if 0 <= t <= FIRST_SLICE_NS else FIRST_SLICE_NS  # first_step, inline
        try:
            if started is not None:
                rc = started
            elif as_torch:
                rc = lib.rdv_recv_start(h, kb, len(kb), step, flags, waiter, info)
            else:  # the start, and the view when the descriptor is known: in C
                rc = fast.recv(self._h_addr, kb, step, flags, writable, info_addr, waiter_addr, forms.descs)
                if type(rc) is not int:
                    if rc is not None:
                        return rc
                    rc = 0  # taken, into info: its view is made below
            if rc < 0 and (waiter[0] or (rc in RETRY and step != t)):  # keep our place in line
                rc = in_line(forms.receiving(h, kb, flags, waiter, info), h, waiter,
                                   t, flags, ffi.NULL, info, step)
            if rc == 0:
                return self._view(info, writable, as_torch, info_bytes)
        except BaseException:  # a signal handler's (Ctrl-C) between the calls: leave the line
            leave_line(h, waiter, flags, ffi.NULL, info)
            raise
        if rc == -errno.EAGAIN and empty_ok:
            return None
        self._fail(rc, f"recv {key!r}", partial(explain.wait_message, self, f"recv {key!r}", timeout))


    def _recv_went_on(self, h: Any, key: str, timeout: Optional[float], lease: bool, writable: bool, got: Any) -> Any:
        """Where recv's hot path (fast.recv_method) stopped after its call into
        the core with handle ``h``: ``got`` is that call's code (the thread's
        scratch as it left it: in line, or a message taken whose descriptor
        is new), or the exception raised after it (a signal handler's,
        Ctrl-C). Whatever this raises with the receive still under way, the
        hot path leaves the line for (``_recv_gave_up``) before it raises it:
        its first line included, where a signal handler may run too."""
        if isinstance(got, BaseException):
            raise got
        return self._recv(key, timeout, False, lease, writable, False, got, h)

    def _recv_gave_up(self, h: Any, lease: bool) -> None:
        """recv's hot path, raising: leave the line, put back a message handed
        over meanwhile or taken and not yet a view's."""
        info, waiter = forms.thread_scratch()[:2]
        leave_line(h, waiter, forms.LEASED if lease else 0, ffi.NULL, info)

    def try_recv(self, key: str, *, lease: bool = False, writable: bool = False, as_torch: bool = False) -> Any:
        """Like ``recv`` but never blocks: the view, or None when nothing is
        queued. ``lease``, ``writable`` and ``as_torch`` as in ``recv``."""
        if as_torch is not False:
            return self._recv(key, 0, True, lease, writable, check_as_torch(as_torch, f"try_recv {key!r}"))
        return self._recv(key, 0, True, lease, writable)

    def recv_many(self, key: str, max_count: int, *, timeout: Optional[float] = None, lease: bool = False,
                  writable: bool = False, as_torch: bool = False) -> List[Any]:
        """Wait for ``key``'s oldest message as ``recv`` does, then take the
        ones queued behind it too, up to ``max_count`` (at most ``MANY_MAX``
        per call) without waiting for more: a list of views, oldest first, in
        one call into the core. Each view is ``recv``'s (``lease``,
        ``writable``, ``as_torch`` as there) and frees its space on its own.

        ``timeout`` bounds the wait for the first message: then
        ``RendezvousTimeout``; with ``timeout=0`` an empty list if nothing is
        queued. A message no view can be made of (see ``recv``) stays queued
        with those behind it: the views before it are returned, and the next
        call raises why."""
        if as_torch is not False:
            as_torch = check_as_torch(as_torch, f"recv_many {key!r}")
        return batches.recv_many(self, key, max_count, timeout, lease, writable, as_torch)

    def recv_any(self, keys: Any, *, timeout: Optional[float] = None, writable: bool = False,
                 as_torch: bool = False) -> Tuple[str, Any]:
        """Take the first message queued under any of ``keys`` (up to 64
        distinct keys), waiting for one up to ``timeout`` seconds (None:
        forever); returns ``(key, view)``. Exactly one message is taken,
        from one key. When several keys have messages, the key tried first
        rotates from call to call, so no key is starved; while waiting, the
        first send to any of the keys serves it. writable=True: a writable
        view, as ``recv`` gives (the message is this receiver's alone).
        as_torch=True: the view is a torch tensor (writable), as ``recv``
        gives."""
        names, kb, lens = forms.any_keys(keys)
        tensor = check_as_torch(as_torch, f"recv_any {names!r}")
        t = -1 if timeout is None else _timeout_ns(timeout)
        h = self._handle()
        info, waiter, _, _, _ = forms.thread_scratch()
        which = ffi.new("uint32_t *")
        step = first_step(t)
        try:
            rc = lib.rdv_recv_any_start(h, kb, lens, len(names), step, 0, waiter, which, info)
            if rc < 0 and (waiter[0] or (rc in RETRY and step != t)):
                rc = in_line(lambda ns: lib.rdv_recv_any_start(h, kb, lens, len(names), ns, 0, waiter, which, info),
                                   h, waiter, t, 0, which, info, step)
            if rc == 0:
                return names[which[0]], self._view(info, writable, tensor)
        except BaseException:
            leave_line(h, waiter, 0, which, info)
            raise
        self._fail(rc, f"recv_any {names!r}", partial(explain.wait_message, self, f"recv_any {names!r}", timeout))

    def give_back(self, *views: Any) -> None:
        """Put messages this handle received back at the head of their key,
        in place and in the order given (or hand them to the key's waiters,
        the first to the oldest), instead of freeing them when their views
        go: for a receiver that took messages and cannot pass them on, such
        as a forwarder whose peer failed before acknowledging them. Needs no
        arena space, so it never waits for room: it holds the key's lock
        briefly, once for all of them.

        ``views``: arrays that ``recv``, ``try_recv``, ``recv_many`` or
        ``recv_async`` of this handle returned (not torch tensors), messages
        of one key, oldest first; at most ``MANY_MAX`` (1024). The messages
        are the key's again at once: the caller must not read or write
        through these views or any view derived from them afterwards.

        ``InvalidArgument`` if a view is not such an array, was given back
        already, or the views are of more than one key (each message is then
        given back on its own, nothing lost); ``Aborted`` if the rendezvous
        is aborted and ``TooManyKeys`` if the key is gone and the key index
        full: the messages are freed then, as letting their views go would."""
        batches.give_back(self, views)
