"""The binding layer: the compiled core, and the one place where its
``-errno`` return codes become Python exceptions."""
import errno
from typing import Callable, Dict, NoReturn, Optional

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

_ERRORS: Dict[int, Callable[[str], Exception]] = {
    errno.ETIMEDOUT: lambda what: RendezvousTimeout(f"{what}: timed out"),
    errno.EAGAIN: lambda what: RendezvousTimeout(f"{what}: would block"),
    errno.EMSGSIZE: lambda what: MessageTooLarge(f"{what}: message larger than the arena can ever hold"),
    errno.ENOSPC: lambda what: TooManyKeys(f"{what}: key index full (raise max_keys)"),
    errno.EINVAL: lambda what: InvalidArgument(f"{what}: invalid argument"),
    errno.EBADF: lambda what: RendezvousError(f"{what}: rendezvous is closed"),
    errno.EBADMSG: lambda what: SegmentMismatch(f"{what}: segment metadata is damaged or inconsistent"),
    errno.EPROTO: lambda what: SegmentMismatch(f"{what}: not a shmrdv segment (bad magic)"),
    errno.EPROTONOSUPPORT: lambda what: SegmentMismatch(f"{what}: segment has another layout version"),
    errno.EFBIG: lambda what: SegmentMismatch(f"{what}: segment size does not match its header"),
    errno.EUSERS: lambda what: RendezvousError(f"{what}: too many handles attached (128)"),
    errno.ENOTUNIQ: lambda what: RendezvousError(f"{what}: two keys share a 128-bit hash; the message was left queued"),
}


def raise_rc(rc: int, what: str, abort_reason: Optional[Callable[[], str]] = None) -> NoReturn:
    """Raise the exception for a negative return code of the C core;
    ``abort_reason`` reads the reason an aborted rendezvous carries."""
    code = -rc
    if code == errno.ECONNABORTED:
        raise Aborted(abort_reason() if abort_reason is not None else "aborted")
    make = _ERRORS.get(code)
    if make is not None:
        raise make(what)
    raise RendezvousError(f"{what}: {errno.errorcode.get(code, code)} ({code})")
