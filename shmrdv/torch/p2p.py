"""Point-to-point for the "shmrdv" process group: ``send``, ``recv`` (also
from any source, telling the sender), ``isend``, ``irecv`` and
``batch_isend_irecv``, in torch's order per (source, destination, tag).

Ranks of one host meet in one private rendezvous per process group (a
sealed memfd, so a container's small /dev/shm does not bound it), made by
rank 0 when the group is made and named to the others through the group's
Store; every rank attaches then, before the group's join completes, so a
rank may send and exit before its peer receives (the memory goes with the
last rank that has it). A message from ``src`` to
``dst`` with ``tag`` goes under the key ``p2p/SRC>DST/TAG``: a key is a
FIFO, which is torch's ordering guarantee.

Sending is eager: the tensor is copied into the arena (its one copy on
the sending side) and the send is done; nothing waits for the receiver.
A tensor larger than ``CHUNK`` goes in chunks, from a thread of its own
(as gloo's sends go on while the caller posts its receives), so that two
ranks sending each other more than the arena holds before receiving do
not block each other. Sends to one key keep their order: a small send
after a chunked one still queued waits its turn behind it.

Receiving happens when the receive is waited for (``wait``, ``is_completed``
polls without blocking, ``get_future`` starts a thread): the waiter copies
the message into the tensor it was given (the one copy on the receiving
side). Receives posted on one key complete in the order they were posted:
waiting for a later one takes the earlier ones' messages first, into their
own tensors. A receive from any source takes the first message on any key
addressed to this rank with its tag, skipping keys with earlier receives
of their own still posted.

A receive waits in slices: between them it checks that the rank it waits
for (any rank, for any source) is still alive, so a dead sender is an
error (``PeerLost``) within a slice, and the group's timeout bounds the
whole wait.

A tensor that fits one chunk goes as one message with its own dtype and
shape, so the receiver checks both; a larger one as bytes, in chunks of
``CHUNK`` (the last one shorter), which the receiver, knowing its tensor's
size, counts. Tensors go through numpy views where their dtype has one
(a torch tensor costs the core about 20 us more per message to convert).
"""
import collections
import datetime
import os
import queue
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

from ..errors import InvalidArgument, PeerLost, RendezvousError, RendezvousTimeout
from ..rendezvous import Rendezvous
from .work import Done, Work

ARENA = 8 << 20
"""Bytes of the arena a process group's point-to-point messages share
(made with every group: its cost grows with its size, 5 ms for 8 MiB)."""
CHUNK = 1 << 20
"""Largest single message; a larger tensor is sent in chunks of this size."""
SLICE_S = 0.5
"""How long a receive waits before checking that its sender is alive."""

_NAME_KEY = "shmrdv/p2p"


def _key(src: int, dst: int, tag: int) -> str:
    return f"p2p/{src}>{dst}/{tag}"


def _source(key: str) -> int:
    return int(key[4:key.index(">")])


def _flat_bytes(t: torch.Tensor) -> np.ndarray:
    """A contiguous tensor's bytes, as a numpy view."""
    return t.reshape(-1).view(torch.uint8).numpy()


def _numpy(t: torch.Tensor) -> Optional[np.ndarray]:
    """t's numpy view (sharing its memory), or None for a dtype numpy lacks (bfloat16, ...)."""
    try:
        return t.numpy()
    except TypeError:
        return None


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _as_torch(out: torch.Tensor) -> bool:
    """Whether a message for out must come as a torch tensor: one chunk of
    a dtype numpy lacks (bfloat16, the float8s; chunks are bytes)."""
    if _nbytes(out) > CHUNK:
        return False
    has = _HAS_NUMPY.get(out.dtype)
    if has is None:
        has = _HAS_NUMPY[out.dtype] = _numpy(torch.empty(0, dtype=out.dtype)) is not None
    return not has


_HAS_NUMPY: Dict[torch.dtype, bool] = {}


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


