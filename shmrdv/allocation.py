"""``Rendezvous.alloc``'s zero-copy send: the checked kinds of allocation
(dtype and shape) and ``Allocation``, the reserved block a producer writes
into and then publishes or discards."""
from functools import partial
from typing import Any, Dict, NoReturn, Optional, Tuple

import numpy as np

from . import async_recv, explain, forms
from ._binding import fast, ffi, lib
from .codec import _MAX_CACHED
from .codec import dtype_code as _dtype_code
from .codec import shape_of as _shape_of
from .errors import InvalidType, RendezvousError
from .marks import Mark, checked_mark
from .tensors import as_tensor, is_torch_dtype, numpy_dtype
from .waits import blocking


# alloc's (dtype, shape) arguments, as given, -> (numpy dtype, shape, torch), checked: a loop of one
# kind of allocation checks it once. Only shapes that are tuples of ints are looked up (2.0 == 2).
_alloc_kinds: Dict[Tuple[Any, Tuple[int, ...]], Tuple[np.dtype, Tuple[int, ...], bool]] = {}


def int_tuple(shape: Any) -> bool:
    if type(shape) is not tuple:
        return False
    for d in shape:
        if type(d) is not int:
            return False
    return True


def alloc_kind(key: str, dtype: Any, shape: Any, remember: bool) -> Tuple[np.dtype, Tuple[int, ...], bool]:
    """alloc's dtype and shape, checked (InvalidType, InvalidArgument), and whether it gives torch tensors;
    remembered in _alloc_kinds if `remember` (shape a tuple of ints)."""
    tensor = is_torch_dtype(dtype)
    if tensor:
        dt = numpy_dtype(dtype, f"alloc {key!r}")
    else:
        try:
            dt = np.dtype(dtype)
        except (TypeError, ValueError) as exc:
            raise InvalidType(f"alloc {key!r}: bad dtype {dtype!r}: {exc}") from exc
    _dtype_code(dt)
    kind = (dt, _shape_of(shape, dt.itemsize, f"alloc {key!r}"), tensor)
    if remember:
        try:
            if len(_alloc_kinds) >= _MAX_CACHED:
                _alloc_kinds.clear()
            _alloc_kinds[(dtype, shape)] = kind
        except TypeError:
            pass  # an unhashable dtype argument: checked each time
    return kind


class Allocation:
    """A reserved block of the arena, returned by ``Rendezvous.alloc``: a
    context manager whose ``__enter__`` reserves the block and returns a
    writable array over it (a torch tensor when ``alloc`` was given a torch
    dtype), and whose ``__exit__`` publishes it (clean exit) or frees it
    (exception)."""

    __slots__ = ("_rdv", "_key", "_kb", "_dtype", "_shape", "_timeout_ns", "_mark", "_h", "_pos", "_tensor", "_buf")

    def __init__(self, rdv: Any, key: str, kb: bytes, dtype: np.dtype, shape: Tuple[int, ...], timeout_ns: int,
                 mark: Optional[Mark] = None, tensor: bool = False) -> None:
        self._rdv, self._key, self._kb = rdv, key, kb
        self._dtype, self._shape, self._timeout_ns = dtype, shape, timeout_ns
        self._mark = mark
        self._tensor = tensor
        self._h: Any = None
        self._pos = -1
        self._buf: Any = None  # the array open gave: sealed (read-only) when the block is published or freed

    def __enter__(self) -> Any:
        return self.open()

    def open(self) -> Any:
        """Reserve the block (waiting for space as ``send`` does) and return the
        writable array over it (a torch tensor for a torch dtype); ``publish``
        or ``discard`` ends it. What a ``with`` block's entry does, for a
        producer that ends it elsewhere."""
        if self._h is not None:
            raise RendezvousError("an Allocation can be opened only once")
        rdv, kb, dtype, shape = self._rdv, self._kb, self._dtype, self._shape
        h = rdv._handle()
        fast_form = forms.fast_forms.get((dtype, shape))
        if fast_form is not None:  # a form reserved or sent before: in C, if there is room now
            got = fast.alloc_view(rdv._h_addr, kb, fast_form, dtype, shape)
            if type(got) is tuple:
                self._h = h
                self._pos, buf = got
                self._buf = buf
                return as_tensor(buf) if self._tensor else buf
            if got is not None:
                self._fail_open(got, len(fast_form[1]) // 16, fast_form[2])
        form = forms.send_forms.get((dtype, shape)) or forms.send_form(dtype, shape)
        ndim, nbytes = form.ndim, form.nbytes
        out = ffi.new("uint64_t[2]")  # the block position, then the payload address
        payload = ffi.cast("void **", out + 1)
        rc = blocking(lambda ns: lib.rdv_send_begin(h, kb, len(kb), form.code, form.code_len, ndim, form.dims,
                                                     form.strides, nbytes, ns, out, payload), self._timeout_ns)
        if rc < 0:
            self._fail_open(rc, ndim, nbytes)
        self._h, self._pos = h, out[0]
        try:
            buf = np.frombuffer(ffi.buffer(ffi.gc(payload[0], rdv._unref), nbytes), dtype=dtype)
            if ndim != 1:
                buf = buf.reshape(shape)
        except BaseException:
            self.discard()  # no array over the block: nobody else could end it
            raise
        self._buf = buf
        return as_tensor(buf) if self._tensor else buf

    def _fail_open(self, rc: int, ndim: int, nbytes: int) -> NoReturn:
        rdv, timeout = self._rdv, None if self._timeout_ns < 0 else self._timeout_ns / 1e9
        rdv._fail(rc, f"alloc {self._key!r}", partial(explain.space_message, rdv, f"alloc {self._key!r}", len(self._kb),
                                                      ndim, nbytes, timeout))

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._h is None:
            return
        h, self._h = self._h, None
        fast.seal(self._buf)  # the block is no longer the producer's to write
        self._buf = None
        if exc_type is not None:
            lib.rdv_send_discard(h, self._pos)
            return
        if self._mark is None:
            rc = lib.rdv_send_commit(h, self._pos)
        else:
            rc = lib.rdv_send_commit_marked(h, self._pos, *self._mark)
        if rc < 0:
            self._rdv._fail(rc, f"send {self._key!r}")
        if async_recv.pending[0]:
            async_recv.after_send()

    def discard(self) -> None:
        """Free the opened block unpublished: what an exception in the ``with``
        block does."""
        if self._h is not None:
            h, self._h = self._h, None
            fast.seal(self._buf)
            self._buf = None
            lib.rdv_send_discard(h, self._pos)

    def publish(self, mark: Optional[Mark] = None) -> None:
        """Publish the entered block now, setting producer mark ``mark`` with
        it (for a producer that learns the mark's value only once the payload
        is written); the ``with`` block's exit then does nothing."""
        if mark is not None:
            self._mark = checked_mark(mark)
        self.__exit__(None, None, None)
