"""The operations commands: shmrdv ls, stat, rm, gc (run as a user would, in a subprocess)."""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import shmrdv
from shmrdv.units import human_bytes

from .. import workers
from ..conftest import run_with_private_shm, segment_path


def shmrdv_cli(*args):
    run = subprocess.run([sys.executable, "-m", "shmrdv", *args], capture_output=True, text=True, timeout=60)
    return run.returncode, run.stdout + run.stderr


@pytest.mark.timeout(120)
def test_ls_stat_gc_rm_with_a_dead_receiver(rdv, children):
    rdv.send("/job:w/task:0;0000000000000001;/job:w/task:1;edge;0:0", np.arange(100))
    rdv.send("held", np.arange(50_000))
    queue = children.context.Queue()
    child = children.start(workers.hold_view_then_wait, rdv.name, "held", queue)
    queue.get(timeout=30)
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)

    code, out = shmrdv_cli("ls")
    assert code == 0 and rdv.name in out
    line = next(line for line in out.splitlines() if line.startswith(rdv.name))
    assert f"{child.pid} (dead, reclaimed)" in line and str(os.getpid()) in line

    code, out = shmrdv_cli("stat", rdv.name)
    assert code == 0
    assert "1 pending on 1 keys" in out and "edge;0:0" in out and f"pid {os.getpid()}" in out
    # The dead receiver's view was reclaimed: once the older pending message is taken, all is free.
    rdv.recv("/job:w/task:0;0000000000000001;/job:w/task:1;edge;0:0", timeout=5)  # dropped at once
    assert rdv.stats().bytes_used == 0

    code, out = shmrdv_cli("gc", rdv.name)
    assert code == 0 and "1 live process(es)" in out
    assert os.path.exists(segment_path(rdv.name))  # we are attached: not an orphan

    rdv.close()  # rm leaves alone a rendezvous that live processes use (rm --force: tests/cli/test_cli_errors.py)
    code, out = shmrdv_cli("rm", rdv.name)
    assert code == 0 and "removed" in out and not os.path.exists(segment_path(rdv.name))


def test_gc_unlinks_orphans_only(rdv_name):
    other = rdv_name + "-live"
    with shmrdv.Rendezvous(rdv_name, size=1 << 16, create=True) as orphan:
        orphan.send("k", np.arange(3))
    live = shmrdv.Rendezvous(other, size=1 << 16, create=True)
    try:
        code, out = shmrdv_cli("gc", rdv_name, other, "--unlink-orphans")
        assert code == 0, out
        assert not os.path.exists(segment_path(rdv_name)) and "1 pending message(s) dropped" in out
        assert os.path.exists(segment_path(other))
    finally:
        live.close()
        live.unlink()


def test_stat_and_rm_of_a_missing_rendezvous(rdv_name):
    code, out = shmrdv_cli("stat", rdv_name)
    assert code != 0 and "no such rendezvous" in out
    code, out = shmrdv_cli("rm", rdv_name)
    assert code == 1 and "no such rendezvous" in out


def test_stat_prints_keys_that_could_drive_a_terminal_escaped(rdv):
    """A key is any string: stat prints one holding control characters
    quoted, with escapes, and a printable one as it is."""
    rdv.send("plain/key 1", np.zeros(1))
    rdv.send("evil\x1b[2J\x1b]0;pwned\x07\n", np.zeros(1))
    code, out = shmrdv_cli("stat", rdv.name)
    assert code == 0, out
    assert "\x1b" not in out and "\x07" not in out, out
    lines = out.splitlines()
    keys = lines[next(i for i, line in enumerate(lines) if line.strip().startswith("keys (")) + 1:][:2]
    assert sorted(line.split(" waiting ", 1)[1].strip() for line in keys) == sorted(
        ["plain/key 1", repr("evil\x1b[2J\x1b]0;pwned\x07\n")]), out


