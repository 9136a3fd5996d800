"""The C core on its own, built under AddressSanitizer and UBSan: a
multi-process stress run (tests/c/stress.c) that checks sums end to end."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(300)
def test_stress_under_sanitizers(tmp_path):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build the sanitized core")
    exe = tmp_path / "stress"
    sources = sorted(str(p) for p in (ROOT / "csrc").glob("*.c"))
    subprocess.run(
        [cc, "-std=gnu11", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
         "-fno-omit-frame-pointer", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'csrc'}",
         *sources, str(ROOT / "tests" / "c" / "stress.c"), "-o", str(exe), "-lrt"],
        check=True, timeout=240,
    )
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "sent sum" in run.stdout
