"""The exception tree of shmrdv, rooted at RendezvousError.

Classes that describe a builtin condition also derive from the builtin, so
callers can catch either: ``RendezvousTimeout`` is a ``TimeoutError``,
``InvalidArgument`` a ``ValueError``, ``InvalidType`` a ``TypeError``.
"""
from typing import Any, Optional, Tuple


class RendezvousError(Exception):
    """Base of every error shmrdv raises for a rendezvous operation."""


class Aborted(RendezvousError):
    """The rendezvous was aborted (by any attached process); ``reason`` says
    why, as given to ``abort``. ``name`` is the rendezvous when known; the
    message then also says that an abort is permanent and how to start
    again."""

    def __init__(self, reason: str, name: Optional[str] = None) -> None:
        if name is None:
            message = reason
        else:
            message = (f"rendezvous {name!r} was aborted: {reason}. An abort is permanent: every send and "
                       f"recv on it fails from now on; to start again remove it (shmrdv rm {name}) and "
                       f"create it anew, or use a new name")
        super().__init__(message)
        self.reason = reason
        self.name = name

    def __reduce__(self) -> Tuple[Any, Tuple[str, Optional[str]]]:
        return (type(self), (self.reason, self.name))


class RendezvousTimeout(RendezvousError, TimeoutError):
    """A blocking operation did not complete within its timeout."""


class MessageTooLarge(RendezvousError):
    """The message can never fit the arena, however much of it is freed."""


class TooManyKeys(RendezvousError):
    """The key index is full: more live keys than the rendezvous was sized for."""


class SegmentMismatch(RendezvousError):
    """The shared-memory segment is not a compatible, intact shmrdv rendezvous."""


class SharedMemoryFull(RendezvousError, OSError):
    """/dev/shm has no room for a new rendezvous of the size asked for (errno
    ENOSPC); the message says what it needs, what is free, and what fits."""


class HugePagesUnavailable(RendezvousError):
    """``huge_pages=True`` on a machine whose /dev/shm gives no huge pages (the message says why and what would)."""


class InvalidArgument(RendezvousError, ValueError):
    """An argument has the right type but a value shmrdv cannot accept."""


class InvalidType(RendezvousError, TypeError):
    """An argument has a type shmrdv cannot accept."""


class ProtocolError(RendezvousError):
    """A bridge peer sent something the wire protocol does not allow; the connection is dropped."""


class ConnectionLost(RendezvousError, ConnectionError):
    """A bridge connection closed or failed."""


class AuthenticationError(RendezvousError):
    """The bridge peer does not hold the same token (or refused ours)."""


class CollectiveMismatch(RendezvousError, ValueError):
    """The ranks of a group made calls that do not match (collective, op,
    dtype, shape, root, or their order): raised on every rank, with no
    result computed."""


class GroupTimeout(Aborted, RendezvousTimeout):
    """A rank of a group gave up waiting at its ``timeout`` (in a call, or
    joining) and aborted the group, as a rank that gives up mid-call must:
    raised by that rank and by every other rank waiting or calling later,
    naming the ranks it had waited for (``missing``). Both an ``Aborted`` and
    a ``RendezvousTimeout`` (so a ``TimeoutError``)."""

    def __init__(self, reason: str, missing: Tuple[int, ...] = ()) -> None:
        super().__init__(reason)
        self.missing = tuple(missing)

    def __reduce__(self) -> Tuple[Any, Tuple[str, Tuple[int, ...]]]:  # type: ignore[override]
        return (type(self), (self.reason, self.missing))


class PeerLost(RendezvousError):
    """A rank of the group died (or closed the group) while others still
    needed it: ``rank`` and ``pid`` say which. The group cannot go on."""

    def __init__(self, message: str, rank: int = -1, pid: int = 0) -> None:
        super().__init__(message)
        self.rank = rank
        self.pid = pid

    def __reduce__(self) -> Tuple[Any, Tuple[str, int, int]]:
        return (type(self), (str(self), self.rank, self.pid))
