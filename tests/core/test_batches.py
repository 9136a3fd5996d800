"""send_many / recv_many: batches of messages, one call into the core each."""
import threading
import time

import numpy as np
import pytest

import shmrdv
from shmrdv import _fastpath, batches

from .. import workers
from ..conftest import fill, swap_caches


class _CountingLib:
    """The binding's lib, counting the calls of each function made through it."""

    def __init__(self, lib):
        self._lib, self.calls = lib, {}

    def __getattr__(self, name):
        target = getattr(self._lib, name)
        if not callable(target):
            return target

        def counted(*args):
            self.calls[name] = self.calls.get(name, 0) + 1
            return target(*args)

        return counted


def test_round_trip_in_order_one_core_call_each(rdv, monkeypatch):
    counting = _CountingLib(batches.lib)
    monkeypatch.setattr(batches, "lib", counting)
    arrays = [np.arange(i, i + 5, dtype=np.float32) for i in range(100)]
    rdv.send_many([("k", a) for a in arrays])
    got = rdv.recv_many("k", 1000)
    assert counting.calls == {"rdv_send_many": 1, "rdv_recv_many": 1}
    assert len(got) == 100
    same = [v.dtype == np.float32 and np.array_equal(a, v) and not v.flags.writeable for a, v in zip(arrays, got)]
    assert all(same)
    del got
    assert rdv.stats().bytes_used == 0


def test_mixed_keys_dtypes_and_layouts(rdv):
    grid = np.arange(24, dtype=np.int16).reshape(4, 6)
    items = [("a", grid), ("b", grid[:, ::2]), ("a", np.float64(2.5)), ("b", [1, 2, 3]),
             ("a", np.array(["x", "yz"])), ("a", np.array(["2020-01-01"], "M8[D]"))]
    rdv.send_many(iter(items))  # any iterable
    a = rdv.recv_many("a", 10)
    b = rdv.recv_many("b", 10)
    assert [v.shape for v in a] == [(4, 6), (), (2,), (1,)]
    assert np.array_equal(a[0], grid) and a[1] == 2.5 and list(a[2]) == ["x", "yz"]
    assert a[3][0] == np.datetime64("2020-01-01")
    assert np.array_equal(b[0], grid[:, ::2]) and list(b[1]) == [1, 2, 3]


def test_torch_tensors_in_and_out(rdv):
    torch = pytest.importorskip("torch")
    rdv.send_many([("t", torch.arange(6).reshape(2, 3)), ("t", torch.ones(3, dtype=torch.bfloat16))])
    first, second = rdv.recv_many("t", 2, as_torch=True)
    assert torch.equal(first, torch.arange(6).reshape(2, 3)) and second.dtype == torch.bfloat16


def test_max_count_and_more_than_one_call(rdv):
    rdv.send_many([("k", np.array([i])) for i in range(2 * batches.MANY_MAX + 5)])
    assert [int(v[0]) for v in rdv.recv_many("k", 3)] == [0, 1, 2]
    rest = rdv.recv_many("k", 10**9)  # capped at MANY_MAX per call
    assert len(rest) == batches.MANY_MAX and int(rest[0][0]) == 3
    del rest
    assert len(rdv.recv_many("k", 10**9)) == batches.MANY_MAX
    left = rdv.recv_many("k", 10**9)
    assert [int(v[0]) for v in left] == [2 * batches.MANY_MAX + 3, 2 * batches.MANY_MAX + 4]


def test_recv_many_waits_for_the_first_only(rdv):
    assert rdv.recv_many("w", 5, timeout=0) == []
    with pytest.raises(shmrdv.RendezvousTimeout):
        rdv.recv_many("w", 5, timeout=0.05)
    sender = threading.Timer(0.2, lambda: rdv.send("w", np.array([7])))
    sender.start()
    try:
        start = time.monotonic()
        got = rdv.recv_many("w", 5, timeout=30)
        assert time.monotonic() - start >= 0.15
        assert [int(v[0]) for v in got] == [7]
    finally:
        sender.join()


@pytest.mark.parametrize("max_count, error", [(0, shmrdv.InvalidArgument), (-1, shmrdv.InvalidArgument),
                                              ("3", shmrdv.InvalidType), (True, shmrdv.InvalidType)])
def test_bad_max_count(rdv, max_count, error):
    with pytest.raises(error, match="max_count"):
        rdv.recv_many("k", max_count)


@pytest.mark.parametrize("bad, words", [(("k", object()), "cannot send an object"), ("ab", "(key, array) pair"),
                                        (("k", np.zeros(2), 3), "(key, array) pair"), ((5, np.zeros(2)), "key must be a str"),
                                        (("", np.zeros(2)), "key must be 1..")])
