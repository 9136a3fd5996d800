"""A snapshot of a rendezvous's state, as ``Rendezvous.stats()`` returns it."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Stats:
    """Taken without stopping other processes, so fields may be mutually a
    moment apart."""

    pending_messages: int
    """Messages sent and not yet received, over all keys."""
    keys: int
    """Keys that currently have pending messages or waiting receivers."""
    waiters: int
    """Receivers blocked in ``recv`` (or a pending ``recv_async``), over all processes."""
    bytes_used: int
    """Arena bytes not yet reclaimed: pending messages, live views, and space
    freed behind a still-held older block."""
    bytes_free: int
    """Arena bytes available to new messages."""
    capacity: int
    """Arena size in bytes."""
    max_keys: int
    """How many keys the index holds at most."""
    aborted: bool
    """Whether the rendezvous has been aborted."""
