"""``Rendezvous``: send and receive numpy tensors by key through one
shared-memory segment shared by every process that opens the same name.

The class holds the handle's life (open, close, fork), sending and
control; its receiving and asyncio methods are mixed in (``receiving``,
``awaiting``). What it stands on, each in a module of its own: segment
files (``segments``), message forms and descriptors (``forms``), waiting
in slices (``waits``), ``alloc``'s blocks (``allocation``), producer marks
(``marks``), what errors say (``explain``)."""
import os
import warnings
import weakref
from functools import partial
from typing import Any, Callable, Dict, List, Mapping, NoReturn, Optional, Tuple, Union

import numpy as np

from . import allocation, async_recv, batches, explain, forms
from ._binding import address, fast, ffi, lib, raise_rc
from .allocation import Allocation, alloc_kind, int_tuple
from .awaiting import Awaiting
from .codec import _key_cache, as_sendable, positive_int
from .codec import key_bytes as _key_bytes
from .codec import timeout_ns as _timeout_ns
from .errors import InvalidArgument, InvalidType, RendezvousError, SegmentMismatch
from .marks import Mark, checked_mark, mark_index
from .receiving import Receiving
from .segments import (OPEN_TIMEOUT, check_attached, open_request, open_segment, unlink_private,
                       unlink_segment)
from .stats import KeyInfo, ProcessInfo, Stats, read_keys, read_processes, read_stats
from .tensors import check_as_torch
from .waits import FIRST_SLICE_NS, blocking, keep_waiting, time_left


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


