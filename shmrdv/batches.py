"""Batches of messages: ``Rendezvous.send_many``, ``Rendezvous.recv_many`` and
``Rendezvous.give_back``, each one call into the core for up to ``MANY_MAX``
messages.

What a batch saves is the per-message crossing into the core and the
argument work around it; the messages themselves are those of ``send`` and
``recv``: the same blocks, keys, order and views, each released on its own.
"""

from __future__ import annotations
import errno
import threading
import time
from functools import partial
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np

from . import async_recv, explain, forms
from ._binding import address, fast, ffi, lib
from .codec import _MAX_CACHED, _key_cache, as_sendable
from .codec import key_bytes as _key_bytes
from .codec import timeout_ns as _timeout_ns
from .errors import InvalidArgument, InvalidType, RendezvousError, SegmentMismatch
from .tensors import tensor_dtype_ok
from .waits import RETRY, blocking, first_step, in_line

_per_thread = threading.local()  # each thread's batch of message infos

MANY_MAX = lib.RDV_MANY_MAX
"""Messages one core call of a batch moves at most; longer batches take several calls."""
_INFO_SIZE = ffi.sizeof("struct rdv_msg_info")  # the stride of a batch's infos


class _Kind:
    """The core's item for one (key, dtype, shape): everything but the
    source, shared by every message of that kind. Cached like send's forms."""

    __slots__ = ("item", "key", "form", "chars")

    def __init__(self, key: str, kb: bytes, form: Any) -> None:
        self.key, self.form = key, form
        self.chars = ffi.new("char[]", kb)  # kept alive with the item that points at it
        item = self.item = ffi.new("struct rdv_send_item *")
        item.key, item.key_len = self.chars, len(kb)
        item.dtype, item.dtype_len = form.code_c, form.code_len
        item.ndim, item.shape, item.strides, item.nbytes = form.ndim, form.dims, form.strides, form.nbytes


_kinds: Dict[Tuple[str, np.dtype, Tuple[int, ...]], _Kind] = {}
# The same kinds as fast.send_many reads them: (the address of each one's
# item, the kind that owns it); datetimes (sent as their int64 bits) are not here.
_fast_kinds: Dict[Tuple[str, np.dtype, Tuple[int, ...]], Tuple[int, _Kind]] = {}


def _kind(key: object, arr: np.ndarray) -> _Kind:
    kb = _key_bytes(key)
    form = forms.send_forms.get((arr.dtype, arr.shape)) or forms.send_form(arr.dtype, arr.shape)
    if len(_kinds) >= _MAX_CACHED:
        _fast_kinds.clear()
        _kinds.clear()
    kind = _kinds[(key, arr.dtype, arr.shape)] = _Kind(key, kb, form)  # type: ignore[index]
    if not form.bits and type(key) is str:
        _fast_kinds[(key, arr.dtype, arr.shape)] = (address(kind.item), kind)
    return kind


class _Prepared:
    """The core's arguments for one call of a batch: its items, its sources,
    and what keeps the sources alive and exported until the call returns."""

    __slots__ = ("items", "srcs", "kinds", "exports")

    def __init__(self, count: int) -> None:
        self.items = ffi.new("struct rdv_send_item *[]", count)
        self.srcs = ffi.new("void *[]", count)
        self.kinds: List[_Kind] = []
        self.exports: List[Any] = []


def _prepare(batch: List[Any], start: int) -> _Prepared:
    """Check every item of batch and fill the core's arguments; nothing is sent yet."""
    prepared = _Prepared(len(batch))
    items, srcs, kinds, exports = prepared.items, prepared.srcs, prepared.kinds, prepared.exports
    for i, item in enumerate(batch):
        try:
            if type(item) is not tuple and not isinstance(item, (tuple, list)):
                raise TypeError  # a str of two characters would unpack
            key, array = item
            arr = array if type(array) is np.ndarray else as_sendable(array)
            kind = _kinds.get((key, arr.dtype, arr.shape)) if type(key) is str else None
            if kind is None:
                kind = _kind(key, arr)
        except (InvalidType, InvalidArgument) as exc:
            raise type(exc)(f"send_many: item {start + i}, nothing sent: {exc}") from None
        except (TypeError, ValueError):
            raise InvalidType(f"send_many: item {start + i}, nothing sent: must be a (key, array) pair, not "
                              f"{type(item).__name__}") from None
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        src = ffi.from_buffer(arr.view(np.int64) if kind.form.bits else arr)  # datetimes: their int64 bits
        exports.append(src)
        items[i] = kind.item
        srcs[i] = src
        kinds.append(kind)
    return prepared


