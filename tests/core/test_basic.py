"""Single-process behaviour of a Rendezvous: round trips, views, blocking, lifecycle, arena limits."""

import concurrent.futures
import dataclasses
import glob
import os
import re
import stat

import numpy as np
import pytest

import shmrdv
from tests.conftest import MiB, SHM_DIR, segment_path, write_segment_file

pytestmark = pytest.mark.timeout(30)

RDV_SIZE = 4 * MiB  # size of the `rdv` fixture


def test_send_then_recv_returns_equal_tensor(rdv):
    sent = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    rdv.send("k", sent)
    received = rdv.recv("k", timeout=5)
    assert received.dtype == sent.dtype
    assert received.shape == sent.shape
    np.testing.assert_array_equal(received, sent)


def test_received_view_is_read_only(rdv):
    rdv.send("k", np.zeros(8, dtype=np.int32))
    view = rdv.recv("k", timeout=5)
    with pytest.raises(ValueError):
        view[0] = 1
    with pytest.raises(ValueError):
        view.flags.writeable = True


def test_try_recv_on_empty_key_returns_none(rdv):
    assert rdv.try_recv("nothing-here") is None


def test_try_recv_returns_a_sent_message(rdv):
    rdv.send("k", np.array([7, 8]))
    np.testing.assert_array_equal(rdv.try_recv("k"), [7, 8])
    assert rdv.try_recv("k") is None


def test_sends_on_one_key_are_received_in_fifo_order(rdv):
    for i in range(100):
        rdv.send("fifo", np.array(i))
    assert [int(rdv.recv("fifo", timeout=5)) for _ in range(100)] == list(range(100))
    assert rdv.try_recv("fifo") is None


def test_many_keys_are_independent(rdv):
    keys = [f"key-{i}" for i in range(300)]
    for i, key in enumerate(keys):
        rdv.send(key, np.full(3, i, dtype=np.int16))
    for i, key in reversed(list(enumerate(keys))):
        np.testing.assert_array_equal(rdv.recv(key, timeout=5), np.full(3, i, dtype=np.int16))
    assert rdv.stats().pending_messages == 0


def test_recv_timeout_raises_rendezvous_timeout_which_is_a_timeout_error(rdv):
    with pytest.raises(shmrdv.RendezvousTimeout) as caught:
        rdv.recv("never-sent", timeout=0.05)
    assert isinstance(caught.value, TimeoutError)
    assert isinstance(caught.value, shmrdv.RendezvousError)
    says = (f"nothing came within 0.05 s; 0 other live process(es) have rendezvous {rdv.name!r} attached "
            f"(`shmrdv stat {rdv.name}` shows")
    assert str(caught.value).startswith(f"recv 'never-sent': {says}"), caught.value
    with pytest.raises(shmrdv.RendezvousTimeout, match=re.escape(f"recv_any ['a', 'b']: {says}")):
        rdv.recv_any(["a", "b"], timeout=0.05)
    with pytest.raises(shmrdv.RendezvousTimeout, match=re.escape(f"recv_many 'm': {says}")):
        rdv.recv_many("m", 4, timeout=0.05)


def test_recv_with_zero_timeout_on_empty_key_times_out(rdv):
    with pytest.raises(TimeoutError):
        rdv.recv("never-sent", timeout=0)


def test_alloc_publishes_on_clean_exit(rdv):
    with rdv.alloc("k", (4, 5), np.float32) as buf:
        assert buf.flags.writeable
        buf[...] = np.arange(20, dtype=np.float32).reshape(4, 5)
    received = rdv.recv("k", timeout=5)
    assert received.dtype == np.float32
    np.testing.assert_array_equal(received, np.arange(20, dtype=np.float32).reshape(4, 5))


