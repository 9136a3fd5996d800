"""The command line on bad input, missing segments, closed pipes and dying children:
one line on stderr and no traceback; exit status 2 for a usage error, 1 for a runtime error."""
import glob
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import shmrdv
import shmrdv.bench as bench
from shmrdv.units import human_bytes

from ..conftest import segment_path, wait_for

CLI = [sys.executable, "-m", "shmrdv"]


def shmrdv_cli(*args, timeout=60):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def assert_one_line(run, status, *words):
    """Exit `status`, no traceback, and the error told on stderr's last line (argparse puts its usage before)."""
    assert run.returncode == status, (run.returncode, run.stdout, run.stderr)
    assert "Traceback" not in run.stderr and "Traceback" not in run.stdout, run.stderr
    lines = run.stderr.strip().splitlines()
    assert lines, "nothing on stderr"
    if status == 1:
        assert len(lines) == 1, run.stderr
    for word in words:
        assert word in lines[-1], run.stderr


# ---------------------------------------------------------------------------
# Missing segments, invalid names, unreadable files, the version
# ---------------------------------------------------------------------------


def test_stat_of_a_missing_rendezvous(rdv_name):
    assert_one_line(shmrdv_cli("stat", rdv_name), 1, "shmrdv stat:", "no such rendezvous", rdv_name)


def test_gc_and_rm_of_a_missing_rendezvous(rdv_name):
    assert_one_line(shmrdv_cli("gc", rdv_name), 1, "no such rendezvous", rdv_name)
    assert_one_line(shmrdv_cli("rm", rdv_name), 1, "no such rendezvous", rdv_name)


@pytest.mark.parametrize("args", [
    ["stat", "a/b"],
    ["rm", "a/b"],
    ["gc", "bad/name"],
    ["bridge", "--name", "a/b", "--listen", "127.0.0.1:0"],
    ["stat", "x" * 201],
], ids=["stat", "rm", "gc", "bridge", "too-long"])
def test_invalid_names_are_usage_errors(args):
    assert_one_line(shmrdv_cli(*args), 2, "invalid rendezvous name")
    assert not os.path.exists("/dev/shm/shmrdv-a") and not glob.glob("/dev/shm/shmrdv-a*b")


@pytest.mark.parametrize("args, words", [
    (["rm"], ["required"]),
    (["demo", "--bogus"], ["unrecognized arguments: --bogus"]),
    (["stat", "--keys", "-1", "x"], ["--keys", "at least 0"]),
    (["frobnicate"], ["invalid choice"]),
    (["bench", "--transports", "carrier-pigeon"], ["unknown transport"]),
    (["bench", "--full", "--smoke"], ["exclude each other"]),
    (["bench", "--json", "/nonexistent/dir/out.json"], ["cannot write in /nonexistent/dir"]),
    (["bench", "--collectives", "--world-size", "100"], ["--world-size", "a group has 1..64 ranks, not 100"]),
    (["bench", "--collectives", "--world-size", "0"], ["--world-size", "a group has 1..64 ranks, not 0"]),
])
def test_usage_errors(args, words):
    assert_one_line(shmrdv_cli(*args), 2, *words)


def test_bench_from_json_of_a_missing_or_foreign_file(tmp_path):
    assert_one_line(shmrdv_cli("bench", "--from-json", "/nonexistent"), 1,
                    "shmrdv bench:", "No such file or directory", "/nonexistent")
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    assert_one_line(shmrdv_cli("bench", "--from-json", str(garbage)), 1, "is not JSON")
    foreign = tmp_path / "foreign.json"
    foreign.write_text('{"hello": 1}')
    assert_one_line(shmrdv_cli("bench", "--from-json", str(foreign)), 1, "is not the JSON of shmrdv bench")


def test_version():
    run = shmrdv_cli("--version")
    assert run.returncode == 0 and run.stdout.strip() == f"shmrdv {shmrdv.__version__}", run


