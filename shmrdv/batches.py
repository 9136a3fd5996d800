"""Batches of messages: ``Rendezvous.send_many`` and ``Rendezvous.recv_many``,
each one call into the core for up to ``MANY_MAX`` messages.

What a batch saves is the per-message crossing into the core and the
argument work around it; the messages themselves are those of ``send`` and
``recv``: the same blocks, keys, order and views, each released on its own.
"""

from __future__ import annotations
import errno
import time
from functools import partial
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Tuple

import numpy as np

from . import rendezvous as _rendezvous  # it imports this module: its names are read at call time
from ._binding import ffi, lib
from .codec import _MAX_CACHED, _key_cache, as_sendable
from .codec import key_bytes as _key_bytes
from .codec import timeout_ns as _timeout_ns
from .errors import InvalidArgument, InvalidType, RendezvousError
from .tensors import tensor_dtype_ok

if TYPE_CHECKING:
    from .rendezvous import Rendezvous

MANY_MAX = lib.RDV_MANY_MAX
"""Messages one core call of a batch moves at most; longer batches take several calls."""

_SLICE_NS = 10_000_000  # a blocking call returns this often, so signal handlers run (Ctrl-C)

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


def _kind(key: object, arr: np.ndarray) -> _Kind:
    kb = _key_bytes(key)
    form = _rendezvous._send_forms.get((arr.dtype, arr.shape)) or _rendezvous._send_form(arr.dtype, arr.shape)
    if len(_kinds) >= _MAX_CACHED:
        _kinds.clear()
    kind = _kinds[(key, arr.dtype, arr.shape)] = _Kind(key, kb, form)  # type: ignore[index]
    return kind


def _step(deadline: Optional[int]) -> int:
    """The timeout of the next core call: a slice, or what is left of the deadline."""
    if deadline is None:
        return _SLICE_NS
    return max(0, min(_SLICE_NS, deadline - time.monotonic_ns()))


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


def send_many(rdv: "Rendezvous", items: Iterable[Tuple[str, Any]], timeout: Optional[float]) -> int:
    """``Rendezvous.send_many``: how many messages were sent (all of them)."""
    t = _timeout_ns(timeout)
    deadline = None if t < 0 else time.monotonic_ns() + t
    batch = items if type(items) is list else list(items)
    if rdv._routes is not None and any(rdv._routes.url_for(item[0]) is not None for item in batch
                                       if isinstance(item, (tuple, list)) and len(item) == 2):
        return _send_each(rdv, batch, deadline)
    chunks = [_prepare(batch[at:at + MANY_MAX], at) for at in range(0, len(batch), MANY_MAX)]
    h = rdv._handle()
    sent = ffi.new("uint32_t *")
    total = 0
    for prepared in chunks:
        count, done = len(prepared.kinds), 0
        while done < count:
            step = _step(deadline)
            rc = lib.rdv_send_many(h, prepared.items + done, prepared.srcs + done, count - done, step, sent)
            done += sent[0]
            if rc == 0:
                break
            if rc == -errno.EINTR or (rc == -errno.ETIMEDOUT and (deadline is None or time.monotonic_ns() < deadline)):
                continue  # a slice ran out or a signal came: its handler has run; go on
            _fail_at(rdv, rc, prepared, done, total + done, timeout)
        total += count
    return total


def _fail_at(rdv: "Rendezvous", rc: int, prepared: _Prepared, index: int, sent: int,
             timeout: Optional[float]) -> None:
    """Raise the error of item `index` of a chunk, saying how many messages were sent before it."""
    kind = prepared.kinds[index]
    key, form = kind.key, kind.form
    what = f"send_many {key!r} (item {sent})"
    try:
        rdv._fail(rc, what, partial(rdv._explain_space, what, len(_key_bytes(key)), form.ndim, form.nbytes, timeout))
    except RendezvousError as exc:
        exc.args = (f"{exc.args[0] if exc.args else exc}; the {sent} item(s) before it were sent, it and the "
                    f"rest were not",) + exc.args[1:]
        exc.sent = sent  # type: ignore[attr-defined]
        raise


def _send_each(rdv: "Rendezvous", batch: List[Any], deadline: Optional[int]) -> int:
    """A batch with keys routed to other hosts: each message sent on its own, in order."""
    for index, item in enumerate(batch):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise InvalidType(f"send_many: item {index} must be a (key, array) pair, not {type(item).__name__}")
        left = None if deadline is None else max(0, deadline - time.monotonic_ns()) / 1e9
        try:
            rdv.send(item[0], item[1], timeout=left)
        except RendezvousError as exc:
            exc.args = (f"{exc.args[0] if exc.args else exc}; the {index} item(s) before it were sent, it and the "
                        f"rest were not",) + exc.args[1:]
            exc.sent = index  # type: ignore[attr-defined]
            raise
    return len(batch)


