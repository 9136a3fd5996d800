"""The C core on its own, built under AddressSanitizer and UBSan: a
multi-process stress run (tests/c/stress.c) that checks sums end to end."""
import pytest

from .conftest import ROOT, build_sanitized, run_c_program


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
