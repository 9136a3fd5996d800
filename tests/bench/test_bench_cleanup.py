"""A benchmark run that is interrupted leaves nothing behind: SIGTERM (what a
job runner sends) or Ctrl-C (SIGINT to the whole process group) while
segments exist and a peer child streams, and afterwards no segment of the run
is in /dev/shm and none of its processes is alive. Segments of a run killed
outright (SIGKILL) are unlinked by the next run."""
import contextlib
import glob
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from shmrdv import bench

from ..conftest import ROOT

# Every process of the run inherits this variable: how its survivors are found.
MARKER = "SHMRDV_BENCH_CLEANUP_PROBE"
START_TIMEOUT_S = 120.0
EXIT_TIMEOUT_S = 60.0


def _marked(value: str) -> list:
    """Pids of the processes whose environment holds MARKER=value (zombies excluded)."""
    needle = f"{MARKER}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or not bench.alive(int(entry)):
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as env:
                if needle in env.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _segments(pid: int) -> list:
    """The run's named segments in /dev/shm (huge pages), and the private
    ones (memfds) its process holds: those the kernel frees with it."""
    held = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(f"/memfd:shmrdv-private-{pid}-"):
                    held.append(f"/proc/{pid}/fd/{fd}")
    except OSError:
        pass  # gone
    return glob.glob(f"/dev/shm/shmrdv-bench-{pid}-*") + held


def _wait(predicate, timeout: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the benchmark run ended (code {proc.returncode}) before {what}:\n{out}\n{err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s")
        time.sleep(0.02)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["SIGTERM to pytest", "Ctrl-C to the process group"])
def test_an_interrupted_benchmark_run_leaves_nothing_behind(how):
    marker = uuid.uuid4().hex
    # Full counts (--benchmark-enable): the shmrdv stream runs for half a
    # minute or more over its sizes, so the signal lands in the middle of it.
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "benchmarks/test_bench_throughput.py",
               "-k", "shmrdv and not alloc", "--benchmark-enable", "--benchmark-only"]
    proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, MARKER: marker}, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: _segments(proc.pid) and [p for p in _marked(marker) if p != proc.pid], START_TIMEOUT_S,
              "segment and peer child", proc)
        children = [p for p in _marked(marker) if p != proc.pid]
        if how.startswith("SIGTERM"):
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
        assert proc.returncode == pytest.ExitCode.INTERRUPTED, f"exit code {proc.returncode}:\n{out}\n{err}"
        assert "KeyboardInterrupt" in out + err, out + err
        assert _segments(proc.pid) == [], f"left in /dev/shm: {_segments(proc.pid)}\n{out}\n{err}"
        # multiprocessing's resource tracker ends right after the run: give the last ones a moment
        deadline = time.monotonic() + 10
        while _marked(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        survivors = _marked(marker)
        assert survivors == [], f"still running: {survivors} (the run's children were {children})\n{out}\n{err}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        for pid in _marked(marker):  # only processes this test started carry the marker
            os.kill(pid, signal.SIGKILL)
        for path in glob.glob(f"/dev/shm/shmrdv-bench-{proc.pid}-*"):
            os.unlink(path)


def test_segments_of_a_run_that_was_killed_are_swept_by_the_next():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = f"/dev/shm/shmrdv-bench-{dead.pid}-{uuid.uuid4().hex[:12]}"
    ours = f"/dev/shm/shmrdv-bench-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        for path in (stale, ours):
            with open(path, "wb") as segment:
                segment.write(b"x")
        assert stale in bench.sweep_stale_segments()
        assert not os.path.exists(stale) and os.path.exists(ours)  # a live run's segments stay
    finally:
        for path in (stale, ours):
            if os.path.exists(path):
                os.unlink(path)


def test_descendants_are_found_and_stopped():
    sleeper = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                                "subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)'])"])
    try:
        deadline = time.monotonic() + 30
        while len(bench.descendants(sleeper.pid)) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        grandchild = bench.descendants(sleeper.pid)
        assert len(grandchild) == 1 and sleeper.pid in bench.descendants()
        bench.stop_processes([sleeper.pid, *grandchild], grace_s=5)
        sleeper.wait(10)
        deadline = time.monotonic() + 10
        while bench.alive(grandchild[0]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not bench.alive(grandchild[0]) and not bench.alive(sleeper.pid)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
