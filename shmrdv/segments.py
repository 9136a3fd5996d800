"""The segments of rendezvous: the names and sizes they may have, where
they live, creating and attaching to them safely (owner, mode, symbolic
links, a creator still initialising or dead), private rendezvous' names and
the sweep of what older versions left, and removing them.

Two kinds, told apart by the name:

* A named rendezvous is a file, ``DIR/shmrdv-NAME``, mode 0600, in the
  directory ``dir=`` names, else ``$SHMRDV_DIR``, else ``/dev/shm`` (any
  tmpfs or hugetlbfs: its messages outlive every process, until ``unlink``).
  Unrelated processes of this user meet there by name.
* A name of ``private_name()``'s form (``private-PID-HEX``) is a sealed
  memfd of process PID, bound to no mount (a 64 MiB container ``/dev/shm``
  does not limit it; the memory cgroup does): created by PID alone, sealed
  once sized (``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``: nobody can cut
  it under a mapping), and kept attachable by one descriptor of PID's
  (``_held``) until the handle that created it closes. Another process
  attaches by opening ``/proc/PID/fd/N`` of that descriptor, which gives it
  an open file description of its own (the byte locks that tell who is
  alive need one per process). That needs PID alive and holding it, and
  the attacher able to read PID's descriptors: the same user, PID dumpable,
  the same pid namespace; Yama's ``ptrace_scope`` restricts attaching a
  debugger, not this. The kernel frees the memory with its last descriptor
  or mapping: nothing of it can be left anywhere."""
import contextlib
import errno
import fcntl
import os
import re
import stat
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import posix_ipc

from . import limits
from ._binding import ffi, lib, raise_rc
from .codec import positive_int
from .errors import (HugePagesUnavailable, InvalidArgument, InvalidType, RendezvousError, RendezvousTimeout,
                     SegmentMismatch, SharedMemoryFull)
from .forms import round_up
from .huge_pages import offered as huge_pages_offered
from .leftovers import CREATOR_GRACE_S, pid_gone, sweep

DEFAULT_SIZE = 64 << 20
"""Arena bytes of a rendezvous created without ``size``."""
SEGMENT_PREFIX = "/shmrdv-"
"""A named rendezvous NAME lives in the file ``DIR/shmrdv-NAME`` (in /dev/shm:
the POSIX shm object ``/shmrdv-NAME``), a private one in the memfd ``shmrdv-NAME``."""
SHM_DIR = "/dev/shm"
"""Where named rendezvous' files are unless ``dir=`` or ``$SHMRDV_DIR`` names another directory."""
DIR_ENV = "SHMRDV_DIR"
"""The environment variable naming the directory of named rendezvous' files (default /dev/shm)."""
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

# A private rendezvous' memfd, once sized, takes these seals: nobody (its
# creator included) can shrink or grow it, nor change its seals.
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
# The descriptor that keeps a private rendezvous attachable is told apart
# from the other descriptors its creator has of the same memory (each
# handle's own lock description, rdv_reopen in csrc/rdv_os.c) by its file
# position, which nothing reads or writes through: attachers look for it in
# /proc/PID/fdinfo/N, so that once the creator closes it no new attach
# succeeds, whatever handles or views of the creator's still map it.
_HELD_POS = int.from_bytes(b"shmrdv", "big")
_held: Dict[str, int] = {}
"""The private rendezvous this process created and still offers: name -> that descriptor."""


def _forget_held_in_child() -> None:
    # A forked child is not their creator: it attaches through its parent's
    # descriptors as any process does, and copies of them here would only
    # keep descriptors open in a child that may live long.
    held = list(_held.values())
    _held.clear()
    for fd in held:
        with contextlib.suppress(OSError):
            os.close(fd)


os.register_at_fork(after_in_child=_forget_held_in_child)


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


def segment_dir(dir: Optional[str] = None) -> str:
    """The directory of named rendezvous' files: ``dir``, else
    ``$SHMRDV_DIR``, else /dev/shm. An absolute path: the processes that
    meet there may run in different working directories."""
    if dir is None:
        chosen: object = os.environ.get(DIR_ENV) or SHM_DIR
        what = DIR_ENV
    else:
        chosen, what = os.fspath(dir) if isinstance(dir, os.PathLike) else dir, "dir"
    if not isinstance(chosen, str):
        raise InvalidType(f"{what} must be a str or a path, not {type(chosen).__name__}")
    if not os.path.isabs(chosen):
        raise InvalidArgument(f"{what} must be an absolute path (the processes that meet in it may run in other "
                              f"working directories): {chosen!r}")
    return os.path.normpath(chosen)


