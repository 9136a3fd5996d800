"""``Group``: collectives (allreduce, broadcast, allgather, reduce-scatter,
reduce, gather, scatter, alltoall, barrier) among ``world_size`` processes
on one host, through a shared-memory segment of the group's own.

Every member calls ``Group(name, rank, world_size)``; rank 0 creates the
segment (``/dev/shm/shmrdv.group-NAME``, mode 0600), the others attach to
it, and once all have joined the last one removes the name: a later job may
reuse the name at once, and a group that has formed leaves nothing in
``/dev/shm`` however its members end. A join that does not complete is
removed by its members as they end (an error, a timeout, ``close``, a
member found dead); what members all killed at once leave, the next rank 0
of any group, or ``shmrdv gc``, removes. The data path is one call into
the C core per collective (``csrc/rdv_coll.c``, which explains the phases
and the waiting).

Who belongs to a group: the processes that pass its name and ``job``
token. Joining, as a table (``joined`` and ``state`` are words of the
segment's header, ``csrc/rdv_coll.h``):

============================  ===========================================
a process finds               it
============================  ===========================================
no segment                    rank 0 creates it; the others wait for it
another ``job``'s segment     waits until the name is free (two correct
                              groups, one after the other); never joins
                              it, never disturbs it
this job's, creator gone      removes it (a killed job's) and goes on
this job's, forming, and it   joins: takes its rank's lock and slot, counts
fits                          itself in ``joined``; the one that makes it
                              ``world_size`` removes the name
this job's, forming, and it   refuses the join (``rdv_coll_refuse``: a bit
conflicts: another            in ``joined`` while it is short of
world_size, its rank taken,   ``world_size``, then ``state`` aborted with
or a second rank 0            why) and raises; every member's ``Group()``
                              raises within a wait slice (50 ms), with
                              ``timeout=None`` too
this job's, formed (the       cannot stop it (the bit is refused once the
moment before its name goes)  count is full): removes the name and raises
                              (came late) or, as rank 0, creates anew
============================  ===========================================

So a conflict among processes that claim one job ends that join on every
rank, never in a mixed group; a process of another job can neither join
nor stop it. Without ``job=``, a launcher's job id is the token
(``launcher_job()``); with neither, the name alone says which job a process
is of: two jobs that meet while joining fail alike, but a rank of one can
also complete the other's group before they meet (both then compute on a
mix); jobs started by hand that may share a name at once must pass
distinct ``job=`` (or ``SHMRDV_JOB``).
"""
import errno
import hashlib
import os
import threading
import time
import weakref
import zlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import posix_ipc

from . import limits
from ._binding import ffi, lib
from .codec import timeout_ns as _timeout_ns
from .errors import (
    Aborted,
    CollectiveMismatch,
    GroupTimeout,
    InvalidArgument,
    InvalidType,
    PeerLost,
    RendezvousError,
    RendezvousTimeout,
    SegmentMismatch,
    SharedMemoryFull,
)
from .leftovers import CREATOR_GRACE_S, sweep
from .segments import SHM_DIR, check_owner, checked_name, shm_open
from .tensors import as_array, as_tensor, bfloat16, is_tensor
from .units import human_bytes

GROUP_PREFIX = "/shmrdv.group-"
"""A group NAME's segment is the POSIX shm object ``/shmrdv.group-NAME``, while it is joining."""
MAX_RANKS = int(lib.RDV_COLL_MAX_RANKS)
"""The largest world_size of a group."""
SLOT_BYTES = int(lib.RDV_COLL_SLOT_BYTES)
"""Bytes of each of a rank's two data buffers: its segment is about 2 * world_size of them."""
OPS = {"sum": lib.RDV_OP_SUM, "prod": lib.RDV_OP_PROD, "min": lib.RDV_OP_MIN, "max": lib.RDV_OP_MAX,
       "mean": lib.RDV_OP_MEAN, "band": lib.RDV_OP_BAND, "bor": lib.RDV_OP_BOR, "bxor": lib.RDV_OP_BXOR}
"""The reduction ops, by name."""

_KINDS = {lib.RDV_COLL_BARRIER: "barrier", lib.RDV_COLL_ALLREDUCE: "allreduce", lib.RDV_COLL_BROADCAST: "broadcast",
          lib.RDV_COLL_ALLGATHER: "allgather", lib.RDV_COLL_REDUCE_SCATTER: "reduce_scatter",
          lib.RDV_COLL_REDUCE: "reduce", lib.RDV_COLL_GATHER: "gather", lib.RDV_COLL_SCATTER: "scatter",
          lib.RDV_COLL_ALLTOALL: "alltoall", lib.RDV_COLL_SCATTER_META: "scatter",
          lib.RDV_COLL_FAILED: "call that failed"}
_OP_NAMES = {v: k for k, v in OPS.items()}
_DTYPES: Dict[np.dtype, int] = {
    np.dtype(np.bool_): lib.RDV_DT_BOOL, np.dtype(np.int8): lib.RDV_DT_I8, np.dtype(np.uint8): lib.RDV_DT_U8,
    np.dtype(np.int16): lib.RDV_DT_I16, np.dtype(np.uint16): lib.RDV_DT_U16, np.dtype(np.int32): lib.RDV_DT_I32,
    np.dtype(np.uint32): lib.RDV_DT_U32, np.dtype(np.int64): lib.RDV_DT_I64, np.dtype(np.uint64): lib.RDV_DT_U64,
    np.dtype(np.float16): lib.RDV_DT_F16, np.dtype(np.float32): lib.RDV_DT_F32, np.dtype(np.float64): lib.RDV_DT_F64,
    np.dtype(np.complex64): lib.RDV_DT_C64, np.dtype(np.complex128): lib.RDV_DT_C128,
}
_DTYPE_NAMES = {v: str(k) for k, v in _DTYPES.items()}
_DTYPE_NAMES[lib.RDV_DT_BF16] = "bfloat16"


def _code(dtype: np.dtype) -> int:
    """The core's code for dtype, 0 for one it does not compute on. bfloat16
    joins the table the first time one is seen (ml_dtypes is then imported)."""
    code = _DTYPES.get(dtype)
    if code is None:
        bf16 = bfloat16(load=False) if dtype.name == "bfloat16" else None
        if bf16 is None or dtype != bf16:
            return 0
        code = _DTYPES[dtype] = lib.RDV_DT_BF16
    return code


def _dtype_of(code: int) -> Optional[np.dtype]:
    if code == lib.RDV_DT_BF16:
        return bfloat16()
    return next((d for d, c in _DTYPES.items() if c == code), None)