def test_a_bad_item_sends_nothing(rdv, bad, words):
    with pytest.raises((shmrdv.InvalidType, shmrdv.InvalidArgument), match="item 1, nothing sent") as raised:
        rdv.send_many([("k", np.zeros(2)), bad, ("k", np.ones(2))])
    assert words in str(raised.value)
    assert rdv.stats().pending_messages == 0


def test_a_message_that_can_never_fit_stops_the_batch_there(rdv):
    huge = np.zeros(rdv.stats().capacity + 1, np.uint8)
    with pytest.raises(shmrdv.MessageTooLarge, match=r"item 2\).*the 2 item\(s\) before it were sent") as raised:
        rdv.send_many([("k", np.array([0])), ("k", np.array([1])), ("k", huge), ("k", np.array([3]))])
    assert raised.value.sent == 2
    assert [int(v[0]) for v in rdv.recv_many("k", 10)] == [0, 1]


@pytest.mark.timeout(60)
def test_a_full_arena_times_out_mid_batch_with_what_was_sent(rdv_name):
    with shmrdv.Rendezvous(rdv_name, create=True, size=1 << 20) as small:
        try:
            block = np.zeros(100_000, np.uint8)
            with pytest.raises(shmrdv.RendezvousTimeout) as raised:
                small.send_many([("k", block)] * 20, timeout=0.2)
            sent = raised.value.sent
            assert 0 < sent < 20
            got = []
            while True:
                more = small.recv_many("k", 100, timeout=0)
                if not more:
                    break
                got += [int(v.sum()) for v in more]
                del more
            assert len(got) == sent
        finally:
            small.unlink()


def test_a_view_that_cannot_be_made_keeps_it_and_those_after_queued(rdv):
    pytest.importorskip("torch")
    rdv.send_many([("k", np.array([1.0])), ("k", np.array(["2020-01-01"], "M8[D]")), ("k", np.array([3.0]))])
    first = rdv.recv_many("k", 10, as_torch=True)
    assert [float(t[0]) for t in first] == [1.0]
    with pytest.raises(shmrdv.InvalidType, match="torch has no tensors of"):
        rdv.recv_many("k", 10, as_torch=True)
    rest = rdv.recv_many("k", 10)
    assert rest[0].dtype.kind == "M" and float(rest[1][0]) == 3.0 and len(rest) == 2


def test_leased_batch(rdv):
    rdv.send_many([("k", np.array([i])) for i in range(3)])
    views = rdv.recv_many("k", 3, lease=True, writable=True)
    writable = [v.flags.writeable for v in views]
    assert all(writable)
    assert sum(p.views for p in rdv.processes()) == 3
    del views
    assert rdv.stats().bytes_used == 0


@pytest.mark.timeout(120)
def test_batches_between_processes(rdv, children):
    """A child sends 3,000 numbered messages in batches of 64; the parent
    takes them in batches: every one arrives, once, in order."""
    count = 3000
    child = children.start(workers.send_counter_many, rdv.name, "n", count, 64)
    seen = []
    while len(seen) < count:
        seen += [int(v[0]) for v in rdv.recv_many("n", 256, timeout=60)]
    assert seen == list(range(count))
    children.join()
    assert child.exitcode == 0


@pytest.mark.timeout(120)
def test_space_a_dead_process_held_is_reclaimed_for_a_blocked_batch(rdv_name, children):
    """A full arena whose messages a process took and died holding: a
    send_many waiting for room reclaims them, as send does."""
    with shmrdv.Rendezvous(rdv_name, create=True, size=64 << 10) as small:
        try:
            block = np.zeros(8000, np.uint8)
            sent = fill(small, "k", block)
            queue = children.context.Queue()
            children.start(workers.take_all_and_exit, rdv_name, "k", sent, queue)
            assert queue.get(timeout=60) == sent
            children.join()
            small.send_many([("k", block)] * 3, timeout=30)  # room only once the dead child's views are freed
            assert len(small.recv_many("k", 10, timeout=0)) == 3
        finally:
            small.unlink()


@pytest.mark.timeout(120)
def test_a_batch_many_times_the_arena_streams_through_it(rdv_name, children):
    """A batch of 2 MiB through a 64 KiB arena: each run of one key is
    written before it is linked, and one that runs out of room is linked
    before the batch waits for more (a consumer can free nothing it cannot
    see). Every message arrives, once, in order."""
    with shmrdv.Rendezvous(rdv_name, create=True, size=64 << 10) as small:
        try:
            count = 512
            queue = children.context.Queue()
            children.start(workers.first_elements, rdv_name, "k", count, queue)
            small.send_many([("k", np.full(1024, i, np.int32)) for i in range(count)], timeout=15)
            assert queue.get(timeout=60) == list(range(count))
            children.join()
        finally:
            small.unlink()


