"""The collectives' C core on its own, built under AddressSanitizer and UBSan:
a multi-process stress run (tests/c/coll_stress.c) of every collective with
exact checks, mismatches, ranks killed with SIGKILL mid-call, abort and leave."""
import pytest

from ..conftest import ROOT, build_sanitized, run_c_program

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_coll_stress_under_sanitizers(tmp_path):
    exe = tmp_path / "coll_stress"
    build_sanitized(ROOT / "tests" / "c" / "coll_stress.c", exe)
    run = run_c_program(exe, "t-ccoll", timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "coll stress ok:" in run.stdout, run.stdout + run.stderr