def _count(max_count: object) -> int:
    if isinstance(max_count, bool) or not isinstance(max_count, (int, np.integer)):
        raise InvalidType(f"max_count must be an int, not {type(max_count).__name__}")
    if not 1 <= max_count:
        raise InvalidArgument(f"max_count must be at least 1, got {max_count}")
    return int(max_count)


def recv_many(rdv: "Rendezvous", key: str, max_count: int, timeout: Optional[float], lease: bool,
              writable: bool, as_torch: bool) -> List[Any]:
    """``Rendezvous.recv_many``."""
    count = min(_count(max_count), MANY_MAX)
    kb = _key_cache.get(key) if type(key) is str else None
    if kb is None:
        kb = _key_bytes(key)
    t = _timeout_ns(timeout)
    h = rdv._handle()
    infos = ffi.new("struct rdv_msg_info[]", count)
    waiter, n = ffi.new("uint32_t *"), ffi.new("uint32_t *")
    flags = lib.RDV_RECV_LEASED if lease else 0
    step = t if 0 <= t <= _SLICE_NS else _SLICE_NS
    taken = 0
    try:
        rc = lib.rdv_recv_many(h, kb, len(kb), step, flags, waiter, infos, count, n)
        taken = n[0]
        if rc < 0 and (waiter[0] or (rc in (-errno.ETIMEDOUT, -errno.EINTR) and step != t)):
            rc = rdv._in_line(lambda ns: lib.rdv_recv_many(h, kb, len(kb), ns, flags, waiter, infos, count, n), h,
                              waiter, t, flags, ffi.NULL, infos + 0, step)
            taken = n[0]
            if rc == 0 and taken == 0:  # served through the line: the first message; the rest that are queued
                taken = 1
                if count > 1 and lib.rdv_recv_more(h, kb, len(kb), flags, infos + 1, count - 1, n) == 0:
                    taken += n[0]
    except BaseException:  # a signal handler's (Ctrl-C): nothing taken is lost, and the order is kept
        for j in range(taken - 1, 0, -1):
            _give_back_unviewed(rdv, (infos + j))
        rdv._leave_line(h, waiter, flags, ffi.NULL, infos + 0)
        raise
    if rc == 0:
        return _views(rdv, infos, taken, writable, as_torch)
    if rc == -errno.EAGAIN and t == 0:
        return []
    rdv._fail(rc, f"recv_many {key!r}")


def _give_back_unviewed(rdv: "Rendezvous", info: Any) -> None:
    if info.payload != ffi.NULL:
        payload, info.payload = info.payload, ffi.NULL
        lib.rdv_give_back(rdv._handle(), payload)


def _parsed(info: Any, as_torch: bool) -> Any:
    """What info's descriptor means, or None if no view can be made of it (the
    check ``Rendezvous._view`` makes, without its side effects)."""
    offset = _rendezvous._DESC_OFFSET
    desc = ffi.buffer(info)[offset : offset + 40 + 16 * info.ndim]
    parsed = _rendezvous._descs.get(desc)
    if parsed is None:
        try:
            parsed = _rendezvous._parse_descriptor(info, desc)
        except Exception:
            return None
    return None if as_torch and not tensor_dtype_ok(parsed[0]) else parsed


def _views(rdv: "Rendezvous", infos: Any, taken: int, writable: bool, as_torch: bool) -> List[Any]:
    """The views of infos[0..taken), in order. If one cannot be made, it and
    those after it go back to the head of the key in their order (nothing is
    lost) and the views before it are returned; with none before it, its
    error is raised (by ``Rendezvous._view``, which puts it back first)."""
    parsed = [_parsed((infos + i), as_torch) for i in range(taken)]
    good = parsed.index(None) if None in parsed else taken
    # to the head of the key, last first, so they keep their order there
    for j in range(taken - 1, good - 1 if good else 0, -1):  # infos[0] with none good: _view below
        _give_back_unviewed(rdv, (infos + j))
    if good == 0:
        return [rdv._view(infos + 0, writable, as_torch)]  # raises why, and puts it back (or frees it)
    views: List[Any] = []
    make = rdv._view_parsed
    for i in range(good):
        try:
            views.append(make((infos + i), parsed[i], writable, as_torch))
        except BaseException:  # metadata that contradicts its payload: that message is freed
            for j in range(good - 1, i, -1):
                _give_back_unviewed(rdv, (infos + j))
            if views:
                return views
            raise
    return views