def test_items_after_one_of_their_key_keep_their_own_dtype_and_shape(rdv):
    """Consecutive items that share a key (the same str object) or a dtype
    and shape but differ otherwise each arrive as they were sent, through
    the fast path too (the second batch, its kinds known)."""
    key = "k"
    items = [(key, np.zeros(3, np.float32)), (key, np.ones(4, np.float32)), (key, np.full(4, 2.0)),
             (key, np.full((2, 2), 3.0)), ("j", np.full((2, 2), 4.0)), (key, np.full((2, 2), 5, np.int8))]
    for _ in range(2):
        rdv.send_many(items)
        got = rdv.recv_many("k", 10)
        other = rdv.recv_many("j", 10)
        expect = [a for k, a in items if k == "k"]
        assert [(v.dtype, v.shape) for v in got] == [(a.dtype, a.shape) for a in expect]
        assert all(np.array_equal(v, a) for v, a in zip(got, expect))
        assert len(other) == 1 and other[0].shape == (2, 2) and float(other[0][0, 0]) == 4.0
        del got, other


def _interrupt_on(call_number):
    calls = [0]

    def maybe(*args):
        calls[0] += 1
        if calls[0] == call_number:
            raise KeyboardInterrupt
    return maybe


class _ViewsThenInterrupt:
    """shmrdv._fastpath, but a KeyboardInterrupt once views() has made its views."""

    def __getattr__(self, name):
        return getattr(_fastpath, name)

    def views(self, *args):
        _fastpath.views(*args)
        raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["parsing", "making views", "after the views made in C"])
def test_an_interrupted_batch_gives_everything_back_in_order(rdv, monkeypatch, where):
    rdv.send_many([("k", np.array([i])) for i in range(4)])
    if where == "after the views made in C":
        rdv.send("k0", np.array([9]))
        rdv.recv("k0")  # the descriptor is known: all four views are made in C
        monkeypatch.setattr(batches, "fast", _ViewsThenInterrupt())
    else:  # a descriptor not seen before: parsed and made views in Python
        swap_caches(monkeypatch, descs={})
    if where == "parsing":
        real = batches._parsed
        trip = _interrupt_on(2)
        monkeypatch.setattr(batches, "_parsed", lambda *a: (trip(), real(*a))[1])
    else:
        real = type(rdv)._view_parsed
        trip = _interrupt_on(2)
        monkeypatch.setattr(type(rdv), "_view_parsed", lambda self, *a: (trip(), real(self, *a))[1])
    with pytest.raises(KeyboardInterrupt):
        rdv.recv_many("k", 10)
    monkeypatch.undo()
    assert [int(v[0]) for v in rdv.recv_many("k", 10)] == [0, 1, 2, 3]
    assert rdv.stats().bytes_used == 0


@pytest.mark.timeout(60)
def test_what_goes_back_reaches_a_waiting_receiver_oldest_first(rdv, monkeypatch):
    """Messages a batch takes and cannot hand out go back in one step: a
    receiver that lined up meanwhile gets the oldest of them, and the next
    call the rest, in order."""
    pytest.importorskip("torch")
    rdv.send_many([("k", np.array(["2020-01-01"], "M8[D]")), ("k", np.array([2.0])), ("k", np.array([3.0]))])
    got = []
    waiter = threading.Thread(target=lambda: got.append(rdv.recv("k", timeout=30)))
    real, started = batches._parsed, []

    def parsed_once_a_receiver_waits(*args):
        if not started:  # the batch has emptied the key: a receiver lines up now
            started.append(waiter.start())
            deadline = time.monotonic() + 20
            while rdv.stats().waiters == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
        return real(*args)

    monkeypatch.setattr(batches, "_parsed", parsed_once_a_receiver_waits)
    with pytest.raises(shmrdv.InvalidType, match="torch has no tensors of"):
        rdv.recv_many("k", 10, as_torch=True)
    waiter.join(30)
    monkeypatch.undo()
    assert got and got[0].dtype.kind == "M"
    assert [float(v[0]) for v in rdv.recv_many("k", 10)] == [2.0, 3.0]


def test_send_many_finishes_the_futures_it_served(rdv):
    future = rdv.recv_async("f")
    rdv.send_many([("f", np.array([5]))])
    assert future.done() and int(future.result()[0]) == 5


def test_a_bad_item_sends_nothing_on_a_routed_rendezvous_too(rdv_name):
    with shmrdv.Rendezvous(rdv_name, create=True, routes={"/job:far": "tcp://127.0.0.1:9"}, token="t") as routed:
        try:
            before = routed.stats().pending_messages  # the route table, announced to the bridge
            with pytest.raises(shmrdv.InvalidType, match="item 1, nothing sent"):
                routed.send_many([("local", np.zeros(2)), ("local", object())])
            assert routed.stats().pending_messages == before
        finally:
            routed.unlink()