def check_dir(directory: str) -> None:
    """Create and attach only in a directory where no other user can put a
    file under a name after we checked it: owned by this user or root, and
    writable by nobody else unless sticky (as /dev/shm and /tmp are)."""
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"the directory for rendezvous files does not exist: create it (any "
                                f"tmpfs, e.g. mount -t tmpfs -o size=8g tmpfs {directory}), or name another with "
                                f"dir= or {DIR_ENV}", directory) from None
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, f"rendezvous files go in a directory: name one with dir= or "
                                 f"{DIR_ENV}", directory)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (0, os.geteuid()):
        raise PermissionError(errno.EACCES, f"refusing to keep rendezvous files in a directory owned by uid "
                              f"{st.st_uid} ({user_name(st.st_uid)}): its owner could replace them; use one of "
                              f"your own, or a sticky one such as /dev/shm", directory)
    if mode & 0o022 and not mode & stat.S_ISVTX:
        raise PermissionError(errno.EACCES, f"refusing to keep rendezvous files in a directory that others may "
                              f"write to (mode {mode:04o}) without the sticky bit: they could replace them; "
                              f"chmod go-w it, or chmod +t it as /dev/shm is", directory)


def no_space_error(what: str, arena: int, max_keys: Optional[int], size_word: str = "size",
                   directory: Optional[str] = None) -> SharedMemoryFull:
    """The error of a create that the directory of named rendezvous
    (``directory``, else segment_dir()) has no room for: what the segment
    needs, what is free, the largest ``size_word`` that fits now (with
    max_keys None: its default for each size, as a create without it
    gets), and the ways to more room."""
    where = segment_dir() if directory is None else directory

    def needs(size: int) -> int:
        return int(lib.rdv_segment_bytes(size, default_max_keys(size) if max_keys is None else max_keys))

    try:
        st = os.statvfs(where)
        # no size: a tmpfs mounted size=0, a hugetlbfs without size= (which
        # has what /proc/meminfo's HugePages_Free says)
        free: Optional[int] = st.f_bavail * st.f_frsize if st.f_blocks else None
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
    enlarge = " (docker run --shm-size, a memory-backed emptyDir in Kubernetes)" if where == SHM_DIR else ""
    return SharedMemoryFull(
        errno.ENOSPC,
        f"{what}: {where} has no room: the segment needs {needs(arena):,} bytes (its {arena:,}-byte arena, key "
        f"index, side table and process table) and {where} has {advice}free space there, enlarge it{enlarge}, or "
        f"keep named rendezvous on a larger tmpfs (dir=, {DIR_ENV}); a private Rendezvous() is in no directory")


class MemoryLimit(NamedTuple):
    """The tightest memory cgroup limit over this process (``memory_limit``)."""

    limit: int
    """Bytes the cgroup may use (``memory.max``, or v1's ``memory.limit_in_bytes``)."""
    used: int
    """Bytes it uses now, less its inactive file cache (which the kernel reclaims before it refuses)."""
    where: str
    """The cgroup's directory and file, for messages."""

    @property
    def room(self) -> int:
        return max(0, self.limit - self.used)


def _cgroup_dirs() -> List[Tuple[str, str, str, str]]:
    """The memory cgroup directories over this process, innermost first, with
    the names of their limit, usage and inactive-cache entries (v2's, or
    v1's memory controller's): the process's own cgroup and its ancestors,
    then the mount's root (in a container without a cgroup namespace,
    /proc/self/cgroup names a path the container's mount does not have, and
    its root is the container's cgroup)."""
    found: List[Tuple[str, str, str, str]] = []
    with open("/proc/self/cgroup") as cgroups:
        lines = [line.rstrip("\n").split(":", 2) for line in cgroups]
    for _, controllers, path in (line for line in lines if len(line) == 3):
        if controllers == "":
            mount, names = "/sys/fs/cgroup", ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            mount, names = "/sys/fs/cgroup/memory", ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                                     "total_inactive_file")
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            directory = os.path.join(mount, *parts[:depth])
            if os.path.exists(os.path.join(directory, names[0])):
                found.append((directory, *names))
    return found


