"""``Store``: a ``torch.distributed.Store`` in a named shmrdv rendezvous, for
the processes of one job on one host: TCPStore's semantics with no server
thread, no socket and no daemon.

How the Store lays out its state in the rendezvous (``NAME`` is the Store's
name, its segment ``DIR/shmrdv-NAME`` as for any named rendezvous; ``K`` a
Store key):

============  ==========================================================
rdv key       what its messages are
============  ==========================================================
``s/K``       K's value (uint8 bytes): the newest message is the value;
              older ones are stale copies a crash left (below)
``q/K``       queue K's items, oldest first (``queue_push``/``queue_pop``)
``w/K``       how many waiters sleep on ``n/K`` (one decimal message)
``n/K``       wake-up notices for the waiters of K, one per waiter
============  ==========================================================

**The lock.** Every operation on ``s/``, ``w/`` and ``n/`` keys runs under
one store-wide lock: ``flock(LOCK_EX)`` on the rendezvous handle's own open
file description (``Rendezvous.lock_fd``; one per ``Store`` object, so
objects exclude each other within one process too; a ``threading.Lock``
excludes the threads sharing an object). The kernel drops a ``flock`` when
its holder dies, whatever killed it: a SIGKILLed holder frees the lock at
once, with no daemon and no timeout. It is the description whose byte
lock says the process lives, and the kernel drops that byte lock first,
in the same release: the next holder finds the dead holder dead, and
reclaims its leases (below). (A flock on a description of its own could
go first: a dying process's descriptions are released last-opened first,
and a holder that found the key empty with the dead one's leases not yet
reclaimable took the key for missing: an ``add`` started again from 0.)

**One operation, under the lock.** Read the key's messages, each taken with
a lease (``try_recv(lease=True)``: if this process dies holding them, they
go back to the head of the key, in order, when the dead process is
reclaimed; a key that looks empty under the lock is looked at again after
reclaiming the dead, so a dead holder's leases are back before anyone
concludes a key is missing), then:

=====  =====================================  ==============================
step   what the holder does                   if it dies after this step
=====  =====================================  ==============================
1      takes every message of ``s/K``,        nothing happened: the leased
       leased; the last one is the value      messages go back as they were
2      sends the new value (or, for a read,   the op happened: the key reads
       the same bytes again): **the commit**  ``[old..., new]``, its newest
                                              is the value
3      lets the taken messages go, oldest     the op happened; the stale
       first                                  ones that went back are
                                              dropped by the next op on K
=====  =====================================  ==============================

So a reader must take the newest message, never the first; it always
takes them all (step 1), which is also how the next operation removes what
a crash left. ``delete_key`` has no step 2: its commit is letting the newest
message go, which it does last; dying before leaves the key with its value.
A reader sends its value again (step 2) rather than ``give_back``: both
keep the value, and a send is the core's fast path.

``multi_set`` commits key by key: a holder killed inside it leaves the keys
before the one it was at set, and the rest as they were (each key's set is
atomic, the call as a whole is not across a crash).

**Waiting for a key** (``get``, ``wait``, ``multi_get``). A waiter finding
K missing adds one to ``w/K`` (under the lock), lets the lock go and
sleeps in the core on ``n/K``. A write that creates K takes ``w/K`` and
sends that many notices to ``n/K``. Notices are hints: every waiter also
looks again every ``_POLL_S`` seconds, so a notice lost to a crash or one
left by a waiter that timed out costs that much latency, never a wrong
answer.

**Queues** need no lock: ``queue_push`` is one ``send`` to ``q/K`` and
``queue_pop`` one ``recv`` (FIFO, blocking in the core, first come first
served); a process killed inside either has either queued (taken) the item
or not.

**Keys counted** (``num_keys``, ``list_keys``): the ``s/`` keys with a
value, from ``Rendezvous.keys()``; queues are not keys here.

**Through torch's C++ side** (``PrefixStore``, ``init_process_group``):
torch 2.13's trampoline for Python Stores forwards ``set``, ``get``,
``add``, ``compare_set``, ``wait``, ``check``, ``multi_get``,
``multi_set``, ``append``, ``clone`` and ``has_extended_api``; its
``barrier`` runs torch's own over those. ``delete_key``, ``num_keys``,
``list_keys``, the queues and ``set_timeout`` are not forwarded: call them
on the Store itself.
"""
import datetime
import fcntl
import threading
import time
from typing import Any, List, Optional, Sequence, Union