def send_many(rdv: Any, items: Iterable[Tuple[str, Any]], timeout: Optional[float]) -> int:
    """``Rendezvous.send_many``: how many messages were sent (all of them)."""
    t = _timeout_ns(timeout)
    deadline = None if t < 0 else time.monotonic_ns() + t
    batch = items if type(items) is list else list(items)
    total = 0  # queued so far
    if rdv._routes is None and rdv._h is not None:
        # Kinds sent before, all in one core call, in C (or none of them):
        # what found no room goes the way below, its items checked again.
        total = fast.send_many(rdv._h_addr, batch, _fast_kinds)
        if total == len(batch):
            if total and async_recv.pending[0]:
                async_recv.after_send()  # a future of ours a message served is done when we return, as with send
            return total
        batch = batch[total:] if total else batch
    chunks = [_prepare(batch[at:at + MANY_MAX], total + at) for at in range(0, len(batch), MANY_MAX)]  # checks all
    if rdv._routes is not None and any(rdv._routes.url_for(kind.key) is not None
                                       for prepared in chunks for kind in prepared.kinds):
        return _send_each(rdv, batch, deadline)
    h = rdv._handle()
    try:
        for prepared in chunks:
            left = -1 if deadline is None else max(0, deadline - time.monotonic_ns())
            rc, done = _send_chunk(h, prepared, left)
            if rc < 0:
                _fail_at(rdv, rc, prepared, done, total + done, timeout)
            total += done
    finally:
        if async_recv.pending[0]:
            async_recv.after_send()  # a future of ours a message served is done when we return, as with send
    return total


def _send_chunk(h: Any, prepared: _Prepared, timeout_ns: int) -> Tuple[int, int]:
    """One chunk through rdv_send_many in send's slices (``_blocking``: a wait
    long enough looks for dead processes whose space it can reclaim, and
    signal handlers run between slices): its code and how many were sent."""
    count, done, sent = len(prepared.kinds), [0], ffi.new("uint32_t *")

    def call(ns: int) -> int:
        rc = lib.rdv_send_many(h, prepared.items + done[0], prepared.srcs + done[0], count - done[0], ns, sent)
        done[0] += sent[0]
        return rc  # type: ignore[no-any-return]

    return blocking(call, timeout_ns), done[0]


def _with_sent(exc: RendezvousError, sent: int) -> None:
    """Make exc say (and carry in ``sent``) how many items before it were queued."""
    exc.args = (f"{exc.args[0] if exc.args else exc}; the {sent} item(s) before it were sent, it and the rest were "
                f"not",) + exc.args[1:]
    exc.sent = sent  # type: ignore[attr-defined]


def _fail_at(rdv: Any, rc: int, prepared: _Prepared, index: int, sent: int,
             timeout: Optional[float]) -> None:
    """Raise the error of item `index` of a chunk, saying how many messages were sent before it."""
    kind = prepared.kinds[index]
    key, form = kind.key, kind.form
    what = f"send_many {key!r} (item {sent})"
    try:
        rdv._fail(rc, what, partial(explain.space_message, rdv, what, kind.item.key_len, form.ndim, form.nbytes, timeout))
    except RendezvousError as exc:
        _with_sent(exc, sent)
        raise


def _send_each(rdv: Any, batch: List[Any], deadline: Optional[int]) -> int:
    """A batch with keys routed to other hosts (every item already checked):
    each message sent on its own, in order."""
    for index, item in enumerate(batch):
        left = None if deadline is None else max(0, deadline - time.monotonic_ns()) / 1e9
        try:
            rdv.send(item[0], item[1], timeout=left)
        except RendezvousError as exc:
            _with_sent(exc, index)
            raise
    return len(batch)