def memory_limit() -> Optional[MemoryLimit]:
    """The memory cgroup limit over this process with the least room left
    (cgroup v2 or v1), or None where none is set or none can be read. Every
    page of a segment is charged to the cgroup of the process that
    reserves it, and a reservation past the limit is met by the OOM killer,
    not by an error: creates check this first."""
    tightest: Optional[MemoryLimit] = None
    try:
        directories = _cgroup_dirs()
    except OSError:
        return None
    for directory, limit_name, used_name, inactive_name in directories:
        try:
            with open(os.path.join(directory, limit_name)) as f:
                text = f.read().strip()
            if text == "max" or int(text) >= 1 << 62:  # v1 writes "no limit" as about 2**63
                continue
            with open(os.path.join(directory, used_name)) as f:
                used = int(f.read())
            inactive = 0
            with contextlib.suppress(OSError, ValueError, StopIteration):
                with open(os.path.join(directory, "memory.stat")) as f:
                    inactive = int(next(line for line in f if line.startswith(inactive_name + " ")).split()[1])
            found = MemoryLimit(int(text), max(0, used - inactive), os.path.join(directory, limit_name))
        except (OSError, ValueError):
            continue
        if tightest is None or found.room < tightest.room:
            tightest = found
    return tightest


def memory_full_error(what: str, arena: int, max_keys: Optional[int], code: Optional[int] = None,
                      size_word: str = "size", limit: Optional[MemoryLimit] = None) -> SharedMemoryFull:
    """The error of a segment the memory cannot hold: what it needs, the
    memory cgroup's limit and what of it is left (``limit``, else read
    now), the largest ``size_word`` that fits, and what to do. ``max_keys``
    None: its default for each size; ``code``: the errno the kernel refused
    it with (None: refused before asking it)."""

    def needs(size: int) -> int:
        return int(lib.rdv_segment_bytes(size, default_max_keys(size) if max_keys is None else max_keys))

    limit = memory_limit() if limit is None else limit
    room = []
    free: Optional[int] = None
    if limit is not None:
        room.append(f"this process's memory cgroup may use {limit.limit:,} bytes ({limit.where}) and uses "
                    f"{limit.used:,} of them")
        free = limit.room
    with contextlib.suppress(OSError, ValueError, IndexError, StopIteration):
        with open("/proc/meminfo") as meminfo:
            available = next(line for line in meminfo if line.startswith("MemAvailable:"))
        machine = int(available.split()[1]) * 1024
        room.append(f"the machine has {machine:,} bytes available")
        free = machine if free is None else min(free, machine)
    said = "; ".join(room) or "how much is free is unknown"
    fits = ""
    if free is not None:
        lo, hi = 0, arena // PAGE - 1  # in pages: the largest arena whose segment fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if needs(mid * PAGE) <= free else (lo, mid - 1)
        fits = f" ({size_word}={lo * PAGE} fits now)" if lo and needs(lo * PAGE) <= free else ""
    refused = "" if code is None else f" ({os.strerror(code)})"
    return SharedMemoryFull(errno.ENOSPC, f"{what}: no memory for it{refused}: the segment needs "
                                          f"{needs(arena):,} bytes and {said}; pass a smaller {size_word}={fits}, or "
                                          f"give this process (its container: docker run --memory, a pod's memory "
                                          f"limit) more memory")


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


# private_name()'s form: kept for private rendezvous (memfds of process
# PID); the sweep below removes files of this form that older versions
# left once their creator is gone; no other name is ever swept.
_PRIVATE_RE = re.compile(r"private-([0-9]{1,10})-[0-9a-f]{12}\Z", re.ASCII)


def private_pid(name: str) -> Optional[int]:
    """The creator's pid in a name of private_name()'s form, else None."""
    match = _PRIVATE_RE.match(name)
    return int(match.group(1)) if match else None


