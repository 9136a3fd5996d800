"""Opening while a segment is still being created: an attacher waits for a
creator that is alive and still initialising (up to ``timeout``), and fails
at once, saying what to do, when the creator died before finishing.

While it initialises a segment the creator holds an open-file-description
lock on byte RDV_CREATOR_LOCK_BYTE (128, just past the process table's
bytes) of the file; the kernel drops it if the creator dies. These tests play
the creator's part with that lock (fcntl), so they need no big segment."""

import fcntl
import os
import struct
import time

import numpy as np
import posix_ipc
import pytest

import shmrdv
from shmrdv import segments as core
from shmrdv.leftovers import CREATOR_GRACE_S

from ..conftest import segment_path

CREATOR_LOCK_BYTE = 128
# The smallest segment: header (2 pages), process table (128 x 256 B), key
# index (64 slots x 64 B), side table (a page), a one-page arena.
MIN_SEGMENT_BYTES = 8192 + 128 * 256 + 4096 + 4096 + 4096
SLOW_CREATOR_S = 3.0  # longer than the 2 s an attacher used to wait


def ofd_lock(fd: int, byte: int) -> None:
    """Take an open-file-description write lock on one byte (struct flock, Linux)."""
    flock = struct.pack("hh4xqqi4x", fcntl.F_WRLCK, os.SEEK_SET, byte, 1, 0)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, flock)


class _SlowLib:
    """shmrdv's compiled core, but rdv_create_flags takes the creator's lock
    and then waits before it starts: a creator reserving a very big arena."""

    def __init__(self, lib, delay: float, started) -> None:
        self._lib, self._delay, self._started = lib, delay, started

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def rdv_create_flags(self, fd, arena, max_keys, flags, out):
        ofd_lock(fd, CREATOR_LOCK_BYTE)  # what the core does first, on the same file description
        self._started.set()
        time.sleep(self._delay)
        return self._lib.rdv_create_flags(fd, arena, max_keys, flags, out)


def slow_creator(name, started, done):
    """Spawned child: create rendezvous name slowly, send one message, stay until told."""
    core.lib = _SlowLib(core.lib, SLOW_CREATOR_S, started)
    with shmrdv.Rendezvous(name, size=1 << 20, create=True) as rdv:
        rdv.send("hello", np.arange(4), timeout=30)
        done.wait(60)


