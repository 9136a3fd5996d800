"""Several processes on one rendezvous (spawned children, every blocking call bounded)."""


import numpy as np
import pytest

import shmrdv
from tests import workers
from tests.conftest import MiB, wait_for

QUEUE_TIMEOUT = 40.0  # longer than CHILD_TIMEOUT: a stuck child gives up (and exits non-zero) first


def _child_waiting_in_recv(rdv, children, worker, key):
    """Start a child that reports "ready" and then blocks in recv; return its report queue
    once the rendezvous counts it as a waiter."""
    reports = children.context.Queue()
    children.start(worker, rdv.name, key, reports)
    assert reports.get(timeout=QUEUE_TIMEOUT) == "ready"
    wait_for(lambda: rdv.stats().waiters > 0, "the child to block in recv", QUEUE_TIMEOUT)
    return reports


@pytest.mark.timeout(60)
def test_recv_before_send(rdv, children):
    reports = _child_waiting_in_recv(rdv, children, workers.recv_one, "late")
    sent = workers.payload(seed=1, nbytes=100_000).reshape(100, 1000)
    rdv.send("late", sent, timeout=10)
    assert reports.get(timeout=QUEUE_TIMEOUT) == (sent.shape, sent.dtype.str, workers.checksum(sent))
    children.join()


@pytest.mark.timeout(60)
def test_tensor_survives_sender_exit(rdv, children):
    children.start(workers.send_one_and_exit, rdv.name, "orphan", 7, 300_000)
    children.join()
    np.testing.assert_array_equal(rdv.recv("orphan", timeout=5), workers.payload(7, 300_000))


@pytest.mark.timeout(60)
def test_fifo_across_processes(rdv, children):
    children.start(workers.send_counter, rdv.name, "counter", 1000)
    received = [int(rdv.recv("counter", timeout=30)) for _ in range(1000)]
    children.join()
    assert received == list(range(1000))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "n_keys, arena",
    [
        # ~4 MiB in total fits at once, so consumers may drain the keys one after another.
        pytest.param(50, 16 * MiB, id="50-keys-roomy-arena"),
        # Sixteen laps of a small arena: producers wait for space while consumers free it.
        pytest.param(1, MiB // 4, id="one-key-small-arena"),
    ],
)
def test_two_producers_two_consumers(rdv_name, children, n_keys, arena):
    n_producers, n_consumers, n_messages = 2, 2, 500
    barrier = children.context.Barrier(n_producers + n_consumers)
    reports = children.context.Queue()
    with shmrdv.Rendezvous(rdv_name, size=arena, create=True) as rdv:
        for producer in range(n_producers):
            children.start(workers.stress_producer, rdv_name, producer, n_messages, n_keys, barrier, reports)
        for consumer in range(n_consumers):
            children.start(workers.stress_consumer, rdv_name, consumer, n_consumers, n_producers, n_messages,
                           n_keys, barrier, reports)
        results = [reports.get(timeout=90) for _ in range(n_producers + n_consumers)]
        children.join()
        assert rdv.stats().pending_messages == 0

    sent_checksum = sum(r[1] for r in results if r[0] == "producer")
    consumers = [r for r in results if r[0] == "consumer"]
    received_ids = [message_id for _, _, ids, _ in consumers for message_id in ids]
    assert sorted(received_ids) == [(p, s) for p in range(n_producers) for s in range(n_messages)]
    assert [violations for *_, violations in consumers] == [[], []]
    assert sum(r[1] for r in consumers) == sent_checksum


@pytest.mark.timeout(60)
def test_abort_wakes_a_receiver_in_another_process(rdv, children):
    reports = _child_waiting_in_recv(rdv, children, workers.recv_expect_abort, "never-sent")
    rdv.abort("parent gave up")
    assert reports.get(timeout=QUEUE_TIMEOUT) == "parent gave up"
    children.join()


@pytest.mark.timeout(120)
def test_twenty_arenas_stream_through_a_small_rendezvous(rdv_name, children):
    arena = MiB
    sizes = workers.stream_sizes(arena, rounds=20)
    with shmrdv.Rendezvous(rdv_name, size=arena, create=True) as rdv:
        idle_bytes_used = rdv.stats().bytes_used
        children.start(workers.send_stream, rdv_name, "stream", sizes)
        for seed, nbytes in enumerate(sizes):
            view = rdv.recv("stream", timeout=30)
            np.testing.assert_array_equal(view, workers.payload(seed, nbytes))
            del view  # hand the space back for the sender to reuse
        children.join()
        assert rdv.stats().bytes_used == idle_bytes_used


@pytest.mark.timeout(60)
def test_full_arena_blocks_sender_until_receiver_releases_views(rdv_name, children):
    arena, nbytes = MiB, 360 * 1024  # two messages fit (< 3/4 of the arena), a third never does
    release, reports = children.context.Event(), children.context.Queue()
    with shmrdv.Rendezvous(rdv_name, size=arena, create=True) as rdv:
        children.start(workers.hold_then_release, rdv_name, "k", 2, release, reports)
        for seed in (0, 1):
            rdv.send("k", workers.payload(seed, nbytes), timeout=0)
        held = reports.get(timeout=QUEUE_TIMEOUT)
        assert held == [workers.checksum(workers.payload(seed, nbytes)) for seed in (0, 1)]

        with pytest.raises(shmrdv.RendezvousTimeout):
            rdv.send("k", workers.payload(2, nbytes), timeout=0.2)
        assert rdv.stats().pending_messages == 0

        release.set()
        rdv.send("k", workers.payload(3, nbytes), timeout=30)  # blocks until the child drops its views
        assert reports.get(timeout=QUEUE_TIMEOUT) == workers.checksum(workers.payload(3, nbytes))
        children.join()