def sweep_dead_private() -> List[str]:
    """Remove this user's files of private rendezvous in /dev/shm whose
    creating process is gone and that no process has attached: what a
    creator of an older version (whose private rendezvous were files there)
    killed before it could unlink left (SIGKILL, or a SIGTERM nobody
    handled). Run by every ``Rendezvous()`` and by ``shmrdv gc``; returns
    the names removed. A private rendezvous of this version is a memfd,
    which the kernel frees with its last user: it leaves nothing to sweep."""

    def stale(rest: str, fd: int, st: os.stat_result) -> bool:
        pid = private_pid("private-" + rest)
        if pid is None or pid == os.getpid() or not pid_gone(pid):
            return False
        # Nobody attached, nor creating it: a file this young may be a
        # creator's (from another pid namespace) between its steps, when no
        # byte of it is locked for a moment (before the first, or after
        # publishing it and before attaching as an entry).
        return not lib.rdv_segment_in_use(fd) and time.time() - st.st_ctime >= CREATOR_GRACE_S

    return ["private-" + rest for rest in sweep(_FILE_PREFIX + "private-", stale)]


def unlink_private(name: str, pid: int) -> None:
    # Only the creating process removes a private rendezvous: never a child
    # that inherited the object through fork and exits normally.
    if os.getpid() == pid:
        unlink_segment(name)


def segment_names(dir: Optional[str] = None) -> List[str]:
    """Names of the named rendezvous whose files are in ``dir`` (see
    segment_dir), sorted. Files under private_name()'s form are not among
    them: older versions' private rendezvous, which sweep_dead_private
    removes once their creator is gone (this version's are memfds)."""
    try:
        entries = os.listdir(segment_dir(dir))
    except (FileNotFoundError, NotADirectoryError):
        return []
    names = (e[len(_FILE_PREFIX) :] for e in entries if e.startswith(_FILE_PREFIX))
    return sorted(name for name in names if private_pid(name) is None)


def private_holders() -> Dict[str, List[int]]:
    """This user's private rendezvous that live processes have open (each
    attached handle keeps a descriptor of its own), from /proc: name ->
    the pids that hold a descriptor of it, sorted. Processes this user may
    not look into are passed by."""
    prefix, suffix = f"/memfd:{_FILE_PREFIX}", " (deleted)"
    found: Dict[str, set] = {}
    try:
        pids = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        try:
            entries = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone, or not ours to look into
        for entry in entries:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{entry}")
            except OSError:
                continue
            if target.startswith(prefix) and target.endswith(suffix):
                name = target[len(prefix) : -len(suffix)]
                if private_pid(name) is not None:
                    found.setdefault(name, set()).add(pid)
    return {name: sorted(holders) for name, holders in sorted(found.items())}


def segment_path(name: str, dir: Optional[str] = None) -> str:
    """The file of named rendezvous ``name`` in ``dir`` (see segment_dir)."""
    return os.path.join(segment_dir(dir), _FILE_PREFIX + name)


def rm_command(name: str, directory: str) -> str:
    """The command that removes named rendezvous ``name`` in ``directory``, for messages."""
    return f"shmrdv rm {name}" if directory == segment_dir() else f"shmrdv rm --dir {directory} {name}"


def foreign_owner(name: str, dir: Optional[str] = None) -> Optional[str]:
    """"uid N (login)" when the file of rendezvous ``name`` is another
    user's (shmrdv never attaches to one), else None: ours, or none there."""
    try:
        uid = os.lstat(segment_path(name, dir)).st_uid
    except FileNotFoundError:
        return None
    return None if uid == os.geteuid() else f"uid {uid} ({user_name(uid)})"


def segment_file(path: str) -> str:
    """The file of a POSIX shm object (``/NAME``: in /dev/shm); a file path as it is."""
    return os.path.join(SHM_DIR, path[1:]) if path.rfind("/") == 0 else path


def shm_open(path: str, what: str, *args: Any, **kwargs: Any) -> "posix_ipc.SharedMemory":
    """posix_ipc.SharedMemory(path, ...), whose bare ValueError for an entry
    that is no shared-memory file (a directory made under the name: /dev/shm
    is writable by every user) becomes a SegmentMismatch saying so."""
    try:
        return posix_ipc.SharedMemory(path, *args, **kwargs)
    except ValueError:
        raise SegmentMismatch(f"cannot open {what}: {segment_file(path)} is not a shared-memory file (a directory?); "
                              f"remove it if it is yours, else use another name") from None


