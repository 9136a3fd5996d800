"""Message forms and descriptors: what ``send`` passes the core for one
(dtype, shape), what a received message's descriptor means, the per-thread
scratch a receive fills, and the caches of all three (a program sends the
same few forms over and over). Shared by ``Rendezvous``, ``Allocation`` and
the batch calls (``batches``)."""
import math
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from ._binding import address, fast, ffi, lib
from .codec import _MAX_CACHED
from .codec import dtype_code as _dtype_code
from .codec import dtype_of as _dtype_of
from .codec import key_bytes as _key_bytes
from .errors import InvalidArgument, InvalidType, SegmentMismatch

MSG_HEADER = 64  # sizeof(struct rdv_msg), csrc/rdv_layout.h
LEASED = int(lib.RDV_RECV_LEASED)
DESC_OFFSET = ffi.offsetof("struct rdv_msg_info", "ndim")
descs: Dict[bytes, Tuple[np.dtype, Tuple[int, ...], int]] = {}
"""A message descriptor's bytes -> (dtype, shape, nbytes): what it means, checked."""


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def block_bytes(key_len: int, ndim: int, nbytes: int) -> Tuple[int, int]:
    """(block, header) bytes a message takes in the arena, as the core counts
    them for its size check (rdv_meta_bytes in csrc/rdv_queue.c): a header of
    rdv_msg, shape, strides, key and position rounded up to 64, then the payload."""
    meta = round_up(MSG_HEADER + 16 * ndim + key_len + 8, 64)
    return meta + nbytes, meta


class Layout:
    """The C-contiguous layout of one (shape, itemsize): what send passes to
    the core and what recv checks a message's metadata against. Cached, since
    a program sends the same few shapes over and over."""

    __slots__ = ("dims", "strides", "nbytes")

    def __init__(self, shape: Tuple[int, ...], itemsize: int) -> None:
        strides = []
        step = itemsize
        for n in reversed(shape):
            strides.append(step)
            step *= n
        self.strides = tuple(reversed(strides))
        self.nbytes = math.prod(shape) * itemsize
        # shape then strides; read-only to the core, so safe to share between threads
        self.dims = ffi.new("int64_t[]", shape + self.strides)


def parse_descriptor(info: Any, desc: bytes) -> Tuple[np.dtype, Tuple[int, ...], int]:
    """Check a message descriptor read from shared memory (dtype, shape,
    strides) and cache what it means, keyed by its bytes."""
    dtype = _dtype_of(ffi.unpack(info.dtype, info.dtype_len))
    ndim = info.ndim
    dims = tuple(ffi.unpack(info.dims, 2 * ndim))
    shape = dims[:ndim]
    if min(shape, default=0) < 0:
        raise SegmentMismatch(f"message carries a negative dimension: {shape}")
    layout = layout_of(shape, dtype.itemsize)
    if layout.strides != dims[ndim:]:
        raise SegmentMismatch(f"message strides {dims[ndim:]} are not C-contiguous for shape {shape}")
    if len(descs) >= _MAX_CACHED:
        descs.clear()
    parsed = descs[desc] = (dtype, shape, layout.nbytes)
    return parsed


_layouts: Dict[Tuple[Tuple[int, ...], int], Layout] = {}


def layout_of(shape: Tuple[int, ...], itemsize: int) -> Layout:
    layout = _layouts.get((shape, itemsize))
    if layout is None:
        if len(shape) > lib.RDV_NDIM_MAX:
            raise InvalidArgument(f"array has {len(shape)} dimensions, at most {lib.RDV_NDIM_MAX} are supported")
        if len(_layouts) >= _MAX_CACHED:
            _layouts.clear()
        layout = _layouts[(shape, itemsize)] = Layout(shape, itemsize)
    return layout


class SendForm:
    """What send passes the core for one (dtype, shape): the dtype's code,
    the C-contiguous layout, and whether the values go as int64 bits
    (datetimes have no buffer protocol). Cached like the layouts."""

    __slots__ = ("code", "code_c", "code_len", "ndim", "dims", "strides", "nbytes", "bits")

    def __init__(self, dtype: np.dtype, shape: Tuple[int, ...]) -> None:
        self.code = _dtype_code(dtype)
        self.code_c = ffi.new("char[]", self.code)  # for send_many's items, which outlive a call's arguments
        self.code_len = len(self.code)
        layout = layout_of(shape, dtype.itemsize)
        self.ndim = len(shape)
        self.dims = layout.dims
        self.strides = layout.dims + self.ndim
        self.nbytes = layout.nbytes
        self.bits = dtype.kind in "mM"


