"""The binding layer: the compiled core, its hot paths against CPython
(``fast``: ``shmrdv/_fastpath.c``, given the core's functions here), and
the one place where its ``-errno`` return codes become Python exceptions."""
import errno
from typing import Callable, Dict, NoReturn, Optional, Tuple, Type

from . import _fastpath as fast
from ._native import ffi, lib  # noqa: F401  (re-exported to the other modules)
from .errors import (
    Aborted,
    InvalidArgument,
    MessageTooLarge,
    RendezvousError,
    RendezvousTimeout,
    SegmentMismatch,
    TooManyKeys,
)


def address(cdata: object) -> int:
    """A pointer's address, for ``fast``'s calls."""
    return int(ffi.cast("uintptr_t", cdata))


fast.init(*(address(ffi.addressof(lib, name)) for name in ("rdv_send", "rdv_send_many", "rdv_recv_start",
                                                              "rdv_recv_wait", "rdv_release_payload", "rdv_send_begin",
                                                              "rdv_unref", "rdv_send_discard")))

# errno -> (exception class, what the code says when the caller knows no more)
_ERRORS: Dict[int, Tuple[Type[RendezvousError], str]] = {
    errno.ETIMEDOUT: (RendezvousTimeout, "timed out"),
    errno.EAGAIN: (RendezvousTimeout, "would block"),
    errno.EMSGSIZE: (MessageTooLarge, "message larger than the arena can ever hold: it can never fit"),
    errno.ENOSPC: (TooManyKeys, "max_keys keys are live already (stats().max_keys): receive from some of them, "
                   "or create the rendezvous with a larger max_keys"),
    errno.ENOBUFS: (RendezvousError, "no room in the arena for the record of a waiting receiver (4 KiB holds 62): "
                    "receive what is pending, drop views no longer needed, or create the rendezvous larger"),
    errno.EINVAL: (InvalidArgument, "invalid argument"),
    errno.EBADF: (RendezvousError, "rendezvous is closed"),
    errno.EBADMSG: (SegmentMismatch, "segment metadata is damaged or inconsistent"),
    errno.EPROTO: (SegmentMismatch, "not a shmrdv segment (bad magic)"),
    errno.EPROTONOSUPPORT: (SegmentMismatch, "segment has another layout version"),
    errno.EFBIG: (SegmentMismatch, "segment size does not match its header: another process truncated (or grew) "
                  "its file; what lay past the cut is lost, so recreate the rendezvous (shmrdv rm NAME, then open it "
                  "again)"),
    errno.EOWNERDEAD: (SegmentMismatch, "segment never initialised: its creator died"),
    errno.EUSERS: (RendezvousError, f"too many handles attached ({lib.RDV_MAX_PROCS}, the most a rendezvous "
                   f"has room for): one handle per process is enough (threads share it); close() those no longer "
                   f"needed (shmrdv stat NAME lists the processes that hold them)"),
    errno.ENOTUNIQ: (RendezvousError, "two keys share a 128-bit hash; the message was left queued"),
}


def raise_rc(
    rc: int,
    what: str,
    abort_reason: Optional[Callable[[], str]] = None,
    *,
    name: Optional[str] = None,
    explain: Optional[Callable[[int], Optional[str]]] = None,
) -> NoReturn:
    """Raise the exception for a negative return code of the C core.

    ``what`` names the operation; ``abort_reason`` reads the reason an
    aborted rendezvous carries and ``name`` is the rendezvous (both for
    ``Aborted``). ``explain(errno)`` gives the whole message when the caller
    knows more than the code says (a message's sizes, a full arena's
    figures), or None to keep the code's own."""
    code = -rc
    if code == errno.ECONNABORTED:
        raise Aborted(abort_reason() if abort_reason is not None else "aborted", name)
    entry = _ERRORS.get(code)
    if entry is not None:
        cls, text = entry
        message = explain(code) if explain is not None else None
        raise cls(message if message is not None else f"{what}: {text}")
    raise RendezvousError(f"{what}: {errno.errorcode.get(code, code)} ({code})")