import numpy as np
import torch.distributed as dist

from ..errors import RendezvousTimeout
from ..rendezvous import Rendezvous

DEFAULT_TIMEOUT = datetime.timedelta(seconds=300)
"""How long ``get``, ``wait`` and ``queue_pop`` wait by default, as TCPStore's default."""
DEFAULT_SIZE = 16 << 20
"""Arena bytes of a Store's rendezvous: values, queues and notices (fits a container's 64 MiB /dev/shm)."""
CLOSED_KEY = "shmrdv.store/closed"
"""The counter each member of a job of ``world_size`` adds one to as it closes; the last removes the segment."""
_POLL_S = 0.05
"""The longest a waiter sleeps before it looks at the key again (see the module docstring)."""
"""The lowest descriptor the lock's description is moved to (see _StoreLock._open)."""
_VALUE, _QUEUE, _WAITERS, _NOTICE = "s/", "q/", "w/", "n/"
_EMPTY = np.zeros(0, np.uint8)


def _as_bytes(value: Union[str, bytes, bytearray, memoryview, Sequence[int]]) -> bytes:
    """A value as torch's Stores take it: str (UTF-8), bytes-like, or a list of ints (bytes)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return bytes(value)


def _array(value: bytes) -> np.ndarray:
    return np.frombuffer(value, np.uint8) if value else _EMPTY


def _seconds(timeout: Union[datetime.timedelta, float, None]) -> float:
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout) if timeout is not None else DEFAULT_TIMEOUT.total_seconds()


class _StoreLock:
    """The store-wide lock: this object's threads, then every other object
    (a flock on the rendezvous handle's own description, ``lock_fd``)."""

    __slots__ = ("_thread_lock", "_rdv")

    def __init__(self, rdv: Rendezvous) -> None:
        self._thread_lock = threading.Lock()
        self._rdv = rdv

    def __enter__(self) -> None:
        self._thread_lock.acquire()
        try:
            # In a fork child the rendezvous has a handle, and a description, of its own.
            fcntl.flock(self._rdv.lock_fd(), fcntl.LOCK_EX)
        except BaseException:
            self._thread_lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._rdv.lock_fd(), fcntl.LOCK_UN)
        self._thread_lock.release()


