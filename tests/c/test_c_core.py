"""The C core on its own, built under AddressSanitizer and UBSan: a
multi-process stress run (tests/c/stress.c) that checks sums end to end, and
threads of one process sharing a handle (tests/c/threads.c), also under
ThreadSanitizer."""
import subprocess

import pytest

from ..conftest import ROOT, build_sanitized, run_c_program

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_stress_under_sanitizers(tmp_path):
    exe = tmp_path / "stress"
    build_sanitized(ROOT / "tests" / "c" / "stress.c", exe)
    run = run_c_program(exe, "t-cstress", timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "sent sum" in run.stdout


@pytest.mark.timeout(300)
def test_core_pingpong_benchmark_runs_under_sanitizers(tmp_path):
    """benchmarks/core_pingpong.c (the core's round trip without Python, and
    its local mode: one process's work per message), once each, as a check
    that it still builds and runs; no time is judged."""
    exe = tmp_path / "core_pingpong"
    build_sanitized(ROOT / "benchmarks" / "core_pingpong.c", exe)
    run = run_c_program(exe, "core-pingpong", 120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "core 64 B round trip, apart" in run.stdout
    run = run_c_program(exe, "core-pingpong", 120, "20000", "local")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "core 64 B send + receive + release, one process" in run.stdout


@pytest.mark.timeout(300)
@pytest.mark.parametrize("threads", [False, True], ids=["asan", "tsan"])
def test_threads_of_one_process_share_a_handle(tmp_path, threads):
    """Pairs of threads bouncing messages (hand-offs to waiting threads: waiter records taken
    and freed, two at a time for a receive from two keys; an async receiver's poll looking at
    every record while other threads set theirs up) beside threads inserting and deleting
    keys of their own, on one handle; then such threads on a rendezvous whose max_keys is half
    their number. Every message checked; nothing left after (no waiter slab either: a record
    the pool lost would show as one), the key count right; under ThreadSanitizer, no data race
    between them (a race is reported on stderr, exit code 66)."""
    exe = tmp_path / "threads"
    try:
        build_sanitized(ROOT / "tests" / "c" / "threads.c", exe, threads=threads)
    except subprocess.CalledProcessError:
        if not threads:
            raise
        pytest.skip("the C compiler cannot build with -fsanitize=thread (no libtsan)")
    run = run_c_program(exe, "t-cthreads", 120)
    if threads and "unexpected memory mapping" in run.stderr:
        pytest.skip("ThreadSanitizer cannot run with this kernel's address-space randomisation")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ThreadSanitizer" not in run.stderr, run.stderr
    for part in ("2 pairs, an any pair, an async pair and 2 loopers, 20000 messages each: ok", "nothing left: ok",
                 "4 loopers on max_keys 2, 20000 messages each", "all passed"):
        assert f"threads: {part}" in run.stdout, run.stdout