def _infos() -> Any:
    """This thread's MANY_MAX message infos, made once (a batch fills what it takes)."""
    infos = getattr(_per_thread, "infos", None)
    if infos is None:
        infos = _per_thread.infos = ffi.new("struct rdv_msg_info[]", MANY_MAX)
    return infos


def recv_many(rdv: Any, key: str, max_count: int, timeout: Optional[float], lease: bool,
              writable: bool, as_torch: bool) -> List[Any]:
    """``Rendezvous.recv_many``."""
    count = min(_count(max_count), MANY_MAX)
    kb = _key_cache.get(key) if type(key) is str else None
    if kb is None:
        kb = _key_bytes(key)
    t = _timeout_ns(timeout)
    h = rdv._handle()
    infos = _infos()
    waiter, n = ffi.new("uint32_t *"), ffi.new("uint32_t *")
    flags = lib.RDV_RECV_LEASED if lease else 0
    step = first_step(t)
    made: List[Any] = []  # the owner (fast.view's array's base) of each view made, in order
    try:
        rc = lib.rdv_recv_many(h, kb, len(kb), step, flags, waiter, infos, count, n)
        taken = n[0]
        if rc < 0 and (waiter[0] or (rc in RETRY and step != t)):
            rc = in_line(lambda ns: lib.rdv_recv_many(h, kb, len(kb), ns, flags, waiter, infos, count, n), h,
                          waiter, t, flags, ffi.NULL, infos + 0, step)
            taken = n[0]
            if rc == 0 and taken == 0:  # served through the line: the first message; then what is queued
                taken = 1
                if count > 1 and lib.rdv_recv_more(h, kb, len(kb), flags, infos + 1, count - 1, n) == 0:
                    taken += n[0]
        if rc == 0:
            return _views(rdv, infos, taken, writable, as_torch, made)
    except BaseException:  # a signal handler's (Ctrl-C) anywhere in here: nothing taken is lost or reordered
        _put_back_all(rdv, h, waiter, flags, infos, count, made)
        raise
    if rc == -errno.EAGAIN and t == 0:
        return []
    rdv._fail(rc, f"recv_many {key!r}", partial(explain.wait_message, rdv, f"recv_many {key!r}", timeout))


def _put_back_all(rdv: Any, h: Any, waiter: Any, flags: int, infos: Any, count: int,
                  made: List[Any]) -> None:
    """An interrupted recv_many: leave the line (taking a message handed over
    meanwhile), then every message taken, those made views included (their
    views never reach the caller), goes back to the head of the key in order,
    or to its waiters oldest first."""
    if waiter[0] and lib.rdv_recv_cancel(h, waiter, flags, ffi.NULL, infos + 0) < 0:
        return
    payloads = []
    for owner in made:  # its view is dropped unread: the message goes back instead of being freed
        payloads.append(ffi.cast("void *", owner._disarm()))
    for j in range(len(made), count):  # the core cleared what it did not fill; views made cleared theirs
        if infos[j].payload != ffi.NULL:
            payloads.append(infos[j].payload)
            infos[j].payload = ffi.NULL
    _give_back(h, payloads)


def _give_back(h: Any, payloads: List[Any]) -> None:
    """Messages of one key back to its head, in this order, under one hold of its lock."""
    if payloads:
        lib.rdv_give_back_many(h, payloads, len(payloads))


