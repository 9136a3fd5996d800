"""A segment truncated under the processes using it (another process of the
same user can always ftruncate it: shared-memory files take no seals). Each
process survives: the SIGBUS of an access past the cut becomes a
SegmentMismatch in the call it hit, every later call on that handle raises
SegmentMismatch, waits end, and a view reads zeros where its bytes were cut."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import shmrdv

from ..conftest import MiB, segment_path

REPO = Path(__file__).resolve().parent.parent.parent

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("cut", ["to nothing", "in the arena", "past the arena", "grown"])
def test_a_process_survives_its_segment_truncated_under_it(rdv_name, cut):
    shmrdv.Rendezvous(rdv_name, size=4 * MiB, create=True).close()
    path = segment_path(rdv_name)
    size = os.stat(path).st_size
    victim = subprocess.Popen([sys.executable, "-c", f"from tests import workers; workers.truncation_victim({rdv_name!r})"],
                              cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert victim.stdout.readline().strip() == "ready", victim.stderr.read()
        new_size = {"to nothing": 0, "in the arena": size // 2, "past the arena": size - 4096, "grown": size + 4096}[cut]
        os.truncate(path, new_size)
        out, err = victim.communicate("go\n", timeout=60)
    finally:
        victim.kill()
        victim.wait(10)
        os.unlink(path)
    assert victim.returncode == 0, f"the victim died ({victim.returncode}): {out}\n{err}"
    lines = dict(line.split(": ", 1) if ": " in line else (line, "") for line in out.splitlines())
    assert out.startswith("view sum "), out
    # A receiver waiting in line ends: at once when its own access faults,
    # else at its next look for the dead (every 50 ms), which checks the size.
    assert lines["waiter"].startswith("SegmentMismatch") and "truncated" in lines["waiter"], out
    for call in ("send", "recv", "stats", "try_recv"):
        assert lines[call].startswith("SegmentMismatch") and "truncated" in lines[call], (call, out)
    assert "closed" in lines


def test_an_unclosed_handle_of_a_truncated_segment_is_dropped_without_a_traceback(rdv_name):
    # Its unclosed-handle warning shows its repr, which must not raise.
    script = f"""
import gc, os, warnings, shmrdv
warnings.simplefilter("always")
rdv = shmrdv.Rendezvous({rdv_name!r}, size=4 << 20, create=True)
os.truncate({str(segment_path(rdv_name))!r}, 0)
print(repr(rdv))
del rdv
gc.collect()
"""
    try:
        done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(segment_path(rdv_name))
    assert done.returncode == 0, done.stderr
    assert "state=damaged" in done.stdout
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "ResourceWarning: unclosed <Rendezvous" in done.stderr
