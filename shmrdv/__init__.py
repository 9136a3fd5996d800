"""shmrdv: a TensorFlow-style rendezvous over POSIX shared memory.

One process ``send``s a numpy array under a string key, another ``recv``s it
by the same key, before or after the send, and gets a zero-copy read-only view
into shared memory.
"""
from .errors import (
    Aborted,
    InvalidArgument,
    InvalidType,
    MessageTooLarge,
    RendezvousError,
    RendezvousTimeout,
    SegmentMismatch,
    TooManyKeys,
)
from .keys import ParsedKey, create_key, parse_key
from .protocol import AuthenticationError, ConnectionLost, ProtocolError
from .rendezvous import DEFAULT_SIZE, Rendezvous
from .connect import RemoteRendezvous, connect
from .stats import KeyInfo, ProcessInfo, Stats

__all__ = [
    "Aborted",
    "AuthenticationError",
    "ConnectionLost",
    "DEFAULT_SIZE",
    "InvalidArgument",
    "InvalidType",
    "KeyInfo",
    "MessageTooLarge",
    "ParsedKey",
    "ProcessInfo",
    "ProtocolError",
    "RemoteRendezvous",
    "Rendezvous",
    "RendezvousError",
    "RendezvousTimeout",
    "SegmentMismatch",
    "Stats",
    "TooManyKeys",
    "connect",
    "create_key",
    "parse_key",
]

__version__ = "0.1.0"
