"""Where a sending bridge keeps each link's identity: its origin id and the
next sequence number, in a producer mark of the local rendezvous, so a
bridge restarted after a crash numbers on where the dead one stopped and
the far side's dedupe window still applies. Marks [0, INBOUND_MARKS) keep
the receiving side's windows (dedupe.Origins); the rest are for links."""
import hashlib
import struct
import threading
from typing import Optional, Tuple

from ..limits import MAX_MARKS
from ..rendezvous import Rendezvous

INBOUND_MARKS = 48


def link_id(url: str, token: bytes) -> int:
    digest = hashlib.sha256(url.encode("utf-8") + b"\0" + token).digest()
    return struct.unpack("<Q", digest[:8])[0] | 1


class LinkMark:
    """One link's persistent (origin, next_seq); None when every mark is taken
    (the link then lives on a fresh origin each run, as without marks)."""

    def __init__(self, rdv: Rendezvous, idx: Optional[int], ident: int) -> None:
        self._rdv, self._idx, self._id = rdv, idx, ident

    def load(self) -> Optional[Tuple[int, int]]:
        if self._idx is None:
            return None
        ident, origin, next_seq = self._rdv.mark(self._idx)
        return (origin, next_seq) if ident == self._id and origin else None

    def store(self, origin: int, next_seq: int) -> None:
        if self._idx is not None:
            self._rdv.set_mark(self._idx, self._id, origin, next_seq)


class LinkMarks:
    _lock = threading.Lock()

    def __init__(self, rdv: Rendezvous) -> None:
        self._rdv = rdv

    def for_link(self, url: str, token: bytes) -> LinkMark:
        ident = link_id(url, token)
        with self._lock:
            free = None
            for idx in range(INBOUND_MARKS, MAX_MARKS):
                found = self._rdv.mark(idx)[0]
                if found == ident:
                    return LinkMark(self._rdv, idx, ident)
                if found == 0 and free is None:
                    free = idx
            return LinkMark(self._rdv, free, ident)
