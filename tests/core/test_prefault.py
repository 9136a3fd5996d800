"""Rendezvous(prefault=False): the segment is mapped, by its creator and by
those who attach, without faulting its pages in; each page is resident once
touched, and everything else works as with the default (every page faulted
in when mapped). The space is reserved all the same (tests/core/test_small_shm.py)."""
import errno
import os
import subprocess
import sys
import textwrap

import numpy as np
import posix_ipc
import pytest

import shmrdv
from shmrdv._native import ffi, lib
from shmrdv.cli._common import pages_text

from ..conftest import segment_path
from ..segment_bytes import SEG_FLAGS, Segment

MiB = 1 << 20


def resident_bytes(rdv: shmrdv.Rendezvous) -> int:
    """Bytes of this handle's mapping of its segment resident in this process (Rss in /proc/self/smaps)."""
    base, length = ffi.new("uint64_t *"), ffi.new("uint64_t *")
    lib.rdv_mapping(rdv._handle(), base, length)
    lo, hi, total, inside = int(base[0]), int(base[0]) + int(length[0]), 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(None, 1)[0] if line.strip() else ""
            if "-" in head and not head.endswith(":"):
                start, _, end = head.partition("-")
                inside = lo <= int(start, 16) and int(end, 16) <= hi
            elif inside and head == "Rss:":
                total += int(line.split()[1]) * 1024
    return total


@pytest.mark.parametrize("prefault", [True, False])
def test_pages_are_resident_when_mapped_or_once_touched(rdv_name, prefault):
    with shmrdv.Rendezvous(rdv_name, size=64 * MiB, create=True, prefault=prefault) as rdv:
        st = os.stat(segment_path(rdv_name))
        assert st.st_blocks * 512 >= st.st_size  # reserved either way: no SIGBUS on a full /dev/shm later
        with shmrdv.Rendezvous(rdv_name, create=False) as attached:
            for handle in (rdv, attached):
                assert handle.stats().prefault is prefault
                resident = resident_bytes(handle)
                if prefault:
                    assert resident >= 64 * MiB, resident
                else:  # the header, index and side table touched (whole 2 MiB pages where tmpfs makes them huge)
                    assert resident < 16 * MiB, resident
            before = resident_bytes(rdv)
            data = np.arange(4 * MiB, dtype=np.uint8)  # 4 MiB written into the arena
            rdv.send("k", data)
            assert np.array_equal(attached.recv("k", timeout=10), data)
            if not prefault:
                assert resident_bytes(rdv) >= before + 4 * MiB
                assert resident_bytes(attached) >= 4 * MiB  # what the receiver read is now resident in it too
        rdv.unlink()


def test_bad_arguments_and_attaching_with_the_other_choice(rdv_name):
    with pytest.raises(shmrdv.InvalidType, match="prefault must be None, True or False, not 'no'"):
        shmrdv.Rendezvous(rdv_name, create=True, prefault="no")
    with pytest.raises(shmrdv.InvalidArgument, match="huge_pages=True with prefault=False"):
        shmrdv.Rendezvous(rdv_name, create=True, huge_pages=True, prefault=False)
    assert not os.path.exists(segment_path(rdv_name))
    with shmrdv.Rendezvous(rdv_name, size=4 * MiB, create=True, prefault=False) as rdv:
        assert "faulted in by its first touch (prefault=False)" in pages_text(rdv.stats())
        with pytest.raises(shmrdv.SegmentMismatch, match="prefault=False, not the prefault=True asked for"):
            shmrdv.Rendezvous(rdv_name, create=False, prefault=True)
        with shmrdv.Rendezvous(rdv_name, create=False, prefault=False) as same:
            assert same.stats().prefault is False
        rdv.unlink()
    with shmrdv.Rendezvous(rdv_name, size=4 * MiB, create=True) as rdv:
        assert "first touch" not in pages_text(rdv.stats())
        with pytest.raises(shmrdv.SegmentMismatch, match="prefault=True, not the prefault=False asked for"):
            shmrdv.Rendezvous(rdv_name, create=False, prefault=False)
        rdv.unlink()


def test_the_core_refuses_both_page_flags_and_flags_it_does_not_know(rdv_name):
    shm = posix_ipc.SharedMemory("/shmrdv-" + rdv_name, posix_ipc.O_CREX, mode=0o600)
    try:
        out = ffi.new("rdv_t **")
        for flags in (lib.RDV_CREATE_HUGE_PAGES | lib.RDV_CREATE_NO_PREFAULT, 1 << 7):
            assert lib.rdv_create_flags(shm.fd, MiB, 1024, flags, out) == -errno.EINVAL
    finally:
        shm.close_fd()
        shm.unlink()
    with shmrdv.Rendezvous(rdv_name, size=MiB, create=True) as rdv:
        seg = Segment(rdv_name)
        try:
            seg.u32(SEG_FLAGS, 1 << 7)  # as a newer build's option would leave it
            with pytest.raises(shmrdv.SegmentMismatch, match="made with options this shmrdv does not know"):
                shmrdv.Rendezvous(rdv_name, create=False)
            seg.u32(SEG_FLAGS, lib.RDV_CREATE_HUGE_PAGES | lib.RDV_CREATE_NO_PREFAULT)
            with pytest.raises(shmrdv.SegmentMismatch, match="damaged or inconsistent"):
                shmrdv.Rendezvous(rdv_name, create=False)
            seg.u32(SEG_FLAGS, 0)
        finally:
            seg.close()
        rdv.unlink()


_CHILD = textwrap.dedent("""
    import sys, numpy as np, shmrdv
    rdv = shmrdv.Rendezvous(sys.argv[1], create=False)
    assert rdv.stats().prefault is False
    got = rdv.recv("in", timeout=30, writable=True)
    got += 1  # written in place, in pages this process never faulted in before
    rdv.send("out", got)
    rdv.close()
""")


@pytest.mark.timeout(60)
def test_between_processes(rdv_name):
    with shmrdv.Rendezvous(rdv_name, size=96 * MiB, create=True, prefault=False) as rdv:  # in and out, 32 MiB each
        child = subprocess.Popen([sys.executable, "-c", _CHILD, rdv_name])
        try:
            data = np.arange(8 * MiB, dtype=np.int32)  # 32 MiB
            rdv.send("in", data)
            assert np.array_equal(rdv.recv("out", timeout=30), data + 1)
            assert child.wait(timeout=30) == 0
        finally:
            child.kill()
            child.wait()
        rdv.unlink()