# ---------------------------------------------------------------------------
# The bridge: a bad token file, TLS files, a port in use
# ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("extra, words", [
    (["--token-file", "/nonexistent/token"], ["cannot read token file", "No such file or directory"]),
    (["--token-file", "/"], ["cannot read token file", "Is a directory"]),
    (["--tls-cert", "/nonexistent/c.pem", "--tls-key", "/nonexistent/k.pem"], ["cannot load --tls-cert"]),
    (["--size", "0"], ["--size", "must be positive"]),
    (["--size", "5"], ["--size", "multiple of 4096", "use --size 4096"]),
    (["--size", "1.5M"], ["--size", "not a size", "KiB"]),
    (["--deadline", "-1"], ["--deadline", "at least 0"]),
    (["--drain-timeout", "nan"], ["--drain-timeout", "at least 0"]),
    (["--route", "no-equals-sign"], ["PREFIX=URL"]),
], ids=["missing-token", "token-is-a-directory", "tls", "size", "size-not-a-page", "size-unit", "deadline",
        "drain-timeout", "route"])
def test_bridge_configuration_errors(rdv_name, extra, words):
    run = shmrdv_cli("bridge", "--name", rdv_name, "--listen", "127.0.0.1:0", *extra, timeout=30)
    assert_one_line(run, 2, *words)
    assert not os.path.exists(segment_path(rdv_name))  # refused before creating anything


@pytest.mark.timeout(60)
def test_bridge_on_a_port_in_use(rdv_name):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        run = shmrdv_cli("bridge", "--name", rdv_name, "--listen", f"127.0.0.1:{port}", timeout=30)
    assert_one_line(run, 1, f"cannot listen on 127.0.0.1:{port}", "Address already in use")
    assert not os.path.exists(segment_path(rdv_name))  # the segment it made only to serve goes too


# ---------------------------------------------------------------------------
# A reader that stops reading: `shmrdv stat NAME | head -3`, `shmrdv ls | head -1`
# ---------------------------------------------------------------------------


@pytest.fixture
def many_keys(rdv_name):
    """A rendezvous whose `stat --keys 3000` prints more than a pipe holds (~200 KiB)."""
    with shmrdv.Rendezvous(rdv_name, size=4 << 20, max_keys=4096, create=True) as rdv:
        message = np.zeros(1, dtype=np.float32)
        for i in range(3000):
            rdv.send(f"key-{i:05d}-" + "x" * 50, message)
    yield rdv_name


def _with_closed_stdout(*args):
    """Run the command with its stdout a pipe whose reader is already gone."""
    process = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()
    try:
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    return process.returncode, err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["ls", "stat"])
def test_closed_stdout_ends_quietly(many_keys, command):
    args = ["ls"] if command == "ls" else ["stat", "--keys", "3000", many_keys]
    code, err = _with_closed_stdout(*args)
    assert code in (0, 141), (code, err)
    assert err == "", err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pipeline", ["stat --keys 3000 {name} | head -3", "ls | head -1"])
def test_head_of_the_output(many_keys, pipeline):
    command = f"{sys.executable} -m shmrdv {pipeline.format(name=many_keys)}; echo \"status ${{PIPESTATUS[0]}}\" >&2"
    run = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    assert len(run.stdout.splitlines()) == int(pipeline[-1]), run.stdout
    assert run.stderr.strip() in ("status 0", "status 141"), run.stderr


# ---------------------------------------------------------------------------
# shmrdv bench --sizes
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("text, words", [
    ("0B", ["0 bytes", "positive multiple of 4"]),
    ("2B", ["2 bytes", "positive multiple of 4"]),
    ("5B", ["5 bytes", "positive multiple of 4"]),
    ("3MB", ["unknown unit 'MB'", "B, K, KiB, M, MiB, G, GiB"]),
    ("64B,,4KiB", ["not a size: ''"]),
    ("1.5MiB", ["not a size"]),
    ("-4", ["not a size"]),
    ("64GiB", ["size '64GiB' is more than the bench measures", "at most 17,179,865,088 bytes"]),
])
def test_bench_refuses_bad_sizes(text, words):
    run = shmrdv_cli("bench", "--sizes", text, timeout=30)
    assert_one_line(run, 2, "--sizes", *words)


