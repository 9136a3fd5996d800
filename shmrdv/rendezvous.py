"""``Rendezvous``: send and receive numpy tensors by key through one POSIX
shared-memory segment shared by every process that opens the same name."""
import contextlib
import errno
import math
import os
import re
import stat
import time
import warnings
import weakref
from functools import partial
from typing import Any, Callable, Dict, List, Mapping, NoReturn, Optional, Tuple, Union

import numpy as np
import posix_ipc

from . import async_recv, batches, huge_pages, limits
from ._binding import address, fast, ffi, lib, raise_rc
from .codec import _MAX_CACHED, _key_cache, as_sendable
from .codec import dtype_code as _dtype_code
from .codec import shape_of as _shape_of
from .codec import dtype_of as _dtype_of
from .codec import key_bytes as _key_bytes
from .codec import timeout_ns as _timeout_ns
from .errors import (HugePagesUnavailable, InvalidArgument, InvalidType, RendezvousError, RendezvousTimeout,
                     SegmentMismatch, SharedMemoryFull)
from .huge_pages import offered as huge_pages_offered
from .leftovers import CREATOR_GRACE_S, pid_gone, sweep
from .stats import KeyInfo, ProcessInfo, Stats
from .tensors import as_tensor, check_as_torch, is_torch_dtype, numpy_dtype, tensor_dtype_ok

DEFAULT_SIZE = 64 << 20
"""Arena bytes of a rendezvous created without ``size``."""
SEGMENT_PREFIX = "/shmrdv-"
"""A rendezvous NAME lives in the POSIX shm object ``/shmrdv-NAME`` (``/dev/shm/shmrdv-NAME``)."""

_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,%d}\Z" % lib.RDV_NAME_MAX)
_MAX_PROCS = limits.MAX_PROCS  # the segment's process table
OPEN_TIMEOUT = 60.0
"""Seconds ``Rendezvous(...)`` waits, by default, for the creator of a
segment that is still initialising it (see ``timeout``)."""
_PAGE = 4096
MAX_SIZE = limits.MAX_ARENA_BYTES
"""The largest arena a rendezvous can have, in bytes (2**36 - 4096, about 64 GiB)."""
MAX_KEYS = limits.MAX_KEYS
"""The largest max_keys a rendezvous can have (2**24)."""
_MSG_HEADER = 64  # sizeof(struct rdv_msg), csrc/rdv_layout.h


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _block_bytes(key_len: int, ndim: int, nbytes: int) -> Tuple[int, int]:
    """(block, header) bytes a message takes in the arena, as the core counts
    them for its size check (rdv_meta_bytes in csrc/rdv_queue.c): a header of
    rdv_msg, shape, strides, key and position rounded up to 64, then the payload."""
    meta = _round_up(_MSG_HEADER + 16 * ndim + key_len + 8, 64)
    return meta + nbytes, meta


def arena_size(size: object, what: str = "size") -> int:
    """Check an arena size argument (``size=``, or ``what``): a multiple of
    4096 in [4096, MAX_SIZE] (the one check, for every layer that takes one)."""
    size = _positive_int(size, what)
    if size > MAX_SIZE:
        raise InvalidArgument(f"{what}={size} is over the limit of a rendezvous: at most {MAX_SIZE} bytes "
                              f"(64 GiB less 4 KiB)")
    if size % _PAGE:
        below, above = size // _PAGE * _PAGE, _round_up(size, _PAGE)
        nearest = f"{what}={above}" if below == 0 else f"{what}={below} or {what}={above}"
        raise InvalidArgument(f"{what} must be a multiple of {_PAGE} bytes (a page), got {what}={size}: use {nearest}")
    return size


def private_name() -> str:
    """A name for a private rendezvous of this process: private-PID-RANDOM."""
    return f"private-{os.getpid()}-{os.urandom(6).hex()}"  # not secrets: it loads hmac


# private_name()'s form: kept for private rendezvous, which the sweep below
# may remove once their creator is gone; no other name is ever swept.
_PRIVATE_RE = re.compile(r"private-([0-9]{1,10})-[0-9a-f]{12}\Z", re.ASCII)


def private_pid(name: str) -> Optional[int]:
    """The creator's pid in a name of private_name()'s form, else None."""
    match = _PRIVATE_RE.match(name)
    return int(match.group(1)) if match else None


def sweep_dead_private() -> List[str]:
    """Remove this user's private rendezvous whose creating process is gone
    and that no process has attached: what a creator killed before it could
    unlink leaves (SIGKILL, or a SIGTERM nobody handled). Run by every
    ``Rendezvous()`` and by ``shmrdv gc``; returns the names removed."""

    def stale(rest: str, fd: int, st: os.stat_result) -> bool:
        pid = private_pid("private-" + rest)
        if pid is None or pid == os.getpid() or not pid_gone(pid):
            return False
        # Nobody attached, nor creating it: a file this young may be a
        # creator's (from another pid namespace) between its steps, when no
        # byte of it is locked for a moment (before the first, or after
        # publishing it and before attaching as an entry).
        return not lib.rdv_segment_in_use(fd) and time.time() - st.st_ctime >= CREATOR_GRACE_S

    return ["private-" + rest for rest in sweep(SEGMENT_PREFIX.lstrip("/") + "private-", stale)]


def _unlink_private(name: str, pid: int) -> None:
    # Only the creating process removes a private rendezvous: never a child
    # that inherited the object through fork and exits normally.
    if os.getpid() == pid:
        unlink_segment(name)


def _segment_file(path: str) -> str:
    return os.path.join("/dev/shm", path.lstrip("/"))


def checked_name(name: object, what: str, max_len: int) -> str:
    """A segment's name: 1..max_len characters of [A-Za-z0-9._-] (the one check of names)."""
    if not isinstance(name, str):
        raise InvalidType(f"{what} must be a str, not {type(name).__name__}")
    if not _NAME_RE.match(name) or len(name) > max_len:
        raise InvalidArgument(f"{what} must be 1..{max_len} characters of [A-Za-z0-9._-]: {name!r}")
    return name


def shm_open(path: str, what: str, *args: Any, **kwargs: Any) -> "posix_ipc.SharedMemory":
    """posix_ipc.SharedMemory(path, ...), whose bare ValueError for an entry
    that is no shared-memory file (a directory made under the name: /dev/shm
    is writable by every user) becomes a SegmentMismatch saying so."""
    try:
        return posix_ipc.SharedMemory(path, *args, **kwargs)
    except ValueError:
        raise SegmentMismatch(f"cannot open {what}: {_segment_file(path)} is not a shared-memory file (a directory?); "
                              f"remove it if it is yours, else use another name") from None


def check_owner(fd: int, name: str, path: str, *, what: str = "rendezvous", remove: str = "") -> None:
    """Attach only to a segment this user owns and nobody else can open:
    another local user could have created it first, to read the tensors
    sent through it or plant its own (PermissionError, naming owner and mode).
    ``what`` names the kind of segment, ``remove`` the command that removes
    it (``shmrdv rm NAME`` by default)."""
    st = os.fstat(fd)
    euid = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    remove = remove or f"shmrdv rm {name}"
    if st.st_uid != euid:
        raise PermissionError(errno.EACCES, f"refusing to attach to {what} {name!r}: its segment is owned by "
                              f"uid {st.st_uid} ({_user(st.st_uid)}), not by this user (uid {euid}), so its owner "
                              f"can read and change what is sent through it; remove it ({remove}, as its "
                              f"owner or root) or use another name", _segment_file(path))
    if mode & 0o077:
        raise PermissionError(errno.EACCES, f"refusing to attach to {what} {name!r}: its segment has mode "
                              f"{mode:04o}, open to group or others (shmrdv creates them 0600); remove it "
                              f"({remove}), or chmod 600 it if you trust what it holds", _segment_file(path))


