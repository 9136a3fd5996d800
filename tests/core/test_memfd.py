"""A private rendezvous is a sealed memfd: nobody (its creator included) can
shrink, grow or extend it; other processes attach by name through its
creator's descriptor (/proc/PID/fd), spawned or forked, only while the
creating handle is open; and whatever kills its processes, nothing of it is
left anywhere once the last is gone."""
import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import traceback

import numpy as np
import pytest

import shmrdv
from shmrdv import segments

from ..conftest import ROOT, MiB, SHM_DIR

pytestmark = pytest.mark.timeout(120)

PAGE = 4096
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def link(name: str) -> str:
    return f"/memfd:shmrdv-{name} (deleted)"


def fds_of(pid: int, name: str) -> list:
    """/proc/PID/fd/N of every descriptor process pid has of private rendezvous name."""
    found = []
    for entry in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{entry}"
        try:
            if os.readlink(path) == link(name):
                found.append(path)
        except OSError:
            pass
    return found


def holders(name: str) -> set:
    """The processes that have private rendezvous name open or mapped."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if fds_of(int(entry), name):
                pids.add(int(entry))
            with open(f"/proc/{entry}/maps") as maps:
                if f"/memfd:shmrdv-{name} " in maps.read():
                    pids.add(int(entry))
        except OSError:
            pass  # gone meanwhile
    return pids


def python(code: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                          **kwargs)


def truncations(path: str) -> dict:
    """What ftruncate (shrink, to 0, grow), fallocate past the end and a new
    seal do to the file open at path: errno names, or "ok"."""
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        tried = {"shrink": lambda: os.ftruncate(fd, size - PAGE), "zero": lambda: os.ftruncate(fd, 0),
                 "grow": lambda: os.ftruncate(fd, size + PAGE), "extend": lambda: os.posix_fallocate(fd, size, PAGE),
                 "seal": lambda: fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)}
        out = {}
        for what, call in tried.items():
            try:
                call()
                out[what] = "ok"
            except OSError as exc:
                out[what] = errno.errorcode[exc.errno]
        out["seals"] = fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS == SEALS
        out["size_kept"] = os.fstat(fd).st_size == size
        return out
    finally:
        os.close(fd)


REFUSED = {"shrink": "EPERM", "zero": "EPERM", "grow": "EPERM", "extend": "EPERM", "seal": "EPERM", "seals": True,
           "size_kept": True}


def test_its_creator_can_neither_shrink_grow_nor_extend_it():
    with shmrdv.Rendezvous(size=MiB) as rdv:
        paths = fds_of(os.getpid(), rdv.name)
        assert len(paths) == 2  # the descriptor offered to attachers, and the handle's own
        for path in paths:
            assert truncations(path) == REFUSED
        rdv.send("k", np.arange(4))
        np.testing.assert_array_equal(rdv.recv("k", timeout=5), np.arange(4))
        assert not rdv.stats().aborted


def test_another_process_can_neither_shrink_grow_nor_extend_it():
    """Through the creator's descriptor (/proc/PID/fd) and through its own
    handle's, after attaching by name."""
    with shmrdv.Rendezvous(size=MiB) as rdv:
        run = python(f"""
            import json, os, shmrdv
            from tests.core.test_memfd import fds_of, truncations
            with shmrdv.Rendezvous({rdv.name!r}, create=False) as rdv:
                out = {{"creator's": [truncations(p) for p in fds_of({os.getpid()}, rdv.name)],
                        "own": [truncations(p) for p in fds_of(os.getpid(), rdv.name)]}}
                rdv.send("from-child", [7])
            print(json.dumps(out))
            """, cwd=ROOT)
        assert run.returncode == 0, run.stderr
        out = json.loads(run.stdout)
        assert out["creator's"] == [REFUSED, REFUSED] and out["own"] == [REFUSED], out
        assert rdv.recv("from-child", timeout=5).tolist() == [7]


def test_a_forked_child_attaches_anew_and_by_name_and_does_not_keep_the_offer():
    with shmrdv.Rendezvous(size=MiB) as rdv:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                assert not segments._held, "the parent's offer was kept"
                rdv.send("inherited", np.array([1]), timeout=10)  # the object it inherited attaches anew
                with shmrdv.Rendezvous(rdv.name, create=False) as again:
                    again.send("by-name", np.array([2]), timeout=10)
                code = 0
            except BaseException:
                traceback.print_exc()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert rdv.recv("inherited", timeout=5).tolist() == [1] and rdv.recv("by-name", timeout=5).tolist() == [2]


ATTACHED_CHILD = """
    import sys, numpy as np, shmrdv
    rdv = shmrdv.Rendezvous(sys.argv[1], create=False)
    print("attached", flush=True)
    sys.stdin.readline()
    rdv.send("after", np.arange(3), timeout=10)  # the creator is gone or closed: this one goes on
    print(rdv.recv("after", timeout=10).tolist(), flush=True)
    sys.stdin.readline()
    """


def attached_child(name: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(ATTACHED_CHILD), name], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "attached\n"
    return child


def test_once_its_creator_closed_it_nobody_new_attaches_and_those_attached_go_on():
    """A view the creator still holds keeps its handle's own descriptor open
    and the memory mapped: still, nobody can attach any more."""
    rdv = shmrdv.Rendezvous(size=MiB)
    name = rdv.name
    rdv.send("k", np.arange(5))
    view = rdv.recv("k", timeout=5)
    child = attached_child(name)
    try:
        rdv.close()
        assert fds_of(os.getpid(), name)  # the handle's own, for the view
        late = python(f"import shmrdv; shmrdv.Rendezvous({name!r}, create=False)")
        assert "FileNotFoundError" in late.stderr and "does not have it open any more" in late.stderr, late.stderr
        with pytest.raises(FileNotFoundError, match="does not have it open any more"):
            shmrdv.Rendezvous(name, create=False)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "[0, 1, 2]\n"
        assert view.tolist() == [0, 1, 2, 3, 4]
    finally:
        child.kill()
        child.wait()
    del view
    assert not fds_of(os.getpid(), name)


