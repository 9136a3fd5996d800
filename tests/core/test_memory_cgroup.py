"""A memory cgroup too small for a reservation gives a ``SharedMemoryFull``
naming its limit and what fits, before anything is reserved: past the limit
the kernel answers a reservation (fallocate, the first touch) with the OOM
killer, not an error. Each case runs a process in a child cgroup of this
one limited to 300 MiB (cgroup v2's ``memory.max`` where the memory
controller is there, else v1's ``memory.limit_in_bytes``; needs root: the
test is skipped, saying why, where neither can be made)."""
import os
import subprocess
import sys
import textwrap
import uuid

import pytest

pytestmark = [pytest.mark.timeout(120)]

LIMIT = 300 << 20


def _child_cgroup():
    """A new child of this process's memory cgroup limited to LIMIT: (directory, oom_kills()), or skip saying why."""
    with open("/proc/self/cgroup") as f:
        lines = [line.rstrip("\n").split(":", 2) for line in f]
    v2 = next((path for _, controllers, path in lines if controllers == ""), None)
    v1 = next((path for _, controllers, path in lines if "memory" in controllers.split(",")), None)
    tried = []
    for mount, path, limit_file in (("/sys/fs/cgroup", v2, "memory.max"),
                                    ("/sys/fs/cgroup/memory", v1, "memory.limit_in_bytes")):
        if path is None:
            continue
        directory = os.path.join(mount, path.lstrip("/"), f"shmrdv-test-{uuid.uuid4().hex[:8]}")
        try:
            os.mkdir(directory)
        except OSError as exc:
            tried.append(f"mkdir {directory}: {exc.strerror}")
            continue
        if not os.path.exists(os.path.join(directory, limit_file)):
            os.rmdir(directory)
            tried.append(f"{directory} has no {limit_file} (no memory controller there)")
            continue
        with open(os.path.join(directory, limit_file), "w") as f:
            f.write(str(LIMIT))
        return directory
    pytest.skip("cannot make a memory cgroup here: " + "; ".join(tried or ["no cgroup in /proc/self/cgroup"]))


def _oom_kills(directory: str) -> int:
    for name, key in (("memory.events", "oom_kill "), ("memory.oom_control", "oom_kill ")):
        try:
            with open(os.path.join(directory, name)) as f:
                return int(next(line for line in f if line.startswith(key)).split()[1])
        except (OSError, StopIteration):
            continue
    return 0


@pytest.fixture
def small_cgroup():
    directory = _child_cgroup()
    yield directory
    os.rmdir(directory)


def run_in(directory: str, code: str) -> subprocess.CompletedProcess:
    """Run Python code in a new process of the cgroup ``directory``."""
    return subprocess.run(["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', directory, sys.executable, "-c",
                           textwrap.dedent(code)], capture_output=True, text=True, timeout=90)


def test_a_private_rendezvous_bigger_than_the_limit_says_so_and_one_that_fits_works(small_cgroup):
    run = run_in(small_cgroup, """
        import numpy as np
        import shmrdv
        for prefault in (None, False):
            try:
                shmrdv.Rendezvous(size=512 << 20, prefault=prefault)
            except shmrdv.SharedMemoryFull as exc:
                print("FULL", exc)
        with shmrdv.Rendezvous(size=128 << 20) as rdv:
            rdv.send("k", np.ones(64 << 20, np.uint8))
            print("SENT", rdv.recv("k", timeout=10).sum())
    """)
    assert run.returncode == 0, run.stdout + run.stderr  # -9: the OOM killer
    fulls = [line for line in run.stdout.splitlines() if line.startswith("FULL")]
    assert len(fulls) == 2, run.stdout
    for said in ("587,767,808 bytes", f"may use {LIMIT:,} bytes", small_cgroup, "size=", "fits now", "--memory"):
        assert said in fulls[0] and said in fulls[1], (said, fulls)
    assert "SENT 67108864" in run.stdout, run.stdout
    assert _oom_kills(small_cgroup) == 0


def test_the_data_loader_says_which_shm_size_fits(small_cgroup):
    run = run_in(small_cgroup, """
        from shmrdv import SharedMemoryFull
        from shmrdv.loader import DataLoader
        try:
            iter(DataLoader(range(4), batch_size=2, num_workers=1, shm_size=512 << 20, output="numpy"))
        except SharedMemoryFull as exc:
            print("FULL", exc)
    """)
    assert run.returncode == 0, run.stdout + run.stderr
    full = run.stdout.split("FULL ", 1)[1]
    for said in ("DataLoader: cannot reserve its shared memory", f"may use {LIMIT:,} bytes", "shm_size=",
                 "fits now"):
        assert said in full, (said, full)
    assert "dir=" not in full and "/dev/shm" not in full, full  # a memfd: no directory to name
    assert _oom_kills(small_cgroup) == 0