def _user(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return "no such user"


def _segment_version(path: str) -> str:
    """The layout version a segment's header names (byte 8 in every version), for messages."""
    try:
        with open(os.path.join("/dev/shm", path.lstrip("/")), "rb") as f:
            head = f.read(12)
    except OSError:
        return "unknown"
    return str(int.from_bytes(head[8:12], "little")) if len(head) == 12 else "unknown"


MAX_MARKS = limits.MAX_MARKS
"""Producer marks per rendezvous: ``Rendezvous.mark(idx)`` takes idx in [0, MAX_MARKS)."""
_U64_MAX = (1 << 64) - 1
Mark = Tuple[int, int, int, int]
"""A producer mark change: (index, id, val0, val1)."""


def _mark_index(idx: object) -> int:
    if isinstance(idx, bool) or not isinstance(idx, int):
        raise InvalidType(f"mark index must be an int, not {type(idx).__name__}")
    if not 0 <= idx < MAX_MARKS:
        raise InvalidArgument(f"mark index must be in [0, {MAX_MARKS}), got {idx}")
    return idx


def _u64(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidType(f"{what} must be an int, not {type(value).__name__}")
    if not 0 <= value <= _U64_MAX:
        raise InvalidArgument(f"{what} must fit 64 unsigned bits, got {value}")
    return value


def _mark(mark: object) -> Mark:
    """Check a mark=(idx, id, val0, val1) argument."""
    if not isinstance(mark, tuple) or len(mark) != 4:
        raise InvalidType(f"mark must be None or a tuple (idx, id, val0, val1), not {mark!r}")
    idx, id_, val0, val1 = mark
    return (_mark_index(idx), _u64(id_, "mark id"), _u64(val0, "mark val0"), _u64(val1, "mark val1"))


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidType(f"{what} must be an int, not {type(value).__name__}")
    if value <= 0:
        raise InvalidArgument(f"{what} must be positive, got {value}")
    return value


class _Layout:
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


_FIRST_SLICE_NS = int(fast.FIRST_SLICE_NS)  # how soon a wait runs signal handlers (Ctrl-C) first
_MAX_SLICE_NS = 1_000_000_000


def _blocking(call: Callable[[int], int], timeout_ns: int) -> int:
    """Run a blocking core call, ``call(timeout_ns)``, for up to timeout_ns
    (-1: forever) and return its code.

    A signal interrupts a futex sleep (-EINTR) and its Python handler then runs
    here, between calls, and may raise (Ctrl-C: KeyboardInterrupt). A signal
    that lands just before the sleep begins cannot interrupt it, so a wait is
    cut into slices (10 ms doubling to 1 s) and the handler runs within one."""
    deadline = None if timeout_ns < 0 else time.monotonic_ns() + timeout_ns
    slice_ns = _FIRST_SLICE_NS
    left = timeout_ns
    while True:
        step = slice_ns if left < 0 or left > slice_ns else left
        rc = call(step)
        if rc != -errno.EINTR and not (rc == -errno.ETIMEDOUT and step != left):
            return rc
        if deadline is not None:
            left = max(0, deadline - time.monotonic_ns())
        slice_ns = min(2 * slice_ns, _MAX_SLICE_NS)


def _first_step(timeout_ns: int) -> int:
    """The timeout of a blocking call's first attempt: the whole wait, or its first slice."""
    return timeout_ns if 0 <= timeout_ns <= _FIRST_SLICE_NS else _FIRST_SLICE_NS


def _keep_waiting(rc: int, step: int, timeout_ns: int) -> bool:
    """Whether a first attempt ended early: a signal, or a slice that ran out."""
    return rc == -errno.EINTR or (rc == -errno.ETIMEDOUT and step != timeout_ns)


def _left(timeout_ns: int, step: int) -> int:
    # A first attempt cut short by a signal may have waited less than step: the
    # caller then waits up to step less than it asked, never more.
    return timeout_ns if timeout_ns < 0 else max(0, timeout_ns - step)


_async_pending = async_recv.pending  # recv_async futures outstanding in this process
_LEASED = int(lib.RDV_RECV_LEASED)
_RETRY = (-errno.ETIMEDOUT, -errno.EINTR)  # a receive's slice ran out, or a signal came

_DESC_OFFSET = ffi.offsetof("struct rdv_msg_info", "ndim")
_descs: Dict[bytes, Tuple[np.dtype, Tuple[int, ...], int]] = {}


def _parse_descriptor(info: Any, desc: bytes) -> Tuple[np.dtype, Tuple[int, ...], int]:
    """Check a message descriptor read from shared memory (dtype, shape,
    strides) and cache what it means, keyed by its bytes."""
    dtype = _dtype_of(ffi.unpack(info.dtype, info.dtype_len))
    ndim = info.ndim
    dims = tuple(ffi.unpack(info.dims, 2 * ndim))
    shape = dims[:ndim]
    if min(shape, default=0) < 0:
        raise SegmentMismatch(f"message carries a negative dimension: {shape}")
    layout = _layout(shape, dtype.itemsize)
    if layout.strides != dims[ndim:]:
        raise SegmentMismatch(f"message strides {dims[ndim:]} are not C-contiguous for shape {shape}")
    if len(_descs) >= _MAX_CACHED:
        _descs.clear()
    parsed = _descs[desc] = (dtype, shape, layout.nbytes)
    return parsed


_layouts: Dict[Tuple[Tuple[int, ...], int], _Layout] = {}


def _layout(shape: Tuple[int, ...], itemsize: int) -> _Layout:
    layout = _layouts.get((shape, itemsize))
    if layout is None:
        if len(shape) > lib.RDV_NDIM_MAX:
            raise InvalidArgument(f"array has {len(shape)} dimensions, at most {lib.RDV_NDIM_MAX} are supported")
        if len(_layouts) >= _MAX_CACHED:
            _layouts.clear()
        layout = _layouts[(shape, itemsize)] = _Layout(shape, itemsize)
    return layout


class _SendForm:
    """What send passes the core for one (dtype, shape): the dtype's code,
    the C-contiguous layout, and whether the values go as int64 bits
    (datetimes have no buffer protocol). Cached like the layouts."""

    __slots__ = ("code", "code_c", "code_len", "ndim", "dims", "strides", "nbytes", "bits")

    def __init__(self, dtype: np.dtype, shape: Tuple[int, ...]) -> None:
        self.code = _dtype_code(dtype)
        self.code_c = ffi.new("char[]", self.code)  # for send_many's items, which outlive a call's arguments
        self.code_len = len(self.code)
        layout = _layout(shape, dtype.itemsize)
        self.ndim = len(shape)
        self.dims = layout.dims
        self.strides = layout.dims + self.ndim
        self.nbytes = layout.nbytes
        self.bits = dtype.kind in "mM"


_send_forms: Dict[Tuple[np.dtype, Tuple[int, ...]], _SendForm] = {}
# The same forms as send's hot path (fast.send_method) reads them: (dtype code, shape and strides as
# int64 bytes, nbytes); datetimes (sent as their int64 bits) are not here.
_fast_forms: Dict[Tuple[np.dtype, Tuple[int, ...]], Tuple[bytes, bytes, int]] = {}


def _send_form(dtype: np.dtype, shape: Tuple[int, ...]) -> _SendForm:
    form = _SendForm(dtype, shape)  # checks first: nothing unsendable is cached
    if len(_send_forms) >= _MAX_CACHED:
        _send_forms.clear()
        _fast_forms.clear()
    _send_forms[(dtype, shape)] = form
    if not form.bits:
        _fast_forms[(dtype, shape)] = (form.code, ffi.buffer(form.dims, 16 * form.ndim)[:], form.nbytes)
    return form


def no_tensor_of(dtype: np.dtype) -> InvalidType:
    """Why a message of dtype cannot be received as a torch tensor."""
    return InvalidType(f"the message is {dtype}, which torch has no tensors of (only numbers and bool in native byte "
                       f"order, and bfloat16): receive it as an array (as_torch=False); it stays queued")


def size_mismatch(shape: Tuple[int, ...], dtype: np.dtype, nbytes: int) -> SegmentMismatch:
    """A message whose descriptor contradicts its payload's length."""
    return SegmentMismatch(f"message metadata does not match its payload: shape {shape} of {dtype} is not "
                           f"{nbytes} bytes")


def _thread_scratch() -> Tuple[Any, Any, Any, int, int]:
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
def _sending(h: Any, kb: bytes, form: Any, src: Any) -> Callable[[int], int]:
    """rdv_send of this message, waiting up to ns."""
    return lambda ns: lib.rdv_send(h, kb, len(kb), form.code, form.code_len, form.ndim, form.dims, form.strides, src,
                                   form.nbytes, ns)


def _receiving(h: Any, kb: bytes, flags: int, waiter: Any, info: Any) -> Callable[[int], int]:
    """rdv_recv_start of this key, waiting up to ns."""
    return lambda ns: lib.rdv_recv_start(h, kb, len(kb), ns, flags, waiter, info)


def _any_keys(keys: Any) -> Tuple[List[str], bytes, Any]:
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


async def _with_timeout(start: Callable[[], Any], timeout: Optional[float], what: str) -> Any:
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


def default_max_keys(arena: int) -> int:
    """max_keys of a rendezvous created without one: size/4096, clamped to 1,024..1,048,576."""
    return max(1024, min(arena // 4096, 1 << 20))


def no_space_error(what: str, arena: int, max_keys: Optional[int], size_word: str = "size") -> SharedMemoryFull:
    """The error of a create that /dev/shm has no room for: what the segment
    needs, what is free, the largest ``size_word`` that fits now (with
    max_keys None: its default for each size, as a create without it gets)."""

    def needs(size: int) -> int:
        return int(lib.rdv_segment_bytes(size, default_max_keys(size) if max_keys is None else max_keys))

    try:
        st = os.statvfs("/dev/shm")
        free: Optional[int] = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    if free is None:
        advice = "free space unknown; "
    else:
        lo, hi = 0, arena // _PAGE - 1  # in pages: the largest arena whose segment fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if needs(mid * _PAGE) <= free else (lo, mid - 1)
        fits = lo * _PAGE if lo and needs(lo * _PAGE) <= free else 0
        advice = f"{free:,} bytes free; " + (f"pass a smaller {size_word}= ({size_word}={fits} fits now), " if fits else
                                            f"not even the smallest rendezvous ({needs(_PAGE):,} bytes) fits: ")
    return SharedMemoryFull(
        errno.ENOSPC,
        f"{what}: /dev/shm has no room: the segment needs {needs(arena):,} bytes (its {arena:,}-byte arena, key "
        f"index, side table and process table) and /dev/shm has {advice}free space there, or enlarge it "
        f"(docker run --shm-size, a memory-backed emptyDir in Kubernetes)")


def unlink_segment(name: str) -> None:
    """Remove the segment of rendezvous ``name`` if it exists."""
    try:
        posix_ipc.unlink_shared_memory(SEGMENT_PREFIX + name)
    except posix_ipc.ExistentialError:
        pass


# alloc's (dtype, shape) arguments, as given, -> (numpy dtype, shape, torch), checked: a loop of one
# kind of allocation checks it once. Only shapes that are tuples of ints are looked up (2.0 == 2).
_alloc_kinds: Dict[Tuple[Any, Tuple[int, ...]], Tuple[np.dtype, Tuple[int, ...], bool]] = {}


def _int_tuple(shape: Any) -> bool:
    if type(shape) is not tuple:
        return False
    for d in shape:
        if type(d) is not int:
            return False
    return True


def _alloc_kind(key: str, dtype: Any, shape: Any, remember: bool) -> Tuple[np.dtype, Tuple[int, ...], bool]:
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

    def __init__(self, rdv: "Rendezvous", key: str, kb: bytes, dtype: np.dtype, shape: Tuple[int, ...], timeout_ns: int,
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
        fast_form = _fast_forms.get((dtype, shape))
        if fast_form is not None:  # a form reserved or sent before: in C, if there is room now
            got = fast.alloc_view(rdv._h_addr, kb, fast_form, dtype, shape)
            if type(got) is tuple:
                self._h = h
                self._pos, buf = got
                self._buf = buf
                return as_tensor(buf) if self._tensor else buf
            if got is not None:
                self._fail_open(got, len(fast_form[1]) // 16, fast_form[2])
        form = _send_forms.get((dtype, shape)) or _send_form(dtype, shape)
        ndim, nbytes = form.ndim, form.nbytes
        out = ffi.new("uint64_t[2]")  # the block position, then the payload address
        payload = ffi.cast("void **", out + 1)
        rc = _blocking(lambda ns: lib.rdv_send_begin(h, kb, len(kb), form.code, form.code_len, ndim, form.dims,
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
        rdv._fail(rc, f"alloc {self._key!r}", partial(rdv._explain_space, f"alloc {self._key!r}", len(self._kb), ndim,
                                                      nbytes, timeout))

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
        if _async_pending[0]:
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
            self._mark = _mark(mark)
        self.__exit__(None, None, None)


_open_rendezvous: "weakref.WeakSet[Rendezvous]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for rdv in list(_open_rendezvous):
        rdv._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# The bridge layer's router for Rendezvous(routes=...): a callable (routes,
# token, tls_ca) -> router, installed by the package (shmrdv/__init__.py) so
# that this module never imports the bridge. A router has table, token,
# tls_ca, url_for(key), announce(rdv), tell_abort(reason), send(rdv, url, key, array, timeout)
# and alloc(rdv, url, key, dtype, shape, timeout, tensor) (tensor: the
# buffer is a torch tensor).
_router_factory: Optional[Callable[..., Any]] = None


def install_router(factory: Callable[..., Any]) -> None:
    """Set the router factory (the bridge layer's routing.Routes)."""
    global _router_factory
    _router_factory = factory


def _router(routes: Mapping[str, str], token: Union[str, bytes, None], tls_ca: Optional[str]) -> Any:
    if _router_factory is None:
        raise RendezvousError("routes need the bridge layer: import shmrdv (not shmrdv.rendezvous alone)")
    return _router_factory(routes, token, tls_ca)


class Rendezvous(fast.Handle):
    """A table of FIFO channels keyed by string, in one shared-memory segment.

    ``Rendezvous(name)`` attaches to the rendezvous ``name`` if it exists and
    creates it otherwise (``create=True``: create or ``FileExistsError``;
    ``create=False``: attach or ``FileNotFoundError``). ``size`` is the arena's
    payload capacity in bytes: a multiple of 4096, at most ``MAX_SIZE`` (about
    64 GiB); default 64 MiB; header and key index come on top. ``max_keys``
    is how many keys may be live at once (default scales with size). Both
    only apply when creating: attaching with a ``size`` or ``max_keys`` the
    existing segment does not have raises ``SegmentMismatch``. The segment is
    created mode 0600 as ``/dev/shm/shmrdv-NAME`` and lives until
    ``unlink()``: messages survive the processes that sent them.

    ``timeout``: how long to wait (seconds; None: as long as it takes) for a
    creator that is still initialising the segment, e.g. reserving a big
    arena; default ``OPEN_TIMEOUT`` (60 s). A segment whose creator died
    before initialising it raises ``SegmentMismatch`` at once, naming it;
    ``shmrdv rm NAME`` removes it.

    ``Rendezvous()`` with no name opens a private rendezvous for this process
    and the processes it hands it to: it gets a unique name
    (``private-PID-RANDOM``, see ``name``), is always created, and is
    unlinked when this handle closes (``close``, the ``with`` block's end,
    garbage collection) or this process exits normally. Pass it to children
    (``multiprocessing`` arguments, pickling): each attaches by name, and a
    child's handle never unlinks it. Children that attach after the creator
    closed it find nothing (``FileNotFoundError``); those already attached
    keep working. A creator killed by a signal (SIGKILL, a SIGTERM nobody
    handles) cannot unlink it: the next ``Rendezvous()`` this user opens on
    the machine removes it once no process has it attached, and so does
    ``shmrdv gc``.

    ``routes`` maps TF device prefixes to the bridges of other hosts, e.g.
    ``{"/job:worker/replica:0/task:1": "tcp://hostB:7700"}``, with the shared
    ``token`` (str or bytes) those bridges expect and, for ``tls://`` routes,
    ``tls_ca`` to verify them. A ``send`` (or ``alloc``) whose key's
    ``dst_device`` lies under a route is queued in this rendezvous for this
    host's bridge (``shmrdv bridge``), which delivers it exactly once to the
    remote rendezvous, where an ordinary ``recv`` takes it. Other keys stay
    local.

    ``huge_pages=True`` (when creating) maps the segment with transparent
    huge pages advised, in the creator and in every process that attaches:
    copies of hundreds of MiB no longer lose a quarter of their speed to TLB
    misses. It needs a /dev/shm that gives them (a tmpfs mounted
    ``huge=within_size``, ``always`` or ``advise``, or shmem_enabled
    ``force``): otherwise ``HugePagesUnavailable`` says what this machine
    lacks. ``stats().huge_pages`` and ``huge_page_bytes`` tell what a
    segment asked for and got; attaching with ``huge_pages=True`` to one
    created without raises ``SegmentMismatch``. Default off: 4 KiB pages
    work everywhere.

    ``prefault=False`` (when creating) maps the segment, in the creator and
    in every process that attaches, without faulting all its pages in up
    front: creating 256 MiB then takes ~50 ms instead of ~150 ms, and an
    attach ~6 ms instead of ~30 ms, but each page costs several times a
    copy the first time a process touches it. Its memory is still reserved,
    so a short /dev/shm fails here, never later. For a segment much larger
    than what is touched soon, or one that must be ready at once (the data
    loader's arena); not with ``huge_pages=True`` (``InvalidArgument``:
    faulting pages in is what makes them huge). The default, None, creates
    a prefaulted segment; those who attach map it as its creator chose
    (``stats().prefault``), and attaching with a ``prefault`` the segment
    does not have raises ``SegmentMismatch``.
    """

    def __init__(
        self,
        name: Optional[str] = None,
        *,
        size: Optional[int] = None,
        create: Optional[bool] = None,
        max_keys: Optional[int] = None,
        routes: Optional[Mapping[str, str]] = None,
        token: Union[str, bytes, None] = None,
        tls_ca: Optional[str] = None,
        timeout: Optional[float] = OPEN_TIMEOUT,
        huge_pages: bool = False,
        prefault: Optional[bool] = None,
    ) -> None:
        self._h = None
        self._finalizer: Optional[weakref.finalize] = None
        self._routes: Any = None if routes is None else _router(routes, token, tls_ca)
        self._forked = False
        self._completions: Optional[async_recv.Completions] = None
        private = name is None
        if private:
            if create is False:
                raise InvalidArgument("Rendezvous() with no name creates a private rendezvous: create=False needs a name")
            name, create = private_name(), True
            sweep_dead_private()
        name = checked_name(name, "name", lib.RDV_NAME_MAX)
        if create not in (None, True, False):
            raise InvalidType(f"create must be None, True or False, not {create!r}")
        owner = private_pid(name)
        if not private and owner is not None and owner != os.getpid():
            # Another process's private name (its children attach by it): the
            # sweep may remove such a segment once that pid is gone, so only
            # its own process ever creates one.
            if create:
                raise InvalidArgument(f"{name!r} has the form of process {owner}'s private rendezvous names "
                                      f"(private-PID-HEX), which only Rendezvous() with no name makes: use another "
                                      f"name, or attach to it (create=False)")
            create = False
        req_size = None if size is None else arena_size(size)
        arena = DEFAULT_SIZE if req_size is None else req_size
        keys = default_max_keys(arena) if max_keys is None else _positive_int(max_keys, "max_keys")
        if keys > limits.MAX_KEYS:
            raise InvalidArgument(f"max_keys is at most {limits.MAX_KEYS:,} (shmrdv.MAX_KEYS), got {keys:,}")
        wait_ns = _timeout_ns(timeout)
        if huge_pages not in (True, False):
            raise InvalidType(f"huge_pages must be True or False, not {huge_pages!r}")
        if prefault not in (None, True, False):
            raise InvalidType(f"prefault must be None, True or False, not {prefault!r}")
        if huge_pages and prefault is False:
            raise InvalidArgument("huge_pages=True with prefault=False: huge pages are made by faulting the segment "
                                  "in as it is mapped; drop one of the two")
        self._name = name
        self._path = SEGMENT_PREFIX + name
        flags = (lib.RDV_CREATE_HUGE_PAGES if huge_pages else 0) | (lib.RDV_CREATE_NO_PREFAULT if prefault is False else 0)
        self._h = self._open(arena, keys, create, wait_ns, flags, asked_keys=max_keys)
        self._capacity = int(lib.rdv_capacity(self._h))
        if private:
            self._finalizer = weakref.finalize(self, _unlink_private, name, os.getpid())
        if not self._created:
            self._check_attached(req_size, max_keys, huge_pages, prefault)
        self._attach_handle(self._h)
        if self._routes is not None:
            self._routes.announce(self)

    def _check_attached(self, size: Optional[int], max_keys: Optional[int], huge: bool,
                        prefault: Optional[bool]) -> None:
        """An attach that asked for a size, max_keys, huge pages or a way of
        faulting pages in gets a segment that has them."""
        differ = []
        out = ffi.new("struct rdv_stats *")
        known = lib.rdv_stats(self._h, out) == 0
        if known:
            if huge and not out.flags & lib.RDV_CREATE_HUGE_PAGES:
                differ.append(("huge_pages", False, True))
            has_prefault = not out.flags & lib.RDV_CREATE_NO_PREFAULT
            if prefault is not None and prefault != has_prefault:
                differ.append(("prefault", has_prefault, prefault))
        if size is not None and size != self._capacity:
            differ.append(("size", self._capacity, size))
        if known and max_keys is not None and out.max_keys != max_keys:
            differ.append(("max_keys", int(out.max_keys), max_keys))
        if not differ:
            return
        self.close()
        has = " and ".join(f"{what}={value}" for what, value, _ in differ)
        asked = " and ".join(f"{what}={value}" for what, _, value in differ)
        raise SegmentMismatch(
            f"rendezvous {self._name!r} already exists with {has}, not the {asked} asked for (size, "
            f"max_keys, huge_pages and prefault only apply when creating it): attach without them, or with {has}; or "
            f"remove it first (shmrdv rm {self._name}) to create it anew with {asked}")

    # ---- lifecycle ---------------------------------------------------------

    def _open(self, arena: int, max_keys: int, create: Optional[bool], wait_ns: int = -1, flags: int = 0,
              asked_keys: Optional[int] = None) -> Any:
        """The handle: created or attached. ``asked_keys``: the max_keys the
        caller gave (None: the default for each size), for what a create
        that /dev/shm has no room for says would fit."""
        out = ffi.new("rdv_t **")
        deadline = None if wait_ns < 0 else time.monotonic() + wait_ns / 1e9
        pause = 0.001
        while True:
            if create is not False:
                try:
                    shm = shm_open(self._path, f"rendezvous {self._name!r}", posix_ipc.O_CREX, mode=0o600)
                except posix_ipc.ExistentialError:
                    if create:
                        raise FileExistsError(errno.EEXIST, "rendezvous already exists", self._name) from None
                else:
                    try:
                        offer = huge_pages_offered() if flags & lib.RDV_CREATE_HUGE_PAGES else None
                        if offer is not None and not offer.available:
                            rc = -errno.EOPNOTSUPP
                        else:
                            rc = lib.rdv_create_flags(shm.fd, arena, max_keys, flags, out)
                    except BaseException:
                        if out[0] != ffi.NULL:  # made before the exception came: let it go too
                            lib.rdv_close(out[0])
                        with contextlib.suppress(posix_ipc.ExistentialError):
                            posix_ipc.unlink_shared_memory(self._path)  # ours, never initialised: not left behind
                        raise
                    finally:
                        shm.close_fd()
                    if rc < 0:
                        posix_ipc.unlink_shared_memory(self._path)
                        if rc == -errno.ENOSPC:
                            raise no_space_error(f"cannot create rendezvous {self._name!r}", arena, asked_keys)
                        if rc == -errno.EOPNOTSUPP and flags & lib.RDV_CREATE_HUGE_PAGES:
                            why = offer.why if offer is not None and not offer.available else \
                                "the kernel refuses to advise huge pages for it (MADV_HUGEPAGE)"
                            raise HugePagesUnavailable(f"rendezvous {self._name!r}: huge_pages=True, but {why}; or "
                                                       f"create it without huge_pages (4 KiB pages; copies of 100 MiB "
                                                       f"and more are then about a quarter slower)")
                        raise_rc(rc, f"creating rendezvous {self._name!r} ({arena} bytes)")
                    self._created = True
                    return out[0]
            try:
                shm = shm_open(self._path, f"rendezvous {self._name!r}")  # O_NOFOLLOW
            except posix_ipc.ExistentialError:
                if create is False:
                    raise FileNotFoundError(errno.ENOENT, "no such rendezvous", self._name) from None
                continue  # unlinked between our create and attach attempts
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise PermissionError(errno.EACCES, f"refusing to attach to rendezvous {self._name!r}: its "
                                          f"segment is a symbolic link; remove it (shmrdv rm {self._name})",
                                          _segment_file(self._path)) from None
                raise
            try:
                check_owner(shm.fd, self._name, self._path)
                rc = lib.rdv_attach(shm.fd, out)
                age = time.time() - os.fstat(shm.fd).st_ctime if rc == -errno.EOWNERDEAD else 0.0
            finally:
                shm.close_fd()
            if rc in (-errno.EAGAIN, -errno.EOWNERDEAD):
                # EAGAIN: its creator is alive and still initialising it.
                # EOWNERDEAD: nobody is: a creator that died, unless the file
                # is so new that its creator may not have locked it yet.
                late = deadline is not None and time.monotonic() >= deadline
                if rc == -errno.EOWNERDEAD and (age >= CREATOR_GRACE_S or late):
                    raise SegmentMismatch(
                        f"rendezvous {self._name!r} was never initialised: the process that created its segment "
                        f"died before finishing (or it is not a shmrdv segment); remove it (shmrdv rm {self._name}) "
                        f"and open it again")
                if late:
                    raise RendezvousTimeout(
                        f"attaching to rendezvous {self._name!r}: its creator is alive but still initialising "
                        f"it after {wait_ns / 1e9:g} s; pass a longer timeout= (None waits as long as it takes)")
                time.sleep(pause)
                pause = min(2 * pause, 0.05)
                continue
            if rc == -errno.EPROTONOSUPPORT:
                version = _segment_version(self._path)
                what = (f"was made with options this shmrdv does not know (a newer shmrdv's)"
                        if version == str(lib.RDV_LAYOUT_VERSION) else
                        f"has layout version {version}, this shmrdv uses version {lib.RDV_LAYOUT_VERSION}")
                raise SegmentMismatch(
                    f"attaching to rendezvous {self._name!r}: its segment {what}; recreate it "
                    f"(shmrdv rm {self._name}) with this shmrdv, or use the shmrdv that made it")
            if rc < 0:
                raise_rc(rc, f"attaching to rendezvous {self._name!r}")
            self._created = False
            return out[0]

    @property
    def name(self) -> str:
        """The rendezvous name (the segment is ``/dev/shm/shmrdv-NAME``)."""
        return self._name

    @property
    def capacity(self) -> int:
        """Arena size in bytes."""
        return self._capacity

    @property
    def closed(self) -> bool:
        return self._h is None

    def close(self) -> None:
        """Detach this handle; idempotent. Views and ``alloc`` buffers already
        handed out stay valid until they are dropped; pending ``recv_async``
        futures are cancelled. The segment stays (see ``unlink``), except
        that closing the handle that created a private rendezvous
        (``Rendezvous()``) unlinks it."""
        h, self._h = self._h, None
        self._forked = False
        if h is not None:
            comp, self._completions = self._completions, None
            if comp is not None:
                comp.close()  # pending recv_async futures are cancelled
            lib.rdv_close(h)
        if self._finalizer is not None:
            self._finalizer()  # a private rendezvous: unlinked (in its creating process only)

    @property
    def private(self) -> bool:
        """Whether this handle created a private rendezvous (``Rendezvous()``),
        which it unlinks when it closes."""
        return self._finalizer is not None

    def unlink(self) -> None:
        """Remove the segment's name; idempotent. Processes still attached keep
        their mapping; nothing remains under /dev/shm once all have closed."""
        unlink_segment(self._name)

    def __enter__(self) -> "Rendezvous":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_h", None) is not None:
            warnings.warn(f"unclosed {self!r}", ResourceWarning, stacklevel=2)
            self.close()

    def __repr__(self) -> str:
        if self._h is None:
            state = "closed"
        else:
            state = "aborted" if self.stats().aborted else "open"
        return f"<Rendezvous name={self._name!r} capacity={self._capacity} state={state}>"

    def __reduce__(self) -> Tuple[Any, Tuple[str]]:
        # A child process re-attaches by name instead of pickling a mapping.
        if self._routes is None:
            return (partial(Rendezvous, create=False), (self._name,))
        r = self._routes
        return (partial(Rendezvous, create=False, routes=r.table, token=r.token or None, tls_ca=r.tls_ca), (self._name,))

    def _handle(self) -> Any:
        h = self._h
        if h is None:
            if not self._forked:
                raise RendezvousError(f"rendezvous {self._name!r} is closed")
            self._attach_handle(self._open(0, 0, False))  # in a forked child: our own handle
            h = self._h
        return h

    def _attach_handle(self, h: Any) -> None:
        self._h = h
        self._h_addr = address(h)  # for fast's calls, which take addresses
        self._forked = False
        self._release = partial(lib.rdv_release_payload, h)
        self._give_back = partial(lib.rdv_give_back, h)
        self._unref = partial(self._unref_payload, h)
        _open_rendezvous.add(self)

    def _after_fork_in_child(self) -> None:
        # The parent's handle, its views and its process-table entry stay the
        # parent's: the core ignores them in this process. The next call
        # attaches a handle of our own.
        if self._h is not None:
            self._h = None
            self._forked = True
            self._completions = None  # the parent's waiters, and its thread
        if self._finalizer is not None:
            # A private rendezvous is the parent's to unlink, not this child's.
            self._finalizer.detach()
            self._finalizer = None

    def _fail(self, rc: int, what: str, explain: Optional[Callable[[int], Optional[str]]] = None) -> NoReturn:
        raise_rc(rc, what, self._abort_reason, name=self._name, explain=explain)

    def _error(self, rc: int, what: str) -> RendezvousError:
        """The exception _fail would raise, for a future to carry."""
        try:
            self._fail(rc, what)
        except RendezvousError as exc:
            return exc

    def _closed_error(self) -> RendezvousError:
        return RendezvousError(f"rendezvous {self._name!r} is closed")

    def _explain_wait(self, what: str, timeout: Optional[float], code: int) -> Optional[str]:
        """The message of a receive whose timeout ran out: how long, who else
        has the rendezvous, and where to look."""
        if code != errno.ETIMEDOUT or timeout is None:
            return None
        try:
            others = len({p.pid for p in self.processes() if p.alive and p.pid != os.getpid()})
        except RendezvousError:
            return None
        return (f"{what}: nothing came within {float(timeout):g} s; {others} other live process(es) have rendezvous "
                f"{self._name!r} attached (`shmrdv stat {self._name}` shows its keys, pending messages and "
                f"waiting receivers)")

    def _constructor(self, size: int) -> str:
        """How to make a rendezvous like this one with another size, for messages."""
        return f"Rendezvous(size={size})" if self.private else f"Rendezvous({self._name!r}, size={size})"

    def _explain_space(self, what: str, key_len: int, ndim: int, nbytes: int, timeout: Optional[float], code: int) -> Optional[str]:
        """The message of a send or alloc that found no room: one that can
        never fit (EMSGSIZE) or a wait for space that ran out (ETIMEDOUT)."""
        block, meta = _block_bytes(key_len, ndim, nbytes)
        cap = self._capacity
        if code == errno.EMSGSIZE:
            needs = (f"{what}: the message needs a block of {block} bytes ({nbytes} of payload, {meta} of header), "
                     f"more than this rendezvous's {cap}-byte arena, so it can never fit however much is freed")
            size = _round_up(block, _PAGE)
            if size > MAX_SIZE:
                return f"{needs}; no rendezvous can hold it either (at most size={MAX_SIZE}, about 64 GiB): send it in parts"
            remove = "" if self.private else f" (remove this one first: shmrdv rm {self._name})"
            return (f"{needs}; create the rendezvous with room for it{remove}: {self._constructor(size)} "
                    f"holds one such message, a larger size several at once")
        if code != errno.ETIMEDOUT:
            return None
        try:
            st, procs = self.stats(), self.processes()
        except RendezvousError:
            return None
        views = sum(p.views for p in procs)
        view_bytes = sum(p.view_bytes for p in procs)
        writing = sum(p.writing for p in procs)
        waited = "with timeout=0" if timeout == 0 else f"after {timeout:g} s"
        held = f"{st.bytes_used} bytes held by {views} views ({view_bytes} bytes) and {st.pending_messages} pending messages"
        if writing:
            held += f" and {writing} blocks being written"
        return (f"{what}: timed out {waited} waiting for a free block of {block} bytes: arena full: {st.bytes_free} bytes "
                f"free (largest free block {st.largest_free}), {held}. A received view keeps its space until it and every "
                f"array derived from it are gone (del them): receive what is pending, drop views no longer needed, or "
                f"create the rendezvous with a larger size than its {cap} bytes")

    def _abort_reason(self) -> str:
        buf = ffi.new("char[]", lib.RDV_REASON_MAX)
        n = ffi.new("uint32_t *")
        if self._h is None or lib.rdv_abort_reason(self._h, buf, lib.RDV_REASON_MAX, n) < 0:
            return "aborted"
        return ffi.unpack(buf, n[0]).decode("utf-8", "replace")

    # ---- sending -----------------------------------------------------------

    @staticmethod
    def _sendable(array: object) -> np.ndarray:
        return as_sendable(array)

    def send(self, key: str, array: Any, *, timeout: Optional[float] = None) -> None:
        """Queue a copy of ``array`` under ``key``; a later (or waiting) ``recv``
        of the key in any process gets it. One copy, into shared memory.

        Blocks only while the arena is full, up to ``timeout`` seconds (None:
        forever), then raises ``RendezvousTimeout``. ``MessageTooLarge`` at once
        if the message can never fit. Once this returns, the message survives
        the sending process. Non-contiguous arrays are sent as C-contiguous.

        ``array`` may be a CPU torch tensor of any dtype numpy has, or
        bfloat16 (received as ``ml_dtypes.bfloat16``, or as torch.bfloat16
        with ``as_torch=True``; ``pip install ml_dtypes``). A tensor that
        requires grad sends its data (``.detach()``): the message is values,
        with no autograd history. Non-contiguous tensors are sent as
        C-contiguous, conjugate or negative views resolved. A CUDA (or other
        non-CPU) tensor, a sparse one, or a dtype numpy has no counterpart
        of (complex32, float8, quantized) raises ``InvalidType`` saying what
        to convert it to."""
        # The hot path (a key and a form sent before, a timeout of None or
        # seconds, a C-contiguous array, and room) runs whole in C, before
        # this: see fast.send_method below the class. This is the rest.
        h = self._h
        kb = _key_cache.get(key) if type(key) is str else None
        if kb is None:
            kb = _key_bytes(key)
        if self._routes is not None:
            url = self._routes.url_for(key)
            if url is not None:
                self._routes.send(self, url, key, array, timeout)
                return
        t = -1 if timeout is None else _timeout_ns(timeout)
        arr = array if type(array) is np.ndarray else self._sendable(array)
        if h is None:
            h = self._handle()
        dtype = arr.dtype
        form = _send_forms.get((dtype, arr.shape)) or _send_form(dtype, arr.shape)
        if arr.flags.c_contiguous:
            step = t if 0 <= t <= _FIRST_SLICE_NS else _FIRST_SLICE_NS  # _first_step, inline: the hot path
            src = ffi.from_buffer(arr.view(np.int64) if form.bits else arr)  # datetimes: their int64 bits
            rc = lib.rdv_send(h, kb, len(kb), form.code, form.code_len, form.ndim, form.dims, form.strides, src,
                              form.nbytes, step)
            if rc < 0:
                if _keep_waiting(rc, step, t):
                    rc = _blocking(_sending(h, kb, form, src), _left(t, step))
                if rc < 0:
                    self._fail(rc, f"send {key!r}", partial(self._explain_space, f"send {key!r}", len(kb), form.ndim,
                                                            form.nbytes, timeout))
            if _async_pending[0]:
                async_recv.after_send()  # a future of ours it served is done when we return
            return
        with Allocation(self, key, kb, dtype, arr.shape, t) as dst:
            np.copyto(dst, arr)

    @property
    def routes(self) -> Dict[str, str]:
        """The route table given at construction (empty: every key is local)."""
        return {} if self._routes is None else self._routes.table

    @staticmethod
    def _unref_payload(h: Any, _payload: Any) -> None:
        lib.rdv_unref(h)

    def alloc(
        self, key: str, shape: Any, dtype: Any, *, timeout: Optional[float] = None, mark: Optional[Mark] = None
    ) -> "Allocation":
        """Zero-copy producer: ``with rdv.alloc(key, shape, dtype) as buf:``
        gives a writable array inside shared memory. ``dtype`` is a numpy
        dtype (anything ``np.dtype`` takes, ``ml_dtypes.bfloat16`` too) or a
        torch dtype (``torch.float32``, ``torch.bfloat16``, ...): then ``buf``
        is a writable torch tensor over the same memory.

        On clean exit of the ``with`` block the array is published under
        ``key`` exactly as ``send`` would; on an exception its space is freed
        and nothing is sent. The array is read-only once the block ends (its
        memory may soon hold another message): a write through it raises
        ValueError. Views of it made inside the block, and a torch tensor,
        cannot be sealed so: do not write through them afterwards.
        Entering blocks like ``send`` while the arena is full.

        ``mark=(idx, id, val0, val1)``: publishing also sets producer mark
        ``idx`` to ``(id, val0, val1)`` (see ``mark``), atomically with respect
        to this process's death: once a dead producer has been reclaimed,
        either the message is queued and the mark set, or neither. A publish
        that fails, or an exception in the block, leaves the mark as it was."""
        kb = _key_bytes(key)
        t = _timeout_ns(timeout)
        checked_mark = None if mark is None else _mark(mark)
        kind, ints = None, _int_tuple(shape)
        if ints:
            try:
                kind = _alloc_kinds.get((dtype, shape))
            except TypeError:
                pass  # an unhashable dtype argument (a structured dtype's list, say)
        if kind is None:
            kind = _alloc_kind(key, dtype, shape, ints)
        dt, shp, tensor = kind
        if self._routes is not None:
            url = self._routes.url_for(key)
            if url is not None:
                if mark is not None:
                    raise InvalidArgument(f"alloc {key!r}: producer marks are local; this key is routed to {url.decode()}")
                return self._routes.alloc(self, url, key, dt, shp, timeout, tensor)  # type: ignore[no-any-return]
        return Allocation(self, key, kb, dt, shp, t, checked_mark, tensor)

    # ---- producer marks ----------------------------------------------------

    def mark(self, idx: int) -> Tuple[int, int, int]:
        """Producer mark ``idx`` as ``(id, val0, val1)``.

        producer marks: for idempotent producers such as the network bridge;
        see docs. A rendezvous holds ``MAX_MARKS`` (64) marks, each three
        unsigned 64-bit words, all zero until set; id 0 means unused. A
        producer records in a mark how far it got (e.g. the last sequence
        number it published for a remote sender) with ``alloc(...,
        mark=...)``, and a producer restarted after a crash reads it back
        here. Each mark must have one writer at a time.

        Returns a value some change left, never one in the middle of a
        change: waits (briefly) while a live writer is changing the mark, and
        reclaims a dead writer first, rolling its change back if its message
        was not committed. ``InvalidArgument`` if idx is out of range."""
        i = _mark_index(idx)
        out = ffi.new("uint64_t[3]")
        rc = lib.rdv_mark_get(self._handle(), i, out, out + 1, out + 2)
        if rc < 0:
            raise_rc(rc, f"mark {i}")
        return (int(out[0]), int(out[1]), int(out[2]))

    def set_mark(self, idx: int, id: int, val0: int, val1: int) -> None:
        """Set producer mark ``idx`` to ``(id, val0, val1)`` with no message:
        to claim a mark or reset it (see ``mark``). Atomic with respect to
        this process's death (a death before it returns may leave the old
        value). Never blocks for long. ``InvalidArgument`` if idx is out of
        range or a value does not fit 64 unsigned bits."""
        i, id_, v0, v1 = _mark((idx, id, val0, val1))
        rc = lib.rdv_mark_set(self._handle(), i, id_, v0, v1)
        if rc < 0:
            raise_rc(rc, f"set_mark {i}")

    # ---- receiving ---------------------------------------------------------

    def _view(self, info: Any, writable: bool = False, as_torch: bool = False, info_bytes: Any = None) -> Any:
        """The view of the message taken into info: an array, or with as_torch
        a torch tensor (over writable memory: torch has no read-only tensors,
        and warns about read-only arrays). A message this process cannot
        represent (bfloat16 without ml_dtypes; for a tensor, a dtype torch
        lacks) goes back to the head of its key, and InvalidType says why."""
        desc = (ffi.buffer(info) if info_bytes is None else info_bytes)[_DESC_OFFSET : _DESC_OFFSET + 40 + 16 * info.ndim]
        parsed = _descs.get(desc)
        if parsed is None:
            try:
                parsed = _parse_descriptor(info, desc)
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
        info, waiter, info_bytes, info_addr, waiter_addr = _thread_scratch()
        flags = _LEASED if lease else 0
        step = t if 0 <= t <= _FIRST_SLICE_NS else _FIRST_SLICE_NS  # _first_step, inline
        try:
            if started is not None:
                rc = started
            elif as_torch:
                rc = lib.rdv_recv_start(h, kb, len(kb), step, flags, waiter, info)
            else:  # the start, and the view when the descriptor is known: in C
                rc = fast.recv(self._h_addr, kb, step, flags, writable, info_addr, waiter_addr, _descs)
                if type(rc) is not int:
                    if rc is not None:
                        return rc
                    rc = 0  # taken, into info: its view is made below
            if rc < 0 and (waiter[0] or (rc in _RETRY and step != t)):  # keep our place in line
                rc = self._in_line(_receiving(h, kb, flags, waiter, info), h, waiter,
                                   t, flags, ffi.NULL, info, step)
            if rc == 0:
                return self._view(info, writable, as_torch, info_bytes)
        except BaseException:  # a signal handler's (Ctrl-C) between the calls: leave the line
            self._leave_line(h, waiter, flags, ffi.NULL, info)
            raise
        if rc == -errno.EAGAIN and empty_ok:
            return None
        self._fail(rc, f"recv {key!r}", partial(self._explain_wait, f"recv {key!r}", timeout))

    @staticmethod
    def _in_line(start: Callable[[int], int], h: Any, waiter: Any, timeout_ns: int, flags: int, which: Any,
                 info: Any, waited: int) -> int:
        """After a receive's first call (``start(ns)``, which waited up to
        ``waited`` ns), keep its place in line in slices, so that signal
        handlers run (Ctrl-C), and leave the line at the deadline. A start
        that ran out of its slice before it got in line (waiting for arena
        room for its record) is called again. The caller leaves the line if
        this raises (``_leave_line``): the core clears *waiter once the
        waiter has ended, so wherever the exception lands it is known
        whether we are still in line."""
        deadline = None if timeout_ns < 0 else time.monotonic_ns() + max(0, timeout_ns - waited)
        slice_ns = 2 * _FIRST_SLICE_NS
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
                if rc not in _RETRY:
                    # the handle was closed by another thread (its unmapping
                    # took our place out of line) or the segment was cut:
                    # nothing to wait for, no line to leave
                    waiter[0] = 0
                    return rc
            else:
                if left == 0:
                    return -errno.ETIMEDOUT
                rc = start(step)
                if rc == 0 or (rc not in _RETRY and not waiter[0]):
                    return rc
            slice_ns = min(2 * slice_ns, _MAX_SLICE_NS)

    @staticmethod
    def _leave_line(h: Any, waiter: Any, flags: int, which: Any, info: Any) -> None:
        """Leave the line if still in it; put back a message handed over
        meanwhile, or taken and not yet made a view (info.payload is cleared
        once a view owns it)."""
        if waiter[0] and lib.rdv_recv_cancel(h, waiter, flags, which, info) == 1 or info.payload != ffi.NULL:
            payload, info.payload = info.payload, ffi.NULL
            lib.rdv_give_back(h, payload)

    def recv(self, key: str, *, timeout: Optional[float] = None, lease: bool = False, writable: bool = False,
             as_torch: bool = False) -> Any:
        """Take the oldest message under ``key``, waiting for one if none is
        queued: up to ``timeout`` seconds (None: forever), then
        ``RendezvousTimeout``. A spinning-then-sleeping wait: a receiver that
        keeps waiting sleeps in the kernel and uses no CPU.

        Returns a read-only view into shared memory with the sent dtype and
        shape. It stays valid, its bytes untouched, while it or any view
        derived from it is alive; its space returns to the arena after.

        lease=True: if this process dies while the view (or anything derived
        from it) is alive, the message goes back to the head of its key
        instead of being freed (at-least-once forwarding). Leased messages of
        one key come back in the order they were sent (allocated), ahead of
        messages queued meanwhile, once the dead process is reclaimed (see
        ``collect_garbage``). They are freed instead if the rendezvous is
        aborted, or if the key index is full and the key was deleted. Letting
        the view go frees the message as without a lease.

        writable=True: the view is writable. A received message is this
        receiver's alone, so writing into it touches nobody else's data; a
        leased message goes back to its key with what was written.

        as_torch=True: a torch tensor over the same shared memory (no copy),
        of the sent dtype (torch.bfloat16 for bfloat16); torch is imported
        then, never otherwise. torch has no read-only tensors, so the tensor
        is writable whatever ``writable`` says: writing into it is safe when
        the message is this receiver's alone (no lease, or lease with
        writable=True), and a leased tensor without writable=True is
        read-only by contract only: do not write into it (what is written
        would go back to the key with the message if this process died).
        A message torch cannot hold (datetimes, strings, another byte order)
        raises InvalidType and stays queued."""
        # The hot path (a key received before, by a thread that has received
        # before, with a timeout of None or seconds, lease and writable True
        # or False) runs whole in C, before this: see fast.recv_method below
        # the class, and _recv_went_on. This is the rest.
        if as_torch is not False:
            return self._recv(key, timeout, False, lease, writable, check_as_torch(as_torch, f"recv {key!r}"))
        return self._recv(key, timeout, False, lease, writable)

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
        info, waiter = _thread_scratch()[:2]
        self._leave_line(h, waiter, _LEASED if lease else 0, ffi.NULL, info)

    def try_recv(self, key: str, *, lease: bool = False, writable: bool = False, as_torch: bool = False) -> Any:
        """Like ``recv`` but never blocks: the view, or None when nothing is
        queued. ``lease``, ``writable`` and ``as_torch`` as in ``recv``."""
        if as_torch is not False:
            return self._recv(key, 0, True, lease, writable, check_as_torch(as_torch, f"try_recv {key!r}"))
        return self._recv(key, 0, True, lease, writable)

    def recv_async(self, key: str, *, as_torch: bool = False) -> "async_recv.RecvFuture":
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

        as_torch=True: the result is a torch tensor, as ``recv`` gives."""
        kb = _key_bytes(key)
        tensor = check_as_torch(as_torch, f"recv_async {key!r}")
        fut = self._async().start(0, kb, what=f"recv_async {key!r}")
        fut._as_torch = tensor  # read when the result is first asked for
        return fut

    def _async(self) -> "async_recv.Completions":
        comp = self._completions
        if comp is None:
            comp = self._completions = async_recv.Completions(self, self._handle())
        return comp

    def send_many(self, items: Any, *, timeout: Optional[float] = None) -> None:
        """Send every ``(key, array)`` of ``items`` (any iterable), in order,
        as ``send`` would, in one call into the core per ``MANY_MAX`` (1024)
        messages: what it saves is the per-message call overhead.

        Every item is checked before any is sent, so a bad key or dtype
        (``InvalidType``, ``InvalidArgument``) sends nothing. Blocks only while
        the arena is full, the whole batch within ``timeout`` seconds (None:
        forever). If a message cannot be queued (``RendezvousTimeout``,
        ``MessageTooLarge``, ...), the error says which item and has a
        ``sent`` attribute: that many items before it were queued and stay
        sent; it and the rest were not. Keys routed to another host are sent
        one by one."""
        batches.send_many(self, items, timeout)

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
        names, kb, lens = _any_keys(keys)
        tensor = check_as_torch(as_torch, f"recv_any {names!r}")
        t = -1 if timeout is None else _timeout_ns(timeout)
        h = self._handle()
        info, waiter, _, _, _ = _thread_scratch()
        which = ffi.new("uint32_t *")
        step = _first_step(t)
        try:
            rc = lib.rdv_recv_any_start(h, kb, lens, len(names), step, 0, waiter, which, info)
            if rc < 0 and (waiter[0] or (rc in _RETRY and step != t)):
                rc = self._in_line(lambda ns: lib.rdv_recv_any_start(h, kb, lens, len(names), ns, 0, waiter, which, info),
                                   h, waiter, t, 0, which, info, step)
            if rc == 0:
                return names[which[0]], self._view(info, writable, tensor)
        except BaseException:
            self._leave_line(h, waiter, 0, which, info)
            raise
        self._fail(rc, f"recv_any {names!r}", partial(self._explain_wait, f"recv_any {names!r}", timeout))

    async def arecv(self, key: str, *, timeout: Optional[float] = None, as_torch: bool = False) -> Any:
        """``recv`` for asyncio: waits without blocking the event loop (and
        without a thread of its own). Cancelling the task leaves the line,
        or puts a message handed over meanwhile back at the head of its key;
        ``RendezvousTimeout`` after ``timeout`` seconds (None: forever).
        as_torch=True: a torch tensor, as ``recv`` gives."""
        return await _with_timeout(lambda: self.recv_async(key, as_torch=as_torch), timeout, f"arecv {key!r}")

    async def arecv_any(self, keys: Any, *, timeout: Optional[float] = None, as_torch: bool = False) -> Tuple[str, Any]:
        """``recv_any`` for asyncio: ``(key, view)`` of the first message
        under any of ``keys``, as ``arecv`` waits (as_torch as there)."""
        names, kb, lens = _any_keys(keys)
        tensor = check_as_torch(as_torch, f"arecv_any {names!r}")
        def start() -> "async_recv.RecvFuture":
            fut = self._async().start(0, kb, names, lens, what=f"arecv_any {names!r}")
            fut._as_torch = tensor
            return fut

        return await _with_timeout(start, timeout, f"arecv_any {names!r}")  # type: ignore[no-any-return]

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

    # ---- control -----------------------------------------------------------

    def abort(self, reason: str) -> None:
        """Abort the rendezvous for every attached process: pending and future
        ``send``/``recv`` raise ``Aborted`` (its ``reason`` is ``reason``);
        queued messages are freed. Views already received stay valid. The
        first reason given wins. Permanent: the segment stays aborted until it
        is removed (``shmrdv rm NAME``, ``unlink``). ``reason`` is at most
        1024 bytes of UTF-8 (``InvalidArgument`` otherwise). With ``routes``,
        each route's bridge is also told directly (all at once, waiting at
        most 2 s in all), so the abort crosses even if this host's bridge is
        down or has not linked to it yet."""
        if not isinstance(reason, str):
            raise InvalidType(f"reason must be a str, not {type(reason).__name__}")
        try:
            rb = reason.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgument(f"abort reason holds a lone surrogate ({reason[exc.start:exc.end]!r}): a reason is "
                                  f"a str of valid Unicode") from None
        if len(rb) > lib.RDV_REASON_MAX:
            raise InvalidArgument(f"abort reason is {len(rb)} bytes of UTF-8, more than the {lib.RDV_REASON_MAX} "
                                  f"a rendezvous keeps: shorten it")
        rc = lib.rdv_abort(self._handle(), rb, len(rb))
        if rc < 0:
            raise_rc(rc, "abort")
        if self._routes is not None:
            self._routes.tell_abort(self._abort_reason())  # the reason that won, if another came first

    def stats(self) -> Stats:
        """A snapshot of queued messages, keys, waiters and arena use."""
        out = ffi.new("struct rdv_stats *")
        rc = lib.rdv_stats(self._handle(), out)
        if rc < 0:
            raise_rc(rc, "stats")
        return Stats(
            pending_messages=out.pending_messages,
            keys=out.keys,
            waiters=out.waiters,
            bytes_used=out.bytes_used,
            bytes_free=out.bytes_free,
            largest_free=out.largest_free,
            live_blocks=out.live_blocks,
            waiter_bytes=out.waiter_bytes,
            capacity=out.capacity,
            max_keys=out.max_keys,
            aborted=bool(out.aborted),
            leases_dropped=out.leases_dropped,
            keys_counted=out.keys_counted,
            huge_pages=bool(out.flags & lib.RDV_CREATE_HUGE_PAGES),
            huge_page_bytes=self._huge_page_bytes() if out.flags & lib.RDV_CREATE_HUGE_PAGES else 0,
            prefault=not out.flags & lib.RDV_CREATE_NO_PREFAULT,
        )

    def _huge_page_bytes(self) -> int:
        base, length = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        lib.rdv_mapping(self._handle(), base, length)
        return huge_pages.mapped_huge_bytes(int(base[0]), int(length[0]))

    def processes(self) -> List[ProcessInfo]:
        """The handles attached to this rendezvous (this one included), with
        whether their process is alive and what each holds."""
        out = ffi.new("struct rdv_proc_info[]", _MAX_PROCS)
        n = ffi.new("uint32_t *")
        rc = lib.rdv_procs(self._handle(), out, _MAX_PROCS, n)
        if rc < 0:
            raise_rc(rc, "processes")
        return [
            ProcessInfo(
                entry=p.entry, pid=p.pid, alive=bool(p.alive), reclaiming=p.state == 2,
                attached_at=p.attached_ns / 1e9, views=p.views, view_bytes=p.view_bytes,
                writing=p.writing, waits=p.waits,
            )
            for p in out[0 : n[0]]
        ]

    def keys(self, limit: int = 100_000) -> List[KeyInfo]:
        """The live keys (with messages pending or receivers waiting), up to limit."""
        limit = _positive_int(limit, "limit")
        # no more keys than the index holds can be live: room for those only
        limit = min(limit, 4 * int(self.stats().max_keys))  # more than its index has slots for
        out = ffi.new("struct rdv_key_info[]", limit)
        n = ffi.new("uint32_t *")
        rc = lib.rdv_keys(self._handle(), out, limit, n)
        if rc < 0:
            raise_rc(rc, "keys")
        result = []
        for k in out[0 : n[0]]:
            name = ffi.unpack(k.key, k.key_len).decode("utf-8", "replace") if k.key_len else None
            if name is not None and k.full_len > k.key_len:
                name += "..."
            result.append(KeyInfo(name=name, pending=k.pending, waiters=k.waiters))
        return result

    def reclaimed_pids(self) -> List[int]:
        """Pids of the dead processes this handle has reclaimed so far (attaching
        reclaims the dead it finds; at most the first 16 are remembered)."""
        pids = ffi.new("uint32_t[16]")
        n = lib.rdv_reaped(self._handle(), pids, 16)
        return list(pids[0 : min(n, 16)])

    def collect_garbage(self) -> int:
        """Reclaim what dead processes held (their views, half-written blocks,
        waits, locks); returns how many dead processes were reclaimed. Also
        happens on its own: at every attach, and when a lock holder or a full
        arena stays stuck."""
        n = ffi.new("uint32_t *")
        rc = lib.rdv_gc(self._handle(), n)
        if rc < 0:
            raise_rc(rc, "collect_garbage")
        return int(n[0])


_send_py, _recv_py = Rendezvous.send, Rendezvous.recv


def _hot_methods() -> Tuple[Any, Any]:
    """Rendezvous.send and .recv with their hot paths whole in C, with no
    Python frame (fast.send_method, fast.recv_method), over this module's
    caches as they are now; every call those decline goes to the Python
    methods above (each one's ``__wrapped__``). Made once, below; a test that
    swaps a cache for a fresh dict makes them again."""
    return (fast.send_method(_send_py, _fast_forms, _key_cache, _async_pending, async_recv),
            fast.recv_method(_recv_py, _key_cache, _descs))


Rendezvous.send, Rendezvous.recv = _hot_methods()  # type: ignore[method-assign]
