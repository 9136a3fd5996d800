"""Segments that processes killed before they could clean up leave in
/dev/shm: one sweep over this user's entries of a kind, for the kinds whose
owners are known to be gone (private rendezvous, groups that never formed)."""
import os
from typing import Callable, List

import posix_ipc

SHM_DIR = "/dev/shm"
# A segment nobody holds a lock of is judged left over only once its file is
# this old: a creator is between its steps for a moment with no lock of it
# held (between creating the file and taking its creator's lock; a
# rendezvous's also between publishing it and claiming its entry), a few
# microseconds unless it is descheduled. For rendezvous and groups alike.
CREATOR_GRACE_S = 1.0


def sweep(file_prefix: str, stale: Callable[[str, int, os.stat_result], bool]) -> List[str]:
    """Unlink the entries of /dev/shm that start with ``file_prefix``, are
    this user's, and that ``stale(rest_of_name, fd, stat)`` judges left
    over; return their names without the prefix. An entry is unlinked only
    while its name still names the file judged."""
    removed: List[str] = []
    try:
        entries = [e for e in os.listdir(SHM_DIR) if e.startswith(file_prefix)]
    except FileNotFoundError:
        return removed
    for entry in entries:
        try:
            shm = posix_ipc.SharedMemory("/" + entry)
        except (posix_ipc.ExistentialError, posix_ipc.PermissionsError, OSError, ValueError):
            continue  # ValueError: no shared-memory file (a directory someone made)
        try:
            st = os.fstat(shm.fd)
            if st.st_uid != os.geteuid() or not stale(entry[len(file_prefix):], shm.fd, st):
                continue
        finally:
            shm.close_fd()
        try:
            if os.stat(os.path.join(SHM_DIR, entry)).st_ino == st.st_ino:
                posix_ipc.unlink_shared_memory("/" + entry)
                removed.append(entry[len(file_prefix):])
        except (FileNotFoundError, posix_ipc.ExistentialError):
            pass
    return removed


def pid_gone(pid: int) -> bool:
    """Whether no process has this pid (in our pid namespace)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, ValueError):
        pass  # someone else's: alive; or no pid at all: not known to be gone
    return False
