"""Attaching to a damaged segment: whatever bytes of its header, process table, key index or
side table are wrong, shmrdv raises a clear error or works on; it never crashes the
interpreter or hangs. Hypothesis picks the damage."""
import os
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shmrdv

from ..conftest import segment_path, write_segment_file

ARENA = 64 * 1024
MAX_KEYS = 32


@pytest.fixture(scope="module")
def pristine():
    """The bytes of a segment in use: messages queued on a few keys."""
    name = f"t-{os.getpid()}-fuzz-{uuid.uuid4().hex[:8]}"
    rdv = shmrdv.Rendezvous(name, size=ARENA, max_keys=MAX_KEYS, create=True)
    try:
        for i in range(6):
            rdv.send(f"k{i % 3}", np.full(100 + 50 * i, i, dtype=np.int32))
        rdv.close()
        with open(segment_path(name), "rb") as f:
            data = f.read()
    finally:
        rdv.close()
        rdv.unlink()
    return data


def _regions(data: bytes) -> list:
    """[start, end) of each metadata region: the used part of the header, the
    process table, the key index, the side table (offsets from the header)."""
    field = lambda at: int.from_bytes(data[at : at + 8], "little")  # noqa: E731
    index_off, side_off, arena_off = field(24), field(40), field(48)
    return [(0, 8192), (8192, index_off), (index_off, side_off), (side_off, arena_off)]


def _exercise(name: str) -> None:
    try:
        rdv = shmrdv.Rendezvous(name, create=False)
    except shmrdv.RendezvousError:
        return  # refused with a clear error: fine
    try:
        for op in (
            rdv.stats,
            rdv.processes,
            rdv.collect_garbage,
            lambda: rdv.try_recv("k0"),
            lambda: rdv.try_recv("k1"),
            lambda: rdv.send("fresh", np.arange(10), timeout=0.05),
            lambda: rdv.recv("fresh", timeout=0.05),
            lambda: rdv.recv("k2", timeout=0.05),
        ):
            try:
                result = op()
                del result
            except shmrdv.RendezvousError:
                pass  # damage found on the way: a clear error, and we go on
    finally:
        rdv.close()


@pytest.mark.timeout(300)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damage_gives_an_error_never_a_crash(pristine, rdv_name, data):
    offsets = st.sampled_from(_regions(pristine)).flatmap(lambda r: st.integers(r[0], r[1] - 1))
    damage = data.draw(st.lists(st.tuples(offsets, st.integers(0, 255)), min_size=1, max_size=12), label="damage")
    raw = bytearray(pristine)
    for offset, value in damage:
        raw[offset] = value
    path = segment_path(rdv_name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, bytes(raw))
    finally:
        os.close(fd)
    try:
        _exercise(rdv_name)
    finally:
        os.unlink(path)


@pytest.mark.parametrize(
    "offset, value, message",
    [(0, 0x00, "magic"), (8, shmrdv.limits.LAYOUT_VERSION + 1, "layout version"), (24, 0x01, "damaged")],
)
def test_named_damage_is_named_in_the_error(pristine, rdv_name, offset, value, message):
    raw = bytearray(pristine)
    raw[offset] = value
    if offset == 0:
        raw[0:8] = b"NOTSHMRD"
    path = segment_path(rdv_name)
    write_segment_file(path, bytes(raw))
    try:
        with pytest.raises(shmrdv.SegmentMismatch, match=message):
            shmrdv.Rendezvous(rdv_name, create=False)
    finally:
        os.unlink(path)


def test_truncated_segment_is_refused(pristine, rdv_name):
    path = segment_path(rdv_name)
    write_segment_file(path, pristine[: len(pristine) // 2])
    try:
        with pytest.raises(shmrdv.SegmentMismatch, match="size"):
            shmrdv.Rendezvous(rdv_name, create=False)
    finally:
        os.unlink(path)


def test_an_old_layout_version_is_named_with_ours(pristine, rdv_name):
    raw = bytearray(pristine)
    raw[8:12] = (6).to_bytes(4, "little")  # the layout before the key count
    path = segment_path(rdv_name)
    write_segment_file(path, bytes(raw))
    try:
        ours = shmrdv.limits.LAYOUT_VERSION
        with pytest.raises(shmrdv.SegmentMismatch, match=rf"layout version 6, this shmrdv uses version {ours}.*shmrdv rm"):
            shmrdv.Rendezvous(rdv_name, create=False)
    finally:
        os.unlink(path)
