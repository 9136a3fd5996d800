"""max_keys is the limit it says: that many keys live at once (with
messages or waiting receivers), one more raises TooManyKeys naming the
limit, and the count stays exact across processes killed while they make
and delete keys."""
import multiprocessing
import os
import random
import threading
import time

import numpy as np
import pytest

import shmrdv

from .. import workers
from ..conftest import MiB, kill_process, segment_path

pytestmark = pytest.mark.timeout(120)


def test_max_keys_keys_and_not_one_more(rdv_name):
    with shmrdv.Rendezvous(rdv_name, size=8 * MiB, max_keys=1024, create=True) as rdv:
        try:
            for i in range(1024):
                rdv.send(f"k{i}", np.zeros(1))
            with pytest.raises(shmrdv.TooManyKeys, match="max_keys keys are live already.*larger max_keys"):
                rdv.send("one-too-many", np.zeros(1))
            stats = rdv.stats()
            assert stats.keys == stats.keys_counted == 1024 and stats.max_keys == 1024
            rdv.send("k7", np.ones(1))  # a key already live takes more messages
            rdv.recv("k0")
            rdv.send("one-more", np.zeros(1))  # a key deleted makes room for one
            with pytest.raises(shmrdv.TooManyKeys):
                rdv.send("and-another", np.zeros(1))
        finally:
            rdv.unlink()


@pytest.mark.parametrize("max_keys", [shmrdv.MAX_KEYS + 1, 2**64], ids=["MAX_KEYS+1", "2**64"])
def test_a_max_keys_past_the_limit_is_refused_and_leaves_nothing(rdv_name, max_keys):
    with pytest.raises(shmrdv.InvalidArgument, match=f"max_keys is at most {shmrdv.MAX_KEYS:,}"):
        shmrdv.Rendezvous(rdv_name, size=4096, max_keys=max_keys)
    assert not os.path.exists(segment_path(rdv_name))


def test_a_create_interrupted_after_its_file_exists_removes_it(rdv_name, monkeypatch):
    """Whatever ends a create between making the file and initialising it
    (here a KeyboardInterrupt from inside the core's call) unlinks the file:
    the next open of the name is not met by a segment never initialised."""
    from shmrdv import segments

    class Interrupting:
        def __getattr__(self, name):
            if name == "rdv_create_flags":
                def interrupted(*args):
                    raise KeyboardInterrupt
                return interrupted
            return getattr(real, name)

    real = segments.lib
    monkeypatch.setattr(segments, "lib", Interrupting())
    with pytest.raises(KeyboardInterrupt):
        shmrdv.Rendezvous(rdv_name, size=4096)
    monkeypatch.undo()
    assert not os.path.exists(segment_path(rdv_name))
    with shmrdv.Rendezvous(rdv_name, size=4096, create=True) as rdv:
        rdv.unlink()


def test_a_waiting_receiver_holds_a_key(rdv_name):
    with shmrdv.Rendezvous(rdv_name, size=4 * MiB, max_keys=2, create=True) as rdv:
        try:
            rdv.send("a", np.zeros(1))
            fut = rdv.recv_async("b")  # waits in line: its key is live
            with pytest.raises(shmrdv.TooManyKeys):
                rdv.send("c", np.zeros(1))
            with pytest.raises(shmrdv.TooManyKeys):
                rdv.recv("c", timeout=0.1)
            assert fut.cancel()
            rdv.send("c", np.zeros(1))
            assert rdv.stats().keys_counted == 2
        finally:
            rdv.unlink()


def test_threads_racing_for_the_last_keys_get_exactly_max_keys(rdv_name):
    with shmrdv.Rendezvous(rdv_name, size=8 * MiB, max_keys=100, create=True) as rdv:
        try:
            admitted, barrier = [], threading.Barrier(4)

            def insert(t):
                barrier.wait()
                for i in range(50):
                    try:
                        rdv.send(f"t{t}-{i}", np.zeros(1))
                        admitted.append(1)
                    except shmrdv.TooManyKeys:
                        pass

            threads = [threading.Thread(target=insert, args=(t,)) for t in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert len(admitted) == 100
            assert rdv.stats().keys == rdv.stats().keys_counted == 100
        finally:
            rdv.unlink()


@pytest.mark.slow
def test_the_count_survives_processes_killed_while_they_make_and_delete_keys(rdv_name):
    ctx = multiprocessing.get_context("spawn")
    rng = random.Random(7)
    with shmrdv.Rendezvous(rdv_name, size=8 * MiB, max_keys=300, create=True) as rdv:
        try:
            for round_ in range(12):
                ready = [ctx.Event() for _ in range(2)]
                procs = [ctx.Process(target=workers.key_churn, args=(rdv_name, w, ready[w])) for w in range(2)]
                for p in procs:
                    p.start()
                for r in ready:
                    assert r.wait(60)
                time.sleep(rng.uniform(0.05, 0.3))
                for p in procs:
                    kill_process(p)
                rdv.collect_garbage()
                stats = rdv.stats()
                assert stats.keys_counted == stats.keys, (round_, stats)
            # Every key the dead left behind (their last sends) drains away,
            # and the count with them: the limit is whole again.
            for key in [k.name for k in rdv.keys()]:
                while rdv.try_recv(key) is not None:
                    pass
            stats = rdv.stats()
            assert stats.keys == stats.keys_counted == 0 and stats.bytes_used == 0
            for i in range(300):
                rdv.send(f"after-{i}", np.zeros(1))
            with pytest.raises(shmrdv.TooManyKeys):
                rdv.send("one-too-many", np.zeros(1))
        finally:
            rdv.unlink()


def test_processes_racing_for_the_last_keys_get_exactly_max_keys(rdv_name):
    # Each process counts in its own entry: the admission near the limit
    # must sum the others' counts, in progress ones included.
    ctx = multiprocessing.get_context("spawn")
    with shmrdv.Rendezvous(rdv_name, size=8 * MiB, max_keys=100, create=True) as rdv:
        try:
            start, queue = ctx.Event(), ctx.Queue()
            procs = [ctx.Process(target=workers.insert_keys, args=(rdv_name, w, 60, start, queue)) for w in range(3)]
            for p in procs:
                p.start()
            time.sleep(0.5)
            start.set()
            admitted = sum(queue.get(timeout=60) for _ in procs)
            for p in procs:
                p.join(30)
            assert admitted == 100
            assert rdv.stats().keys == rdv.stats().keys_counted == 100
        finally:
            rdv.unlink()
