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