@pytest.mark.parametrize("shape", [(4,), (2, 2)], ids=["1-d, reserved in C", "2-d"])
@pytest.mark.parametrize("end", ["publish", "exception", "discard", "publish()"])
def test_an_alloc_buffer_is_read_only_once_its_block_ends(rdv, shape, end):
    """A write through the array after the with block would land in a block
    that may already hold another message: it raises instead."""
    for _ in range(2):  # the second time the form is known: the block is reserved in C
        alloc = rdv.alloc("a", shape, np.float32)
        buf = alloc.open()
        buf[...] = 1
        if end == "publish":
            alloc.__exit__(None, None, None)
        elif end == "exception":
            alloc.__exit__(RuntimeError, RuntimeError("producer failed"), None)
        elif end == "discard":
            alloc.discard()
        else:
            alloc.publish()
        assert not buf.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            buf[...] = 55
        if end.startswith("publish"):
            assert rdv.recv("a", timeout=5).tolist() == np.ones(shape, np.float32).tolist()
    rdv.send("b", np.zeros(shape, np.float32))  # where the freed block was: untouched
    assert not rdv.recv("b", timeout=5).any()


def test_alloc_discards_on_exception_and_frees_its_space(rdv):
    before = rdv.stats()
    with pytest.raises(RuntimeError, match="producer failed"):
        with rdv.alloc("k", (1024, 64), np.float64) as buf:
            buf[...] = 1.0
            raise RuntimeError("producer failed")
    del buf
    after = rdv.stats()
    assert after.pending_messages == 0
    assert after.bytes_used == before.bytes_used
    assert after.bytes_free == before.bytes_free
    assert rdv.try_recv("k") is None