_INTEGRAL = "biu"  # numpy kinds the bitwise ops take
_META_DIMS = 3 + limits.NDIM_MAX  # scatter's header: dtype code, ndim, shape, whether a tensor
_EINPROGRESS = -errno.EINPROGRESS
_EFAULT = -errno.EFAULT
_ALLREDUCE, _BARRIER, _NULL = lib.RDV_COLL_ALLREDUCE, lib.RDV_COLL_BARRIER, ffi.NULL  # the short paths' constants
_open_groups: "weakref.WeakSet[Group]" = weakref.WeakSet()
_HASH_MASK = (1 << 63) - 1
_reductions: Dict[Tuple[str, np.dtype], Tuple[int, int]] = {}  # (op, dtype) -> codes, once checked


def _after_fork_in_child() -> None:
    # A forked child must not keep its parent's ranks alive, nor act as them.
    for g in list(_open_groups):
        g._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def sweep_stale_groups() -> List[str]:
    """Remove the segments of groups whose joining never completed and whose
    rank 0 is gone (every member died before all had joined: nobody is left
    to remove the name), this user's only; return their names. Run by every
    rank 0 that creates a group, and by ``shmrdv gc``."""
    pid = ffi.new("uint32_t *")

    def stale(_: str, fd: int, st: os.stat_result) -> bool:
        if lib.rdv_coll_creator_alive(fd, 0, pid):
            return False
        # a creator between its O_EXCL and its lock (microseconds) has a young, empty file
        return not (st.st_size == 0 and time.time() - st.st_ctime < CREATOR_GRACE_S)

    return sweep(GROUP_PREFIX.lstrip("/"), stale)


def remove_group(name: str, force: bool = False) -> List[int]:
    """Remove group ``name``'s segment (``/dev/shm/shmrdv.group-NAME``: there
    while a group joins, or left by a job killed while joining; or put there
    by someone else: another user's file, a symbolic link). A join under way
    (its rank 0 alive) is left alone: returns ``[pid of rank 0]`` and removes
    nothing, unless ``force``: its join is then refused first (every member's
    ``Group()`` raises ``Aborted``, "removed by shmrdv rm --force") and the
    segment removed. Returns ``[]`` when nobody was joining it;
    FileNotFoundError when there is none, OSError when it cannot be removed."""
    name = checked_name(name, "group name", limits.NAME_MAX - 40)
    path = GROUP_PREFIX + name
    file = "/dev/shm" + path
    if not os.path.lexists(file):
        raise FileNotFoundError(errno.ENOENT, "no such group", name)
    live: List[int] = []
    try:
        shm = posix_ipc.SharedMemory(path)
    except (posix_ipc.Error, OSError, ValueError):
        shm = None  # a symbolic link, another user's file, a directory: nothing to ask; unlinking decides
    if shm is not None:
        try:
            pid = ffi.new("uint32_t *")
            if lib.rdv_coll_creator_alive(shm.fd, 0, pid):
                live.append(int(pid[0]))
                if force:
                    why = b"removed by shmrdv rm --force"
                    lib.rdv_coll_refuse(shm.fd, ffi.NULL, why, len(why))
        finally:
            shm.close_fd()
    if not live or force:
        try:
            os.unlink(file)
        except FileNotFoundError:
            if not live:
                raise
            # its members, refused, removed it first
    return live


# Where the launchers people use put an id their job's processes share and
# no other job has: a Group made without job= takes the first one set.
LAUNCHER_JOB_VARIABLES = ("SHMRDV_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PMIX_NAMESPACE",
                          "OMPI_MCA_orte_ess_jobid")


def launcher_job() -> Optional[str]:
    """The job id a launcher gave this process (``LAUNCHER_JOB_VARIABLES``:
    ``SHMRDV_JOB``, torchrun's run id, Slurm's job and step, Open MPI's
    PMIx namespace), or None when none is set."""
    for variable in LAUNCHER_JOB_VARIABLES:
        value = os.environ.get(variable)
        if value:
            if variable == "SLURM_JOB_ID":
                value += "." + os.environ.get("SLURM_STEP_ID", "")
            return f"{variable}={value}"
    return None


def _job_token(job: Optional[str]) -> bytes:
    """The RDV_COLL_JOB_BYTES a segment's header holds for job: a digest,
    all zero for none."""
    if job is None:
        return bytes(lib.RDV_COLL_JOB_BYTES)
    if not isinstance(job, str):
        raise InvalidType(f"job must be a str or None, not {type(job).__name__}")
    return hashlib.blake2b(job.encode("utf-8", "surrogatepass"), digest_size=lib.RDV_COLL_JOB_BYTES,
                           person=b"shmrdv.group.job").digest()


def _shape_hash(shape: Tuple[int, ...], dtype: np.dtype) -> int:
    """What every rank's call must agree on besides kind, op, dtype code,
    root and bytes: the shape (a tuple of ints hashes alike in every
    process: only str and bytes hashes are salted), and the dtype itself
    when it has no code (allreduce's short path computes the same)."""
    h = hash(shape) & _HASH_MASK
    return h if _code(dtype) else h ^ zlib.crc32(dtype.str.encode())