def check_owner(fd: int, name: str, path: str, remove: Optional[str] = None, *, what: str = "rendezvous") -> None:
    """Attach only to a segment this user owns and nobody else can open:
    another local user could have created it first, to read the tensors
    sent through it or plant its own (PermissionError, naming owner and
    mode). ``path``: its file, its POSIX shm object, or a private
    rendezvous' /proc/PID/fd; ``what`` names the kind of segment;
    ``remove``: how to remove it, for the message (default ``shmrdv rm
    NAME``; a private one is its creator's to close)."""
    st = os.fstat(fd)
    euid = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    private = path.startswith("/proc/")
    remove = f"shmrdv rm {name}" if not remove else remove
    if st.st_uid != euid:
        fix = ("attach only to private rendezvous of this user's processes" if private else
               f"remove it ({remove}, as its owner or root) or use another name")
        raise PermissionError(errno.EACCES, f"refusing to attach to {what} {name!r}: its segment is owned by "
                              f"uid {st.st_uid} ({user_name(st.st_uid)}), not by this user (uid {euid}), so its owner "
                              f"can read and change what is sent through it; {fix}", segment_file(path))
    if mode & 0o077:
        fix = ("its creator made it so: make a new one" if private else
               f"remove it ({remove}), or chmod 600 it if you trust what it holds")
        raise PermissionError(errno.EACCES, f"refusing to attach to {what} {name!r}: its segment has mode "
                              f"{mode:04o}, open to group or others (shmrdv creates them 0600); {fix}",
                              segment_file(path))


def user_name(uid: int) -> str:
    """The login name of a uid, for messages that name a segment's owner."""
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return "no such user"


def _layout_version(fd: int) -> str:
    """The layout version a segment's header names (byte 8 in every version), for messages."""
    try:
        head = os.pread(fd, 12, 0)
    except OSError:
        return "unknown"
    return str(int.from_bytes(head[8:12], "little")) if len(head) == 12 else "unknown"


def unlink_segment(name: str, dir: Optional[str] = None) -> None:
    """Remove rendezvous ``name`` if it exists: a named one's file in
    ``dir`` (see segment_dir); a private one this process created stops
    being attachable (its memory goes with its last user; another
    process's private rendezvous is not this process's to remove)."""
    if private_pid(name) is not None:
        fd = _held.pop(name, None)
        if fd is not None:
            os.close(fd)
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(segment_path(name, dir))


def segment_in_use(name: str, dir: Optional[str] = None) -> bool:
    """Whether a live process has the file of rendezvous ``name`` attached
    (or is creating it), told without attaching: for root, who may remove
    another user's segment but never attaches to it. ``FileNotFoundError``
    if there is none."""
    path = segment_path(name, dir)
    fd = _open_file(path, name, False)
    try:
        return bool(lib.rdv_segment_in_use(fd))
    finally:
        os.close(fd)