class Rendezvous(Receiving, Awaiting, fast.Handle):
    """A table of FIFO channels keyed by string, in one shared-memory segment.

    ``Rendezvous(name)`` attaches to the rendezvous ``name`` if it exists and
    creates it otherwise (``create=True``: create or ``FileExistsError``;
    ``create=False``: attach or ``FileNotFoundError``). ``size`` is the arena's
    payload capacity in bytes: a multiple of 4096, at most ``MAX_SIZE`` (about
    64 GiB); default 64 MiB; header and key index come on top. ``max_keys``
    is how many keys may be live at once (default scales with size). Both
    only apply when creating: attaching with a ``size`` or ``max_keys`` the
    existing segment does not have raises ``SegmentMismatch``. The segment is
    the file ``DIR/shmrdv-NAME``, mode 0600, and lives until ``unlink()``:
    messages survive the processes that sent them. DIR is ``dir`` (an
    absolute path), else the environment variable ``SHMRDV_DIR``, else
    ``/dev/shm``: any tmpfs, or a hugetlbfs (the file then takes whole
    huge pages, in every process); ``shmrdv ls --dir DIR`` or the same
    variable shows it. Those who meet by a name must use the same DIR. A create that
    DIR has no room for raises ``SharedMemoryFull`` naming what it needs,
    what fits and where to find room, rather than making a smaller arena than
    asked for: a container's default 64 MiB ``/dev/shm`` cannot hold the
    default 64 MiB arena with its index (73,965,568 bytes): pass ``size=``,
    ``dir=`` a larger tmpfs, or give the container more (``docker run
    --shm-size``), or use a private rendezvous, which is in no directory.

    ``timeout``: how long to wait (seconds; None: as long as it takes) for a
    creator that is still initialising the segment, e.g. reserving a big
    arena; default ``OPEN_TIMEOUT`` (60 s). A segment whose creator died
    before initialising it raises ``SegmentMismatch`` at once, naming it;
    ``shmrdv rm NAME`` removes it.

    ``Rendezvous()`` with no name opens a private rendezvous for this process
    and the processes it hands it to: it gets a unique name
    (``private-PID-RANDOM``, see ``name``), is always created, in memory
    of its own (a memfd, sealed against truncation and growth: a
    ``/dev/shm`` of any size, a container's 64 MiB one too, does not bound
    it; the memory cgroup does), in no directory (``dir`` does not apply).
    Pass it to children (``multiprocessing`` arguments, pickling; a forked
    child attaches anew by itself): each attaches by name, through this
    process's descriptor of it (``/proc/PID/fd``: the same user, this
    process dumpable, the same pid namespace), and a child's handle never
    removes it. It can be attached while this handle is open: after
    ``close`` (the ``with`` block's end, garbage collection) or this
    process's end, children that attach find nothing
    (``FileNotFoundError``); those already attached keep working. Its
    memory goes with the last process that has it mapped, whatever killed
    them: nothing is ever left behind.

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

    # The handle's state that its mixins (receiving, awaiting) and the
    # modules beside it (allocation, batches, async_recv) share, and only
    # they: _h (the core's handle; None when closed or in a fork child),
    # _h_addr (its address, for fast's calls), _handle() (the handle,
    # attaching one of our own in a fork child), _fail(rc, what, explain),
    # _error, _closed_error, _release/_give_back/_unref (a payload's end),
    # _view/_view_parsed (a message's view) and _routes.

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
        dir: Optional[str] = None,
    ) -> None:
        self._h = None
        self._finalizer: Optional[weakref.finalize] = None
        self._routes: Any = None if routes is None else _router(routes, token, tls_ca)
        self._forked = False
        self._completions: Optional[async_recv.Completions] = None
        req = open_request(name, create, size, max_keys, huge_pages, prefault, dir)
        wait_ns = _timeout_ns(timeout)
        self._name, self._dir = req.name, req.dir
        self._h, self._created = open_segment(req.name, req.arena, req.max_keys, req.create, wait_ns, req.flags,
                                              asked_keys=max_keys, dir=req.dir)
        self._capacity = int(lib.rdv_capacity(self._h))
        if req.owner is not None and self._created:
            # This process's private rendezvous: attachable while this handle is open.
            self._finalizer = weakref.finalize(self, unlink_private, req.name, os.getpid())
        if not self._created:
            try:
                check_attached(self._h, req.name, self._capacity, req.asked_size, max_keys, huge_pages, prefault)
            except SegmentMismatch:
                self.close()
                raise
        self._attach_handle(self._h)
        if self._routes is not None:
            self._routes.announce(self)

    # ---- lifecycle ---------------------------------------------------------

    @property
    def name(self) -> str:
        """The rendezvous name (a named one's segment is ``DIR/shmrdv-NAME``, see ``dir``)."""
        return self._name

    @property
    def dir(self) -> Optional[str]:
        """The directory of a named rendezvous' file; None for a private one (a memfd)."""
        return self._dir

    @property
    def capacity(self) -> int:
        """Arena size in bytes."""
        return self._capacity

    def lock_fd(self) -> int:
        """A descriptor of this handle's own open file description of the
        segment: the one whose byte lock says this process lives. An
        advisory ``flock`` taken on it (by a layer above, e.g. the torch
        Store's lock) is released when this process dies in the same step
        as that byte lock, and after it: whoever gets the flock next
        already sees this process as dead (``collect_garbage`` reclaims
        it). A flock on a description of one's own may go first, as a dying
        process's descriptions are released in no order one can rely on.
        Valid while the rendezvous is open; do not close it."""
        fd = int(lib.rdv_lock_fd(self._handle()))
        if fd < 0:
            raise RendezvousError(f"rendezvous {self._name!r} has no lock description (a private one in creation)")
        return fd

    @property
    def closed(self) -> bool:
        """Whether this handle has no attachment now: closed (``close``, the
        end of a ``with`` block), or inherited by a fork child that has not
        used it yet (its first call attaches one of the child's own)."""
        return self._h is None

    def close(self) -> None:
        """Detach this handle; idempotent. Views and ``alloc`` buffers already
        handed out stay valid until they are dropped; pending ``recv_async``
        futures are cancelled. The segment stays (see ``unlink``), except
        that closing the handle that created a private rendezvous
        (``Rendezvous()``) removes it: nobody can attach to it any more."""
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
        """Whether this handle created a private rendezvous (``Rendezvous()``,
        or a name of its form), which it removes when it closes."""
        return self._finalizer is not None

    def unlink(self) -> None:
        """Remove the segment's name; idempotent. Processes still attached keep
        their mapping; nothing remains once all have closed. A private
        rendezvous is removed by the handle that created it alone (its close
        does it): unlink from another handle does nothing."""
        unlink_segment(self._name, self._dir)

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
            try:
                state = "aborted" if self.stats().aborted else "open"
            except SegmentMismatch:  # a repr (and the unclosed warning's) must not raise
                state = "damaged"
        return f"<Rendezvous name={self._name!r} capacity={self._capacity} state={state}>"

    def __reduce__(self) -> Tuple[Any, Tuple[str]]:
        # A child process re-attaches by name (in our directory, whatever
        # its environment says) instead of pickling a mapping.
        if self._routes is None:
            return (partial(Rendezvous, create=False, dir=self._dir), (self._name,))
        r = self._routes
        return (partial(Rendezvous, create=False, dir=self._dir, routes=r.table, token=r.token or None,
                        tls_ca=r.tls_ca), (self._name,))

    def _handle(self) -> Any:
        h = self._h
        if h is None:
            if not self._forked:
                raise RendezvousError(f"rendezvous {self._name!r} is closed")
            self._attach_handle(open_segment(self._name, 0, 0, False, dir=self._dir)[0])  # in a forked child: our own handle
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
        form = forms.send_forms.get((dtype, arr.shape)) or forms.send_form(dtype, arr.shape)
        if arr.flags.c_contiguous:
            step = t if 0 <= t <= FIRST_SLICE_NS else FIRST_SLICE_NS  # first_step, inline: the hot path
            src = ffi.from_buffer(arr.view(np.int64) if form.bits else arr)  # datetimes: their int64 bits
            rc = lib.rdv_send(h, kb, len(kb), form.code, form.code_len, form.ndim, form.dims, form.strides, src,
                              form.nbytes, step)
            if rc < 0:
                if keep_waiting(rc, step, t):
                    rc = blocking(forms.sending(h, kb, form, src), time_left(t, step))
                if rc < 0:
                    self._fail(rc, f"send {key!r}", partial(explain.space_message, self, f"send {key!r}", len(kb), form.ndim,
                                                            form.nbytes, timeout))
            if async_recv.pending[0]:
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
        the_mark = None if mark is None else checked_mark(mark)
        kind, ints = None, int_tuple(shape)
        if ints:
            try:
                kind = allocation._alloc_kinds.get((dtype, shape))
            except TypeError:
                pass  # an unhashable dtype argument (a structured dtype's list, say)
        if kind is None:
            kind = alloc_kind(key, dtype, shape, ints)
        dt, shp, tensor = kind
        if self._routes is not None:
            url = self._routes.url_for(key)
            if url is not None:
                if mark is not None:
                    raise InvalidArgument(f"alloc {key!r}: producer marks are local; this key is routed to {url.decode()}")
                return self._routes.alloc(self, url, key, dt, shp, timeout, tensor)  # type: ignore[no-any-return]
        return Allocation(self, key, kb, dt, shp, t, the_mark, tensor)

    # ---- receiving (the rest: receiving.Receiving) -----------------------------

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

    # ---- producer marks ----------------------------------------------------

    def mark(self, idx: int) -> Tuple[int, int, int]:
        """Producer mark ``idx`` as ``(id, val0, val1)``.

        Producer marks are for idempotent producers such as the network
        bridge (docs: crash safety). A rendezvous holds ``MAX_MARKS`` (64) marks, each three
        unsigned 64-bit words, all zero until set; id 0 means unused. A
        producer records in a mark how far it got (e.g. the last sequence
        number it published for a remote sender) with ``alloc(...,
        mark=...)``, and a producer restarted after a crash reads it back
        here. Each mark must have one writer at a time.

        Returns a value some change left, never one in the middle of a
        change: waits (briefly) while a live writer is changing the mark, and
        reclaims a dead writer first, rolling its change back if its message
        was not committed. ``InvalidArgument`` if idx is out of range."""
        i = mark_index(idx)
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
        i, id_, v0, v1 = checked_mark((idx, id, val0, val1))
        rc = lib.rdv_mark_set(self._handle(), i, id_, v0, v1)
        if rc < 0:
            raise_rc(rc, f"set_mark {i}")


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
        return read_stats(self._handle())

    def processes(self) -> List[ProcessInfo]:
        """The handles attached to this rendezvous (this one included), with
        whether their process is alive and what each holds."""
        return read_processes(self._handle())

    def keys(self, limit: int = 100_000) -> List[KeyInfo]:
        """The live keys (with messages pending or receivers waiting), up to limit."""
        return read_keys(self._handle(), positive_int(limit, "limit"))

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
    Python frame (fast.send_method, fast.recv_method), over the caches (``forms``)
    as they are now; every call those decline goes to the Python
    methods above (each one's ``__wrapped__``). Made once, below; a test that
    swaps a cache for a fresh dict makes them again."""
    return (fast.send_method(_send_py, forms.fast_forms, _key_cache, async_recv.pending, async_recv),
            fast.recv_method(_recv_py, _key_cache, forms.descs))


Rendezvous.send, Rendezvous.recv = _hot_methods()  # type: ignore[method-assign]
