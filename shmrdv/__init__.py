"""shmrdv: a TensorFlow-style rendezvous over POSIX shared memory.

One process ``send``s a numpy array under a string key, another ``recv``s it
by the same key, before or after the send, and gets a zero-copy read-only view
into shared memory.
"""
from typing import Any

from . import rendezvous as _rendezvous
from .errors import (
    Aborted,
    AuthenticationError,
    CollectiveMismatch,
    ConnectionLost,
    GroupTimeout,
    InvalidArgument,
    InvalidType,
    MessageTooLarge,
    PeerLost,
    ProtocolError,
    RendezvousError,
    RendezvousTimeout,
    SegmentMismatch,
    SharedMemoryFull,
    HugePagesUnavailable,
    TooManyKeys,
)
from .group import Group
from .keys import DeviceName, ParsedKey, create_key, parse_key
from .rendezvous import Rendezvous
from .segments import DEFAULT_SIZE, MAX_KEYS, MAX_SIZE
from .stats import KeyInfo, ProcessInfo, Stats


def _routes(routes: Any, token: Any, tls_ca: Any) -> Any:
    # Rendezvous(routes=...) is the bridge layer wrapping the core: loaded
    # on first use, so that ``import shmrdv`` loads no sockets, ssl or hmac.
    from .bridge.routing import Routes

    return Routes(routes, token, tls_ca)


_rendezvous.install_router(_routes)


def __getattr__(name: str) -> Any:
    # connect() and RemoteRendezvous live in the bridge layer: loaded on first use.
    if name in ("connect", "RemoteRendezvous"):
        from .bridge import connect as _connect

        return getattr(_connect, name)
    raise AttributeError(f"module 'shmrdv' has no attribute {name!r}")

__all__ = [
    "Aborted",
    "AuthenticationError",
    "CollectiveMismatch",
    "ConnectionLost",
    "DEFAULT_SIZE",
    "Group",
    "GroupTimeout",
    "InvalidArgument",
    "InvalidType",
    "KeyInfo",
    "MAX_KEYS",
    "MAX_SIZE",
    "MessageTooLarge",
    "PeerLost",
    "ParsedKey",
    "ProcessInfo",
    "ProtocolError",
    "RemoteRendezvous",
    "Rendezvous",
    "RendezvousError",
    "RendezvousTimeout",
    "SegmentMismatch",
    "SharedMemoryFull",
    "HugePagesUnavailable",
    "Stats",
    "TooManyKeys",
    "connect",
    "create_key",
    "DeviceName",
    "parse_key",
]

__version__ = "0.1.0"