send_forms: Dict[Tuple[np.dtype, Tuple[int, ...]], SendForm] = {}
# The same forms as send's hot path (fast.send_method) reads them: (dtype code, shape and strides as
# int64 bytes, nbytes); datetimes (sent as their int64 bits) are not here.
fast_forms: Dict[Tuple[np.dtype, Tuple[int, ...]], Tuple[bytes, bytes, int]] = {}


def send_form(dtype: np.dtype, shape: Tuple[int, ...]) -> SendForm:
    form = SendForm(dtype, shape)  # checks first: nothing unsendable is cached
    if len(send_forms) >= _MAX_CACHED:
        send_forms.clear()
        fast_forms.clear()
    send_forms[(dtype, shape)] = form
    if not form.bits:
        fast_forms[(dtype, shape)] = (form.code, ffi.buffer(form.dims, 16 * form.ndim)[:], form.nbytes)
    return form


def no_tensor_of(dtype: np.dtype) -> InvalidType:
    """Why a message of dtype cannot be received as a torch tensor."""
    return InvalidType(f"the message is {dtype}, which torch has no tensors of (only numbers and bool in native byte "
                       f"order, and bfloat16): receive it as an array (as_torch=False); it stays queued")


def size_mismatch(shape: Tuple[int, ...], dtype: np.dtype, nbytes: int) -> SegmentMismatch:
    """A message whose descriptor contradicts its payload's length."""
    return SegmentMismatch(f"message metadata does not match its payload: shape {shape} of {dtype} is not "
                           f"{nbytes} bytes")


def thread_scratch() -> Tuple[Any, Any, Any, int, int]:
    """This thread's reusable rdv_msg_info, waiter word, the info's bytes
    (a buffer over it, made once: the descriptor is read through it), and
    the info's and the waiter's addresses (for fast.recv). Kept in the
    thread's state dict (fast.keep_scratch), where recv's hot path finds it
    too: one scratch per thread for both, let go when the thread ends."""
    scratch = fast.scratch()
    if scratch is None:
        info, waiter = ffi.new("struct rdv_msg_info *"), ffi.new("uint32_t *")
        scratch = (info, waiter, ffi.buffer(info), address(info), address(waiter))
        fast.keep_scratch(scratch)
    return scratch  # type: ignore[no-any-return]


# The slow paths' calls of send and recv, made here: a lambda inside the hot
# method would make its variables cells, paid for on every call.
def sending(h: Any, kb: bytes, form: Any, src: Any) -> Callable[[int], int]:
    """rdv_send of this message, waiting up to ns."""
    return lambda ns: lib.rdv_send(h, kb, len(kb), form.code, form.code_len, form.ndim, form.dims, form.strides, src,
                                   form.nbytes, ns)


def receiving(h: Any, kb: bytes, flags: int, waiter: Any, info: Any) -> Callable[[int], int]:
    """rdv_recv_start of this key, waiting up to ns."""
    return lambda ns: lib.rdv_recv_start(h, kb, len(kb), ns, flags, waiter, info)


def any_keys(keys: Any) -> Tuple[List[str], bytes, Any]:
    """Check the keys of a recv_any: (names, their bytes concatenated, lengths)."""
    if isinstance(keys, (str, bytes)) or not hasattr(keys, "__iter__"):
        raise InvalidType(f"keys must be a list or tuple of str keys, not {type(keys).__name__}")
    names = list(keys)
    if not names:
        raise InvalidArgument("recv_any needs at least one key")
    if len(names) > lib.RDV_ANY_MAX:
        raise InvalidArgument(f"recv_any waits on at most {lib.RDV_ANY_MAX} keys, got {len(names)}")
    encoded = [_key_bytes(k) for k in names]
    if len(set(encoded)) != len(encoded):
        dup = next(k for i, k in enumerate(names) if encoded.index(encoded[i]) != i)
        raise InvalidArgument(f"recv_any keys must be distinct: {dup!r} is given twice")
    return names, b"".join(encoded), ffi.new("uint32_t[]", [len(k) for k in encoded])