def test_a_killed_creator_leaves_nothing_anywhere():
    """SIGKILL: its attached child goes on, nobody new attaches, and once the
    child is gone too no process holds the memory and /dev/shm has nothing."""
    creator = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time, shmrdv
        rdv = shmrdv.Rendezvous(size=64 << 20)
        print(rdv.name, flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    name = creator.stdout.readline().strip()
    child = None
    try:
        child = attached_child(name)
        creator.kill()
        creator.wait()
        late = python(f"import shmrdv; shmrdv.Rendezvous({name!r}, create=False)")
        assert "FileNotFoundError" in late.stderr and f"process {creator.pid}, which created it, is gone" in late.stderr
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "[0, 1, 2]\n"
        assert holders(name) == {child.pid}
    finally:
        creator.kill()
        if child is not None:
            child.kill()
            child.wait()
    assert holders(name) == set()
    assert not [e for e in os.listdir(SHM_DIR) if name in e]


def test_a_creator_killed_while_creating_leaves_nothing():
    creator = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, shmrdv
        from shmrdv import segments
        name = segments.private_name()
        segments.private_name = lambda: name
        print(name, flush=True)
        shmrdv.Rendezvous(size=1 << 30)
        """)], stdout=subprocess.PIPE, text=True)
    name = creator.stdout.readline().strip()
    deadline = time.monotonic() + 30
    while not holders(name) and time.monotonic() < deadline and creator.poll() is None:
        time.sleep(0.001)  # memfd_create has run; reserving and mapping 1 GiB takes a while
    creator.send_signal(signal.SIGKILL)
    creator.wait()
    assert holders(name) == set()
    assert not [e for e in os.listdir(SHM_DIR) if name in e]


def test_a_create_interrupted_before_the_offer_leaves_nothing(monkeypatch):
    name = segments.private_name()
    monkeypatch.setattr(shmrdv.segments, "private_name", lambda: name)

    def interrupted(fd, name):
        raise KeyboardInterrupt

    monkeypatch.setattr(segments, "_offer_memfd", interrupted)
    with pytest.raises(KeyboardInterrupt):
        shmrdv.Rendezvous(size=MiB)
    assert holders(name) == set() and name not in segments._held


def test_an_attacher_that_may_not_read_its_creators_descriptors_is_told_why():
    """A creator that made itself undumpable, and an attacher without
    CAP_SYS_PTRACE (root without it is a user like any other here)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv(1) to drop CAP_SYS_PTRACE")
    run = python("""
        import ctypes, subprocess, sys, shmrdv
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
        with shmrdv.Rendezvous(size=1 << 20) as rdv:
            attach = subprocess.run(["setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace",
                                     sys.executable, "-c",
                                     f"import shmrdv; shmrdv.Rendezvous({rdv.name!r}, create=False)"],
                                    capture_output=True, text=True)
        print(attach.stderr)
        """)
    assert run.returncode == 0, run.stderr
    assert "PermissionError" in run.stdout and "may not open the descriptors of process" in run.stdout, run.stdout
    assert "dumpable" in run.stdout and "named rendezvous" in run.stdout, run.stdout


def test_dir_does_not_apply_to_a_private_rendezvous():
    with pytest.raises(shmrdv.InvalidArgument, match="is a memfd, in no directory"):
        shmrdv.Rendezvous(dir="/dev/shm")
    with pytest.raises(shmrdv.InvalidArgument, match="is a memfd, in no directory"):
        shmrdv.Rendezvous(segments.private_name(), dir="/dev/shm")


def test_huge_pages_on_a_private_rendezvous_follow_shmem_enabled():
    offer = shmrdv.huge_pages.offered(None)
    if offer.available:
        with shmrdv.Rendezvous(size=4 << 20, huge_pages=True) as rdv:
            assert rdv.stats().huge_pages
    else:
        with pytest.raises(shmrdv.HugePagesUnavailable, match="shmem_enabled"):
            shmrdv.Rendezvous(size=4 << 20, huge_pages=True)


def test_shmrdv_ls_shows_private_rendezvous_and_who_holds_them():
    rdv = shmrdv.Rendezvous(size=MiB)
    name = rdv.name
    rdv.send("k", np.arange(3))
    child = attached_child(name)
    try:
        ls = subprocess.run([sys.executable, "-m", "shmrdv", "ls"], capture_output=True, text=True, timeout=60)
        line = next(line for line in ls.stdout.splitlines() if line.startswith(name))
        assert f"PRIVATE (memory of process {os.getpid()})" in line and str(child.pid) in line, line
        assert " 1 MiB " in line, line  # its arena
        rdv.close()
        ls = subprocess.run([sys.executable, "-m", "shmrdv", "ls"], capture_output=True, text=True, timeout=60)
        line = next(line for line in ls.stdout.splitlines() if line.startswith(name))
        assert f"closed by its creator (process {os.getpid()}): still held by {child.pid}" in line, line
    finally:
        rdv.close()
        child.kill()
        child.wait()
    ls = subprocess.run([sys.executable, "-m", "shmrdv", "ls"], capture_output=True, text=True, timeout=60)
    assert name not in ls.stdout