def _same_memory(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether x and y are views of exactly the same bytes."""
    return (x.__array_interface__["data"][0] == y.__array_interface__["data"][0] and x.shape == y.shape
            and x.strides == y.strides and x.dtype == y.dtype)


def _no_room(name: str, world: int, slot_bytes: int) -> SharedMemoryFull:
    """The error of a rank 0 whose group's segment /dev/shm has no room for:
    what it needs, what is free, how many ranks would fit, what to do."""
    needs = int(lib.rdv_coll_segment_bytes(world, slot_bytes))
    try:
        st = os.statvfs(SHM_DIR)
        room = st.f_bavail * st.f_frsize
        free = f"{room:,} bytes free"
        fits = max((w for w in range(1, world) if lib.rdv_coll_segment_bytes(w, slot_bytes) <= room), default=0)
        now = f" (a group of {fits} ranks fits now)" if fits else ""
    except OSError:
        free, now = "free space unknown", ""
    return SharedMemoryFull(
        errno.ENOSPC,
        f"creating group {name!r}: {SHM_DIR} has no room: the group's segment needs {needs:,} bytes (two "
        f"{human_bytes(slot_bytes)} buffers per rank for its {world} ranks) for as long as its members run, and "
        f"{SHM_DIR} has {free}{now}; enlarge {SHM_DIR} (docker run --shm-size, or --ipc=host; a memory-backed "
        f"emptyDir in Kubernetes), or free some of it (shmrdv ls shows what is there)")


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidType(f"{what} must be an int, got {type(value).__name__}")
    return int(value)


class Group:
    """A group of ``world_size`` processes that run collectives together.

    Every rank makes the same calls in the same order; a call returns once
    the ranks it needs have made theirs. ``timeout`` (seconds, None: no
    limit) bounds joining and every call: a rank that gives up aborts the
    group, and it and every other rank raise ``GroupTimeout`` (a
    ``RendezvousTimeout``) naming the ranks it waited for.

    ``job``: a token the ranks of one job share and no other job uses (a
    launcher's run id, or any string handed to every rank): processes with
    another token never join this group nor disturb its join, they wait for
    the name to be free. Without it, the id a launcher gave the process is
    the token (``SHMRDV_JOB``, torchrun's ``TORCHELASTIC_RUN_ID``, Slurm's
    job and step, Open MPI's PMIx namespace: ``launcher_job()``); with
    none of those, the name alone says which processes belong together (see
    the module's table). ``Group()`` blocks until all
    ``world_size`` ranks have joined; a process of this job that conflicts
    with the join (another ``world_size``, a rank already taken, a second
    rank 0) makes every member's ``Group()`` raise within a tenth of a
    second, and raises itself.

    A call whose arguments this rank gets wrong raises here, and is made
    all the same, as a call that failed: the others' call raises
    ``CollectiveMismatch`` naming the error (rather than pairing with this
    rank's next call), and the group goes on.

    The calls: ``allreduce``, ``reduce``, ``reduce_scatter``, ``broadcast``,
    ``allgather``, ``gather``, ``scatter``, ``alltoall``, ``barrier`` and
    ``new_group``. Calls that do not match across ranks raise
    ``CollectiveMismatch`` on every rank and the group goes on; a rank that
    dies makes the others raise ``PeerLost`` within a tenth of a second; a
    Ctrl-C during a call aborts the group (``Aborted`` on the others)."""

    def __init__(self, name: str, rank: int, world_size: int, *, timeout: Optional[float] = None,
                 job: Optional[str] = None, _slot_bytes: int = SLOT_BYTES) -> None:
        self._g: Any = None
        self._name = checked_name(name, "group name", limits.NAME_MAX - 40)
        world_size = _int(world_size, "world_size")
        rank = _int(rank, "rank")
        if not 1 <= world_size <= MAX_RANKS:
            raise InvalidArgument(f"world_size must be 1..{MAX_RANKS}, got {world_size}")
        if not 0 <= rank < world_size:
            raise InvalidArgument(f"rank must be in [0, world_size) = [0, {world_size}), got {rank}")
        self._rank = rank
        self._world = world_size
        self._job = launcher_job() if job is None else job
        self._job_token = _job_token(self._job)
        self._holder = 0  # the pid the last attempt to join found holding what it needed, for messages
        self._timeout = timeout
        self._timeout_ns = _timeout_ns(timeout)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._subgroups: Dict[Tuple[int, ...], int] = {}
        self._last: Tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)  # the call that failed, for messages
        self._forked = False
        self._last_reduction: Tuple[Any, Any, int] = (None, None, 0)  # allreduce's (op, dtype, call word)
        self._status = ffi.new("struct rdv_coll_status *")
        self._path = GROUP_PREFIX + self._name
        self._unlinked = False
        self._ino = 0
        self._opened: Any = None  # a handle just opened, until _join keeps it
        self._join(_slot_bytes)
        _open_groups.add(self)

    # ---- joining ----

    def _join(self, slot_bytes: int) -> None:
        deadline = None if self._timeout_ns < 0 else time.monotonic() + self._timeout_ns / 1e9
        pause = 0.001
        out = ffi.new("rdv_group_t **")
        last = ffi.new("uint32_t *")
        if self._rank == 0:
            sweep_stale_groups()  # once: another job may hold our name for long
        while True:
            rc, fd_ino = self._try_open(slot_bytes, out, last)
            if rc == 0:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise RendezvousTimeout(self._not_joined(rc))
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
        self._ino = fd_ino
        # freed once no call holds it (close only leaves), or at once by an exception
        self._g, self._opened = self._opened, None
        try:
            lib.rdv_coll_set_timeout(self._g, self._timeout_ns)
            if last[0]:
                self._unlink()
            self._wait_joined(deadline)
        except BaseException:
            self._close_handle()
            raise

    def _not_joined(self, rc: int) -> str:
        """Why a join that timed out before it found a segment to join did not."""
        if rc == -errno.EREMCHG:
            who = (f"another job's group holds the name (its rank 0 is pid {self._holder}; its job= token is not "
                   f"ours), and still did")
            hint = "give each job its own group name, or pass a longer timeout= (it waits for the name)"
        else:
            who = "rank 0 has not created it" if rc == -errno.ENOENT else "rank 0 is still creating it"
            hint = "start every rank, or pass a longer timeout="
        return f"joining group {self._name!r} as rank {self._rank}: {who} after {self._timeout} s; {hint}"

    def _shm_open(self, *args: Any, **kwargs: Any) -> "posix_ipc.SharedMemory":
        """The group's segment (shm_open: O_NOFOLLOW); a symbolic link at its name is refused, saying so."""
        try:
            return shm_open(self._path, f"group {self._name!r}", *args, **kwargs)
        except OSError as exc:  # posix_ipc's own errors are no OSError
            if exc.errno == errno.ELOOP:
                raise PermissionError(errno.EACCES, f"refusing to join group {self._name!r}: its segment's name is "
                                      f"a symbolic link (shmrdv never makes one; it could lead a member's writes "
                                      f"anywhere); remove it (shmrdv rm --group {self._name})",
                                      "/dev/shm" + self._path) from None
            raise

    def _check_owner(self, fd: int) -> None:
        check_owner(fd, self._name, self._path, what="group", remove=f"shmrdv rm --group {self._name}")

    def _refuse(self, fd: int, why: str) -> int:
        """Refuse the join of the group in fd, as a process of our job that
        conflicts with it (rdv_coll_refuse: 0 refused, -EALREADY formed, ...)."""
        hint = "give each job its own group name, or pass each its own job="
        return int(lib.rdv_coll_refuse(fd, self._job_token, *self._reason(f"{why}; {hint}")))

    def _try_open(self, slot_bytes: int, out: Any, last: Any) -> Tuple[int, int]:
        """One attempt: (0, inode) joined; (-ENOENT, -EAGAIN or -EREMCHG: another job's, 0) to try again."""
        if self._rank == 0:
            try:
                shm = self._shm_open(posix_ipc.O_CREX, mode=0o600)
            except posix_ipc.ExistentialError:
                return self._name_taken(), 0
            try:
                ino = os.fstat(shm.fd).st_ino
                rc = lib.rdv_coll_open(shm.fd, 1, self._world, 0, slot_bytes, self._job_token, out, last)
                if rc == 0:  # owned at once: an exception from here on frees it (lock, mapping)
                    self._opened = ffi.gc(out[0], lib.rdv_coll_free)
            finally:
                shm.close_fd()
            if rc < 0:
                posix_ipc.unlink_shared_memory(self._path)
                if rc in (-errno.ENOSPC, -errno.ENOMEM):
                    raise _no_room(self._name, self._world, slot_bytes)
                raise RendezvousError(f"creating group {self._name!r}: {errno.errorcode.get(-rc, rc)} "
                                      f"({os.strerror(-rc)})")
            return 0, ino
        try:
            shm = self._shm_open()
        except posix_ipc.ExistentialError:
            return -errno.ENOENT, 0
        pid = ffi.new("uint32_t *")
        refused = 0
        try:
            self._check_owner(shm.fd)
            st = os.fstat(shm.fd)
            rc = lib.rdv_coll_open(shm.fd, 0, self._world, self._rank, slot_bytes, self._job_token, out, last)
            if rc == 0:
                self._opened = ffi.gc(out[0], lib.rdv_coll_free)  # an exception from here on frees it
                if lib.rdv_coll_creator_alive(shm.fd, 1, pid):
                    return 0, st.st_ino
                # joined a segment whose rank 0 is gone: a killed job's, not ours
                self._opened = None
                self._unlink_if(st.st_ino)
                return -errno.EAGAIN, 0
            if rc == -errno.EAGAIN:
                return rc, 0
            creator = lib.rdv_coll_creator_alive(shm.fd, 0, pid)
            stale = not creator and (rc != -errno.EOWNERDEAD or time.time() - st.st_ctime >= CREATOR_GRACE_S)
            if not stale and rc == -errno.EBUSY:
                refused = self._refuse(shm.fd, f"pid {os.getpid()} came as rank {self._rank}, which pid {last[0]} "
                                               f"holds: a rank was started twice, or another job uses this name")
            elif not stale and rc == -errno.EXDEV:
                refused = self._refuse(shm.fd, f"pid {os.getpid()} came as rank {self._rank} with world_size="
                                               f"{self._world} (or another buffer size), not the group's: the ranks "
                                               f"disagree, or another job uses this name")
        finally:
            shm.close_fd()
        self._holder = pid[0]
        if stale:  # left by a job whose rank 0 is gone: not ours to join
            self._unlink_if(st.st_ino)
            return -errno.EAGAIN, 0
        if rc == -errno.EOWNERDEAD:
            return -errno.EAGAIN, 0
        if rc == -errno.EREMCHG:  # another job's: wait until its name goes
            return rc, 0
        formed = refused == -errno.EALREADY
        if formed:  # every rank has joined it: its name is of no more use
            self._unlink_if(st.st_ino)
        if rc == -errno.EBUSY:
            then = (f"and that group has formed (all {self._world} ranks joined): this process came late, or"
                    if formed else "so the group's join is refused (its members raise too): a rank was started "
                    "twice, or")
            raise RendezvousError(f"joining group {self._name!r}: rank {self._rank} is taken by pid {last[0]}, "
                                  f"{then} another job uses this group name (started by pid {pid[0]}); give each "
                                  f"job its own name, or pass each its own job=")
        if rc == -errno.EXDEV:
            then = "that group has formed already" if formed else "its join is refused (its members raise too)"
            raise CollectiveMismatch(f"joining group {self._name!r} with world_size={self._world}: rank 0 "
                                     f"(pid {pid[0]}) created it with another world_size (or buffer size), and "
                                     f"{then}; every rank must pass the same (or another job uses this name: give "
                                     f"each job its own, or pass each its own job=)")
        raise SegmentMismatch(f"joining group {self._name!r}: its segment is not a group of this shmrdv "
                              f"({errno.errorcode.get(-rc, rc)}); remove it (shmrdv rm --group {self._name}) if no "
                              f"job uses it")

    def _name_taken(self) -> int:
        """Rank 0 found the name taken: left by a dead job (removed), a group
        that has formed (its name of no more use: removed), one being created
        or another job's (wait): -EAGAIN or -EREMCHG to try again; or a join
        of this job's under way: a second rank 0, which refuses that join
        (its members raise) and raises."""
        try:
            shm = self._shm_open()
        except posix_ipc.ExistentialError:
            return -errno.EAGAIN
        pid = ffi.new("uint32_t *")
        rc = 0
        try:
            self._check_owner(shm.fd)
            st = os.fstat(shm.fd)
            creator = lib.rdv_coll_creator_alive(shm.fd, 0, pid)
            if creator:
                rc = self._refuse(shm.fd, f"pid {os.getpid()} came as rank 0 too: a rank was started twice, or "
                                          f"another job uses this name")
        finally:
            shm.close_fd()
        self._holder = pid[0]
        if not creator:  # a killed job's (once its creator had time to lock it)
            if time.time() - st.st_ctime >= CREATOR_GRACE_S or st.st_size > 0:
                self._unlink_if(st.st_ino)
            return -errno.EAGAIN
        if rc == -errno.EALREADY:
            self._unlink_if(st.st_ino)
        if rc in (-errno.EALREADY, -errno.EAGAIN, -errno.EREMCHG):
            return -errno.EREMCHG if rc == -errno.EREMCHG else -errno.EAGAIN
        if rc == 0:
            raise RendezvousError(f"creating group {self._name!r}: pid {pid[0]} created it as rank 0 already, and "
                                  f"its join is under way; this refuses that join (its members raise too), as a "
                                  f"rank was started twice or another job uses this group name; give each job its "
                                  f"own name, or pass each its own job=")
        raise SegmentMismatch(f"creating group {self._name!r}: pid {pid[0]} holds its name, but it is not a group "
                              f"of this shmrdv ({errno.errorcode.get(-rc, rc)}); use another name")

    def _unlink_if(self, ino: int) -> None:
        try:
            if os.stat("/dev/shm" + self._path).st_ino == ino:
                posix_ipc.unlink_shared_memory(self._path)
        except (FileNotFoundError, posix_ipc.ExistentialError):
            pass

    def _unlink(self) -> None:
        if not self._unlinked:
            self._unlinked = True
            self._unlink_if(self._ino)

    def _wait_joined(self, deadline: Optional[float]) -> None:
        st = self._status
        while True:
            left = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1e9))
            rc = lib.rdv_coll_wait_joined(self._g, left)
            if rc == 0:
                return
            lib.rdv_coll_status(self._g, st)
            if rc != _EINPROGRESS:
                self._raise(self._g, rc, "joining")
            if deadline is not None and time.monotonic() >= deadline:
                missing = [r for r in range(self._world) if st.missing >> r & 1]
                reason = f"rank {self._rank} gave up joining after {self._timeout} s: ranks {missing} had not joined"
                # the others must not wait on: they raise the same
                lib.rdv_coll_abort_timed_out(self._g, *self._reason(reason), st.missing)
                raise GroupTimeout(f"joining group {self._name!r} as rank {self._rank}: {reason}; start every "
                                   f"rank, or pass a longer timeout= (the group is aborted)", tuple(missing))

    # ---- properties, lifetime ----

    @property
    def rank(self) -> int:
        """This process's rank, 0 .. world_size - 1."""
        return self._rank

    @property
    def world_size(self) -> int:
        """How many ranks the group has (at most ``MAX_RANKS``, 64)."""
        return self._world

    @property
    def name(self) -> str:
        """The group's name (its segment is /dev/shm/shmrdv.group-NAME while it joins)."""
        return self._name

    def pid(self, rank: int) -> int:
        """The pid of the process that joined as ``rank`` (0 if none did)."""
        if not 0 <= rank < self._world:
            raise InvalidArgument(f"group {self._name!r} has no rank {rank} (world_size {self._world})")
        return int(lib.rdv_coll_pid(self._handle(), rank))

    @property
    def closed(self) -> bool:
        """Whether this rank has left the group (``close``, the end of a ``with`` block)."""
        return self._g is None

    def __repr__(self) -> str:
        state = "closed" if self._g is None else "open"
        return f"Group({self._name!r}, rank={self._rank}, world_size={self._world}, {state})"

    def __enter__(self) -> "Group":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_g", None) is not None:
            self.close()

    def close(self) -> None:
        """Leave the group: a rank still waiting for this one raises PeerLost."""
        with self._lock:
            self._close_handle()

    def _close_handle(self) -> None:
        if self._g is not None:
            g, self._g = self._g, None
            _open_groups.discard(self)
            if not self._forked and not self._unlinked:
                self._unlink()  # the group never completed: its name goes with it
            lib.rdv_coll_leave(g)  # a call of another thread still running keeps g (and its mapping) alive

    def _forget(self) -> None:
        self._forked = True
        if self._g is not None:
            lib.rdv_coll_forget(self._g)

    def abort(self, reason: str = "aborted") -> None:
        """Abort the group: every member's pending and later calls raise Aborted with reason."""
        if not isinstance(reason, str):
            raise InvalidType(f"reason must be a str, not {type(reason).__name__}")
        data = reason.encode("utf-8", "replace")[: limits.REASON_MAX]
        g = self._handle()
        lib.rdv_coll_abort(g, data, len(data))

    def _handle(self) -> Any:
        g = self._g
        if g is None:
            raise RendezvousError(f"group {self._name!r} is closed")
        if self._forked:
            raise RendezvousError(f"group {self._name!r} was joined by pid {self._pid}: a forked child cannot take "
                                  f"part in its parent's place; join a group of its own in the child")
        return g

    # ---- running a call ----

    def _run(self, kind: int, op: int, dtype: int, root: int, nbytes: int, shash: int, src: Any, dst: Any) -> None:
        g = self._g
        if g is None or self._forked:
            g = self._handle()  # raises, saying why
        what = kind | op << 8 | dtype << 16 | root << 32
        try:
            rc = lib.rdv_coll_run(g, what, nbytes, shash, src, dst)
            if rc:
                self._finish(g, rc, what, nbytes)
        except BaseException as exc:
            self._interrupted(g, exc, what)
            raise

    def _finish(self, g: Any, rc: int, what: int, nbytes: int) -> None:
        """A call that did not complete at once: wait on (in slices, between
        which signal handlers run), or raise what went wrong."""
        kind = _KINDS.get(what & 0xFF, "collective")
        while rc == _EINPROGRESS:  # signal handlers run between the slices
            rc = lib.rdv_coll_resume(g)
        if rc < 0:
            self._last = (what & 0xFF, what >> 8 & 0xFF, what >> 16 & 0xFF, what >> 32, nbytes)
            lib.rdv_coll_status(g, self._status)
            self._raise(g, rc, kind)

    def _interrupted(self, g: Any, exc: BaseException, what: int) -> None:
        """An exception (Ctrl-C, another signal's handler) left a call of this
        thread half done: abort the group, as the others must not wait for
        us nor read what we would have rewritten."""
        if not isinstance(exc, RendezvousError) and lib.rdv_coll_mine(g):
            kind = _KINDS.get(what & 0xFF, "collective")
            lib.rdv_coll_abort(g, *self._reason(f"rank {self._rank} was interrupted ({type(exc).__name__}) in {kind}"))

    def _failed_call(self, kind: int, exc: Exception) -> None:
        """This rank's call of kind failed before it began (exc, raised from
        its arguments): make it all the same, as a call that says so, so
        that the others stop at it (CollectiveMismatch naming exc) rather
        than pair their call with this rank's next one. Errors of that call
        are the group's, for a later call to raise: the caller raises exc."""
        g = self._g
        if g is None or self._forked:
            return  # no call to make: the next one raises why
        why = f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")[: limits.REASON_MAX]
        what = lib.RDV_COLL_FAILED | kind << 8
        try:
            rc = lib.rdv_coll_run(g, what, len(why), 0, why, ffi.NULL)
            if rc:
                self._finish(g, rc, what, len(why))
        except RendezvousError:
            pass
        except BaseException as interrupt:
            self._interrupted(g, interrupt, what)
            raise

    @staticmethod
    def _reason(text: str) -> Tuple[bytes, int]:
        data = text.encode()[: limits.REASON_MAX]
        return data, len(data)

    def _raise(self, g: Any, rc: int, what: str) -> None:
        st = self._status
        if rc == -errno.EBADE and st.kind == lib.RDV_COLL_FAILED:
            buf = ffi.new("char[]", limits.REASON_MAX)
            n = ffi.new("uint32_t *")
            lib.rdv_coll_failed_why(g, buf, limits.REASON_MAX, n)
            why = ffi.unpack(buf, n[0]).decode("utf-8", "replace")
            raise CollectiveMismatch(
                f"{what} on group {self._name!r}: rank {st.rank} could not make its {_KINDS.get(st.op, 'call')} "
                f"({why}); it raised that, and every rank stops at this call. No result was computed; the group "
                f"can go on")
        if rc == -errno.EBADE:
            mine = self._last
            theirs = (st.kind, st.op, st.dtype, st.root, st.nbytes)
            raise CollectiveMismatch(
                f"{what} on group {self._name!r}: rank {self._rank} called {_describe(*mine)} but rank {st.rank} "
                f"called {_describe(*theirs)}{' (the same sizes, another shape)' if theirs == mine else ''}; "
                f"every rank must make the same calls in the same order, with the same op, dtype, shape and root. "
                f"No result was computed; the group can go on")
        if rc == -errno.EPIPE:
            how = "closed the group" if st.closed else "died"
            raise PeerLost(f"{what} on group {self._name!r}: rank {st.rank} (pid {st.pid}) {how}; the group "
                           f"cannot go on: close it, and start the job (or a new group) again", st.rank, st.pid)
        if rc == -errno.ETIMEDOUT:
            missing = [r for r in range(self._world) if st.missing >> r & 1]
            message = (f"{what} on group {self._name!r}: rank {self._rank} gave up at its timeout of {self._timeout} s: "
                       f"ranks {missing} had not arrived")
            # the others must not wait for us, nor read our half-done call (the core has done this already)
            lib.rdv_coll_abort_timed_out(g, *self._reason(message), st.missing)
            raise GroupTimeout(message + "; the group is aborted", tuple(missing))
        if rc == -errno.ECONNABORTED:
            buf = ffi.new("char[]", limits.REASON_MAX)
            n = ffi.new("uint32_t *")
            known = lib.rdv_coll_reason(g, buf, limits.REASON_MAX, n) == 0
            reason = ffi.unpack(buf, n[0]).decode("utf-8", "replace")
            if st.rank == lib.RDV_COLL_OUTSIDER:
                if not known:
                    reason = ("a process of this job conflicted with it (another world_size, a rank already taken, "
                              "or a second rank 0) and could not say more")
                raise Aborted(f"group {self._name!r} was aborted: its join was refused: {reason}")
            if st.timed_out:
                raise GroupTimeout(f"group {self._name!r} was aborted: {reason}",
                                   tuple(r for r in range(self._world) if st.missing >> r & 1))
            raise Aborted(f"group {self._name!r} was aborted: {reason}")
        if rc == -errno.EBADF:
            raise RendezvousError(f"group {self._name!r} is closed")
        if rc == -errno.EALREADY:
            raise RendezvousError(f"{what} on group {self._name!r}: another thread of this process is in a call on "
                                  f"this group; a group runs one call at a time, in the same order on every rank")
        if rc == -errno.EINVAL:
            raise InvalidArgument(f"{what} on group {self._name!r}: invalid arguments")
        raise RendezvousError(f"{what} on group {self._name!r}: {errno.errorcode.get(-rc, rc)} ({rc})")

    # ---- arguments ----

    def _input(self, obj: Any, what: str) -> Tuple[np.ndarray, bool]:
        array, tensor = as_array(obj, what)
        if array.dtype.hasobject:
            raise InvalidType(f"{what}: dtype {array.dtype} holds Python objects, which cannot be shared")
        if not array.flags.c_contiguous or not array.flags.aligned:
            array = np.ascontiguousarray(array) if array.flags.aligned else array.copy()
        return array, tensor

    def _reduction(self, array: np.ndarray, op: object, what: str) -> Tuple[int, int]:
        codes = _reductions.get((op, array.dtype)) if isinstance(op, str) else None
        if codes is not None:
            return codes
        codes = self._check_reduction(array, op, what)
        _reductions[(op, array.dtype)] = codes  # type: ignore[index]
        return codes

    def _check_reduction(self, array: np.ndarray, op: object, what: str) -> Tuple[int, int]:
        code = OPS.get(op) if isinstance(op, str) else None
        if code is None:
            raise InvalidArgument(f"{what}: op must be one of {', '.join(map(repr, OPS))}, got {op!r}")
        dt = _code(array.dtype)
        if not dt:
            raise InvalidType(f"{what}: cannot reduce dtype {array.dtype}: numeric, bool, float16 and bfloat16 "
                              f"arrays only (native byte order)")
        kind = array.dtype.kind
        if op in ("band", "bor", "bxor") and kind not in _INTEGRAL:
            raise InvalidArgument(f"{what}: op {op!r} is for integer and bool arrays, not {array.dtype}")
        if op == "mean" and kind in _INTEGRAL:
            raise InvalidArgument(f"{what}: op 'mean' needs a floating or complex dtype, not {array.dtype}; "
                                  f"use 'sum' and divide by world_size")
        if op in ("min", "max") and kind == "c":
            raise InvalidArgument(f"{what}: op {op!r} is not defined for complex numbers ({array.dtype})")
        return code, dt

    def _root(self, root: object, what: str) -> int:
        root = _int(root, f"{what}: root")
        if not 0 <= root < self._world:
            raise InvalidArgument(f"{what}: root must be a rank in [0, {self._world}), got {root}")
        return root

    def _out(self, out: Any, like: np.ndarray, what: str) -> Tuple[np.ndarray, Any, Optional[np.ndarray]]:
        """(the contiguous array the core writes, what the call returns: None
        for that array itself, else out, and a non-contiguous out's array,
        which gets the result through a copy in _result, or None)."""
        if out is None:
            return np.empty_like(like), None, None
        array, _ = as_array(out, f"{what}: out", out=True)
        if array.shape != like.shape or array.dtype != like.dtype:
            raise InvalidArgument(f"{what}: out has shape {array.shape} and dtype {array.dtype}, the result "
                                  f"{like.shape} and {like.dtype}")
        if not array.flags.writeable:
            raise InvalidArgument(f"{what}: out is read-only")
        if not array.flags.c_contiguous or not array.flags.aligned:
            return np.empty_like(like), out, array
        return array, out, None

    @staticmethod
    def _result(array: np.ndarray, tensor: bool, out_obj: Any = None, fill: Optional[np.ndarray] = None) -> Any:
        if out_obj is not None:
            if fill is not None:
                np.copyto(fill, array)
            return out_obj
        return as_tensor(array) if tensor else array

    def _rows(self, array: np.ndarray, what: str) -> None:
        if array.ndim == 0 or array.shape[0] != self._world:
            raise InvalidArgument(f"{what}: the array must have world_size = {self._world} rows (shape "
                                  f"({self._world}, ...)), got shape {array.shape}")

    # ---- the collectives ----

    def barrier(self) -> None:
        """Return once every rank has called barrier."""
        g = self._g
        if g is None or self._forked:
            g = self._handle()
        try:
            rc = lib.rdv_coll_barrier(g)
            if rc:
                self._finish(g, rc, _BARRIER, 0)
        except BaseException as exc:
            self._interrupted(g, exc, _BARRIER)
            raise

    def allreduce(self, array: Any, op: str = "sum", *, out: Any = None) -> Any:
        """The element-wise reduction of every rank's array, on every rank
        (the same bits everywhere). out may be the input (in place)."""
        # The common case, an ndarray with the op and dtype of the call
        # before, in place or into a new array, takes the fewest steps: a
        # small allreduce is mostly this. from_buffer refuses what the core
        # cannot take as it is (not C-contiguous; read-only, for writing).
        g = self._g
        if g is None or self._forked:
            g = self._handle()
        last_op, last_dtype, what = self._last_reduction
        if type(array) is np.ndarray and op is last_op and array.dtype is last_dtype and (out is None or out is array):
            try:
                if out is None:
                    src = ffi.from_buffer(array)
                    res = np.empty_like(array)
                    dst = ffi.from_buffer(res)
                else:
                    src = dst = ffi.from_buffer("char[]", array, True)
                    res = array
            except ValueError:
                pass
            else:
                try:
                    rc = lib.rdv_coll_run(g, what, array.nbytes, hash(array.shape) & _HASH_MASK, src, dst)
                    if rc == _EFAULT:  # misaligned: through aligned copies, below
                        return self._allreduce(g, array, op, out)
                    if rc:
                        self._finish(g, rc, what, array.nbytes)
                except BaseException as exc:
                    self._interrupted(g, exc, what)
                    raise
                return res
        if out is array and is_tensor(array):
            # a tensor in place (DDP's buckets): its own ndarray, in place,
            # takes the fast path above from the second call on
            try:
                view, _ = as_array(array, "allreduce: out", out=True)
            except Exception as exc:
                self._failed_call(_ALLREDUCE, exc)
                raise
            self.allreduce(view, op, out=view)
            return array
        return self._allreduce(g, array, op, out)

    def _allreduce(self, g: Any, array: Any, op: str, out: Any) -> Any:
        """allreduce, every case."""
        try:
            a, tensor = self._input(array, "allreduce")
            code, dt = self._reduction(a, op, "allreduce")
            what = _ALLREDUCE | code << 8 | dt << 16
            self._last_reduction = (op, a.dtype, what)
            fill = None
            if out is None:
                res, out_obj = np.empty_like(a), None
            elif out is array and a is array and a.flags.writeable:
                res, out_obj = a, out
            else:
                res, out_obj, fill = self._out(out, a, "allreduce")
                if res is not a and np.may_share_memory(res, a):
                    if _same_memory(res, a):  # two views of it (a tensor's and ours): in place
                        res = a
                    else:  # overlapping, not the same: reduce from a copy
                        a = a.copy()
        except Exception as exc:
            self._failed_call(_ALLREDUCE, exc)
            raise
        src = ffi.from_buffer(a)
        try:
            rc = lib.rdv_coll_run(g, what, a.nbytes, hash(a.shape) & _HASH_MASK, src,
                                  src if res is a else ffi.from_buffer(res))
            if rc:
                self._finish(g, rc, what, a.nbytes)
        except BaseException as exc:
            self._interrupted(g, exc, what)
            raise
        return res if out_obj is None and not tensor else self._result(res, tensor, out_obj, fill)

    def reduce(self, array: Any, root: int = 0, op: str = "sum") -> Any:
        """The reduction on root; None on the other ranks."""
        try:
            a, tensor = self._input(array, "reduce")
            code, dt = self._reduction(a, op, "reduce")
            root = self._root(root, "reduce")
            res = np.empty_like(a) if self._rank == root else None
        except Exception as exc:
            self._failed_call(lib.RDV_COLL_REDUCE, exc)
            raise
        self._run(lib.RDV_COLL_REDUCE, code, dt, root, a.nbytes, _shape_hash(a.shape, a.dtype), ffi.from_buffer(a),
                  ffi.NULL if res is None else ffi.from_buffer(res, require_writable=True))
        return None if res is None else self._result(res, tensor)

    def reduce_scatter(self, array: Any, op: str = "sum") -> Any:
        """This rank's block of the reduction: rows [rank * n, (rank + 1) * n)
        of it, n = array.shape[0] // world_size."""
        try:
            a, tensor = self._input(array, "reduce_scatter")
            code, dt = self._reduction(a, op, "reduce_scatter")
            if a.ndim == 0 or a.shape[0] % self._world:
                raise InvalidArgument(f"reduce_scatter: array.shape[0] must be a multiple of world_size = "
                                      f"{self._world}, got shape {a.shape}")
            res = np.empty((a.shape[0] // self._world,) + a.shape[1:], a.dtype)
        except Exception as exc:
            self._failed_call(lib.RDV_COLL_REDUCE_SCATTER, exc)
            raise
        self._run(lib.RDV_COLL_REDUCE_SCATTER, code, dt, 0, a.nbytes, _shape_hash(a.shape, a.dtype),
                  ffi.from_buffer(a), ffi.from_buffer(res, require_writable=True))
        return self._result(res, tensor)

    def broadcast(self, array: Any, root: int = 0, *, out: Any = None) -> Any:
        """root's array on every rank. Every rank passes an array of the same
        shape and dtype (the others' contents are not read); the root gets
        its own array back (or out, filled with it)."""
        try:
            a, tensor = self._input(array, "broadcast")
            root = self._root(root, "broadcast")
            fill = None
            if self._rank == root and out is None:
                res, out_obj = a, array if tensor else None
            else:
                res, out_obj, fill = self._out(out, a, "broadcast")
        except Exception as exc:
            self._failed_call(lib.RDV_COLL_BROADCAST, exc)
            raise
        self._run(lib.RDV_COLL_BROADCAST, 0, _code(a.dtype), root, a.nbytes, _shape_hash(a.shape, a.dtype),
                  ffi.from_buffer(a), ffi.from_buffer(res, require_writable=res is not a))
        return self._result(res, tensor, out_obj, fill)

    def allgather(self, array: Any) -> Any:
        """Every rank's array, stacked: shape (world_size, *array.shape), row r from rank r."""
        try:
            a, tensor = self._input(array, "allgather")
            res = np.empty((self._world,) + a.shape, a.dtype)
        except Exception as exc:
            self._failed_call(lib.RDV_COLL_ALLGATHER, exc)
            raise
        self._run(lib.RDV_COLL_ALLGATHER, 0, _code(a.dtype), 0, a.nbytes, _shape_hash(a.shape, a.dtype),
                  ffi.from_buffer(a), ffi.from_buffer(res, require_writable=True))
        return self._result(res, tensor)

    def gather(self, array: Any, root: int = 0) -> Any:
        """allgather's result on root; None on the other ranks."""
        try:
            a, tensor = self._input(array, "gather")
            root = self._root(root, "gather")
            res = np.empty((self._world,) + a.shape, a.dtype) if self._rank == root else None
        except Exception as exc:
            self._failed_call(lib.RDV_COLL_GATHER, exc)
            raise
        self._run(lib.RDV_COLL_GATHER, 0, _code(a.dtype), root, a.nbytes, _shape_hash(a.shape, a.dtype),
                  ffi.from_buffer(a), ffi.NULL if res is None else ffi.from_buffer(res, require_writable=True))
        return None if res is None else self._result(res, tensor)

    def scatter(self, array: Any = None, root: int = 0) -> Any:
        """Row ``rank`` of root's array (shape (world_size, ...)); the other
        ranks pass None (or anything: it is not read)."""
        meta = np.zeros(_META_DIMS, np.int64)
        tensor = False
        a: Optional[np.ndarray] = None
        try:
            root = self._root(root, "scatter")
            if self._rank == root:
                a, tensor = self._input(array, "scatter")
                self._rows(a, "scatter")
                if a.ndim - 1 > limits.NDIM_MAX - 1:
                    raise InvalidArgument(f"scatter: rows of {a.ndim - 1} dimensions; at most "
                                          f"{limits.NDIM_MAX - 1} (the array, with its world_size rows, at most "
                                          f"{limits.NDIM_MAX})")
                code = _code(a.dtype)
                if code == 0:
                    raise InvalidType(f"scatter: dtype {a.dtype} is not one a group moves: numeric, bool, float16 "
                                      f"and bfloat16 arrays")
                meta[0], meta[1], meta[2 : 2 + a.ndim - 1] = code, a.ndim - 1, a.shape[1:]
                meta[-1] = int(tensor)
        except Exception as exc:
            self._failed_call(lib.RDV_COLL_SCATTER, exc)
            raise
        self._run(lib.RDV_COLL_SCATTER_META, 0, lib.RDV_DT_I64, root, meta.nbytes, 0, ffi.from_buffer(meta),
                  ffi.from_buffer(meta, require_writable=True))
        dtype, shape, tensor = self._scattered(meta)
        res = np.empty(shape, dtype)
        self._run(lib.RDV_COLL_SCATTER, 0, _code(dtype), root, res.nbytes, _shape_hash(shape, dtype),
                  ffi.NULL if a is None else ffi.from_buffer(a), ffi.from_buffer(res, require_writable=True))
        return self._result(res, tensor)

    def _scattered(self, meta: np.ndarray) -> Tuple[np.dtype, Tuple[int, ...], bool]:
        """What the root's scatter header says (read from shared memory: checked)."""
        code, ndim = int(meta[0]), int(meta[1])
        dtype = _dtype_of(code)
        if dtype is None or not 0 <= ndim <= limits.NDIM_MAX - 1 or (meta[2 : 2 + ndim] < 0).any():
            raise SegmentMismatch(f"scatter on group {self._name!r}: the root's header is damaged")
        return dtype, tuple(int(n) for n in meta[2 : 2 + ndim]), bool(meta[-1])

    def alltoall(self, array: Any) -> Any:
        """array has world_size rows; out[j] is rank j's array[rank]."""
        try:
            a, tensor = self._input(array, "alltoall")
            self._rows(a, "alltoall")
            res = np.empty_like(a)
        except Exception as exc:
            self._failed_call(lib.RDV_COLL_ALLTOALL, exc)
            raise
        self._run(lib.RDV_COLL_ALLTOALL, 0, _code(a.dtype), 0, a.nbytes // self._world,
                  _shape_hash(a.shape, a.dtype), ffi.from_buffer(a), ffi.from_buffer(res, require_writable=True))
        return self._result(res, tensor)

    def new_group(self, ranks: Sequence[int]) -> "Group":
        """A group of some of this group's ranks (in the order given: the
        first is its rank 0), called by those ranks only. Collectives of
        disjoint subgroups run concurrently."""
        self._handle()  # a closed group, or a forked child's copy, has no subgroups
        try:
            members = tuple(_int(r, "new_group: ranks") for r in ranks)
        except TypeError:
            raise InvalidType(f"new_group: ranks must be a sequence of ints, got {type(ranks).__name__}") from None
        if len(set(members)) != len(members) or not all(0 <= r < self._world for r in members):
            raise InvalidArgument(f"new_group: ranks must be distinct ranks of [0, {self._world}), got {list(members)}")
        if self._rank not in members:
            raise InvalidArgument(f"new_group: rank {self._rank} is not in {list(members)}: only the members of a "
                                  f"subgroup call new_group")
        count = self._subgroups.get(members, 0)
        self._subgroups[members] = count + 1
        tag = zlib.crc32(repr(members).encode())
        name = f"{self._name}.{len(members)}-{tag:08x}-{count}"
        return Group(name, members.index(self._rank), len(members), timeout=self._timeout, job=self._job)


def _describe(kind: int, op: int, dtype: int, root: int, nbytes: int) -> str:
    name = _KINDS.get(kind, f"collective {kind}")
    parts = []
    if op:
        parts.append(f"op={_OP_NAMES.get(op, op)!r}")
    if kind not in (lib.RDV_COLL_BARRIER,):
        parts.append(f"dtype={_DTYPE_NAMES.get(dtype, 'other')}")
        parts.append(f"{nbytes} bytes")
    if kind in (lib.RDV_COLL_BROADCAST, lib.RDV_COLL_REDUCE, lib.RDV_COLL_GATHER, lib.RDV_COLL_SCATTER,
                lib.RDV_COLL_SCATTER_META):
        parts.append(f"root={root}")
    return f"{name}({', '.join(parts)})"


__all__ = ["Group", "GROUP_PREFIX", "MAX_RANKS", "OPS", "SLOT_BYTES", "remove_group", "sweep_stale_groups"]
