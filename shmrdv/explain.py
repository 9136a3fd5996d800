"""What the errors of sends and receives say beyond their code: how long
a receive waited and who else has the rendezvous; why a message does not
fit, and what would hold it. Called only on the way to raising."""
import errno
import os
from typing import Any, Optional

from .errors import RendezvousError
from .forms import block_bytes, round_up
from .segments import MAX_SIZE, PAGE, private_pid


def wait_message(rdv: Any, what: str, timeout: Optional[float], code: int) -> Optional[str]:
    """The message of a receive whose timeout ran out: how long, who else
    has the rendezvous, and where to look."""
    if code != errno.ETIMEDOUT or timeout is None:
        return None
    try:
        others = len({p.pid for p in rdv.processes() if p.alive and p.pid != os.getpid()})
    except RendezvousError:
        return None
    return (f"{what}: nothing came within {float(timeout):g} s; {others} other live process(es) have rendezvous "
            f"{rdv.name!r} attached (`shmrdv stat {rdv.name}` shows its keys, pending messages and "
            f"waiting receivers)")


def _constructor(rdv: Any, size: int) -> str:
    """How to make a rendezvous like this one with another size, for messages."""
    return f"Rendezvous(size={size})" if _private(rdv) else f"Rendezvous({rdv.name!r}, size={size})"


def _private(rdv: Any) -> bool:
    """Whether rdv is a private rendezvous (its creator's handle, or another's)."""
    return private_pid(rdv.name) is not None


def space_message(rdv: Any, what: str, key_len: int, ndim: int, nbytes: int, timeout: Optional[float], code: int) -> Optional[str]:
    """The message of a send or alloc that found no room: one that can
    never fit (EMSGSIZE) or a wait for space that ran out (ETIMEDOUT)."""
    block, meta = block_bytes(key_len, ndim, nbytes)
    cap = rdv.capacity
    if code == errno.EMSGSIZE:
        needs = (f"{what}: the message needs a block of {block} bytes ({nbytes} of payload, {meta} of header), "
                 f"more than this rendezvous's {cap}-byte arena, so it can never fit however much is freed")
        size = round_up(block, PAGE)
        if size > MAX_SIZE:
            return f"{needs}; no rendezvous can hold it either (at most size={MAX_SIZE}, about 64 GiB): send it in parts"
        remove = "" if _private(rdv) else f" (remove this one first: shmrdv rm {rdv.name})"
        return (f"{needs}; create the rendezvous with room for it{remove}: {_constructor(rdv, size)} "
                f"holds one such message, a larger size several at once")
    if code != errno.ETIMEDOUT:
        return None
    try:
        st, procs = rdv.stats(), rdv.processes()
    except RendezvousError:
        return None
    views = sum(p.views for p in procs)
    view_bytes = sum(p.view_bytes for p in procs)
    writing = sum(p.writing for p in procs)
    waited = "with timeout=0" if timeout == 0 else f"after {timeout:g} s"
    held = f"{st.bytes_used} bytes held by {views} views ({view_bytes} bytes) and {st.pending_messages} pending messages"
    if writing:
        held += f" and {writing} blocks being written"
    return (f"{what}: timed out {waited} waiting for a free block of {block} bytes: arena full: {st.bytes_free} bytes "
            f"free (largest free block {st.largest_free}), {held}. A received view keeps its space until it and every "
            f"array derived from it are gone (del them): receive what is pending, drop views no longer needed, or "
            f"create the rendezvous with a larger size than its {cap} bytes")
