"""Error messages that say what went wrong and what to do: one test per message.

Each names the values involved (sizes, limits, the rendezvous) and, where
there is one, the fix; values shmrdv would otherwise change silently (a size
rounded up, an abort reason cut) raise instead."""

import os
import pickle

import numpy as np
import posix_ipc
import pytest

import shmrdv
from shmrdv import segments as core

from ..conftest import MiB, segment_path

RDV_SIZE = 4 * MiB  # the rdv fixture's arena
MAX_SIZE = (1 << 36) - 4096


def block_bytes(key: str, ndim: int, nbytes: int) -> int:
    """What a message takes in the arena: a 64 B header, shape, strides, key and
    position rounded up to 64 bytes, then the payload (rdv_meta_bytes)."""
    return -(-(64 + 16 * ndim + len(key.encode()) + 8) // 64) * 64 + nbytes


def no_segment_calls(monkeypatch):
    """Make any attempt to open or create a segment fail the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a segment was opened")
    monkeypatch.setattr(core.posix_ipc, "SharedMemory", refuse)


# ---- MessageTooLarge ---------------------------------------------------------


@pytest.mark.parametrize("how", ["send", "alloc"])
def test_message_too_large_names_its_block_the_capacity_and_a_size_that_fits(rdv, rdv_name, how):
    nbytes = RDV_SIZE + 12345
    block = block_bytes("big", 1, nbytes)
    fits = -(-block // 4096) * 4096
    with pytest.raises(shmrdv.MessageTooLarge) as raised:
        if how == "send":
            rdv.send("big", np.zeros(nbytes, np.uint8))
        else:
            rdv.alloc("big", (nbytes,), np.uint8).open()
    text = str(raised.value)
    assert f"{block} bytes" in text and f"{nbytes} of payload" in text
    assert f"{RDV_SIZE}-byte arena" in text and "can never fit" in text
    assert f"Rendezvous({rdv.name!r}, size={fits})" in text
    assert f"shmrdv rm {rdv.name}" in text
    # The size it hints really holds the message.
    other = rdv_name + "-fits"
    try:
        with shmrdv.Rendezvous(other, size=fits, create=True) as roomy:
            roomy.send("big", np.zeros(nbytes, np.uint8), timeout=0)
    finally:
        core.unlink_segment(other)


def test_message_too_large_for_a_private_rendezvous_hints_rendezvous_with_a_size():
    with shmrdv.Rendezvous(size=MiB) as private:
        with pytest.raises(shmrdv.MessageTooLarge, match=r"Rendezvous\(size=2101248\) holds one such message"):
            private.send("k", np.zeros(2 * MiB, np.uint8))


def test_message_too_large_for_any_rendezvous_says_so(rdv):
    with pytest.raises(shmrdv.MessageTooLarge, match=f"no rendezvous can hold it.*size={MAX_SIZE}.*in parts"):
        rdv.alloc("huge", (MAX_SIZE,), np.uint8).open()


# ---- a send or alloc that times out on a full arena ---------------------------


@pytest.mark.parametrize("how", ["send", "alloc"])
def test_timeout_on_a_full_arena_says_what_is_free_and_what_holds_the_rest(rdv, how):
    for i in range(3):
        rdv.send("k", np.full(MiB, i, np.uint8))
    held = [rdv.recv("k", timeout=5), rdv.recv("k", timeout=5)]  # two views, one message pending
    st = rdv.stats()
    views = sum(p.views for p in rdv.processes())
    view_bytes = sum(p.view_bytes for p in rdv.processes())
    assert views == 2
    with pytest.raises(shmrdv.RendezvousTimeout) as raised:
        if how == "send":
            rdv.send("more", np.zeros(2 * MiB, np.uint8), timeout=0.05)
        else:
            rdv.alloc("more", (2 * MiB,), np.uint8, timeout=0.05).open()
    text = str(raised.value)
    assert f"arena full: {st.bytes_free} bytes free (largest free block {st.largest_free})" in text
    assert f"{st.bytes_used} bytes held by 2 views ({view_bytes} bytes) and 1 pending messages" in text
    assert "received view keeps its space" in text
    assert f"block of {block_bytes('more', 1, 2 * MiB)} bytes" in text
    assert "after 0.05 s" in text
    del held


def test_timeout_zero_on_a_full_arena_says_timeout_0(rdv):
    rdv.send("k", np.zeros(3 * MiB, np.uint8))
    with pytest.raises(shmrdv.RendezvousTimeout, match="timed out with timeout=0 .* arena full"):
        rdv.send("k", np.zeros(2 * MiB, np.uint8), timeout=0)


# ---- what send takes ----------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [{}, {"a": 1}, None, [1, {}], [1, None], [1, "a"], [[1], [1, 2]], object(), [np.zeros(2), "x"]],
    ids=["empty-dict", "dict", "None", "int-and-dict", "int-and-None", "int-and-str", "ragged", "object", "array-and-str"],
)
def test_sending_what_is_not_an_array_of_numbers_says_what_send_takes(rdv, value):
    with pytest.raises(shmrdv.InvalidType) as raised:
        rdv.send("k", value)
    text = str(raised.value)
    assert "send takes a numpy array, or an array-like of numbers" in text
    assert "dtype object" not in text
    assert rdv.stats().pending_messages == 0


@pytest.mark.parametrize("value, dtype", [([1, 2, 3], np.int64), (2.5, np.float64), (["a", "bc"], np.dtype("<U2")),
                                          ((True, False), np.bool_)])
def test_array_likes_of_numbers_or_strings_are_still_sent(rdv, value, dtype):
    rdv.send("k", value)
    got = rdv.recv("k", timeout=5)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, np.asarray(value))


# ---- size --------------------------------------------------------------------


@pytest.mark.parametrize("size", [MAX_SIZE + 4096, 1 << 40])
def test_size_over_the_limit_names_the_limit_before_any_segment_is_made(rdv_name, monkeypatch, size):
    no_segment_calls(monkeypatch)
    with pytest.raises(shmrdv.InvalidArgument, match=f"size={size} is over the limit.*at most {MAX_SIZE} bytes .*64 GiB"):
        shmrdv.Rendezvous(rdv_name, size=size, create=True)
    assert not os.path.exists(segment_path(rdv_name))


def test_the_limit_is_the_c_cores():
    assert shmrdv.MAX_SIZE == core.MAX_SIZE == MAX_SIZE == int(core.lib.RDV_MAX_ARENA_BYTES)


@pytest.mark.timeout(60)
@pytest.mark.skipif(os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize >= MAX_SIZE,
                    reason="/dev/shm can hold the largest arena")
def test_size_over_what_dev_shm_holds_says_so_at_creation(rdv_name):
    with pytest.raises(shmrdv.RendezvousError, match="/dev/shm has no room.*bytes free"):
        shmrdv.Rendezvous(rdv_name, size=MAX_SIZE, create=True)
    assert not os.path.exists(segment_path(rdv_name))


@pytest.mark.parametrize("size, nearest", [(10, "use size=4096"), (4095, "use size=4096"), (5000, "use size=4096 or size=8192"),
                                           (MiB + 1, f"use size={MiB} or size={MiB + 4096}")])
def test_size_that_is_not_a_page_multiple_raises_with_the_nearest_sizes(rdv_name, monkeypatch, size, nearest):
    no_segment_calls(monkeypatch)
    with pytest.raises(shmrdv.InvalidArgument, match=f"multiple of 4096 bytes.*got size={size}: {nearest}$"):
        shmrdv.Rendezvous(rdv_name, size=size, create=True)


def test_the_smallest_size_is_one_page(rdv_name):
    with shmrdv.Rendezvous(rdv_name, size=4096, create=True) as small:
        assert small.capacity == 4096
        small.unlink()


# ---- Aborted -----------------------------------------------------------------


def test_aborted_names_the_rendezvous_and_says_the_abort_is_permanent(rdv):
    rdv.abort("shutting down")
    for operation in (lambda: rdv.send("k", np.ones(3)), lambda: rdv.recv("k", timeout=1)):
        with pytest.raises(shmrdv.Aborted) as raised:
            operation()
        text = str(raised.value)
        assert raised.value.reason == "shutting down"
        assert f"rendezvous {rdv.name!r} was aborted: shutting down" in text
        assert "permanent" in text and f"shmrdv rm {rdv.name}" in text and "new name" in text
    copy = pickle.loads(pickle.dumps(raised.value))
    assert (copy.reason, str(copy)) == (raised.value.reason, str(raised.value))


def test_an_attacher_of_an_aborted_rendezvous_gets_the_same_message(rdv):
    rdv.abort("done")
    with shmrdv.Rendezvous(rdv.name, create=False) as other:
        with pytest.raises(shmrdv.Aborted, match=f"{other.name!r} was aborted: done.*permanent") as raised:
            other.recv("k", timeout=1)
    assert raised.value.reason == "done"


def test_an_abort_reason_over_1024_bytes_raises_instead_of_being_cut(rdv):
    with pytest.raises(shmrdv.InvalidArgument, match="1026 bytes of UTF-8, more than the 1024"):
        rdv.abort("é" * 513)
    with pytest.raises(shmrdv.InvalidArgument, match="lone surrogate"):
        rdv.abort("bad \udcff")
    assert not rdv.stats().aborted
    reason = "é" * 512  # exactly 1024 bytes: kept whole
    rdv.abort(reason)
    with pytest.raises(shmrdv.Aborted) as raised:
        rdv.recv("k", timeout=1)
    assert raised.value.reason == reason


# ---- attaching with other size or max_keys -------------------------------------


@pytest.mark.parametrize("asked, has", [({"size": 8 * MiB}, f"size={RDV_SIZE}"), ({"max_keys": 7}, "max_keys=1024"),
                                        ({"size": MiB, "max_keys": 7}, f"size={RDV_SIZE} and max_keys=1024")],
                         ids=["size", "max_keys", "both"])
def test_attaching_with_another_size_or_max_keys_raises_naming_both_values(rdv, asked, has):
    assert rdv.stats().max_keys == 1024
    want = " and ".join(f"{k}={v}" for k, v in asked.items())
    with pytest.raises(shmrdv.SegmentMismatch) as raised:
        shmrdv.Rendezvous(rdv.name, create=False, **asked)
    text = str(raised.value)
    assert f"already exists with {has}, not the {want} asked for" in text
    assert "attach without them" in text and f"shmrdv rm {rdv.name}" in text
    assert [p.pid for p in rdv.processes()] == [os.getpid()]  # the refused handle is closed


def test_attaching_with_the_values_it_has_is_fine(rdv):
    with shmrdv.Rendezvous(rdv.name, size=RDV_SIZE, max_keys=1024) as same:
        assert same.capacity == RDV_SIZE