def test_stats_is_a_frozen_dataclass_tracking_messages_and_bytes(rdv):
    empty = rdv.stats()
    assert isinstance(empty, shmrdv.Stats)
    assert {f.name for f in dataclasses.fields(empty)} >= {
        "pending_messages", "keys", "waiters", "bytes_used", "bytes_free", "capacity",
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        empty.pending_messages = 1
    assert (empty.pending_messages, empty.keys, empty.waiters) == (0, 0, 0)
    assert empty.capacity == RDV_SIZE
    assert empty.bytes_used + empty.bytes_free == empty.capacity

    rdv.send("a", np.zeros(100_000, dtype=np.uint8))
    rdv.send("b", np.zeros(10, dtype=np.uint8))
    loaded = rdv.stats()
    assert loaded.pending_messages == 2
    assert loaded.keys == 2
    assert loaded.bytes_used >= empty.bytes_used + 100_010
    assert loaded.bytes_used + loaded.waiter_bytes + loaded.bytes_free == loaded.capacity

    for key in ("a", "b"):
        view = rdv.recv(key, timeout=5)
        del view  # the arena space comes back with the last reference
    drained = rdv.stats()
    assert drained.pending_messages == 0
    assert drained.bytes_used == empty.bytes_used


def test_close_and_unlink_are_idempotent(rdv_name):
    rdv = shmrdv.Rendezvous(rdv_name, size=MiB, create=True)
    rdv.close()
    rdv.close()
    rdv.unlink()
    rdv.unlink()
    assert not os.path.exists(segment_path(rdv_name))


def test_views_outlive_close_and_unlink(rdv_name):
    rdv = shmrdv.Rendezvous(rdv_name, size=MiB, create=True)
    rdv.send("k", np.arange(1000))
    view = rdv.recv("k", timeout=5)
    rdv.close()
    rdv.unlink()
    np.testing.assert_array_equal(view, np.arange(1000))


def test_context_manager_closes_but_does_not_unlink(rdv_name):
    with shmrdv.Rendezvous(rdv_name, size=MiB, create=True) as rdv:
        assert rdv.name == rdv_name
        rdv.send("kept", np.array([1.5, 2.5]))
    assert os.path.exists(segment_path(rdv_name))
    with shmrdv.Rendezvous(rdv_name, create=False) as again:
        np.testing.assert_array_equal(again.recv("kept", timeout=5), [1.5, 2.5])
        again.unlink()


def test_repr_contains_name(rdv):
    assert rdv.name in repr(rdv)


def test_create_true_on_existing_segment_raises_file_exists(rdv):
    with pytest.raises(FileExistsError):
        shmrdv.Rendezvous(rdv.name, size=MiB, create=True)


def test_create_false_on_missing_segment_raises_file_not_found(rdv_name):
    with pytest.raises(FileNotFoundError):
        shmrdv.Rendezvous(rdv_name, create=False)
    assert not os.path.exists(segment_path(rdv_name))


def test_attaching_to_a_foreign_segment_raises_segment_mismatch(rdv_name):
    write_segment_file(segment_path(rdv_name), b"not a shmrdv segment".ljust(MiB, b"\xff"))
    with pytest.raises(shmrdv.SegmentMismatch):
        shmrdv.Rendezvous(rdv_name, create=False)


def test_create_none_attaches_to_an_existing_segment(rdv):
    with shmrdv.Rendezvous(rdv.name) as attached:
        attached.send("k", np.array([3]))
    np.testing.assert_array_equal(rdv.recv("k", timeout=5), [3])


def test_segment_is_named_after_the_rendezvous_and_private_to_its_owner(rdv):
    path = segment_path(rdv.name)
    assert os.path.exists(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_unlink_leaves_nothing_in_dev_shm(rdv_name):
    rdv = shmrdv.Rendezvous(rdv_name, size=MiB, create=True)
    rdv.send("k", np.ones(10))
    rdv.close()
    rdv.unlink()
    assert glob.glob(os.path.join(SHM_DIR, f"*{rdv_name}*")) == []


def test_message_larger_than_arena_raises_message_too_large_at_once(rdv):
    # No timeout on purpose: waiting for space that can never exist must not block.
    with pytest.raises(shmrdv.MessageTooLarge):
        rdv.send("k", np.zeros(RDV_SIZE + 1, dtype=np.uint8))
    assert issubclass(shmrdv.MessageTooLarge, shmrdv.RendezvousError)
    assert rdv.stats().pending_messages == 0


def test_three_quarters_of_the_arena_fits_without_blocking(rdv):
    for i in range(12):
        rdv.send(f"k{i}", np.full(RDV_SIZE // 16, i, dtype=np.uint8), timeout=0)
    assert rdv.stats().pending_messages == 12


def test_a_single_message_almost_as_large_as_the_arena_fits(rdv):
    rdv.send("big", np.ones(RDV_SIZE - 8 * 1024, dtype=np.uint8), timeout=0)
    assert int(rdv.recv("big", timeout=5).sum()) == RDV_SIZE - 8 * 1024


@pytest.mark.parametrize("hold", [lambda view: view, lambda view: view[1::3]], ids=["view", "derived-view"])
def test_view_data_stays_intact_while_the_arena_is_reused(rdv, hold):
    pattern = np.arange(16 * 1024, dtype=np.int64)
    rdv.send("held", pattern)
    held = hold(rdv.recv("held", timeout=5))
    chunk = np.empty(64 * 1024, dtype=np.uint8)
    for i in range(200):  # about 3x the arena, so everything but the held view gets reused
        chunk.fill(i % 251)
        rdv.send("churn", chunk, timeout=5)
        assert rdv.recv("churn", timeout=5)[-1] == i % 251
    np.testing.assert_array_equal(held, hold(pattern))


def test_abort_makes_send_and_recv_raise_aborted_with_reason(rdv):
    rdv.send("queued", np.ones(1000))
    rdv.abort("shutting down")
    with pytest.raises(shmrdv.Aborted) as on_send:
        rdv.send("k", np.ones(3), timeout=1)
    with pytest.raises(shmrdv.Aborted) as on_recv:
        rdv.recv("queued", timeout=1)
    assert on_send.value.reason == on_recv.value.reason == "shutting down"
    assert rdv.stats().pending_messages == 0


def test_recv_async_resolves_after_send(rdv):
    future = rdv.recv_async("k")
    assert isinstance(future, concurrent.futures.Future)
    assert not future.done()
    rdv.send("k", np.array([4, 5, 6], dtype=np.uint16))
    received = future.result(timeout=10)
    assert received.dtype == np.uint16
    np.testing.assert_array_equal(received, [4, 5, 6])


def test_cancelled_recv_async_loses_no_message(rdv):
    future = rdv.recv_async("k")
    assert future.cancel() is True
    assert future.cancelled()
    rdv.send("k", np.array([42]))
    np.testing.assert_array_equal(rdv.recv("k", timeout=5), [42])
    assert rdv.stats().pending_messages == 0