class RecvWork(Work):
    """A posted receive: done once a waiter has copied its message into the
    tensor (see the module docstring for who receives when)."""

    def __init__(self, peers: "SharedPeers", tensor: torch.Tensor, keys: List[str]) -> None:
        super().__init__()
        self._peers = peers
        self.tensor = tensor
        self.keys = keys
        self.source = -1
        self._driven = False  # a thread of get_future's receives it

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        if not self._done:
            self._peers.complete(self, blocking=True)
        return super().wait(timeout)

    def is_completed(self) -> bool:
        if not self._done:
            self._peers.complete(self, blocking=False)
        return self._done

    def get_future(self) -> torch.futures.Future:
        if not self._done and not self._driven:  # one thread, however often the future is asked for
            self._driven = True
            threading.Thread(target=self._peers.complete, args=(self, True), daemon=True,
                             name="shmrdv-p2p-recv").start()
        return super().get_future()

    def _source_rank(self) -> int:
        self.wait()
        return self.source


class SharedPeers:
    """Point-to-point among ranks of one host, through a private rendezvous
    shared by the process group (see the module docstring)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
        self._rank = rank
        self._size = size
        self._timeout = timeout.total_seconds()
        self.pid_of: Callable[[int], int] = lambda rank: 0  # a rank's pid: the group's table, once joined
        self._lock = threading.Lock()  # guards _posted, _sending, _sender, _closed
        self._posted: Dict[str, Deque[RecvWork]] = collections.defaultdict(collections.deque)
        self._busy: Dict[str, threading.Lock] = collections.defaultdict(threading.Lock)
        self._sending: Dict[str, int] = collections.defaultdict(int)  # chunked sends queued per key
        self._outbox: "queue.SimpleQueue[Optional[Tuple[str, torch.Tensor, Work]]]" = queue.SimpleQueue()
        self._sender: Optional[threading.Thread] = None
        self._closed = False
        self._barriers = 0  # monitored barriers so far
        if rank == 0:
            self._rdv = Rendezvous(size=ARENA, prefault=False)
            store.set(_NAME_KEY, self._rdv.name)
        else:
            self._rdv = Rendezvous(store.get(_NAME_KEY).decode(), create=False)

    def _rendezvous(self) -> Rendezvous:
        if self._closed:
            raise RendezvousError("point-to-point on a process group that was shut down")
        return self._rdv

    def _alive(self, rank: int) -> bool:
        pid = self.pid_of(rank)
        if not pid:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    # ---- sending ----

    def send(self, t: torch.Tensor, dst: int, tag: int) -> Any:
        key = _key(self._rank, dst, tag)
        if self._closed:
            raise RendezvousError("point-to-point on a process group that was shut down")
        # Read without the lock: only this process's own chunked sends raise
        # the count, and a send after one of them on this thread sees it.
        if not self._sending.get(key) and _nbytes(t) <= CHUNK:
            self._send_now(self._rdv, key, t)
            return Done([t])
        work = Work()
        with self._lock:
            self._sending[key] += 1
            self._start_sender()
            self._outbox.put((key, t, work))
        return work

    def _start_sender(self) -> None:
        if self._sender is None:
            self._sender = threading.Thread(target=self._send_queued, daemon=True,
                                            name=f"shmrdv-p2p-send-r{self._rank}")
            self._sender.start()

    def _send_queued(self) -> None:
        rdv = self._rdv  # close() waits for this thread before closing it
        while True:
            item = self._outbox.get()
            if item is None:
                return
            key, t, work = item
            try:
                self._send_now(rdv, key, t)
            except BaseException as exc:  # the error is the send's, raised by its wait
                work._fail(exc)
            else:
                work._finish([t])
            finally:
                with self._lock:
                    self._sending[key] -= 1

    def _send_now(self, rdv: Rendezvous, key: str, t: torch.Tensor) -> None:
        if _nbytes(t) <= CHUNK:
            view = _numpy(t)  # strided views go as they are: the core copies them once
            rdv.send(key, view if view is not None else t.contiguous(), timeout=self._timeout)
            return
        flat = _flat_bytes(t.contiguous())
        for start in range(0, flat.size, CHUNK):
            rdv.send(key, flat[start:start + CHUNK], timeout=self._timeout)

    # ---- receiving ----

    def recv(self, t: torch.Tensor, src: int, tag: int) -> RecvWork:
        return self._post(RecvWork(self, t, [_key(src, self._rank, tag)]))

    def recv_any(self, t: torch.Tensor, tag: int) -> RecvWork:
        return self._post(RecvWork(self, t, [_key(src, self._rank, tag) for src in range(self._size)]))

    def _post(self, work: RecvWork) -> RecvWork:
        self._rendezvous()
        if len(work.keys) == 1:
            with self._lock:
                self._posted[work.keys[0]].append(work)
        return work

    def complete(self, work: RecvWork, blocking: bool) -> None:
        """Receive what work waits for (and, on its key, every receive posted
        before it), on this thread; without blocking, only what is there."""
        try:
            if len(work.keys) == 1:
                self._complete_in_order(work, blocking)
            else:
                self._complete_any(work, blocking)
        except BaseException as exc:
            if not work._done:
                work._fail(exc)
            if not isinstance(exc, Exception):
                raise

    def _complete_in_order(self, work: RecvWork, blocking: bool) -> None:
        key = work.keys[0]
        busy = self._busy[key]
        if not busy.acquire(blocking=blocking):
            return
        try:
            while not work._done:
                with self._lock:
                    head = self._posted[key][0]
                try:
                    if not self._receive(head, key, blocking):
                        return
                except BaseException as exc:  # the receive waited for fails; the next one may yet succeed
                    head._fail(exc)
                    raise
                finally:
                    if head._done:
                        with self._lock:
                            self._posted[key].popleft()
        finally:
            busy.release()

    def _complete_any(self, work: RecvWork, blocking: bool) -> None:
        deadline = time.monotonic() + self._timeout
        while not work._done:
            with self._lock:
                keys = [k for k in work.keys if not self._posted[k]]
            free = [k for k in keys if self._busy[k].acquire(blocking=False)]
            try:
                if free and self._try_any(work, free, SLICE_S if blocking else 0):
                    return
            finally:
                for k in free:
                    self._busy[k].release()
            if not blocking:
                return
            if not free:
                time.sleep(0.001)  # every key is being received from by another thread
            if not any(self._alive(r) for r in range(self._size) if r != self._rank):
                raise PeerLost(f"recv from any source on rank {self._rank}: every other rank has exited")
            if time.monotonic() > deadline:
                raise RendezvousTimeout(f"recv from any source on rank {self._rank}: nothing came within "
                                  f"{self._timeout:g} s (the process group's timeout)")

    def _try_any(self, work: RecvWork, keys: List[str], timeout: float) -> bool:
        rdv = self._rendezvous()
        try:
            key, first = rdv.recv_any(keys, timeout=timeout, as_torch=_as_torch(work.tensor))
        except RendezvousTimeout:
            return False
        work.source = _source(key)
        self._fill(work, key, first, rdv)
        return True

    def _receive(self, work: RecvWork, key: str, blocking: bool) -> bool:
        """Take work's message (blocking: waiting for it in slices); False
        if it is not there and blocking is False."""
        rdv = self._rendezvous()
        src = _source(key)
        deadline = None
        while True:
            try:
                first = rdv.recv(key, timeout=SLICE_S if blocking else 0, as_torch=_as_torch(work.tensor))
                break
            except RendezvousTimeout:
                if not blocking:
                    return False
            if deadline is None:  # the group's timeout counts from the first slice
                deadline = time.monotonic() + self._timeout - SLICE_S
            if not self._alive(src):
                raise PeerLost(f"recv on rank {self._rank}: rank {src}, the sender, has exited", src,
                               self.pid_of(src))
            if time.monotonic() > deadline:
                raise RendezvousTimeout(f"recv on rank {self._rank} from rank {src}: nothing came within "
                                  f"{self._timeout:g} s (the process group's timeout)")
        work.source = src
        self._fill(work, key, first, rdv)
        return True

    def _fill(self, work: RecvWork, key: str, first: Any, rdv: Rendezvous) -> None:
        """Copy the message first (a tensor that fits one chunk), or the
        chunks it begins, into work's tensor, and complete work."""
        out = work.tensor
        nbytes = _nbytes(out)
        if nbytes <= CHUNK:
            view = _numpy(out)
            if view is not None and first.dtype == view.dtype and first.size == view.size:
                np.copyto(view, first.reshape(view.shape))
            elif view is None and first.dtype == out.dtype and first.numel() == out.numel():
                out.copy_(first.view(out.shape))
            else:
                raise InvalidArgument(f"recv on rank {self._rank}: the tensor sent under {key!r} has "
                                      f"{first.numel() if isinstance(first, torch.Tensor) else first.size} "
                                      f"elements of {_dtype_name(first.dtype)}; the receiving tensor has "
                                      f"{out.numel()} of {_dtype_name(out.dtype)}")
            work._finish([out])
            return
        staged = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
        flat = _flat_bytes(staged)
        at, piece = 0, first
        while True:
            if piece.dtype != np.uint8 or piece.ndim != 1 or at + piece.size > nbytes:
                raise InvalidArgument(f"recv on rank {self._rank}: the tensor sent under {key!r} is not the "
                                      f"receiving tensor's {nbytes} bytes")
            np.copyto(flat[at:at + piece.size], piece)
            at += piece.size
            del piece
            if at == nbytes:
                break
            piece = rdv.recv(key, timeout=self._timeout)
        if staged is not out:
            out.copy_(staged)
        work._finish([out])

    # ---- monitored_barrier ----

    def monitored_barrier(self, timeout: float, wait_all_ranks: bool) -> None:
        """gloo's monitored barrier, with gloo's errors (``DistBackendError``,
        a RuntimeError, worded as gloo words them): every rank tells rank 0
        it came; rank 0 waits for each within timeout and raises naming the
        first that did not come (every one, with wait_all_ranks), else lets
        them all go. A rank that came waits for rank 0's word as long. Each
        barrier has keys of its own, so a rank that comes too late to one
        cannot pass the next."""
        rdv = self._rendezvous()
        self._barriers += 1
        prefix = f"barrier/{self._barriers}/"
        millis = int(timeout * 1000)
        if self._rank != 0:
            rdv.send(f"{prefix}{self._rank}>0", np.zeros(1, np.uint8), timeout=timeout)
            try:
                rdv.recv(f"{prefix}0>{self._rank}", timeout=timeout)
            except RendezvousTimeout:
                raise dist.DistBackendError(
                    f"Rank {self._rank} successfully reached monitoredBarrier, but received errors while waiting "
                    f"for send/recv from rank 0: nothing came within {millis} ms (rank 0 did not come, or found "
                    f"another rank missing)") from None
            return
        deadline = time.monotonic() + timeout
        missing = []
        for rank in range(1, self._size):
            left = deadline - time.monotonic()
            if left <= 0 and not missing:
                raise dist.DistBackendError(f"Rank 0 timed out in monitoredBarrier after {millis} ms.")
            try:
                rdv.recv(f"{prefix}{rank}>0", timeout=max(0.0, left))
            except RendezvousTimeout:
                missing.append(rank)
                if not wait_all_ranks:
                    break
        if missing:
            which = (f"Rank {missing[0]}" if len(missing) == 1 and not wait_all_ranks
                     else f"Ranks {', '.join(map(str, missing))}")
            raise dist.DistBackendError(f"{which} failed to pass monitoredBarrier in {millis} ms")
        for rank in range(1, self._size):
            rdv.send(f"{prefix}0>{rank}", np.zeros(1, np.uint8), timeout=timeout)

    # ---- lifetime ----

    def abort(self, reason: str) -> None:
        if not self._rdv.closed:
            self._rdv.abort(reason)

    def close(self) -> None:
        """Finish the queued sends, then let go of the rendezvous."""
        with self._lock:
            self._closed = True
            sender, self._sender = self._sender, None
        if sender is not None:
            self._outbox.put(None)
            sender.join(timeout=self._timeout)
        self._rdv.close()


class GlooPeers:
    """Point-to-point across hosts: through a gloo group of all the ranks."""

    def __init__(self, pg: Any) -> None:
        self._pg = pg

    def send(self, t: torch.Tensor, dst: int, tag: int) -> Any:
        return self._pg.send([t], dst, tag)

    def recv(self, t: torch.Tensor, src: int, tag: int) -> Any:
        return self._pg.recv([t], src, tag)

    def recv_any(self, t: torch.Tensor, tag: int) -> Any:
        return self._pg.recv_anysource([t], tag)

    def monitored_barrier(self, timeout: float, wait_all_ranks: bool) -> None:
        self._pg.monitored_barrier(datetime.timedelta(seconds=timeout), wait_all_ranks=wait_all_ranks)

    def abort(self, reason: str) -> None:
        """Nothing of its own: the transport aborts its gloo group."""

    def close(self) -> None:
        """Nothing of its own: the transport closes its gloo group."""


__all__ = ["ARENA", "CHUNK", "GlooPeers", "RecvWork", "SharedPeers"]
