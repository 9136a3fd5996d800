"""The C core on its own, built under AddressSanitizer and UBSan: a
multi-process stress run (tests/c/stress.c) that checks sums end to end."""
import pathlib
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
    process = subprocess.Popen([str(exe)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
        process.wait()
        # the segment it names after its pid, in case it died before unlinking it
        pathlib.Path(f"/dev/shm/shmrdv-t-cstress-{process.pid}").unlink(missing_ok=True)
    assert process.returncode == 0, out + err
    run = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    assert "sent sum" in run.stdout