def _open_file(path: str, name: str, create: bool) -> int:
    """A named rendezvous' file, opened read-write, never through a symbolic
    link; ``create``: a new one, mode 0600 (``FileExistsError`` if the name
    is taken). ``FileNotFoundError`` if there is none."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if create else 0)
    directory = os.path.dirname(path)
    try:
        fd = os.open(path, flags, 0o600)
    except IsADirectoryError:
        fd = -1
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, f"no such rendezvous in {directory}", name) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PermissionError(errno.EACCES, f"refusing to attach to rendezvous {name!r}: its segment is a "
                                  f"symbolic link; remove it ({rm_command(name, directory)})", path) from None
        raise
    if fd >= 0 and stat.S_ISREG(os.fstat(fd).st_mode):
        if create:
            os.fchmod(fd, 0o600)  # whatever the umask: attachers refuse a file open to group or others
        return fd
    if fd >= 0:
        os.close(fd)
    raise SegmentMismatch(f"cannot open rendezvous {name!r}: {path} is not a shared-memory file (a directory?); "
                          f"remove it if it is yours, else use another name")


def _discard_file(fd: int, path: str) -> None:
    """Remove a file we created and could not initialise, if the name is still it; close fd."""
    try:
        with contextlib.suppress(FileNotFoundError):
            if os.lstat(path).st_ino == os.fstat(fd).st_ino:
                os.unlink(path)
    finally:
        os.close(fd)


def _new_memfd(name: str) -> Optional[int]:
    """A new memfd for private rendezvous ``name`` of this process, mode
    0600, not yet offered to attachers; None if this process has one."""
    if name in _held:
        return None
    fd = os.memfd_create(_FILE_PREFIX + name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.fchmod(fd, 0o600)  # memfds are made 0777: attachers check mode as of any segment
    except BaseException:
        os.close(fd)
        raise
    return fd


def _offer_memfd(fd: int, name: str) -> None:
    """Seal a private rendezvous' memfd, now sized and initialised, and
    offer it to attachers: the creator keeps fd until its handle closes."""
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    os.lseek(fd, _HELD_POS, os.SEEK_SET)  # the mark attachers look for (see _HELD_POS)
    _held[name] = fd


def _unreadable(pid: int, name: str) -> PermissionError:
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        owner = f"; /proc/{pid} belongs to uid {uid} ({user_name(uid)})"
    except OSError:
        owner = ""
    return PermissionError(
        errno.EACCES,
        f"cannot attach to private rendezvous {name!r}: this process may not open the descriptors of process {pid}, "
        f"its creator (permission denied{owner}). A private rendezvous is attached through its creator's "
        f"/proc/{pid}/fd, which takes the same user, a creator that is dumpable (not after prctl(PR_SET_DUMPABLE, 0), "
        f"nor after changing its user or group ids) and no security module (SELinux, AppArmor) forbidding it; a "
        f"named rendezvous (a file: Rendezvous('NAME')) needs none of this", f"/proc/{pid}/fd")


def _open_memfd(name: str, pid: int) -> int:
    """A new open file description of private rendezvous ``name``, opened
    through the descriptor its creator, process ``pid``, offers it by (see
    _HELD_POS). FileNotFoundError once the creator has closed it or is
    gone; PermissionError if this process may not open its descriptors."""
    target = f"/memfd:{_FILE_PREFIX}{name} (deleted)"
    fd_dir = f"/proc/{pid}/fd"
    if pid == os.getpid():
        held = _held.get(name)
        entries = [] if held is None else [str(held)]
    else:
        try:
            entries = os.listdir(fd_dir)
        except FileNotFoundError:
            if not os.path.isdir("/proc/self/fd"):
                raise RendezvousError(f"cannot attach to private rendezvous {name!r}: /proc is not mounted, and a "
                                      f"private rendezvous is attached through its creator's /proc/{pid}/fd; mount "
                                      f"/proc, or use a named rendezvous (a file: Rendezvous('NAME'))") from None
            raise FileNotFoundError(errno.ENOENT, f"no such rendezvous: process {pid}, which created it, is gone "
                                    f"(a private rendezvous can be attached only while the process that created it "
                                    f"has it open)", name) from None
        except PermissionError:
            raise _unreadable(pid, name) from None
    for entry in entries:
        try:
            if os.readlink(f"{fd_dir}/{entry}") != target:
                continue
            with open(f"/proc/{pid}/fdinfo/{entry}") as info:
                if info.readline() != f"pos:\t{_HELD_POS}\n":
                    continue  # the creator's handle's own description, not the one it offers
            fd = os.open(f"{fd_dir}/{entry}", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # closed meanwhile
        except PermissionError:
            raise _unreadable(pid, name) from None
        try:
            # The number may have been closed and reused since it was read:
            # what we opened must be the rendezvous' memory.
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise FileNotFoundError(errno.ENOENT, f"no such rendezvous: process {pid}, which created it, does not have it "
                            f"open any more (a private rendezvous can be attached only while the process that created "
                            f"it has it open)", name)


def open_segment(name: str, arena: int, max_keys: int, create: Optional[bool], wait_ns: int = -1, flags: int = 0,
                 asked_keys: Optional[int] = None, dir: Optional[str] = None) -> Tuple[Any, bool]:
    """The core's handle of rendezvous ``name``, created or attached, and
    whether it was created (``create``: None either, True create only,
    False attach only). A name of private_name()'s form is a memfd, which
    only its own process creates; any other is a file in ``dir`` (see
    segment_dir). ``wait_ns``: how long to wait for a creator still
    initialising it (-1: forever). ``asked_keys``: the max_keys the caller
    gave (None: the default for each size), for what a create that has no
    room says would fit."""
    pid = private_pid(name)
    directory = path = ""
    if pid is None:
        directory = segment_dir(dir)
        check_dir(directory)
        path = os.path.join(directory, _FILE_PREFIX + name)
    creates = create is not False and pid in (None, os.getpid())
    out = ffi.new("rdv_t **")
    deadline = None if wait_ns < 0 else time.monotonic() + wait_ns / 1e9
    pause = 0.001
    while True:
        if creates:
            try:
                fd = _new_memfd(name) if pid is not None else _open_file(path, name, True)
            except FileExistsError:
                fd = None
            if fd is None:
                if create:
                    raise FileExistsError(errno.EEXIST, "rendezvous already exists", name)
            else:
                return _create(fd, name, path, directory, arena, max_keys, flags, asked_keys, out), True
        try:
            fd = _open_memfd(name, pid) if pid is not None else _open_file(path, name, False)
        except FileNotFoundError:
            if not creates:
                raise
            continue  # removed between our create and attach attempts
        try:
            if pid is None:
                check_owner(fd, name, path, rm_command(name, directory))
            else:
                check_owner(fd, name, f"/proc/{pid}/fd")
            rc = lib.rdv_attach(fd, out)
            age = time.time() - os.fstat(fd).st_ctime if rc == -errno.EOWNERDEAD else 0.0
            version = _layout_version(fd) if rc == -errno.EPROTONOSUPPORT else ""
        finally:
            os.close(fd)
        if rc in (-errno.EAGAIN, -errno.EOWNERDEAD):
            # EAGAIN: its creator is alive and still initialising it.
            # EOWNERDEAD: nobody is: a creator that died, unless the file
            # is so new that its creator may not have locked it yet.
            late = deadline is not None and time.monotonic() >= deadline
            if rc == -errno.EOWNERDEAD and (age >= CREATOR_GRACE_S or late):
                raise SegmentMismatch(
                    f"rendezvous {name!r} was never initialised: the process that created its segment "
                    f"died before finishing (or it is not a shmrdv segment); remove it ({rm_command(name, directory)}) "
                    f"and open it again")
            if late:
                raise RendezvousTimeout(
                    f"attaching to rendezvous {name!r}: its creator is alive but still initialising "
                    f"it after {wait_ns / 1e9:g} s; pass a longer timeout= (None waits as long as it takes)")
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
            continue
        if rc == -errno.EPROTONOSUPPORT:
            what = ("was made with options this shmrdv does not know (a newer shmrdv's)"
                    if version == str(lib.RDV_LAYOUT_VERSION) else
                    f"has layout version {version}, this shmrdv uses version {lib.RDV_LAYOUT_VERSION}")
            raise SegmentMismatch(
                f"attaching to rendezvous {name!r}: its segment {what}; recreate it "
                f"({rm_command(name, directory)}) with this shmrdv, or use the shmrdv that made it")
        if rc < 0:
            raise_rc(rc, f"attaching to rendezvous {name!r}")
        return out[0], False


def _create(fd: int, name: str, path: str, directory: str, arena: int, max_keys: int, flags: int,
            asked_keys: Optional[int], out: Any) -> Any:
    """Initialise the segment fd (a new file at ``path``, or a new memfd when
    path is ""), seal and offer a memfd; the core's handle. Whatever fails
    or interrupts it removes what it made: the file, or the memfd."""
    memfd = not path

    def discard() -> None:
        if memfd:
            os.close(fd)  # never offered: its memory goes with the handle's mapping, closed before
        else:
            _discard_file(fd, path)

    what = f"cannot create rendezvous {name!r}"
    offer = None
    try:
        # Its pages are charged to this process's memory cgroup as they are
        # reserved: past its limit the OOM killer answers, not an error.
        limit = memory_limit()
        if limit is not None and int(lib.rdv_segment_bytes(arena, max_keys)) > limit.room:
            raise memory_full_error(what, arena, asked_keys, limit=limit)
        if flags & lib.RDV_CREATE_HUGE_PAGES:
            offer = huge_pages_offered(None if memfd else directory)
        rc = -errno.EOPNOTSUPP if offer is not None and not offer.available else \
            lib.rdv_create_flags(fd, arena, max_keys, flags, out)
        if rc == 0 and memfd:
            _offer_memfd(fd, name)
    except BaseException:
        if out[0] != ffi.NULL:  # made before the exception came: let it go too
            lib.rdv_close(out[0])
        discard()
        raise
    if rc == 0:
        if not memfd:
            os.close(fd)  # the handle has a description of its own (rdv_segment_lock_fd)
        return out[0]
    discard()
    if memfd and rc in (-errno.ENOSPC, -errno.ENOMEM):
        raise memory_full_error(what, arena, asked_keys, -rc)
    if rc == -errno.ENOSPC:
        raise no_space_error(what, arena, asked_keys, directory=directory)
    if rc == -errno.EOPNOTSUPP and flags & lib.RDV_CREATE_HUGE_PAGES:
        why = offer.why if offer is not None and not offer.available else \
            "the kernel refuses to advise huge pages for it (MADV_HUGEPAGE)"
        raise HugePagesUnavailable(f"rendezvous {name!r}: huge_pages=True, but {why}; or "
                                   f"create it without huge_pages (4 KiB pages; copies of 100 MiB "
                                   f"and more are then about a quarter slower)")
    raise_rc(rc, f"creating rendezvous {name!r} ({arena} bytes)")


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


class OpenRequest(NamedTuple):
    """What ``Rendezvous(...)`` was asked to open, checked (``open_request``)."""

    name: str
    create: Optional[bool]
    owner: Optional[int]
    """The creator's pid in a private rendezvous' name, else None."""
    dir: Optional[str]
    """A named rendezvous' directory; None for a private one (a memfd)."""
    arena: int
    asked_size: Optional[int]
    max_keys: int
    flags: int
    """RDV_CREATE_* for a create."""


