"""The segment files of rendezvous: the names and sizes they may have,
where they live (``/dev/shm/shmrdv-NAME``), creating and attaching to
them safely (owner, mode, symbolic links, a creator still initialising or
dead), private rendezvous' names and their sweep, and removing them."""
import contextlib
import errno
import os
import re
import stat
import time
from typing import Any, List, Optional, Tuple

import posix_ipc

from . import limits
from ._binding import ffi, lib, raise_rc
from .codec import positive_int
from .errors import (HugePagesUnavailable, InvalidArgument, InvalidType, RendezvousTimeout, SegmentMismatch,
                     SharedMemoryFull)
from .forms import round_up
from .huge_pages import offered as huge_pages_offered
from .leftovers import CREATOR_GRACE_S, pid_gone, sweep

DEFAULT_SIZE = 64 << 20
"""Arena bytes of a rendezvous created without ``size``."""
SEGMENT_PREFIX = "/shmrdv-"
"""A rendezvous NAME lives in the POSIX shm object ``/shmrdv-NAME`` (``/dev/shm/shmrdv-NAME``)."""
SHM_DIR = "/dev/shm"
_FILE_PREFIX = SEGMENT_PREFIX.lstrip("/")
_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,%d}\Z" % lib.RDV_NAME_MAX)
OPEN_TIMEOUT = 60.0
"""Seconds ``Rendezvous(...)`` waits, by default, for the creator of a
segment that is still initialising it (see ``timeout``)."""
PAGE = 4096
MAX_SIZE = limits.MAX_ARENA_BYTES
"""The largest arena a rendezvous can have, in bytes (2**36 - 4096, about 64 GiB)."""
MAX_KEYS = limits.MAX_KEYS
"""The largest max_keys a rendezvous can have (2**24)."""


def arena_size(size: object, what: str = "size") -> int:
    """Check an arena size argument (``size=``, or ``what``): a multiple of
    4096 in [4096, MAX_SIZE] (the one check, for every layer that takes one)."""
    size = positive_int(size, what)
    if size > MAX_SIZE:
        raise InvalidArgument(f"{what}={size} is over the limit of a rendezvous: at most {MAX_SIZE} bytes "
                              f"(64 GiB less 4 KiB)")
    if size % PAGE:
        below, above = size // PAGE * PAGE, round_up(size, PAGE)
        nearest = f"{what}={above}" if below == 0 else f"{what}={below} or {what}={above}"
        raise InvalidArgument(f"{what} must be a multiple of {PAGE} bytes (a page), got {what}={size}: use {nearest}")
    return size


