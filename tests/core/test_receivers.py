"""Receivers in line: first come, first served; a send hands its message to
the oldest waiter and wakes it alone; recv_async without a thread per call;
cancel that follows concurrent.futures; a waiter that dies is removed and a
message handed to it goes back to the head of its key."""
import concurrent.futures as cf
import os
import signal
import threading
import time

import numpy as np
import pytest

import shmrdv

from .. import workers
from ..conftest import MiB, wait_for

pytestmark = pytest.mark.timeout(120)


def one(v):
    return np.array([v], dtype=np.int64)


def waiters(rdv):
    return rdv.stats().waiters


def stopped(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def test_waiters_across_processes_are_served_in_arrival_order(rdv, children):
    queue = children.context.Queue()
    procs = []
    for i in range(4):
        procs.append(children.start(workers.recv_in_line, rdv.name, "fifo", queue))
        assert queue.get(timeout=30)[0] == "ready"
        wait_for(lambda: waiters(rdv) == i + 1, f"waiter {i} in line")
    for v in range(4):
        rdv.send("fifo", one(v))
    got = {}
    for _ in range(4):
        _, pid, value = queue.get(timeout=30)
        got[pid] = value
    assert [got[p.pid] for p in procs] == [0, 1, 2, 3]
    children.join()


def test_a_send_wakes_one_of_ten_waiters_and_the_others_stay_in_line(rdv, children):
    queue = children.context.Queue()
    for i in range(10):
        children.start(workers.recv_in_line, rdv.name, "ten", queue)
    for _ in range(10):
        assert queue.get(timeout=30)[0] == "ready"
    wait_for(lambda: waiters(rdv) == 10, "ten waiters")
    rdv.send("ten", one(7))
    assert queue.get(timeout=30)[2] == 7
    time.sleep(0.2)
    assert queue.empty() and waiters(rdv) == 9
    for v in range(9):
        rdv.send("ten", one(v))
    assert sorted(queue.get(timeout=30)[2] for _ in range(9)) == list(range(9))
    children.join()


def test_threads_in_one_process_are_served_in_arrival_order(rdv):
    got = {}

    def take(i):
        got[i] = int(rdv.recv("t", timeout=30)[0])

    threads = []
    for i in range(5):
        t = threading.Thread(target=take, args=(i,))
        t.start()
        threads.append(t)
        wait_for(lambda: waiters(rdv) == i + 1, f"thread {i} in line")
    for v in range(5):
        rdv.send("t", one(v))
    for t in threads:
        t.join(30)
    assert got == {i: i for i in range(5)}


def test_recv_async_uses_one_thread_however_many_are_pending(rdv):
    before = threading.active_count()
    futs = [rdv.recv_async(f"k{i % 100}") for i in range(10_000)]
    assert threading.active_count() <= before + 1
    assert waiters(rdv) == 10_000
    for i in range(100):
        rdv.send(f"k{i}", one(i))
    done = [f for f in futs if f.done()]
    assert len(done) == 100 and all(int(f.result()[0]) == futs.index(f) % 100 for f in done)
    cancelled = [f.cancel() for f in futs if not f.done()]
    assert all(cancelled) and len(cancelled) == 9_900
    assert waiters(rdv) == 0 and rdv.stats().keys == 0


def test_a_future_served_by_a_send_in_this_process_is_done_when_send_returns(rdv):
    for i in range(400):
        fut = rdv.recv_async("mine")
        rdv.send("mine", one(i))
        assert fut.done()
        assert fut.cancel() is False  # handed over: cancel cannot withdraw it
        assert int(fut.result()[0]) == i


def test_cancel_follows_concurrent_futures(rdv):
    futs = [rdv.recv_async("c") for _ in range(50)]
    seen = []
    futs[0].add_done_callback(seen.append)
    assert futs[0].cancel() and futs[0].cancelled() and futs[0].done()
    assert seen == [futs[0]]
    assert futs[0].cancel()  # cancelled already: True again
    with pytest.raises(cf.CancelledError):
        futs[0].result()
    for f in futs[1:]:
        assert f.cancel()
    done, not_done = cf.wait(futs, timeout=5)
    assert len(done) == 50 and not not_done
    assert len(list(cf.as_completed(futs, timeout=5))) == 50
    rdv.send("c", one(1))  # nobody in line now: it stays queued
    assert rdv.stats().pending_messages == 1


@pytest.mark.timeout(60)
def test_ctrl_c_in_result_leaves_the_line(rdv):
    """A KeyboardInterrupt while result() waits takes the future out of
    line, as a cancelled await does: the next message stays queued for
    whoever asks next, and a result() timeout (TimeoutError) keeps it."""
    fut = rdv.recv_async("c")
    with pytest.raises(cf.TimeoutError):
        fut.result(timeout=0.01)
    assert rdv.stats().waiters == 1  # a timeout of result() is no cancel
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        fut.result()
    assert fut.cancelled() and rdv.stats().waiters == 0
    rdv.send("c", one(3))
    assert int(rdv.recv("c", timeout=5)[0]) == 3


def test_close_cancels_every_pending_future(rdv_name):
    rdv = shmrdv.Rendezvous(rdv_name, create=True)
    try:
        futs = [rdv.recv_async(f"close-{i % 10}") for i in range(2_000)]
        rdv.close()
        done, not_done = cf.wait(futs, timeout=5)
        assert not not_done and all(f.cancelled() for f in futs)
    finally:
        rdv.close()
        rdv.unlink()


def test_cancel_after_a_send_of_another_process_returns_false_with_the_message(rdv, children):
    queue = children.context.Queue()
    for i in range(20):
        fut = rdv.recv_async("x")
        go = children.context.Event()
        children.start(workers.send_after_go, rdv.name, "x", [i], go, queue)
        go.set()
        assert queue.get(timeout=30) == "sent"
        assert fut.cancel() is False
        assert int(fut.result(timeout=10)[0]) == i
    children.join()


def test_recv_any_takes_one_message_from_one_key(rdv):
    rdv.send("b", one(2))
    assert (lambda kv: (kv[0], int(kv[1][0])))(rdv.recv_any(["a", "b", "c"], timeout=5)) == ("b", 2)
    got = []
    t = threading.Thread(target=lambda: got.append(rdv.recv_any(["a", "b", "c"], timeout=30)))
    t.start()
    wait_for(lambda: waiters(rdv) == 3, "a receiver on three keys")
    rdv.send("c", one(3))
    t.join(30)
    assert got[0][0] == "c" and int(got[0][1][0]) == 3
    assert waiters(rdv) == 0
    rdv.send("a", one(1))  # taken from exactly one key: this one stays
    assert rdv.stats().pending_messages == 1
    with pytest.raises(shmrdv.RendezvousTimeout):
        rdv.recv_any(["nothing", "here"], timeout=0.05)
    with pytest.raises(shmrdv.InvalidArgument, match="distinct"):
        rdv.recv_any(["a", "a"])
    with pytest.raises(shmrdv.InvalidArgument, match="at least one"):
        rdv.recv_any([])


def test_recv_any_is_fair_across_busy_keys(rdv):
    for i in range(100):
        rdv.send("p", one(i))
        rdv.send("q", one(i))
    counts = {"p": 0, "q": 0}
    for _ in range(100):
        key, _ = rdv.recv_any(["p", "q"], timeout=5)
        counts[key] += 1
    assert counts["p"] >= 40 and counts["q"] >= 40, counts


def test_a_killed_waiter_leaves_the_line_and_a_message_handed_to_it_comes_back_first(rdv, children):
    queue = children.context.Queue()
    child = children.start(workers.recv_in_line, rdv.name, "dead", queue)
    assert queue.get(timeout=30)[0] == "ready"
    wait_for(lambda: waiters(rdv) == 1, "the child in line")
    os.kill(child.pid, signal.SIGSTOP)  # it cannot take what it is handed
    wait_for(lambda: stopped(child.pid), "the child stopped")
    try:
        rdv.send("dead", one(1))  # handed to the stopped child
        rdv.send("dead", one(2))  # queued: nobody waits
        assert rdv.stats().pending_messages == 1
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
    assert rdv.collect_garbage() == 1
    assert [int(rdv.recv("dead", timeout=5)[0]) for _ in range(2)] == [1, 2]

    # A killed waiter that was handed nothing just leaves the line.
    child = children.start(workers.recv_in_line, rdv.name, "gone", queue)
    assert queue.get(timeout=30)[0] == "ready"
    wait_for(lambda: waiters(rdv) == 1, "the second child in line")
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    rdv.collect_garbage()
    assert waiters(rdv) == 0
    rdv.send("gone", one(3))
    assert int(rdv.recv("gone", timeout=5)[0]) == 3


def test_ctrl_c_while_in_line_leaves_the_line(rdv):
    def interrupt():
        wait_for(lambda: waiters(rdv) == 1, "the main thread in line")
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    t = threading.Thread(target=interrupt)
    t.start()
    with pytest.raises(KeyboardInterrupt):
        rdv.recv("ctrl-c", timeout=30)
    t.join(10)
    assert waiters(rdv) == 0
    rdv.send("ctrl-c", one(5))
    assert rdv.stats().pending_messages == 1  # nobody took it


def test_give_back_puts_a_view_at_the_head_of_its_key(rdv):
    from shmrdv._binding import ffi, lib

    rdv.send("g", one(1))
    rdv.send("g", one(2))
    info = ffi.new("struct rdv_msg_info *")
    kb = b"g"
    assert lib.rdv_recv(rdv._handle(), kb, 1, 0, info) == 0
    assert lib.rdv_give_back(rdv._handle(), info.payload) == 0
    assert [int(rdv.recv("g", timeout=5)[0]) for _ in range(2)] == [1, 2]


def test_give_back_needs_no_room_and_puts_the_message_first_untouched(rdv_name):
    """A 600 KiB message in a 1 MiB arena, a send of the next one waiting
    for room: give_back puts the message back first all the same, in place."""
    def big(i):
        return np.full(600 * 1024 // 8, i, np.int64)

    with shmrdv.Rendezvous(rdv_name, size=1 * MiB, create=True) as rdv:
        rdv.send("k", big(0))
        view = rdv.recv("k", timeout=5)
        sender = threading.Thread(target=rdv.send, args=("k", big(1)), kwargs={"timeout": 30})
        sender.start()
        time.sleep(0.1)
        assert sender.is_alive()  # no room for it while the first is held
        rdv.give_back(view)
        with pytest.raises(shmrdv.InvalidArgument, match="given back already"):
            rdv.give_back(view)
        del view
        assert rdv.stats().pending_messages == 1
        got = rdv.recv("k", timeout=5)
        assert (got == 0).all()
        del got  # its room goes to the waiting send
        sender.join(30)
        assert not sender.is_alive() and (rdv.recv("k", timeout=5) == 1).all()
        assert rdv.stats().bytes_used == 0


def test_give_back_puts_views_first_in_their_order_or_hands_them_to_waiters(rdv):
    for v in range(4):
        rdv.send("g", one(v))
    views = [rdv.recv("g", timeout=5) for _ in range(3)]
    rdv.give_back(*views[1:])
    rdv.give_back(views[0])  # one by one: the head each time
    del views
    assert [int(rdv.recv("g", timeout=5)[0]) for _ in range(4)] == [0, 1, 2, 3]
    for v in range(2):
        rdv.send("w", one(v))
    taken = [rdv.recv("w", timeout=5) for _ in range(2)]
    waiting = [rdv.recv_async("w") for _ in range(2)]
    wait_for(lambda: waiters(rdv) == 2, "the receivers to wait")
    rdv.give_back(*taken)  # the first to the oldest waiter
    del taken
    assert [int(f.result(timeout=5)[0]) for f in waiting] == [0, 1]


def test_give_back_refuses_what_it_cannot_put_back(rdv):
    with pytest.raises(shmrdv.InvalidArgument, match="arrays a receive returned"):
        rdv.give_back(np.zeros(3))
    with pytest.raises(shmrdv.InvalidArgument, match="1 to 1024 views"):
        rdv.give_back()
    rdv.send("o", one(1))
    with shmrdv.Rendezvous(rdv.name, create=False) as other:
        view = other.recv("o", timeout=5)
        with pytest.raises(shmrdv.InvalidArgument, match="another handle"):
            rdv.give_back(view)
        with pytest.raises(shmrdv.InvalidArgument, match="the same message twice"):
            other.give_back(view, view)
        other.give_back(view)  # untouched by the refusals: still other's to give back
        del view
    rdv.send("p", one(2))
    views = [rdv.recv("o", timeout=5), rdv.recv("p", timeout=5)]
    with pytest.raises(shmrdv.InvalidArgument, match="not of one key; each message was given back on its own"):
        rdv.give_back(*views)
    del views
    assert [int(rdv.recv(k, timeout=5)[0]) for k in "op"] == [1, 2]
    rdv.send("o", one(3))
    view = rdv.recv("o", timeout=5)
    rdv.abort("stop")
    with pytest.raises(shmrdv.Aborted, match="stop"):
        rdv.give_back(view)  # freed: nothing is queued in an aborted rendezvous
    del view
    assert rdv.stats().bytes_used == 0


def test_a_dead_waiter_ahead_in_line_does_not_keep_the_message(rdv, children):
    """A receiver killed while first in line is handed the next message; the
    live receiver behind it gets that message once it has waited a while (it
    reclaims the dead itself), with nobody attaching or collecting garbage."""
    queue = children.context.Queue()
    child = children.start(workers.recv_in_line, rdv.name, "ahead", queue)
    assert queue.get(timeout=30)[0] == "ready"
    wait_for(lambda: waiters(rdv) == 1, "the child in line")
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    got = []
    t = threading.Thread(target=lambda: got.append(int(rdv.recv("ahead", timeout=30)[0])))
    t.start()
    wait_for(lambda: waiters(rdv) == 2, "a live receiver behind the dead one")
    rdv.send("ahead", one(9))  # handed to the dead child, first in line
    t.join(30)
    assert got == [9]


def _no_room(rdv_name):
    """A handle whose 62 home waiter records are in use, in an arena with no
    room for a slab of more: returns (rdv, the futures holding the records)."""
    rdv = shmrdv.Rendezvous(rdv_name, size=64 * 1024, create=True)
    futs = [rdv.recv_async("held") for _ in range(62)]
    rdv.send("fill", np.zeros(60 * 1024, np.uint8))
    assert rdv.stats().largest_free < 4096
    return rdv, futs


def test_no_room_for_a_waiter_record_times_out_or_takes_what_is_queued(rdv_name):
    rdv, futs = _no_room(rdv_name)
    try:
        with pytest.raises(shmrdv.RendezvousTimeout):
            rdv.recv("nothing", timeout=0.2)
        rdv.send("b", one(5))
        key, view = rdv.recv_any(["a", "b"], timeout=5)  # no record needed: a message is there
        assert (key, int(view[0])) == ("b", 5)
        del view
        with pytest.raises(shmrdv.RendezvousError, match="no room in the arena for the record"):
            rdv.recv_async("more").result(timeout=5)
        assert int(rdv.recv_async("fill").result(timeout=5).size) == 60 * 1024
        assert all(f.cancel() for f in futs)
    finally:
        rdv.close()
        rdv.unlink()


def test_a_finished_future_that_is_never_read_releases_its_message(rdv):
    fut = rdv.recv_async("unread")
    rdv.send("unread", np.zeros(1000, np.uint8))
    assert fut.done()
    used = rdv.stats().bytes_used
    del fut
    import gc

    gc.collect()
    assert rdv.stats().bytes_used < used