def open_request(name: Optional[str], create: Optional[bool], size: Optional[int], max_keys: Optional[int],
                 huge_pages: bool, prefault: Optional[bool], dir: Optional[str]) -> OpenRequest:
    """The arguments of ``Rendezvous(...)`` checked (InvalidType,
    InvalidArgument), with what follows from them: no name is a private
    rendezvous of this process, created (and the files older versions'
    killed creators left swept first); another process's private name is
    only attached to."""
    private = name is None
    if private:
        if create is False:
            raise InvalidArgument("Rendezvous() with no name creates a private rendezvous: create=False needs a name")
        name, create = private_name(), True
        sweep_dead_private()  # what older versions' killed creators left in /dev/shm
    name = checked_name(name, "name", lib.RDV_NAME_MAX)
    if create not in (None, True, False):
        raise InvalidType(f"create must be None, True or False, not {create!r}")
    owner = private_pid(name)
    if owner is not None and dir is not None:
        raise InvalidArgument(f"dir={dir!r}: a private rendezvous ({'Rendezvous()' if private else repr(name)}) "
                              f"is a memfd, in no directory; dir= is for named rendezvous")
    if not private and owner is not None and owner != os.getpid():
        # Another process's private name (its children attach by it): a
        # memfd of that process, which only it creates.
        if create:
            raise InvalidArgument(f"{name!r} has the form of process {owner}'s private rendezvous names "
                                  f"(private-PID-HEX), which only Rendezvous() with no name makes: use another "
                                  f"name, or attach to it (create=False)")
        create = False
    asked_size = None if size is None else arena_size(size)
    arena = DEFAULT_SIZE if asked_size is None else asked_size
    keys = default_max_keys(arena) if max_keys is None else positive_int(max_keys, "max_keys")
    if keys > limits.MAX_KEYS:
        raise InvalidArgument(f"max_keys is at most {limits.MAX_KEYS:,} (shmrdv.MAX_KEYS), got {keys:,}")
    if huge_pages not in (True, False):
        raise InvalidType(f"huge_pages must be True or False, not {huge_pages!r}")
    if prefault not in (None, True, False):
        raise InvalidType(f"prefault must be None, True or False, not {prefault!r}")
    if huge_pages and prefault is False:
        raise InvalidArgument("huge_pages=True with prefault=False: huge pages are made by faulting the segment "
                              "in as it is mapped; drop one of the two")
    flags = (lib.RDV_CREATE_HUGE_PAGES if huge_pages else 0) | (lib.RDV_CREATE_NO_PREFAULT if prefault is False else 0)
    return OpenRequest(name, create, owner, None if owner is not None else segment_dir(dir), arena, asked_size, keys,
                       flags)