class Store(dist.Store):
    """A ``torch.distributed.Store`` in the named rendezvous ``name``: every
    process of this user on this host that opens the same name (and ``dir``)
    shares it. Pass it wherever torch takes a Store
    (``init_process_group(store=...)``, ``PrefixStore``, elastic agents), or
    meet through ``init_method="shmrdv://NAME"``.

    Opening attaches to the rendezvous or creates it (``size``: its arena,
    default 16 MiB; ``dir``/``SHMRDV_DIR``: its directory, as
    ``Rendezvous``). Values persist until deleted or the segment is removed:
    ``unlink()``, ``shmrdv rm NAME``, ``shmrdv gc --unlink-orphans`` once no
    live process has it attached, or, with ``world_size``, the close of the
    job's last member (each ``close`` counts one; the ``world_size``-th
    removes the segment).

    ``timeout`` (a timedelta or seconds; default 300 s, as TCPStore) bounds
    ``get``, ``wait``, ``multi_get`` and ``queue_pop``, which then raise
    ``torch.distributed.DistStoreError`` (a ``RuntimeError``) as TCPStore
    does. Thread-safe; a process killed inside any call leaves the Store
    consistent (the module docstring says how)."""

    def __init__(self, name: str, *, world_size: Optional[int] = None,
                 timeout: Union[datetime.timedelta, float, None] = DEFAULT_TIMEOUT, size: Optional[int] = None,
                 dir: Optional[str] = None) -> None:
        super().__init__()
        self._rdv = Rendezvous(name, size=size or DEFAULT_SIZE, dir=dir)
        self._name, self._dir, self._size, self._world_size = name, self._rdv.dir, size, world_size
        self._timeout_s = _seconds(timeout)
        self._lock = _StoreLock(self._rdv)
        self._closed = False

    # ---- life --------------------------------------------------------------

    @property
    def name(self) -> str:
        """The rendezvous (and Store) name: ``shmrdv ls`` and ``stat`` show it."""
        return self._name

    @property
    def rendezvous(self) -> Rendezvous:
        """The rendezvous underneath (for ``stats()``, ``processes()``)."""
        return self._rdv

    def close(self) -> None:
        """Detach; idempotent. With ``world_size``, the job's last member to
        close (the ``world_size``-th close) removes the segment."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._world_size is not None and self.add(CLOSED_KEY, 1) >= self._world_size:
                self._rdv.unlink()
        finally:
            self._rdv.close()

    def unlink(self) -> None:
        """Remove the segment's name (``Rendezvous.unlink``); idempotent."""
        self._rdv.unlink()

    def __del__(self) -> None:
        # torch holds a Store it was given (init_process_group, PrefixStore)
        # and lets it go at destroy_process_group: that is its close, which
        # counts toward world_size's.
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # a finalizer must not raise; the segment stays for shmrdv gc
                pass

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<shmrdv.torch.Store name={self._name!r} {'closed' if self._closed else 'open'}>"

    def __reduce__(self) -> Any:
        return (_reopen, (self._name, self._dir, self._timeout_s, self._size))

    def clone(self) -> "Store":
        """A new Store object on the same segment, with its own handle and lock description (not counted by
        ``world_size``)."""
        return Store(self._name, timeout=self._timeout_s, size=self._size, dir=self._dir)

    # ---- timeouts ------------------------------------------------------------

    @property
    def timeout(self) -> datetime.timedelta:
        """The default timeout of blocking calls."""
        return datetime.timedelta(seconds=self._timeout_s)

    def set_timeout(self, timeout: Union[datetime.timedelta, float]) -> None:
        """Set the default timeout of ``get``, ``wait``, ``multi_get`` and ``queue_pop``."""
        self._timeout_s = _seconds(timeout)

    # ---- what runs under the lock --------------------------------------------

    def _take(self, key: str) -> List[np.ndarray]:
        """Every message of rdv key ``key``, oldest first, each leased (step 1).
        A key that looks empty may be one a dead holder of the lock had
        taken: its leases are back once the dead are reclaimed, so an empty
        key is looked at again after reclaiming them."""
        try_recv = self._rdv.try_recv
        first = try_recv(key, lease=True)
        if first is None:
            if not self._rdv.collect_garbage():
                return []
            first = try_recv(key, lease=True)
            if first is None:
                return []
        views = [first]
        more = try_recv(key, lease=True)
        while more is not None:
            views.append(more)
            more = try_recv(key, lease=True)
        return views

    def _write(self, key: str, taken: List[np.ndarray], value: Any) -> None:
        """Steps 2 and 3: commit ``value`` under ``s/key``, then let the taken messages go."""
        self._rdv.send(_VALUE + key, value)
        if not taken:
            self._notify(key)
        taken.clear()

    def _notify(self, key: str) -> None:
        """K was just created: one notice on ``n/K`` per waiter registered in ``w/K``."""
        counts = self._take(_WAITERS + key)
        if counts:
            notice = _EMPTY
            for _ in range(int(counts[-1].tobytes())):
                self._rdv.send(_NOTICE + key, notice)
            counts.clear()

    def _adjust_waiters(self, key: str, by: int) -> bool:
        """Add ``by`` to ``w/K``; False (unchanged) when ``w/K`` is gone (its waiters were notified)."""
        counts = self._take(_WAITERS + key)
        if not counts and by < 0:
            return False
        left = (int(counts[-1].tobytes()) if counts else 0) + by
        if left > 0:
            self._rdv.send(_WAITERS + key, _array(str(left).encode()))
        counts.clear()
        return True

    def _value(self, key: str) -> Optional[bytes]:
        """K's value, or None; the value is sent again (step 2), the taken ones dropped."""
        taken = self._take(_VALUE + key)
        if not taken:
            return None
        newest = taken[-1]
        value = newest.tobytes()
        self._rdv.send(_VALUE + key, newest)
        taken.clear()
        return value

    def _exists(self, key: str) -> bool:
        value = self._take(_VALUE + key)
        if value:
            self._rdv.send(_VALUE + key, value[-1])
            value.clear()
            return True
        return self._queue_len(key) > 0

    # ---- set, get, add, compare_set, append --------------------------------

    def set(self, key: str, value: Union[str, bytes]) -> None:
        """Set ``key`` to ``value`` (str, as UTF-8, or bytes); wakes waiters of ``key``."""
        arr = _array(_as_bytes(value))
        with self._lock:
            self._write(key, self._take(_VALUE + key), arr)

    def get(self, key: str) -> bytes:
        """``key``'s value, waiting up to the Store's timeout for it to be set (then ``DistStoreError``)."""
        with self._lock:
            value = self._value(key)
        if value is None:
            return self._wait_for(key, self._timeout_s, fetch=True)  # type: ignore[return-value]
        return value

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer ``key`` holds (0 when missing), atomically; returns the sum."""
        amount = int(amount)
        with self._lock:
            taken = self._take(_VALUE + key)
            total = (int(taken[-1].tobytes()) if taken else 0) + amount
            self._write(key, taken, _array(str(total).encode()))
        return total

    def compare_set(self, key: str, expected_value: Union[str, bytes], desired_value: Union[str, bytes]) -> bytes:
        """Set ``key`` to ``desired_value`` if it holds ``expected_value`` (or is missing and
        ``expected_value`` is empty); returns the value it holds afterwards, or ``expected_value``
        when the key is missing and ``expected_value`` is not empty (as TCPStore)."""
        expected, desired = _as_bytes(expected_value), _as_bytes(desired_value)
        with self._lock:
            taken = self._take(_VALUE + key)
            if not taken:
                if expected:
                    return expected
            elif taken[-1].tobytes() != expected:
                current = taken[-1].tobytes()
                self._rdv.send(_VALUE + key, taken[-1])
                taken.clear()
                return current
            self._write(key, taken, _array(desired))
        return desired

    def append(self, key: str, value: Union[str, bytes]) -> None:
        """Append ``value`` to ``key``'s value (creating it), atomically."""
        tail = _as_bytes(value)
        with self._lock:
            taken = self._take(_VALUE + key)
            self._write(key, taken, _array((taken[-1].tobytes() if taken else b"") + tail))

    def multi_set(self, keys: Sequence[str], values: Sequence[Union[str, bytes]]) -> None:
        """``set`` of each pair, under one hold of the lock (see the module docstring on crashes)."""
        if len(keys) != len(values):
            raise ValueError(f"multi_set: {len(keys)} keys but {len(values)} values")
        arrays = [_array(_as_bytes(v)) for v in values]
        with self._lock:
            for key, arr in zip(keys, arrays):
                self._write(key, self._take(_VALUE + key), arr)

    def multi_get(self, keys: Sequence[str]) -> List[bytes]:
        """The values of ``keys``, waiting (up to the timeout, in all) for those not set yet."""
        deadline = time.monotonic() + self._timeout_s
        out: List[bytes] = []
        for key in keys:
            with self._lock:
                value = self._value(key)
            if value is None:
                value = self._wait_for(key, deadline - time.monotonic(), fetch=True)
            out.append(value)  # type: ignore[arg-type]
        return out

    # ---- keys ------------------------------------------------------------

    def check(self, keys: Sequence[str]) -> bool:
        """Whether every key of ``keys`` has a value (or a non-empty queue) now; never blocks."""
        with self._lock:
            return all(self._exists(key) for key in keys)

    def wait(self, keys: Sequence[str], timeout: Union[datetime.timedelta, float, None] = None) -> None:
        """Wait until every key of ``keys`` has a value (or a non-empty queue), up to ``timeout``
        (default: the Store's) in all; then ``DistStoreError``."""
        deadline = time.monotonic() + (self._timeout_s if timeout is None else _seconds(timeout))
        for key in keys:
            with self._lock:
                there = self._exists(key)
            if not there:
                self._wait_for(key, deadline - time.monotonic(), fetch=False)

    def delete_key(self, key: str) -> bool:
        """Remove ``key``'s value; whether it had one."""
        with self._lock:
            taken = self._take(_VALUE + key)
            had = bool(taken)
            while taken:
                del taken[0]  # oldest first: letting the newest go is the commit
            return had

    def num_keys(self) -> int:
        """How many keys have a value."""
        return len(self.list_keys())

    def list_keys(self) -> List[str]:
        """The keys that have a value (a key of more than 252 bytes comes cut, ending in ``...``)."""
        with self._lock:
            infos = self._rdv.keys(limit=1 << 24)
        return [k.name[len(_VALUE):] for k in infos if k.pending and k.name and k.name.startswith(_VALUE)]

    # ---- queues ------------------------------------------------------------

    def queue_push(self, key: str, value: Union[str, bytes]) -> None:
        """Append ``value`` to queue ``key``; wakes its oldest waiting ``queue_pop``."""
        self._rdv.send(_QUEUE + key, _array(_as_bytes(value)))

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        """The oldest item of queue ``key``, waiting up to the Store's timeout for one
        (``DistStoreError`` then); ``block=False``: ``torch.distributed.QueueEmptyError`` at once when empty."""
        if not block:
            item = self._rdv.try_recv(_QUEUE + key)
            if item is None:
                raise dist.QueueEmptyError(f"queue_pop: queue {key!r} is empty")
            return item.tobytes()  # type: ignore[no-any-return]
        try:
            return self._rdv.recv(_QUEUE + key, timeout=self._timeout_s).tobytes()  # type: ignore[no-any-return]
        except RendezvousTimeout:
            raise dist.DistStoreError(f"Timeout waiting for queue {key!r} after "
                                      f"{self._timeout_s * 1000:.0f} ms (shmrdv Store {self._name!r})") from None

    def queue_len(self, key: str) -> int:
        """How many items queue ``key`` holds (0 for a queue never pushed to)."""
        return self._queue_len(key)

    def _queue_len(self, key: str) -> int:
        want = _QUEUE + key
        return sum(k.pending for k in self._rdv.keys(limit=1 << 24) if k.name == want)

    # ---- barrier -------------------------------------------------------------

    def barrier(self, key: str, world_size: int, timeout: Union[datetime.timedelta, float, None] = None) -> None:
        """Return once ``world_size`` callers have called ``barrier(key, ...)``, waiting up to ``timeout``
        (default: the Store's), then ``DistStoreError``."""
        if self.add(key + "/arrived", 1) >= world_size:
            self.set(key + "/released", b"1")
        self.wait([key + "/released"], timeout)

    def has_extended_api(self) -> bool:
        return True

    # ---- waiting -------------------------------------------------------------

    def _wait_for(self, key: str, seconds: float, fetch: bool) -> Optional[bytes]:
        """Wait for ``key`` to be set, up to ``seconds``: its value (``fetch``) or None."""
        deadline = time.monotonic() + seconds
        registered = False
        try:
            while True:
                with self._lock:
                    if fetch:
                        value = self._value(key)
                        if value is not None:
                            return value
                    elif self._exists(key):
                        return None
                    if not registered:
                        self._adjust_waiters(key, 1)
                        registered = True
                left = deadline - time.monotonic()
                if left <= 0:
                    raise dist.DistStoreError(f"Timeout waiting for key {key!r} after {seconds * 1000:.0f} ms "
                                              f"(shmrdv Store {self._name!r}): wait timeout")
                try:
                    if self._rdv.recv(_NOTICE + key, timeout=min(left, _POLL_S)) is not None:
                        registered = False  # our registration was turned into this notice
                except RendezvousTimeout:
                    pass
        finally:
            if registered:
                with self._lock:
                    if not self._adjust_waiters(key, -1):
                        self._rdv.try_recv(_NOTICE + key)  # our notice was sent: drop it


def _reopen(name: str, dir: Optional[str], timeout: float, size: Optional[int]) -> Store:
    return Store(name, timeout=timeout, size=size, dir=dir)


__all__ = ["CLOSED_KEY", "DEFAULT_SIZE", "DEFAULT_TIMEOUT", "Store"]
