"""The exception tree of shmrdv, rooted at RendezvousError.

Classes that describe a builtin condition also derive from the builtin, so
callers can catch either: ``RendezvousTimeout`` is a ``TimeoutError``,
``InvalidArgument`` a ``ValueError``, ``InvalidType`` a ``TypeError``.
"""


class RendezvousError(Exception):
    """Base of every error shmrdv raises for a rendezvous operation."""


class Aborted(RendezvousError):
    """The rendezvous was aborted (by any attached process); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RendezvousTimeout(RendezvousError, TimeoutError):
    """A blocking operation did not complete within its timeout."""


class MessageTooLarge(RendezvousError):
    """The message can never fit the arena, however much of it is freed."""


class TooManyKeys(RendezvousError):
    """The key index is full: more live keys than the rendezvous was sized for."""


class SegmentMismatch(RendezvousError):
    """The shared-memory segment is not a compatible, intact shmrdv rendezvous."""


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
