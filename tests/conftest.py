"""Fixtures shared by the shmrdv tests: unique segment names, guaranteed unlink, spawned children."""

import glob
import multiprocessing
import os
import signal
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

import shmrdv

MiB = 1 << 20
SHM_DIR = "/dev/shm"
# Every segment this session creates carries this prefix, so leftovers can be found at the end.
SESSION_PREFIX = f"t-{os.getpid()}-"
CHILD_JOIN_TIMEOUT = 60.0


def segment_path(name: str) -> str:
    return os.path.join(SHM_DIR, f"shmrdv-{name}")


def run_with_private_shm(argv, size: str = "64m", timeout: float = 60.0, cwd=None) -> subprocess.CompletedProcess:
    """Run argv in a mount namespace of its own with a fresh tmpfs of `size`
    on /dev/shm, as a container has (needs root and unshare(1): the test is
    skipped, saying why, where either is missing)."""
    import shlex

    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed")
    script = f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {shlex.join(argv)}"
    run = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                         capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if run.returncode != 0 and ("Operation not permitted" in run.stderr or "permission denied" in run.stderr.lower()):
        pytest.skip(f"cannot make a private /dev/shm here: {run.stderr.strip()}")
    return run


def free_port() -> int:
    """A loopback TCP port nobody listens on now (the kernel's pick; closed again)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def process_stats() -> list:
    """(pid, the fields of /proc/PID/stat after the command name) of every
    process: fields[0] is the state letter, [1] the parent, [3] the session."""
    stats = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stats.append((int(entry), f.read().rsplit(")", 1)[1].split()))
            except OSError:
                continue
    return stats


def child_processes() -> list:
    """(pid, state letter) of every child of this process, from /proc."""
    me = str(os.getpid())
    return [(pid, fields[0]) for pid, fields in process_stats() if fields[1] == me]


ROOT = Path(__file__).resolve().parent.parent


def build_sanitized(program: Path, exe: Path, sources=None, threads: bool = False) -> None:
    """Compile the C core with one of the C test programs in tests/c/ under AddressSanitizer
    and UBSan (any finding aborts it); skip the test when there is no C compiler.

    sources: the csrc/ files to link (names such as "rdv_arena.c"), for a unit test of a few
    layers; by default every one of them. threads: under ThreadSanitizer instead (a data race
    between threads of one process aborts it; -Wno-tsan: it warns that it does not model
    fences, which the core's cross-process handshakes use)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build the sanitized core")
    if sources is None:
        paths = sorted(str(p) for p in (ROOT / "csrc").glob("*.c"))
    else:
        paths = [str(ROOT / "csrc" / name) for name in sources]
    sanitize = (["-fsanitize=thread", "-Wno-tsan"] if threads else
                ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-Werror"])
    subprocess.run(
        [cc, "-std=gnu11", "-O1", "-g", *sanitize, "-fno-omit-frame-pointer", "-Wall", "-Wextra",
         f"-I{ROOT / 'csrc'}", *paths, str(program), "-o", str(exe), "-lrt", "-lpthread"],
        check=True, timeout=240,
    )


def run_c_program(exe: Path, segment_prefix: str, timeout: float, *args: str) -> subprocess.CompletedProcess:
    """Run a program built by build_sanitized, with args; afterwards remove the segment it names
    after its pid (``/shmrdv-<segment_prefix>-<pid>``), in case it died before unlinking it."""
    process = subprocess.Popen([str(exe), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        process.kill()
        process.wait()
        Path(f"{SHM_DIR}/shmrdv-{segment_prefix}-{process.pid}").unlink(missing_ok=True)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def write_segment_file(path: str, data: bytes) -> None:
    """A segment file made by hand, as shmrdv makes them: new, mode 0600 (attach refuses others)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def wait_for(condition, what: str, timeout: float = 20.0) -> None:
    """Poll until condition() holds; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def kill_process(process) -> None:
    """SIGKILL a multiprocessing child and check that is how it ended."""
    os.kill(process.pid, signal.SIGKILL)
    process.join(10)
    assert process.exitcode == -signal.SIGKILL


def swap_caches(monkeypatch, **caches) -> None:
    """Give shmrdv.forms fresh caches (``descs={}``, ...) for one test,
    and the C send and recv too (they hold the caches they were made with);
    monkeypatch puts all of it back."""
    from shmrdv import forms, rendezvous

    for name, cache in caches.items():
        monkeypatch.setattr(forms, name, cache)
    send, recv = rendezvous._hot_methods()
    monkeypatch.setattr(rendezvous.Rendezvous, "send", send)
    monkeypatch.setattr(rendezvous.Rendezvous, "recv", recv)


def only_me(rdv) -> bool:
    """Whether this process is the only one attached to rdv."""
    return [p.pid for p in rdv.processes()] == [os.getpid()]


def _new_name() -> str:
    return f"{SESSION_PREFIX}{uuid.uuid4().hex[:8]}"


def _remove_segment(name: str) -> None:
    try:
        os.unlink(segment_path(name))
    except FileNotFoundError:
        pass


@pytest.fixture(scope="session", autouse=True)
def no_leaked_segments():
    """Fail the session loudly if any segment created by it is still in /dev/shm."""
    yield
    leaked = sorted(glob.glob(os.path.join(SHM_DIR, f"*{SESSION_PREFIX}*")))
    for path in leaked:
        os.unlink(path)
    if leaked:
        pytest.fail(f"shared-memory entries leaked by this test session: {leaked}")


@pytest.fixture
def rdv_name():
    """A name no other test uses; its segment is removed afterwards whatever the test did."""
    name = _new_name()
    yield name
    _remove_segment(name)


@pytest.fixture
def seg(rdv):
    """rdv's segment bytes as tests/segment_bytes.py reads and pokes them."""
    from .segment_bytes import Segment  # it imports this module

    s = Segment(rdv.name)
    yield s
    s.close()


def fill(rdv, key, array):
    """Send array under key until the arena has no room for one more (timeout=0):
    how many were sent."""
    sent = 0
    while True:
        try:
            rdv.send(key, array, timeout=0)
        except shmrdv.RendezvousTimeout:
            return sent
        sent += 1


@pytest.fixture
def rdv(rdv_name):
    """A fresh 4 MiB rendezvous, closed and unlinked afterwards."""
    rendezvous = shmrdv.Rendezvous(rdv_name, size=4 * MiB, create=True)
    yield rendezvous
    rendezvous.close()
    rendezvous.unlink()


@pytest.fixture(scope="module")
def module_rdv():
    """One 4 MiB rendezvous shared by every test of a module (e.g. across hypothesis examples)."""
    name = _new_name()
    try:
        rendezvous = shmrdv.Rendezvous(name, size=4 * MiB, create=True)
        yield rendezvous
        rendezvous.close()
        rendezvous.unlink()
    finally:
        _remove_segment(name)


class Children:
    """Processes started with the "spawn" method that never outlive the test that started them."""

    def __init__(self):
        self.context = multiprocessing.get_context("spawn")
        self._processes = []

    def start(self, target, *args):
        process = self.context.Process(target=target, args=args, daemon=True)
        process.start()
        self._processes.append(process)
        return process

    def join(self, timeout: float = CHILD_JOIN_TIMEOUT) -> None:
        """Wait for every child; fail if one is still running after `timeout` or exited non-zero."""
        deadline = time.monotonic() + timeout
        for process in self._processes:
            process.join(max(0.0, deadline - time.monotonic()))
        hung = [p.name for p in self._processes if p.is_alive()]
        self.kill_all()
        assert not hung, f"children still running after {timeout}s: {hung}"
        exit_codes = {p.name: p.exitcode for p in self._processes}
        assert all(code == 0 for code in exit_codes.values()), f"child exit codes: {exit_codes}"

    def kill_all(self) -> None:
        for process in self._processes:
            if process.is_alive():
                process.terminate()
                process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)


@pytest.fixture
def children():
    """Start children with children.start(fn, *args); survivors are killed at teardown."""
    spawned = Children()
    yield spawned
    spawned.kill_all()
