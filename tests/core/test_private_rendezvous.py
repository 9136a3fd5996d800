"""``Rendezvous()`` with no name: a private rendezvous for this process tree.

It gets a unique name, children it is passed to attach by pickling, and it is
removed (nobody can attach to it any more) when the creating handle closes or
the creating process exits; it is a memfd, so nothing is ever left in
/dev/shm (tests/test_memfd.py: sealing, attaching, a killed creator). What
older versions' creators killed by a signal left there (files), the next
private rendezvous (or shmrdv gc) removes, once nobody has it attached."""

import glob
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import shmrdv
from shmrdv.leftovers import CREATOR_GRACE_S
from shmrdv.segments import private_name

from ..conftest import MiB, SHM_DIR, segment_path

SAMPLE = """\
from shmrdv import Rendezvous
rdv = Rendezvous()
rdv.send("key", [1, 2, 3])
print(rdv.recv("key"))
"""


def private_segments(pid: int):
    return glob.glob(os.path.join(SHM_DIR, f"shmrdv-private-{pid}-*"))


def attachable(name: str) -> bool:
    """Whether rendezvous ``name`` can be attached to by name (from this process)."""
    try:
        shmrdv.Rendezvous(name, create=False).close()
    except FileNotFoundError:
        return False
    return True


@pytest.fixture
def leaves_nothing():
    """Fail if a private rendezvous of this process is left in /dev/shm; remove it anyway."""
    before = set(private_segments(os.getpid()))
    yield
    left = set(private_segments(os.getpid())) - before
    for path in left:
        os.unlink(path)
    assert not left, f"private segments left behind: {sorted(left)}"


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter; remove any private segment it leaves (after reporting it)."""
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        process.kill()
        process.wait()
    left = private_segments(process.pid)
    for path in left:
        os.unlink(path)
    result = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    result.left = left
    return result


@pytest.mark.timeout(60)
def test_the_sample_prints_the_array_and_leaves_nothing_in_dev_shm():
    result = run_python(SAMPLE)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[1 2 3]\n"
    assert result.stderr == ""  # no ResourceWarning, no traceback
    assert result.left == []


def test_a_private_rendezvous_has_a_unique_name_and_is_unlinked_when_closed(leaves_nothing):
    first, second = shmrdv.Rendezvous(size=MiB), shmrdv.Rendezvous(size=MiB)
    assert first.private and second.private
    assert first.name != second.name
    assert first.name.startswith(f"private-{os.getpid()}-")
    assert attachable(first.name) and not os.path.exists(segment_path(first.name))  # in memory, no file
    first.close()
    assert not attachable(first.name)
    first.close()  # idempotent
    with second:
        second.send("k", np.arange(3))
    assert not attachable(second.name)


def test_a_garbage_collected_private_rendezvous_is_unlinked(leaves_nothing):
    rdv = shmrdv.Rendezvous(size=MiB)
    name = rdv.name
    with pytest.warns(ResourceWarning):
        del rdv
        import gc

        gc.collect()
    assert not attachable(name)


def test_handles_that_attach_by_name_never_unlink_it(leaves_nothing):
    with shmrdv.Rendezvous(size=MiB) as rdv:
        with shmrdv.Rendezvous(rdv.name, create=False) as other:
            assert not other.private
            other.send("k", np.arange(3))
        assert attachable(rdv.name)
        np.testing.assert_array_equal(rdv.recv("k", timeout=5), [0, 1, 2])


def test_a_private_rendezvous_cannot_be_asked_to_exist(leaves_nothing):
    with pytest.raises(shmrdv.InvalidArgument, match="create=False needs a name"):
        shmrdv.Rendezvous(create=False)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ending", ["sys.exit(0)", "pass", "raise SystemExit(3)"], ids=["sys.exit", "end-of-script", "exit-3"])
def test_unlinked_when_the_creating_process_exits_normally(ending):
    code = textwrap.dedent(f"""\
        import sys
        import numpy as np
        import shmrdv
        rdv = shmrdv.Rendezvous(size=1 << 20)
        rdv.send("k", np.arange(10))
        view = rdv.recv("k")  # a view still held at exit
        print(rdv.name, flush=True)
        {ending}
        """)
    result = run_python(code)
    assert result.returncode == (3 if "3" in ending else 0), result.stderr
    name = result.stdout.strip()
    assert name.startswith("private-")
    assert result.left == []
    assert not os.path.exists(segment_path(name))


@pytest.mark.timeout(60)
def test_a_forked_child_that_exits_normally_leaves_it_to_the_parent():
    code = textwrap.dedent("""\
        import os, sys
        import numpy as np
        import shmrdv
        rdv = shmrdv.Rendezvous(size=1 << 20)
        pid = os.fork()
        if pid == 0:
            rdv.send("from-child", np.arange(3), timeout=10)
            sys.exit(0)  # runs the child's exit handlers: they must not unlink the parent's rendezvous
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        shmrdv.Rendezvous(rdv.name, create=False).close()  # the child's exit left it attachable
        print(rdv.recv("from-child", timeout=10).tolist())
        """)
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[0, 1, 2]\n"
    assert result.left == []


def child_sends_to_parent(rdv):
    """Spawned child: got the parent's private rendezvous by pickling."""
    assert not rdv.private
    rdv.send("from-child", np.array([1, 2, 3]), timeout=30)
    ack = rdv.recv("ack", timeout=30)
    assert int(ack[0]) == 7
    rdv.close()  # a child's close never unlinks it


