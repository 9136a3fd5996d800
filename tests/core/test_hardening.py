"""Inputs that used to escape the documented exceptions, a bridge timeout
too long for a timer, and segments another user could have planted: each
now gets the documented error (or is clamped), with a message that names
the problem."""
import os
import subprocess
import sys

import numpy as np
import pytest

import shmrdv
from shmrdv.bridge import protocol

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("shape", [(2**62, 8), (2**63,), (2**32, 2**32)])
def test_an_alloc_shape_no_rendezvous_can_hold_is_too_large(rdv, shape):
    with pytest.raises(shmrdv.MessageTooLarge, match="more than any rendezvous holds"):
        rdv.alloc("k", shape, np.float64)


@pytest.mark.parametrize("shape", [(0, 2**62), (2**62, 0), (0, 2**64), (2**40, 2**40, 0)])  # * 4 bytes > 2**63 - 1
def test_an_empty_alloc_shape_with_dimensions_no_array_can_have_is_refused_reserving_nothing(rdv, shape):
    with pytest.raises(shmrdv.InvalidArgument, match="dimensions too large for an array"):
        with rdv.alloc("k", shape, np.float32):
            pass
    assert rdv.stats().live_blocks == 0 and all(p.writing == 0 for p in rdv.processes())
    with rdv.alloc("k", (0, 2**40), np.float32) as buf:  # empty, and an array numpy can make
        assert buf.shape == (0, 2**40)
    assert rdv.recv("k", timeout=5).shape == (0, 2**40)


@pytest.mark.parametrize("shape", [(2.7,), "5", (True,), (3, None), 2.0])
def test_an_alloc_shape_must_be_ints(rdv, shape):
    with pytest.raises(shmrdv.InvalidType, match="shape must be an int or a tuple of ints"):
        rdv.alloc("k", shape, np.float32)


def test_an_alloc_shape_of_numpy_ints_is_fine(rdv):
    with rdv.alloc("k", (np.int64(2), np.uint8(3)), np.float32) as buf:
        buf[...] = 1
    assert rdv.recv("k", timeout=5).shape == (2, 3)


def test_a_key_that_is_not_valid_unicode_is_an_invalid_argument(rdv):
    bad = "step\udc80"  # a lone surrogate: no UTF-8 for it
    for call in (lambda: rdv.send(bad, np.zeros(1)), lambda: rdv.try_recv(bad),
                 lambda: rdv.recv_any(["ok", bad], timeout=0)):
        with pytest.raises(shmrdv.InvalidArgument, match="not valid text"):
            call()


def test_keys_with_a_huge_limit_lists_the_keys(rdv):
    rdv.send("a", np.zeros(1))
    assert [k.name for k in rdv.keys(limit=2**40)] == ["a"]


@pytest.mark.parametrize("timeout_ns", [2**63 - 1, 2**62, -5])
def test_a_bridge_recv_timeout_too_long_for_a_timer_waits_forever(timeout_ns):
    frame = protocol.recv_request(1, b"key", timeout_ns)
    body = frame[-(8 + 3):]
    assert protocol.parse_recv(body) == ("key", -1)
    assert protocol.parse_recv(protocol.recv_request(1, b"key", 5_000)[-(8 + 3):]) == ("key", 5_000)


def test_attach_refuses_a_segment_open_to_others_or_owned_by_another_user(rdv_name, tmp_path):
    from ..conftest import segment_path

    path = segment_path(rdv_name)
    shmrdv.Rendezvous(rdv_name, create=True, size=1 << 20).close()
    try:
        os.chmod(path, 0o666)  # squatted: another user could have made it so
        with pytest.raises(PermissionError, match="mode 0666, open to group or others"):
            shmrdv.Rendezvous(rdv_name)
        os.chmod(path, 0o600)
        os.chown(path, 12345, -1)  # pre-created by another user
        with pytest.raises(PermissionError, match="owned by uid 12345"):
            shmrdv.Rendezvous(rdv_name, create=False)
        out = subprocess.run([sys.executable, "-m", "shmrdv", "ls"], capture_output=True, text=True, timeout=60).stdout
        assert rdv_name in out and "owned by uid 12345" in out
        os.chown(path, os.geteuid(), -1)
        shmrdv.Rendezvous(rdv_name, create=False).close()  # ours again: fine
    finally:
        os.unlink(path)
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    os.symlink(target, path)
    try:
        with pytest.raises(PermissionError, match="symbolic link"):
            shmrdv.Rendezvous(rdv_name, create=False)
    finally:
        os.unlink(path)


def test_a_directory_under_a_name_is_named_and_blocks_nothing_else(rdv_name):
    """/dev/shm is writable by every user: a directory made under a
    rendezvous's or a group's name gets an error saying what it is, and
    neither stops other groups, shmrdv ls or shmrdv gc from working."""
    from shmrdv.group import GROUP_PREFIX

    from ..conftest import segment_path

    path = segment_path(rdv_name)
    group_dir = "/dev/shm" + GROUP_PREFIX + rdv_name + "-squat"
    os.mkdir(path)
    os.mkdir(group_dir)
    try:
        for create in (None, False):
            with pytest.raises(shmrdv.SegmentMismatch, match=f"{path} is not a shared-memory file"):
                shmrdv.Rendezvous(rdv_name, create=create)
        with pytest.raises(FileExistsError):  # the name is taken
            shmrdv.Rendezvous(rdv_name, create=True)
        with pytest.raises(shmrdv.SegmentMismatch, match=f"{group_dir} is not a shared-memory file"):
            shmrdv.Group(rdv_name + "-squat", 0, 1, timeout=5)
        with shmrdv.Group(rdv_name + "-other", 0, 1, timeout=5) as g:  # rank 0's sweep passes the directory by
            assert g.allreduce(np.ones(2)).tolist() == [1.0, 1.0]
        ls = subprocess.run([sys.executable, "-m", "shmrdv", "ls"], capture_output=True, text=True, timeout=60)
        assert ls.returncode == 0 and f"{rdv_name} " in ls.stdout and "not a shared-memory file" in ls.stdout, ls
        gc = subprocess.run([sys.executable, "-m", "shmrdv", "gc"], capture_output=True, text=True, timeout=60)
        assert "not a shared-memory file" in gc.stderr and "Invalid parameter" not in gc.stderr, gc
    finally:
        os.rmdir(path)
        os.rmdir(group_dir)


def test_the_handle_after_the_last_entry_is_told_what_to_do(rdv_name):
    handles = [shmrdv.Rendezvous(rdv_name, size=1 << 16, create=True)]
    try:
        handles += [shmrdv.Rendezvous(rdv_name) for _ in range(shmrdv.limits.MAX_PROCS - 1)]
        with pytest.raises(shmrdv.RendezvousError, match=rf"too many handles attached \({shmrdv.limits.MAX_PROCS},"
                                                         r".*one handle per process is enough.*close\(\)"):
            shmrdv.Rendezvous(rdv_name)
        handles.pop().close()
        handles.append(shmrdv.Rendezvous(rdv_name))  # an entry given back is taken again
    finally:
        handles[0].unlink()
        for h in handles:
            h.close()