def default_max_keys(arena: int) -> int:
    """max_keys of a rendezvous created without one: size/4096, clamped to 1,024..1,048,576."""
    return max(1024, min(arena // 4096, 1 << 20))


def no_space_error(what: str, arena: int, max_keys: Optional[int], size_word: str = "size") -> SharedMemoryFull:
    """The error of a create that /dev/shm has no room for: what the segment
    needs, what is free, the largest ``size_word`` that fits now (with
    max_keys None: its default for each size, as a create without it gets)."""

    def needs(size: int) -> int:
        return int(lib.rdv_segment_bytes(size, default_max_keys(size) if max_keys is None else max_keys))

    try:
        st = os.statvfs(SHM_DIR)
        free: Optional[int] = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    if free is None:
        advice = "free space unknown; "
    else:
        lo, hi = 0, arena // PAGE - 1  # in pages: the largest arena whose segment fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if needs(mid * PAGE) <= free else (lo, mid - 1)
        fits = lo * PAGE if lo and needs(lo * PAGE) <= free else 0
        advice = f"{free:,} bytes free; " + (f"pass a smaller {size_word}= ({size_word}={fits} fits now), " if fits else
                                            f"not even the smallest rendezvous ({needs(PAGE):,} bytes) fits: ")
    return SharedMemoryFull(
        errno.ENOSPC,
        f"{what}: /dev/shm has no room: the segment needs {needs(arena):,} bytes (its {arena:,}-byte arena, key "
        f"index, side table and process table) and /dev/shm has {advice}free space there, or enlarge it "
        f"(docker run --shm-size, a memory-backed emptyDir in Kubernetes)")


def checked_name(name: object, what: str, max_len: int) -> str:
    """A segment's name: 1..max_len characters of [A-Za-z0-9._-] (the one check of names)."""
    if not isinstance(name, str):
        raise InvalidType(f"{what} must be a str, not {type(name).__name__}")
    if not _NAME_RE.match(name) or len(name) > max_len:
        raise InvalidArgument(f"{what} must be 1..{max_len} characters of [A-Za-z0-9._-]: {name!r}")
    return name


def private_name() -> str:
    """A name for a private rendezvous of this process: private-PID-RANDOM."""
    return f"private-{os.getpid()}-{os.urandom(6).hex()}"  # not secrets: it loads hmac


# private_name()'s form: kept for private rendezvous, which the sweep below
# may remove once their creator is gone; no other name is ever swept.
_PRIVATE_RE = re.compile(r"private-([0-9]{1,10})-[0-9a-f]{12}\Z", re.ASCII)


def private_pid(name: str) -> Optional[int]:
    """The creator's pid in a name of private_name()'s form, else None."""
    match = _PRIVATE_RE.match(name)
    return int(match.group(1)) if match else None


def sweep_dead_private() -> List[str]:
    """Remove this user's private rendezvous whose creating process is gone
    and that no process has attached: what a creator killed before it could
    unlink leaves (SIGKILL, or a SIGTERM nobody handled). Run by every
    ``Rendezvous()`` and by ``shmrdv gc``; returns the names removed."""

    def stale(rest: str, fd: int, st: os.stat_result) -> bool:
        pid = private_pid("private-" + rest)
        if pid is None or pid == os.getpid() or not pid_gone(pid):
            return False
        # Nobody attached, nor creating it: a file this young may be a
        # creator's (from another pid namespace) between its steps, when no
        # byte of it is locked for a moment (before the first, or after
        # publishing it and before attaching as an entry).
        return not lib.rdv_segment_in_use(fd) and time.time() - st.st_ctime >= CREATOR_GRACE_S

    return ["private-" + rest for rest in sweep(SEGMENT_PREFIX.lstrip("/") + "private-", stale)]


def unlink_private(name: str, pid: int) -> None:
    # Only the creating process removes a private rendezvous: never a child
    # that inherited the object through fork and exits normally.
    if os.getpid() == pid:
        unlink_segment(name)


def segment_names() -> List[str]:
    """Names of the rendezvous whose segments exist, sorted."""
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted(e[len(_FILE_PREFIX) :] for e in entries if e.startswith(_FILE_PREFIX))


def segment_path(name: str) -> str:
    return os.path.join(SHM_DIR, _FILE_PREFIX + name)


def foreign_owner(name: str) -> Optional[str]:
    """"uid N (login)" when the segment of rendezvous ``name`` is another
    user's (shmrdv never attaches to one), else None: ours, or none there."""
    try:
        uid = os.lstat(segment_path(name)).st_uid
    except FileNotFoundError:
        return None
    return None if uid == os.geteuid() else f"uid {uid} ({user_name(uid)})"


def segment_file(path: str) -> str:
    return os.path.join(SHM_DIR, path.lstrip("/"))


def shm_open(path: str, what: str, *args: Any, **kwargs: Any) -> "posix_ipc.SharedMemory":
    """posix_ipc.SharedMemory(path, ...), whose bare ValueError for an entry
    that is no shared-memory file (a directory made under the name: /dev/shm
    is writable by every user) becomes a SegmentMismatch saying so."""
    try:
        return posix_ipc.SharedMemory(path, *args, **kwargs)
    except ValueError:
        raise SegmentMismatch(f"cannot open {what}: {segment_file(path)} is not a shared-memory file (a directory?); "
                              f"remove it if it is yours, else use another name") from None


def check_owner(fd: int, name: str, path: str, *, what: str = "rendezvous", remove: str = "") -> None:
    """Attach only to a segment this user owns and nobody else can open:
    another local user could have created it first, to read the tensors
    sent through it or plant its own (PermissionError, naming owner and mode).
    ``what`` names the kind of segment, ``remove`` the command that removes
    it (``shmrdv rm NAME`` by default)."""
    st = os.fstat(fd)
    euid = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    remove = remove or f"shmrdv rm {name}"
    if st.st_uid != euid:
        raise PermissionError(errno.EACCES, f"refusing to attach to {what} {name!r}: its segment is owned by "
                              f"uid {st.st_uid} ({user_name(st.st_uid)}), not by this user (uid {euid}), so its owner "
                              f"can read and change what is sent through it; remove it ({remove}, as its "
                              f"owner or root) or use another name", segment_file(path))
    if mode & 0o077:
        raise PermissionError(errno.EACCES, f"refusing to attach to {what} {name!r}: its segment has mode "
                              f"{mode:04o}, open to group or others (shmrdv creates them 0600); remove it "
                              f"({remove}), or chmod 600 it if you trust what it holds", segment_file(path))


def user_name(uid: int) -> str:
    """The login name of a uid, for messages that name a segment's owner."""
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return "no such user"


def segment_version(path: str) -> str:
    """The layout version a segment's header names (byte 8 in every version), for messages."""
    try:
        with open(os.path.join(SHM_DIR, path.lstrip("/")), "rb") as f:
            head = f.read(12)
    except OSError:
        return "unknown"
    return str(int.from_bytes(head[8:12], "little")) if len(head) == 12 else "unknown"


def unlink_segment(name: str) -> None:
    """Remove the segment of rendezvous ``name`` if it exists."""
    try:
        posix_ipc.unlink_shared_memory(SEGMENT_PREFIX + name)
    except posix_ipc.ExistentialError:
        pass


def segment_in_use(name: str) -> bool:
    """Whether a live process has the segment of rendezvous ``name`` attached
    (or is creating it), told without attaching: for root, who may remove
    another user's segment but never attaches to it. ``FileNotFoundError``
    if there is none."""
    try:
        shm = shm_open(SEGMENT_PREFIX + name, f"rendezvous {name!r}")
    except posix_ipc.ExistentialError:
        raise FileNotFoundError(errno.ENOENT, "no such rendezvous", name) from None
    try:
        return bool(lib.rdv_segment_in_use(shm.fd))
    finally:
        shm.close_fd()

def open_segment(name: str, arena: int, max_keys: int, create: Optional[bool], wait_ns: int = -1, flags: int = 0,
                 asked_keys: Optional[int] = None) -> Tuple[Any, bool]:
    """The core's handle of rendezvous ``name``, created or attached, and
    whether it was created (``create``: None either, True create only,
    False attach only). ``wait_ns``: how long to wait for a creator still
    initialising it (-1: forever). ``asked_keys``: the max_keys the caller
    gave (None: the default for each size), for what a create that
    /dev/shm has no room for says would fit."""
    path = SEGMENT_PREFIX + name
    out = ffi.new("rdv_t **")
    deadline = None if wait_ns < 0 else time.monotonic() + wait_ns / 1e9
    pause = 0.001
    while True:
        if create is not False:
            try:
                shm = shm_open(path, f"rendezvous {name!r}", posix_ipc.O_CREX, mode=0o600)
            except posix_ipc.ExistentialError:
                if create:
                    raise FileExistsError(errno.EEXIST, "rendezvous already exists", name) from None
            else:
                try:
                    offer = huge_pages_offered() if flags & lib.RDV_CREATE_HUGE_PAGES else None
                    if offer is not None and not offer.available:
                        rc = -errno.EOPNOTSUPP
                    else:
                        rc = lib.rdv_create_flags(shm.fd, arena, max_keys, flags, out)
                except BaseException:
                    if out[0] != ffi.NULL:  # made before the exception came: let it go too
                        lib.rdv_close(out[0])
                    with contextlib.suppress(posix_ipc.ExistentialError):
                        posix_ipc.unlink_shared_memory(path)  # ours, never initialised: not left behind
                    raise
                finally:
                    shm.close_fd()
                if rc < 0:
                    posix_ipc.unlink_shared_memory(path)
                    if rc == -errno.ENOSPC:
                        raise no_space_error(f"cannot create rendezvous {name!r}", arena, asked_keys)
                    if rc == -errno.EOPNOTSUPP and flags & lib.RDV_CREATE_HUGE_PAGES:
                        why = offer.why if offer is not None and not offer.available else \
                            "the kernel refuses to advise huge pages for it (MADV_HUGEPAGE)"
                        raise HugePagesUnavailable(f"rendezvous {name!r}: huge_pages=True, but {why}; or "
                                                   f"create it without huge_pages (4 KiB pages; copies of 100 MiB "
                                                   f"and more are then about a quarter slower)")
                    raise_rc(rc, f"creating rendezvous {name!r} ({arena} bytes)")
                return out[0], True
        try:
            shm = shm_open(path, f"rendezvous {name!r}")  # O_NOFOLLOW
        except posix_ipc.ExistentialError:
            if create is False:
                raise FileNotFoundError(errno.ENOENT, "no such rendezvous", name) from None
            continue  # unlinked between our create and attach attempts
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise PermissionError(errno.EACCES, f"refusing to attach to rendezvous {name!r}: its "
                                      f"segment is a symbolic link; remove it (shmrdv rm {name})",
                                      segment_file(path)) from None
            raise
        try:
            check_owner(shm.fd, name, path)
            rc = lib.rdv_attach(shm.fd, out)
            age = time.time() - os.fstat(shm.fd).st_ctime if rc == -errno.EOWNERDEAD else 0.0
        finally:
            shm.close_fd()
        if rc in (-errno.EAGAIN, -errno.EOWNERDEAD):
            # EAGAIN: its creator is alive and still initialising it.
            # EOWNERDEAD: nobody is: a creator that died, unless the file
            # is so new that its creator may not have locked it yet.
            late = deadline is not None and time.monotonic() >= deadline
            if rc == -errno.EOWNERDEAD and (age >= CREATOR_GRACE_S or late):
                raise SegmentMismatch(
                    f"rendezvous {name!r} was never initialised: the process that created its segment "
                    f"died before finishing (or it is not a shmrdv segment); remove it (shmrdv rm {name}) "
                    f"and open it again")
            if late:
                raise RendezvousTimeout(
                    f"attaching to rendezvous {name!r}: its creator is alive but still initialising "
                    f"it after {wait_ns / 1e9:g} s; pass a longer timeout= (None waits as long as it takes)")
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
            continue
        if rc == -errno.EPROTONOSUPPORT:
            version = segment_version(path)
            what = ("was made with options this shmrdv does not know (a newer shmrdv's)"
                    if version == str(lib.RDV_LAYOUT_VERSION) else
                    f"has layout version {version}, this shmrdv uses version {lib.RDV_LAYOUT_VERSION}")
            raise SegmentMismatch(
                f"attaching to rendezvous {name!r}: its segment {what}; recreate it "
                f"(shmrdv rm {name}) with this shmrdv, or use the shmrdv that made it")
        if rc < 0:
            raise_rc(rc, f"attaching to rendezvous {name!r}")
        return out[0], False


def check_attached(h: Any, name: str, capacity: int, size: Optional[int], max_keys: Optional[int], huge: bool,
                   prefault: Optional[bool]) -> None:
    """An attach that asked for a size, max_keys, huge pages or a way of
    faulting pages in gets a segment that has them: else SegmentMismatch
    saying what differs (the caller closes the handle ``h``)."""
    differ = []
    out = ffi.new("struct rdv_stats *")
    known = lib.rdv_stats(h, out) == 0
    if known:
        if huge and not out.flags & lib.RDV_CREATE_HUGE_PAGES:
            differ.append(("huge_pages", False, True))
        has_prefault = not out.flags & lib.RDV_CREATE_NO_PREFAULT
        if prefault is not None and prefault != has_prefault:
            differ.append(("prefault", has_prefault, prefault))
    if size is not None and size != capacity:
        differ.append(("size", capacity, size))
    if known and max_keys is not None and out.max_keys != max_keys:
        differ.append(("max_keys", int(out.max_keys), max_keys))
    if not differ:
        return
    has = " and ".join(f"{what}={value}" for what, value, _ in differ)
    asked = " and ".join(f"{what}={value}" for what, _, value in differ)
    raise SegmentMismatch(
        f"rendezvous {name!r} already exists with {has}, not the {asked} asked for (size, "
        f"max_keys, huge_pages and prefault only apply when creating it): attach without them, or with {has}; or "
        f"remove it first (shmrdv rm {name}) to create it anew with {asked}")