@pytest.mark.timeout(120)
def test_a_spawned_child_given_the_rendezvous_sends_to_the_parent(children, leaves_nothing):
    rdv = shmrdv.Rendezvous(size=MiB)
    try:
        child = children.start(child_sends_to_parent, rdv)
        np.testing.assert_array_equal(rdv.recv("from-child", timeout=60), [1, 2, 3])
        rdv.send("ack", np.array([7]))
        children.join()
        assert child.exitcode == 0
        assert attachable(rdv.name)  # the child's exit left it alone
    finally:
        rdv.close()
    assert not attachable(rdv.name)


def dead_pid() -> int:
    """The pid of a process that has ended."""
    process = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], stdout=subprocess.PIPE,
                             text=True, timeout=60)
    return int(process.stdout)


def left_by_an_older_version(pid: int, holder: bool = False):
    """The name of a private rendezvous file in /dev/shm, as an older
    version (whose private rendezvous were files there) left it when its
    creator, process ``pid``, was killed by a signal; with ``holder``,
    also the process that still has it attached (its creator's forked
    child, say). Made under another name and renamed, since this version
    makes memfds for names of this form."""
    scratch = f"t-{os.getpid()}-old-{os.urandom(4).hex()}"
    shmrdv.Rendezvous(scratch, size=1 << 20, create=True).close()
    process = None
    if holder:
        code = textwrap.dedent(f"""\
            import sys, time
            import shmrdv
            rdv = shmrdv.Rendezvous({scratch!r}, create=False)
            print("attached", flush=True)
            time.sleep(60)
            """)
        process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert process.stdout.readline() == "attached\n"
    name = f"private-{pid}-{os.urandom(6).hex()}"
    os.rename(segment_path(scratch), segment_path(name))
    return (name, process) if holder else name


def remove_if_left(name: str) -> None:
    try:
        os.unlink(segment_path(name))
    except FileNotFoundError:
        pass


@pytest.mark.timeout(60)
def test_the_next_private_rendezvous_or_gc_removes_what_an_older_versions_killed_creator_left(leaves_nothing):
    """A creator killed by a signal could not unlink its file: the next
    Rendezvous() on the machine (this user's) removes it, and so does a
    plain shmrdv gc."""
    first, second = left_by_an_older_version(dead_pid()), left_by_an_older_version(dead_pid())
    time.sleep(CREATOR_GRACE_S)  # younger, they could be a creator's between its steps
    try:
        with shmrdv.Rendezvous(size=1 << 20):
            assert not os.path.exists(segment_path(first)) and not os.path.exists(segment_path(second))
        third = left_by_an_older_version(dead_pid())
        time.sleep(CREATOR_GRACE_S)
        gc = subprocess.run([sys.executable, "-m", "shmrdv", "gc"], capture_output=True, text=True, timeout=60)
        assert gc.returncode == 0, gc.stderr
        assert f"{third}: private, its creator is gone and nobody has it attached: removed" in gc.stdout, gc.stdout
        assert not os.path.exists(segment_path(third))
    finally:
        for name in (first, second):
            remove_if_left(name)


@pytest.mark.timeout(60)
def test_an_older_versions_private_rendezvous_a_live_process_still_has_stays(leaves_nothing):
    """Its creator is gone, but a process still has it attached: neither
    the next Rendezvous() nor shmrdv gc removes it; once that process is
    gone too, the next one does."""
    name, holder = left_by_an_older_version(dead_pid(), holder=True)
    time.sleep(CREATOR_GRACE_S)
    try:
        with shmrdv.Rendezvous(size=1 << 20):
            assert os.path.exists(segment_path(name))
        gc = subprocess.run([sys.executable, "-m", "shmrdv", "gc"], capture_output=True, text=True, timeout=60)
        assert gc.returncode == 0 and os.path.exists(segment_path(name)), gc.stdout + gc.stderr
        holder.kill()
        holder.wait()
        with shmrdv.Rendezvous(size=1 << 20):
            assert not os.path.exists(segment_path(name))
    finally:
        holder.kill()
        holder.wait()
        remove_if_left(name)


@pytest.mark.timeout(60)
def test_only_private_names_are_swept_and_only_their_process_creates_one(rdv_name, leaves_nothing):
    """A name of the private form names a process's private rendezvous: made
    for another pid it is refused (create=True) or only attached to; a name
    that merely starts so is an ordinary one, which no sweep touches."""
    foreign = "private-4242-0123456789ab"
    with pytest.raises(shmrdv.InvalidArgument, match="process 4242's private rendezvous names"):
        shmrdv.Rendezvous(foreign, size=1 << 20, create=True)
    with pytest.raises(FileNotFoundError):
        shmrdv.Rendezvous(foreign, size=1 << 20)  # attach only: never created
    assert not os.path.exists(segment_path(foreign))
    for ordinary in ("private-4242-run", "private-2147483648", "private-99999999999-0123456789ab"):
        shmrdv.Rendezvous(ordinary, size=1 << 20, create=True).close()  # left, with nobody attached
    try:
        time.sleep(CREATOR_GRACE_S)
        with shmrdv.Rendezvous(size=1 << 20):  # sweeps: passes them by, and nothing in them breaks it
            pass
        for ordinary in ("private-4242-run", "private-2147483648", "private-99999999999-0123456789ab"):
            assert os.path.exists(segment_path(ordinary)), ordinary
    finally:
        for ordinary in ("private-4242-run", "private-2147483648", "private-99999999999-0123456789ab"):
            remove_if_left(ordinary)
    assert private_name().startswith(f"private-{os.getpid()}-")