def test_stat_and_ls_show_live_and_free_space(rdv):
    """A fragmented arena (a hole, pending messages, a held view, an open
    alloc): stat and ls print live bytes, live blocks, free bytes and the
    largest free block, as stats() has them."""
    rdv.send("hole", np.zeros(1 << 20, dtype=np.uint8))
    rdv.send("pending", np.arange(10_000))
    rdv.recv("hole", timeout=5)  # freed at once: a 1 MiB hole before "pending"
    rdv.send("held", np.arange(3_000, dtype=np.float32))
    view = rdv.recv("held", timeout=5)
    with rdv.alloc("open", (200_000,), np.uint8, timeout=5):
        st = rdv.stats()
        assert st.live_blocks == 3 and 0 < st.largest_free < st.bytes_free < st.capacity, st
        code, stat_out = shmrdv_cli("stat", rdv.name)
        code_ls, ls_out = shmrdv_cli("ls")
        assert rdv.stats() == st  # looking changed nothing
    del view
    assert code == 0, stat_out
    arena = next(line for line in stat_out.splitlines() if line.strip().startswith("arena"))
    assert f"{human_bytes(st.bytes_used)} live in 3 blocks" in arena, arena
    assert f"{human_bytes(st.bytes_free)} free" in arena, arena
    assert f"largest free block {human_bytes(st.largest_free)}" in arena, arena
    assert human_bytes(st.capacity) in arena, arena

    assert code_ls == 0, ls_out
    header = next(line for line in ls_out.splitlines() if line.startswith("NAME"))
    assert header.split()[:9] == ["NAME", "FILE", "ARENA", "LIVE", "BLOCKS", "FREE", "LARGEST", "PENDING", "KEYS"], header
    line = next(line for line in ls_out.splitlines() if line.startswith(rdv.name))
    cells = line[len(rdv.name):].split()
    # FILE, ARENA, LIVE, BLOCKS, FREE, LARGEST, PENDING, KEYS (sizes are "<number> <unit>")
    assert cells[2:4] == human_bytes(st.capacity).split(), line
    assert cells[4:6] == human_bytes(st.bytes_used).split() and cells[6] == "3", line
    assert cells[7:9] == human_bytes(st.bytes_free).split(), line
    assert cells[9:11] == human_bytes(st.largest_free).split(), line
    assert cells[11:13] == ["1", "1"], line  # one pending message, on one key


def test_rm_names_the_live_processes_it_leaves_alone(rdv):
    code, out = shmrdv_cli("rm", rdv.name)
    assert code == 1 and f"in use by live process(es) {os.getpid()}" in out and "--force" in out, out
    assert os.path.exists(segment_path(rdv.name))


def _as_nobody(*args):
    """shmrdv's command line run by a user who is not root (nobody). The
    interpreter may lie where nobody cannot read (a root's pyenv): what the
    command needs is imported first, then only the effective ids change."""
    script = ("import contextlib, io, os, sys, shmrdv.cli, shmrdv.cli.gc, shmrdv.cli.rm\n"
              "for command in ('gc', 'rm'):  # loads what parsing and printing help need\n"
              "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
              "        shmrdv.cli.main([command, '--help'])\n"
              "os.setegid(65534); os.seteuid(65534); sys.exit(shmrdv.cli.main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a segment another user's takes root (chown)")
@pytest.mark.timeout(120)
def test_other_users_segments_are_passed_by_and_only_root_removes_them(rdv_name, children):
    path = segment_path(rdv_name)
    with shmrdv.Rendezvous(rdv_name, create=True, size=1 << 20) as rdv:
        rdv.send("held", np.arange(10))
    queue = children.context.Queue()
    children.start(workers.hold_view_then_wait, rdv_name, "held", queue)
    queue.get(timeout=30)
    os.chown(path, 12345, -1)  # another user's, attached by a live process
    try:
        code, out = shmrdv_cli("gc")
        assert code == 0, out
        assert f"left to their owners: {rdv_name} (uid 12345" in out and "Traceback" not in out
        code, out = shmrdv_cli("gc", rdv_name)
        assert code == 1 and "owned by uid 12345" in out and "only its owner can collect it" in out, out
        # A user who is not root: gc passes it by (and any other user's) with status 0; rm is refused.
        run = _as_nobody("gc")
        assert run.returncode == 0 and "uid 12345" in run.stdout, (run.stdout, run.stderr)
        run = _as_nobody("rm", rdv_name)
        assert run.returncode == 1 and "only its owner or root can remove it" in run.stderr, run.stderr
        # Root: never attaches (no "refusing to attach"); in use, it stays unless --force.
        code, out = shmrdv_cli("rm", rdv_name)
        assert code == 1 and "in use by live process(es); not removed" in out and "refusing" not in out, out
        assert os.path.exists(path)
    finally:
        children.kill_all()
    code, out = shmrdv_cli("rm", rdv_name)
    assert code == 0 and out == f"{rdv_name}: owned by uid 12345 (no such user): removed\n", out
    assert not os.path.exists(path)


@pytest.mark.timeout(60)
def test_gc_with_nothing_to_collect_says_so():
    run = run_with_private_shm([sys.executable, "-m", "shmrdv", "gc"])
    assert run.returncode == 0 and run.stdout == "no shmrdv segments in /dev/shm: nothing to collect\n", run
