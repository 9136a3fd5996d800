"""Rendezvous(huge_pages=True): refused with the reason where /dev/shm gives
no huge pages, and backed by them where it does (a private mount namespace
with a tmpfs mounted huge=within_size over /dev/shm, when we may make one)."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import shmrdv
from shmrdv import huge_pages


def test_offer_follows_the_mount_and_the_kernel(monkeypatch):
    monkeypatch.setattr(huge_pages.os.path, "isdir", lambda path: True)
    for forced, option, available, words in [
        ("never", "", False, "no huge= option"), ("never", "never", False, "huge=never"),
        ("never", "within_size", True, "huge=within_size"), ("never", "advise", True, "huge=advise"),
        ("deny", "always", False, "'deny'"), ("force", "", True, "'force'"), ("never", None, False, "not a tmpfs")]:
        monkeypatch.setattr(huge_pages, "_selected", lambda path, forced=forced: forced)
        monkeypatch.setattr(huge_pages, "_mount_huge", lambda directory, option=option: option)
        offer = huge_pages.offered()
        assert offer.available is available and words in offer.why, (forced, option, offer)


def test_mount_option_of_dev_shm_is_read():
    assert huge_pages._mount_huge("/dev/shm") is not None  # /dev/shm is a tmpfs here
    assert huge_pages._mount_huge("/proc") is None


def test_unavailable_says_why_and_creates_nothing(rdv_name):
    if huge_pages.offered().available:
        pytest.skip("this /dev/shm gives huge pages")
    with pytest.raises(shmrdv.HugePagesUnavailable, match="huge_pages=True, but /dev/shm .*huge=within_size"):
        shmrdv.Rendezvous(rdv_name, create=True, huge_pages=True)
    assert not os.path.exists(f"/dev/shm/shmrdv-{rdv_name}")


def test_bad_flag_and_attaching_a_segment_without(rdv):
    with pytest.raises(shmrdv.InvalidType, match="huge_pages must be True or False"):
        shmrdv.Rendezvous(rdv.name, huge_pages="yes")
    with pytest.raises(shmrdv.SegmentMismatch, match="huge_pages=False, not the huge_pages=True"):
        shmrdv.Rendezvous(rdv.name, create=False, huge_pages=True)
    assert rdv.stats().huge_pages is False and rdv.stats().huge_page_bytes == 0


_IN_NAMESPACE = textwrap.dedent("""
    import os, subprocess, sys
    import numpy as np
    import shmrdv
    assert shmrdv.huge_pages.offered().available, shmrdv.huge_pages.offered()
    with shmrdv.Rendezvous("huge", create=True, size=32 << 20, huge_pages=True) as rdv:
        st = rdv.stats()
        assert st.huge_pages and st.huge_page_bytes >= 32 << 20, st
        data = np.arange(8 << 18, dtype=np.float32)
        rdv.send("k", data)
        child = subprocess.run([sys.executable, "-c", (
            "import numpy as np, shmrdv\\n"
            "r = shmrdv.Rendezvous('huge', create=False)\\n"
            "v = r.recv('k', timeout=30)\\n"
            "assert np.array_equal(v, np.arange(8 << 18, dtype=np.float32))\\n"
            "st = r.stats()\\n"
            "assert st.huge_pages and st.huge_page_bytes >= 32 << 20, st\\n"
            "print('attacher', st.huge_page_bytes)\\n")], capture_output=True, text=True, timeout=60)
        assert child.returncode == 0, child.stderr
        print(child.stdout.strip())
        listing = subprocess.run([sys.executable, "-m", "shmrdv", "ls"], capture_output=True, text=True, timeout=60)
        assert "HUGE PAGES" in listing.stdout, listing.stdout
        stat = subprocess.run([sys.executable, "-m", "shmrdv", "stat", "huge"], capture_output=True, text=True, timeout=60)
        assert "huge pages asked for" in stat.stdout, stat.stdout
        rdv.unlink()
    print("creator", st.huge_page_bytes)
""")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("option", ["within_size", "advise"])
def test_backed_by_huge_pages_where_dev_shm_gives_them(tmp_path, option):
    """In a mount namespace of its own (its /dev/shm a fresh tmpfs with
    huge=within_size, or huge=advise, which takes the mappings' advice;
    gone when the namespace ends), the creator and a process that attaches
    both map the segment on huge pages."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to mount a tmpfs in a private mount namespace")
    if not os.path.isdir("/sys/kernel/mm/transparent_hugepage"):
        pytest.skip("this kernel has no transparent huge pages")
    script = tmp_path / "inside.py"
    script.write_text(_IN_NAMESPACE)
    mount = f"mount -t tmpfs -o huge={option},size=256m,mode=1777 tmpfs /dev/shm"
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           f"{mount} && exec {sys.executable} {script}"], capture_output=True, text=True, timeout=150)
    if done.returncode != 0 and "mount" in done.stderr and "creator" not in done.stdout:
        if "permission denied" in done.stderr.lower() or "operation not permitted" in done.stderr.lower():
            pytest.skip(f"cannot mount in a private namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "creator" in done.stdout and "attacher" in done.stdout