def give_back(rdv: Any, views: Tuple[Any, ...]) -> None:
    """``Rendezvous.give_back``."""
    if not 1 <= len(views) <= MANY_MAX:
        raise InvalidArgument(f"give_back takes 1 to {MANY_MAX} views, got {len(views)}")
    h = rdv._handle()
    span = ffi.new("uint64_t[2]")
    lib.rdv_mapping(h, span, span + 1)
    owners = []
    for view in views:  # every one checked before any is touched
        owner = getattr(view, "base", None)
        if not isinstance(view, np.ndarray) or not isinstance(owner, fast.Payload):
            raise InvalidArgument(f"give_back takes arrays a receive returned, not {type(view).__name__}")
        if not span[0] <= view.__array_interface__["data"][0] <= span[0] + span[1]:
            raise InvalidArgument("give_back: a view was received through another handle")
        if any(owner is o for o in owners):
            raise InvalidArgument("give_back: the same message twice")
        owners.append(owner)
    # _disarm: the views no longer free the block when they go; 0 if an
    # earlier give_back had disarmed it already.
    payloads = [ffi.cast("void *", p) for p in (o._disarm() for o in owners) if p]
    rc = lib.rdv_give_back_many(h, payloads, len(payloads)) if payloads else 0
    if rc == -errno.EINVAL:  # not one key (or not ours after all): nothing changed; each on its own, last first
        for payload in reversed(payloads):
            if lib.rdv_give_back(h, payload) == -errno.EINVAL:
                rdv._release(payload)  # not a view of ours: freed, as its views going would
        raise InvalidArgument("give_back: the views are not of one key; each message was given back on its own")
    if len(payloads) < len(owners):
        raise InvalidArgument("give_back: a message was given back already (the others are back now)")
    if rc < 0:
        rdv._fail(rc, "give_back")


def _count(max_count: object) -> int:
    if isinstance(max_count, bool) or not isinstance(max_count, (int, np.integer)):
        raise InvalidType(f"max_count must be an int, not {type(max_count).__name__}")
    if not 1 <= max_count:
        raise InvalidArgument(f"max_count must be at least 1, got {max_count}")
    return int(max_count)


def _parsed(info: Any, as_torch: bool) -> Any:
    """What info's descriptor means, or the exception that says why no view
    can be made of it (the checks ``Rendezvous._view`` makes, without its
    side effects)."""
    offset = forms.DESC_OFFSET
    desc = ffi.buffer(info)[offset : offset + 40 + 16 * info.ndim]
    parsed = forms.descs.get(desc)
    if parsed is None:
        try:
            parsed = forms.parse_descriptor(info, desc)
        except (InvalidType, SegmentMismatch) as exc:
            return exc
    if parsed[2] != info.nbytes:
        return forms.size_mismatch(parsed[1], parsed[0], info.nbytes)
    if as_torch and not tensor_dtype_ok(parsed[0]):
        return forms.no_tensor_of(parsed[0])
    return parsed


def _views(rdv: Any, infos: Any, taken: int, writable: bool, as_torch: bool,
           made: List[Any]) -> List[Any]:
    """The views of infos[0..taken), in order. If one cannot be made, it and
    those after it go back to the head of the key in their order (nothing is
    lost) and the views before it are returned; with none before it, its
    error is raised (a message whose metadata contradicts its payload is
    freed instead, as ``recv`` frees it)."""
    base = address(infos)
    # Those of descriptors seen before, in C, up to the first that is not.
    views: List[Any] = [] if as_torch else fast.views(rdv._h_addr, base, taken, writable, forms.descs, made)
    start = len(views)
    if start == taken:
        return views
    parsed = [None] * start + [_parsed(infos + i, as_torch) for i in range(start, taken)]
    good = next((i for i in range(start, taken) if isinstance(parsed[i], BaseException)), taken)
    if good < taken:
        bad = parsed[good]
        back = range(good + (1 if good == 0 and isinstance(bad, SegmentMismatch) else 0), taken)
        payloads = [infos[j].payload for j in back]
        for j in back:
            infos[j].payload = ffi.NULL
        _give_back(rdv._handle(), payloads)
        if good == 0:
            if isinstance(bad, SegmentMismatch):  # unreadable: freed, as its view would be
                raw, infos[0].payload = infos[0].payload, ffi.NULL
                rdv._release(raw)
            raise bad
    make = rdv._view_parsed
    for i in range(start, good):
        views.append(make(infos + i, parsed[i], writable, as_torch, made, base + i * _INFO_SIZE))
    return views