def test_bench_with_every_transport_missing_fails_saying_why():
    # Open MPI's transport needs mpirun on PATH: with none, nothing is left to measure.
    run = subprocess.run([*CLI, "bench", "--transports", "mpi"], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PATH": "/nonexistent"})
    assert_one_line(run, 1, "nothing to measure: Open MPI (mpi4py): mpirun is not on PATH")


@pytest.mark.parametrize("text, nbytes", [
    ("64", 64), ("64B", 64), ("64b", 64), ("4k", 4096), ("4K", 4096), ("4KiB", 4096), ("4kib", 4096),
    ("3MiB", 3 << 20), ("3m", 3 << 20), ("3MIB", 3 << 20), ("1G", 1 << 30), ("1gib", 1 << 30), (" 8 B ", 8),
])
def test_size_units(text, nbytes):
    assert bench.parse_size(text) == nbytes


@pytest.mark.timeout(120)
def test_bench_with_sizes_in_mib():
    run = shmrdv_cli("bench", "--smoke", "--transports", "copyto", "--no-growth", "--sizes", "3MiB,4k,4K",
                     timeout=100)
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("| 3 MiB |") or line.startswith("| 4 KiB |")]
    assert len(rows) == 2, run.stdout  # 4k and 4K are one size


def test_one_byte_format():
    assert bench.human_size is human_bytes  # benchmarks/ import it by that name
    assert [human_bytes(n) for n in (64, 4096, 1536, 1030, 3 << 20, 256 << 20, 1 << 30)] == \
        ["64 B", "4 KiB", "1.5 KiB", "1.0 KiB", "3 MiB", "256 MiB", "1 GiB"]


# ---------------------------------------------------------------------------
# A bench child that dies ends the run with its reason, at once
# ---------------------------------------------------------------------------


def _fail_soon(delay: float) -> None:
    time.sleep(delay)
    raise ValueError("boom from the child")


@pytest.mark.timeout(120)
def test_a_failing_child_interrupts_the_parents_wait():
    children = bench.Children()
    try:
        children.start(_fail_soon, 0.2, cpu=bench.allowed_cpus()[0])
        start = time.monotonic()
        with pytest.raises(bench.ChildFailed, match=r"failed: ValueError: boom from the child \(at test_cli_errors") as failed:
            time.sleep(60)  # any wait: a message, space, an answer
        assert time.monotonic() - start < 30
        assert "in _fail_soon" in failed.value.child_traceback
    finally:
        children.cleanup()
    assert signal.getsignal(signal.SIGCHLD) in (signal.SIG_DFL, None, signal.SIG_IGN)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["shmrdv", "pipe", "queue", "shm-ring"])
def test_a_killed_peer_interrupts_a_stream(transport):
    bench.untold_failure()  # none from elsewhere
    peer = bench.open_peer(transport, bench.allowed_cpus()[-1])
    with pytest.raises((bench.ChildFailed, EOFError)) as failed:
        with peer:
            peer.resize(64)
            start = time.monotonic()  # before the kill: its SIGCHLD may interrupt the very next line
            os.kill(peer._child.pid, signal.SIGKILL)
            peer.stream(10_000_000)  # would take minutes; its child is gone
    assert time.monotonic() - start < 20
    # ChildFailed, or the EOF of the dead child's pipe with the reason kept behind it
    reason = failed.value if isinstance(failed.value, bench.ChildFailed) else bench.untold_failure()
    assert "was killed by SIGKILL" in str(reason), repr(failed.value)
    assert not glob.glob(f"/dev/shm/shmrdv-{bench.segment_prefix()}*")


