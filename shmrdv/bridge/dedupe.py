"""The receiving bridge's memory of what each sender already delivered.

Each sending origin (a bridge run, or a ``connect()`` client) gets one
producer mark of the local rendezvous: (origin id, base, bits), the dedupe
window of protocol.window_add. A message is committed together with its
origin's new window (``alloc(..., mark=...)``), atomically with respect to
the bridge's death: after a crash and restart the marks say exactly which
messages made it, so a resent one is recognised and dropped.
"""
import threading
from typing import Dict, List, Tuple

from .protocol import window_add, window_has
from ..limits import MAX_MARKS
from ..rendezvous import Rendezvous


class Origin:
    """One sender's window, and the lock that serialises its commits."""

    def __init__(self, index: int, origin: int, base: int, bits: int) -> None:
        self.index, self.origin = index, origin
        self.base, self.bits = base, bits
        self.lock = threading.Lock()
        self.users = 0
        self.last_used = 0

    def has(self, seq: int) -> bool:
        return window_has(self.base, self.bits, seq)

    def after(self, seq: int) -> Tuple[int, int]:
        """The window once seq is committed (ProtocolError if seq is out of it)."""
        return window_add(self.base, self.bits, seq)

    def mark(self, seq: int) -> Tuple[int, int, int, int]:
        base, bits = self.after(seq)
        return (self.index, self.origin, base, bits)


class Origins:
    """Mark slots by origin id. When all slots are taken, the least recently
    used origin that no connection is using gives its slot up."""

    def __init__(self, rdv: Rendezvous, slots: int = MAX_MARKS) -> None:
        self._rdv = rdv
        self._lock = threading.Lock()
        self._clock = 0
        self._slots: List[int] = list(range(slots))
        self._by_id: Dict[int, Origin] = {}
        for idx in self._slots:
            origin, base, bits = rdv.mark(idx)
            if origin:
                self._by_id[origin] = Origin(idx, origin, base, bits)

    def acquire(self, origin: int, first_seq: int = 1) -> Origin:
        """The origin's window, in use until release(). first_seq is the
        lowest sequence number the sender may still send: everything below
        counts as done (the sender had it acknowledged, maybe by a
        window this bridge no longer has)."""
        o = self._acquire(origin)
        with o.lock:
            if first_seq - 1 > o.base:
                shift = first_seq - 1 - o.base
                bits = o.bits >> shift if shift < 64 else 0
                self._rdv.set_mark(o.index, origin, first_seq - 1, bits)
                o.base, o.bits = first_seq - 1, bits
        return o

    def _acquire(self, origin: int) -> Origin:
        with self._lock:
            self._clock += 1
            o = self._by_id.get(origin)
            if o is None:
                used = {x.index for x in self._by_id.values()}
                free = [i for i in self._slots if i not in used]
                if free:
                    idx = free[0]
                else:
                    idle = [x for x in self._by_id.values() if x.users == 0]
                    if not idle:
                        raise RuntimeError(f"more than {len(self._slots)} senders connected at once")
                    victim = min(idle, key=lambda x: x.last_used)
                    del self._by_id[victim.origin]
                    idx = victim.index
                self._rdv.set_mark(idx, origin, 0, 0)
                o = self._by_id[origin] = Origin(idx, origin, 0, 0)
            o.users += 1
            o.last_used = self._clock
            return o

    def release(self, o: Origin) -> None:
        with self._lock:
            o.users -= 1