def creator_that_never_finishes(path, started, stop):
    """Spawned child: a creator stuck initialising: its file, zero-filled, under its lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, MIN_SEGMENT_BYTES)
    ofd_lock(fd, CREATOR_LOCK_BYTE)
    started.set()
    stop.wait(60)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_attacher_waits_for_a_creator_that_is_still_initialising(rdv_name, children):
    started, done = children.context.Event(), children.context.Event()
    children.start(slow_creator, rdv_name, started, done)
    assert started.wait(60)
    assert os.path.exists(segment_path(rdv_name))  # there, but not initialised yet
    begin = time.monotonic()
    with shmrdv.Rendezvous(rdv_name, create=False, timeout=60) as rdv:
        waited = time.monotonic() - begin
        np.testing.assert_array_equal(rdv.recv("hello", timeout=30), np.arange(4))
    assert waited > SLOW_CREATOR_S - 1.0, waited
    done.set()
    children.join()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_create_none_also_waits_for_the_creator(rdv_name, children):
    started, done = children.context.Event(), children.context.Event()
    children.start(slow_creator, rdv_name, started, done)
    assert started.wait(60)
    with shmrdv.Rendezvous(rdv_name, timeout=None) as rdv:  # exists: attaches, once it is ready
        assert rdv.capacity == 1 << 20
        np.testing.assert_array_equal(rdv.recv("hello", timeout=30), np.arange(4))
    done.set()
    children.join()


@pytest.mark.timeout(120)
def test_an_attacher_gives_up_after_its_timeout_saying_the_creator_is_alive(rdv_name, children):
    started, stop = children.context.Event(), children.context.Event()
    child = children.start(creator_that_never_finishes, segment_path(rdv_name), started, stop)
    assert started.wait(60)
    begin = time.monotonic()
    with pytest.raises(shmrdv.RendezvousTimeout, match=f"{rdv_name!r}: its creator is alive but still initialising it "
                                                       f"after 0.5 s; pass a longer timeout="):
        shmrdv.Rendezvous(rdv_name, create=False, timeout=0.5)
    assert 0.5 <= time.monotonic() - begin < 10
    # Once that creator is gone, its segment is known to be dead.
    stop.set()
    child.join(30)
    time.sleep(CREATOR_GRACE_S)
    with pytest.raises(shmrdv.SegmentMismatch, match="creat.* died"):
        shmrdv.Rendezvous(rdv_name, create=False, timeout=60)
    children.join()


def write_dead_segment(name: str, nbytes: int) -> str:
    """What a creator that died before initialising leaves: a zero-filled file, ours, mode 0600."""
    path = segment_path(name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, nbytes)
    finally:
        os.close(fd)
    return path


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nbytes", [MIN_SEGMENT_BYTES, 64 << 20, 0], ids=["minimum", "64MiB", "empty"])
@pytest.mark.parametrize("create", [False, None])
def test_a_segment_whose_creator_died_fails_quickly_saying_how_to_remove_it(rdv_name, nbytes, create):
    write_dead_segment(rdv_name, nbytes)
    begin = time.monotonic()
    with pytest.raises(shmrdv.SegmentMismatch) as raised:
        shmrdv.Rendezvous(rdv_name, create=create)  # the default timeout: 60 s
    elapsed = time.monotonic() - begin
    text = str(raised.value)
    assert f"rendezvous {rdv_name!r} was never initialised" in text
    assert "died" in text and f"shmrdv rm {rdv_name}" in text
    assert elapsed < CREATOR_GRACE_S + 3, elapsed
    assert os.path.exists(segment_path(rdv_name))  # left for the user to remove, as the message says


@pytest.mark.timeout(60)
def test_an_old_dead_segment_fails_at_once(rdv_name):
    write_dead_segment(rdv_name, MIN_SEGMENT_BYTES)
    time.sleep(CREATOR_GRACE_S + 0.1)
    begin = time.monotonic()
    with pytest.raises(shmrdv.SegmentMismatch, match="died"):
        shmrdv.Rendezvous(rdv_name, create=False)
    assert time.monotonic() - begin < 0.5


def test_removing_a_dead_segment_lets_the_name_be_created_again(rdv_name):
    write_dead_segment(rdv_name, MIN_SEGMENT_BYTES)
    time.sleep(CREATOR_GRACE_S + 0.1)
    with pytest.raises(shmrdv.SegmentMismatch):
        shmrdv.Rendezvous(rdv_name)
    core.unlink_segment(rdv_name)
    with shmrdv.Rendezvous(rdv_name, size=1 << 20) as rdv:
        rdv.send("k", np.arange(2))
        rdv.unlink()


def test_a_creator_drops_its_lock_once_the_segment_is_published(rdv_name):
    """An initialised segment's creator lock is free (attachers never wait on a live creator's old lock)."""
    with shmrdv.Rendezvous(rdv_name, size=1 << 20, create=True) as rdv:
        shm = posix_ipc.SharedMemory(core.SEGMENT_PREFIX + rdv_name)
        try:
            flock = struct.pack("hh4xqqi4x", fcntl.F_WRLCK, os.SEEK_SET, CREATOR_LOCK_BYTE, 1, 0)
            l_type = struct.unpack("hh4xqqi4x", fcntl.fcntl(shm.fd, fcntl.F_OFD_GETLK, flock))[0]
        finally:
            shm.close_fd()
        assert l_type == fcntl.F_UNLCK
        rdv.unlink()


@pytest.mark.parametrize("timeout, error", [(-1, ValueError), ("1", TypeError)])
def test_a_bad_open_timeout_is_refused(rdv_name, timeout, error):
    with pytest.raises(error):
        shmrdv.Rendezvous(rdv_name, size=1 << 20, timeout=timeout)
    assert not os.path.exists(segment_path(rdv_name))