def _children_of(pid: int):
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(stat[: -len("stat")] + "cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if int(fields[1]) == pid and b"--multiprocessing-fork" in cmdline:
            found.append(int(stat.split("/")[2]))
    return found


@pytest.mark.timeout(180)
def test_bench_ends_when_its_child_is_killed():
    process = subprocess.Popen([*CLI, "bench", "--transports", "shmrdv", "--no-growth", "--sizes", "64B,4KiB,64KiB"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: _children_of(process.pid) or process.poll() is not None, "the bench's child", timeout=60)
        for child in _children_of(process.pid):
            os.kill(child, signal.SIGKILL)
        killed = time.monotonic()
        out, err = process.communicate(timeout=60)
        assert time.monotonic() - killed < 30
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 1, (out, err)
    assert "Traceback" not in err, err
    assert "killed by SIGKILL" in err.strip().splitlines()[-1], err
    assert not glob.glob(f"/dev/shm/shmrdv-bench-{process.pid}-*")


# ---------------------------------------------------------------------------
# shmrdv rm of a rendezvous live processes use
# ---------------------------------------------------------------------------


def _wait_in_recv(name: str, report) -> None:
    """Child: attach, say so, wait for a message that never comes; report how the wait ended."""
    with shmrdv.Rendezvous(name, create=False) as rdv:
        report.put("attached")
        try:
            rdv.recv("never", timeout=60)
            report.put(("received", ""))
        except shmrdv.Aborted as exc:
            report.put(("aborted", exc.reason))
        except Exception as exc:  # noqa: BLE001 (reported to the test)
            report.put((type(exc).__name__, str(exc)))


@pytest.mark.timeout(120)
def test_rm_refuses_a_rendezvous_in_use_unless_forced(rdv_name, children):
    shmrdv.Rendezvous(rdv_name, size=1 << 20, create=True).close()
    report = children.context.Queue()
    child = children.start(_wait_in_recv, rdv_name, report)
    assert report.get(timeout=60) == "attached"
    with shmrdv.Rendezvous(rdv_name, create=False) as rdv:
        wait_for(lambda: rdv.stats().waiters == 1, "the child to wait in recv")

    run = shmrdv_cli("rm", rdv_name)
    assert_one_line(run, 1, rdv_name, str(child.pid), "--force")
    assert os.path.exists(segment_path(rdv_name))

    start = time.monotonic()
    run = shmrdv_cli("rm", "--force", rdv_name)
    assert run.returncode == 0 and "removed" in run.stdout, run
    assert report.get(timeout=30) == ("aborted", "removed by shmrdv rm --force")
    assert time.monotonic() - start < 30
    assert not os.path.exists(segment_path(rdv_name))
    children.join()


def test_rm_force_of_a_rendezvous_nobody_uses(rdv_name):
    shmrdv.Rendezvous(rdv_name, size=1 << 20, create=True).close()
    run = shmrdv_cli("rm", "--force", rdv_name)
    assert run.returncode == 0 and f"{rdv_name}: removed" in run.stdout, run
    assert not os.path.exists(segment_path(rdv_name))


@pytest.mark.timeout(120)
def test_creating_more_than_a_gib_shows_progress(rdv_name):
    import io

    from shmrdv.cli._common import PROGRESS_ABOVE, open_showing_progress

    told = io.StringIO()
    rdv = open_showing_progress(rdv_name, PROGRESS_ABOVE + (1 << 20), told)
    try:
        assert rdv.capacity == PROGRESS_ABOVE + (1 << 20)
    finally:
        rdv.close()
        rdv.unlink()
    lines = told.getvalue().splitlines()
    assert lines[-1].startswith(f"created rendezvous {rdv_name!r}: 1.0 GiB")
    assert all("creating rendezvous" in line for line in lines[:-1])  # every half second, if it took that long
    small = io.StringIO()
    with open_showing_progress(rdv_name, 1 << 20, small) as rdv2:
        rdv2.unlink()
    assert small.getvalue() == ""
