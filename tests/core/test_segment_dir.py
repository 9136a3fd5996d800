"""Named rendezvous in a directory of the user's choosing (``dir=``,
``SHMRDV_DIR``; default /dev/shm): processes meet there by name, children
given the handle follow it whatever their environment, the CLI sees it
(``--dir`` or the variable), and the refusals that keep another user from
reading or planting segments hold there too, for the directory itself as
well."""
import os
import shutil
import stat
import subprocess
import sys
import uuid

import numpy as np
import pytest

import shmrdv

from ..conftest import SESSION_PREFIX, SHM_DIR

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def shm_subdir():
    """A directory of this user's on /dev/shm's tmpfs, mode 0700, removed afterwards."""
    path = os.path.join(SHM_DIR, f"{SESSION_PREFIX}dir-{uuid.uuid4().hex[:8]}")
    os.mkdir(path, 0o700)
    yield path
    shutil.rmtree(path)


def cli(*args: str, env_dir: str = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("SHMRDV_DIR", None)
    if env_dir is not None:
        env["SHMRDV_DIR"] = env_dir
    return subprocess.run([sys.executable, "-m", "shmrdv", *args], capture_output=True, text=True, timeout=60, env=env)


def child_sends(rdv):
    """Spawned child, with no SHMRDV_DIR in its environment: the pickled handle names its directory."""
    assert "SHMRDV_DIR" not in os.environ
    rdv.send("from-child", np.arange(3), timeout=30)


def test_a_named_rendezvous_lives_in_dir_and_children_follow_it(shm_subdir, children, rdv_name, monkeypatch):
    monkeypatch.delenv("SHMRDV_DIR", raising=False)
    with shmrdv.Rendezvous(rdv_name, size=1 << 20, dir=shm_subdir) as rdv:
        assert rdv.dir == shm_subdir and rdv.private is False
        path = os.path.join(shm_subdir, f"shmrdv-{rdv_name}")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert not os.path.exists(os.path.join(SHM_DIR, f"shmrdv-{rdv_name}"))
        with pytest.raises(FileNotFoundError, match=f"no such rendezvous in {SHM_DIR}"):
            shmrdv.Rendezvous(rdv_name, create=False)  # another directory, another name space
        children.start(child_sends, rdv)
        assert rdv.recv("from-child", timeout=60).tolist() == [0, 1, 2]
        children.join()
        rdv.unlink()
        assert not os.path.exists(path)


def test_shmrdv_dir_is_where_unrelated_processes_meet_and_the_cli_looks(shm_subdir, rdv_name, monkeypatch):
    monkeypatch.setenv("SHMRDV_DIR", shm_subdir)
    with shmrdv.Rendezvous(rdv_name, size=1 << 20) as rdv:
        assert rdv.dir == shm_subdir
        meet = subprocess.run([sys.executable, "-c", f"import shmrdv; shmrdv.Rendezvous({rdv_name!r}, create=False)"
                                                     f".send('k', [5])"], capture_output=True, text=True, timeout=60)
        assert meet.returncode == 0, meet.stderr
        assert rdv.recv("k", timeout=5).tolist() == [5]
        for by in ({"env_dir": shm_subdir}, {}):
            extra = () if by else ("--dir", shm_subdir)
            ls = cli("ls", *extra, **by)
            assert ls.returncode == 0 and f"{rdv_name} " in ls.stdout, ls
            stat_ = cli("stat", rdv_name, *extra, **by)
            assert stat_.returncode == 0 and f"rendezvous {rdv_name}" in stat_.stdout, stat_
            gc = cli("gc", *extra, **by)
            assert gc.returncode == 0 and f"{rdv_name}: 1 live process(es) attached" in gc.stdout, gc
        assert rdv_name not in cli("ls").stdout  # /dev/shm, where nothing of it is
    rm = cli("rm", "--dir", shm_subdir, rdv_name)
    assert rm.returncode == 0 and f"{rdv_name}: removed" in rm.stdout, rm
    assert os.listdir(shm_subdir) == []


def test_what_a_directory_must_be(tmp_path, rdv_name, monkeypatch):
    monkeypatch.delenv("SHMRDV_DIR", raising=False)
    with pytest.raises(shmrdv.InvalidArgument, match="dir must be an absolute path"):
        shmrdv.Rendezvous(rdv_name, dir="relative/dir")
    monkeypatch.setenv("SHMRDV_DIR", "relative/dir")
    with pytest.raises(shmrdv.InvalidArgument, match="SHMRDV_DIR must be an absolute path"):
        shmrdv.Rendezvous(rdv_name)
    monkeypatch.delenv("SHMRDV_DIR")
    with pytest.raises(FileNotFoundError, match="the directory for rendezvous files does not exist"):
        shmrdv.Rendezvous(rdv_name, dir=str(tmp_path / "missing"))
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        shmrdv.Rendezvous(rdv_name, dir=str(tmp_path / "file"))
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # others could swap files in it
    with pytest.raises(PermissionError, match=r"others may write to \(mode 0777\) without the sticky bit"):
        shmrdv.Rendezvous(rdv_name, dir=str(shared))
    os.chmod(shared, 0o1777)  # sticky, as /dev/shm and /tmp are: fine
    shmrdv.Rendezvous(rdv_name, size=1 << 16, dir=str(shared)).close()
    if os.geteuid() == 0:
        os.chown(shared, 12345, -1)
        with pytest.raises(PermissionError, match="in a directory owned by uid 12345"):
            shmrdv.Rendezvous(rdv_name, dir=str(shared))
    assert cli("ls", "--dir", "relative").returncode == 2


def test_owner_mode_symlink_and_directory_refusals_hold_in_dir(shm_subdir, tmp_path, rdv_name):
    path = os.path.join(shm_subdir, f"shmrdv-{rdv_name}")
    shmrdv.Rendezvous(rdv_name, create=True, size=1 << 16, dir=shm_subdir).close()
    os.chmod(path, 0o644)
    with pytest.raises(PermissionError, match=f"mode 0644, open to group or others.*shmrdv rm --dir {shm_subdir}"):
        shmrdv.Rendezvous(rdv_name, dir=shm_subdir)
    os.chmod(path, 0o600)
    if os.geteuid() == 0:
        os.chown(path, 12345, -1)
        with pytest.raises(PermissionError, match="owned by uid 12345"):
            shmrdv.Rendezvous(rdv_name, create=False, dir=shm_subdir)
        ls = cli("ls", "--dir", shm_subdir)
        assert "owned by uid 12345" in ls.stdout, ls
    os.unlink(path)
    (tmp_path / "elsewhere").write_bytes(b"")
    os.symlink(tmp_path / "elsewhere", path)
    with pytest.raises(PermissionError, match="symbolic link"):
        shmrdv.Rendezvous(rdv_name, create=False, dir=shm_subdir)
    with pytest.raises(FileExistsError):
        shmrdv.Rendezvous(rdv_name, create=True, dir=shm_subdir)
    os.unlink(path)
    os.mkdir(path)
    with pytest.raises(shmrdv.SegmentMismatch, match=f"{path} is not a shared-memory file"):
        shmrdv.Rendezvous(rdv_name, dir=shm_subdir)
    os.rmdir(path)


def test_a_create_made_with_a_umask_is_still_0600(shm_subdir, rdv_name):
    old = os.umask(0o277)  # would leave the owner no write access
    try:
        with shmrdv.Rendezvous(rdv_name, size=1 << 16, dir=shm_subdir):
            assert stat.S_IMODE(os.stat(os.path.join(shm_subdir, f"shmrdv-{rdv_name}")).st_mode) == 0o600
            shmrdv.Rendezvous(rdv_name, create=False, dir=shm_subdir).close()
    finally:
        os.umask(old)


HUGETLBFS = """
    import os, subprocess, sys, numpy as np, shmrdv
    d = sys.argv[1]
    with shmrdv.Rendezvous("huge", size=16 << 20, dir=d) as rdv:
        size = os.stat(os.path.join(d, "shmrdv-huge")).st_size
        print("FILE", size % (2 << 20) == 0 and size >= 16 << 20)
        child = subprocess.run([sys.executable, "-c", "import sys, numpy as np, shmrdv; "
                                "shmrdv.Rendezvous('huge', create=False, dir=sys.argv[1]).send('k', np.ones(1 << 20))", d])
        print("CHILD", child.returncode, float(rdv.recv("k", timeout=10).sum()))
        with open("/proc/self/smaps") as smaps:
            print("HUGETLB", any(line.split()[0] in ("Shared_Hugetlb:", "Private_Hugetlb:") and line.split()[1] != "0"
                                 for line in smaps))
        rdv.unlink()
    print("LEFT", os.listdir(d))
    """


def test_a_named_rendezvous_on_hugetlbfs(tmp_path):
    """Its file is sized in whole huge pages, which every process maps. Needs
    root (a hugetlbfs mounted in a mount namespace of its own, 16 huge pages
    reserved for the test and given back)."""
    import textwrap

    if os.geteuid() != 0 or shutil.which("unshare") is None or not os.path.exists("/proc/sys/vm/nr_hugepages"):
        pytest.skip("needs root, unshare(1) and huge pages in the kernel")
    with open("/proc/sys/vm/nr_hugepages") as f:
        before = int(f.read())
    with open("/proc/meminfo") as f:
        page = next(int(line.split()[1]) for line in f if line.startswith("Hugepagesize:")) * 1024
    if page != 2 << 20:
        pytest.skip(f"huge pages of {page} bytes here; the test sizes for 2 MiB")
    mount_point = tmp_path / "huge"
    mount_point.mkdir(mode=0o700)
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(HUGETLBFS))
    try:
        with open("/proc/sys/vm/nr_hugepages", "w") as f:
            f.write(str(before + 16))
        with open("/proc/meminfo") as f:
            if next(int(line.split()[1]) for line in f if line.startswith("HugePages_Free:")) < 10:
                pytest.skip("the kernel could not reserve 10 huge pages")
        run = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                              f"mount -t hugetlbfs -o mode=0700 none {mount_point} && {sys.executable} {script} "
                              f"{mount_point}"], capture_output=True, text=True, timeout=60)
    finally:
        with open("/proc/sys/vm/nr_hugepages", "w") as f:
            f.write(str(before))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "FILE True" in run.stdout and f"CHILD 0 {float(1 << 20)}" in run.stdout, run.stdout
    assert "HUGETLB True" in run.stdout and "LEFT []" in run.stdout, run.stdout
