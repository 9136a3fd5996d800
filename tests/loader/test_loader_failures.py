"""shmrdv.loader when things go wrong: an exception in a worker (raised in
the trainer with the worker, the batch and the traceback), a worker killed
by SIGKILL, a segfault or an exit (raised within a second, naming worker,
pid, signal and batch), timeout, an unshippable sample, a batch too big for
the loader's memory, a failing worker_init_fn, Ctrl-C, and the trainer
itself killed (its workers exit by themselves). Nothing hangs (a timeout on
every test), nothing leaks, batches already delivered stay valid."""
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import shmrdv  # noqa: E402
from shmrdv.loader import DataLoader, LoaderTimeout, WorkerDied, WorkerError  # noqa: E402
from tests.loader import loader_datasets as ds  # noqa: E402
from tests.loader.test_loader import _children, no_leaks  # noqa: E402,F401  (the same leak checks)

pytestmark = pytest.mark.timeout(120)


class SlowEach(torch.utils.data.Dataset):
    """Every item takes ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        time.sleep(self.delay)
        return np.array([i])


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_exception_in_a_worker_is_raised_with_its_traceback(method):
    loader = DataLoader(ds.Failing("value"), batch_size=None, num_workers=2, multiprocessing_context=method)
    it = iter(loader)
    got = [int(next(it)) for _ in range(5)]
    with pytest.raises(ValueError) as err:
        next(it)
    msg = str(err.value)
    assert "Caught ValueError in DataLoader worker 1 (pid" in msg and "while producing batch 5" in msg
    assert "sample 5 is broken" in msg and "in fail" in msg and "loader_datasets.py" in msg  # the traceback
    assert (err.value.worker_id, err.value.batch_index) == (1, 5)
    assert got + [int(b) for b in it] == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]  # the epoch goes on, as in torch


def test_exception_of_a_type_of_its_own_is_a_worker_error():
    with pytest.raises(WorkerError, match=r"(?s)Caught DatasetBroke .*custom failure") as err:
        list(DataLoader(ds.Failing("custom"), batch_size=2, num_workers=1))
    assert err.value.exc_type == "DatasetBroke" and err.value.batch_index == 2


@pytest.mark.parametrize("how,signame", [("sigkill", "SIGKILL"), ("segfault", "SIGSEGV"), ("exit", None)])
def test_a_dead_worker_is_named_within_a_second(how, signame):
    loader = DataLoader(ds.Failing(how), batch_size=None, num_workers=2)
    it = iter(loader)
    kept = [next(it) for _ in range(5)]
    start = time.monotonic()
    with pytest.raises(WorkerDied) as err:
        next(it)
    assert time.monotonic() - start < 1.0
    e = err.value
    assert e.worker_id == 1 and e.batch_index == 5 and isinstance(e.worker_pid, int)
    assert f"worker 1 (pid {e.worker_pid})" in str(e) and "while producing batch 5" in str(e)
    if signame is None:
        assert e.exitcode == 3 and "exit code 3" in str(e)
    else:
        assert e.signal == getattr(signal, signame) and signame in str(e)
    with pytest.raises(WorkerDied):
        next(it)  # the iterator stays failed
    del it, loader
    assert [int(b) for b in kept] == [0, 1, 2, 3, 4]  # delivered batches stay valid


def test_worker_killed_from_outside_while_the_trainer_waits():
    loader = DataLoader(ds.Failing("hang", bad=1, n=4), batch_size=None, num_workers=2)
    it = iter(loader)
    assert int(next(it)) == 0
    pid = it.workers.procs[1].pid
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerDied, match=f"pid {pid}.*SIGKILL.*batch 1"):
        next(it)
    assert time.monotonic() - start < 1.0


def test_timeout_like_torch():
    loader = DataLoader(ds.Slow(30.0), batch_size=None, num_workers=1, timeout=0.3)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after 0.3 seconds"):
        next(iter(loader))
    assert time.monotonic() - start < 5


def test_after_a_timeout_the_iterator_goes_on_like_torch():
    it = iter(DataLoader(ds.Slow(1.0, n=3), batch_size=None, num_workers=1, timeout=0.3))
    timeouts = 0
    while True:
        try:
            first = next(it)
            break
        except LoaderTimeout:
            timeouts += 1
            assert timeouts < 20
    assert timeouts >= 1 and int(first) == 0 and [int(b) for b in it] == [1, 2]


def test_unshippable_sample_names_its_type():
    with pytest.raises(TypeError, match="default_collate: batch must contain"):
        list(DataLoader(ds.Unshippable(), batch_size=2, num_workers=1))
    with pytest.raises(TypeError, match=r"cannot ship a builtins.object"):
        list(DataLoader(ds.Unshippable(), batch_size=None, num_workers=1))


def test_a_batch_bigger_than_the_loader_memory_says_shm_size():
    with pytest.raises(WorkerError, match="shm_size"):
        list(DataLoader(ds.Big(8 << 20, n=2), batch_size=2, num_workers=1, shm_size=4 << 20))


def test_failing_worker_init_fn():
    with pytest.raises(RuntimeError, match=r"init of worker 0 failed") as err:
        list(DataLoader(ds.Squares(), batch_size=4, num_workers=1, worker_init_fn=ds.failing_init))
    assert "with no batch in hand" in str(err.value)


def test_an_iterator_that_fails_to_start_in_process_leaves_no_error_behind(monkeypatch):
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(RuntimeError, match=r"iter\(\) of this dataset failed"):
        iter(DataLoader(ds.FailingIter(), num_workers=0))
    gc.collect()
    assert [str(u.exc_value) for u in unraisable] == []


@pytest.mark.parametrize("failure", ["a sample", "worker_init_fn"])
def test_a_failed_iterator_frees_its_workers_and_memory_without_the_gc(failure):
    gc.disable()  # reference counting alone: no cycle may hold the iterator
    try:
        init = ds.failing_init if failure == "worker_init_fn" else None
        loader = DataLoader(ds.Failing("custom"), batch_size=2, num_workers=2, worker_init_fn=init)
        it = iter(loader)
        pids, name = {p.pid for p in it.workers.procs}, loader._owner.arena.name
        try:
            for _ in it:
                pass
        except RuntimeError:  # a WorkerError, or the RuntimeError of the worker_init_fn
            pass
        del it, loader
        assert not pids & _children(), "the failed iterator's workers are still running"
        assert not os.path.exists(f"/dev/shm/shmrdv-{name}"), "the failed iterator's memory is still reserved"
    finally:
        gc.enable()


def _offered(name: str) -> bool:
    """Whether the loader's arena, a private rendezvous, can still be attached."""
    try:
        shmrdv.Rendezvous(name, create=False).close()
    except FileNotFoundError:
        return False
    return True


def test_forked_workers_leave_the_trainer_s_garbage_to_the_trainer(capfd):
    gc.disable()
    try:
        first = DataLoader(ds.Failing("custom"), batch_size=None, num_workers=2)
        it = iter(first)
        assert [int(next(it)) for _ in range(5)] == [0, 1, 2, 3, 4]
        with pytest.raises(WorkerError):
            next(it)  # batch 5: the epoch goes on, as in torch
        pids, name = {p.pid for p in it.workers.procs}, first._owner.arena.name
        # The iterator and its loader's memory left in a cycle (as a traceback
        # that holds them makes one), not collected yet ...
        cycle = [it]
        cycle.append(cycle)
        left = weakref.ref(it)
        del it, first, cycle
        for _ in range(3):  # ... when other workers fork, and collect it (collect_garbage)
            assert len(list(DataLoader(ds.Squares(), batch_size=4, num_workers=2,
                                       worker_init_fn=ds.collect_garbage))) == 10
        assert pids <= _children(), "a forked worker stopped the trainer's workers"
        assert _offered(name), "a forked worker closed the trainer's memory"
        assert [int(b) for b in left()] == [6, 7, 8, 9, 10, 11], "a forked worker took the trainer's batches"
    finally:
        gc.enable()
    gc.collect()  # the trainer's own collector frees it
    assert not pids & _children() and not _offered(name)
    err = capfd.readouterr().err
    assert "can only join a child process" not in err and "Exception ignored" not in err, err


def test_ctrl_c_in_the_trainer_stops_the_workers():
    loader = DataLoader(ds.Slow(30.0), batch_size=None, num_workers=2)
    it = iter(loader)
    pids = [p.pid for p in it.workers.procs]
    old = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            next(it)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    del it, loader  # dropping the iterator stops its workers
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_workers_exit_when_the_trainer_is_killed(tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.getcwd()!r})
        from shmrdv.loader import DataLoader
        from tests.loader import loader_datasets as ds
        it = iter(DataLoader(ds.Slow(60.0), batch_size=None, num_workers=2))
        print(*[p.pid for p in it.workers.procs], it.workers.rdv.name, flush=True)
        next(it)
    """))
    trainer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        *pids, name = trainer.stdout.readline().split()
        trainer.kill()
        trainer.wait(10)
        deadline = time.monotonic() + 5
        while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(os.path.exists(f"/proc/{p}") for p in pids), "workers outlived their trainer"
        assert not os.path.exists(f"/dev/shm/shmrdv-{name}"), "the workers leave the trainer's segment behind"
    finally:
        trainer.kill()
        trainer.wait()
        for p in pids:
            try:
                os.kill(int(p), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        if os.path.exists(f"/dev/shm/shmrdv-{name}"):
            os.unlink(f"/dev/shm/shmrdv-{name}")


@pytest.mark.slow
def test_batches_held_past_the_loader_memory_raise_instead_of_hanging():
    loader = DataLoader(ds.Big(1 << 20, n=40), batch_size=None, num_workers=2, shm_size=8 << 20)
    kept = []
    with pytest.raises(RuntimeError, match=r"(?s)cannot write batch \d+.*full \(8388608 bytes: shm_size\)"):
        for batch in loader:
            kept.append(batch)  # a trainer that keeps every batch: the arena fills
    assert 4 <= len(kept) < 8 and all(float(b[0]) == i for i, b in enumerate(kept))
    kept.clear()
    # once they are dropped, the next epoch runs through
    assert sum(1 for _ in DataLoader(ds.Big(1 << 20, n=40), batch_size=None, num_workers=2, shm_size=8 << 20)) == 40


def test_a_failing_worker_init_fn_is_raised_not_a_death():
    loader = DataLoader(ds.Slow(0.5), batch_size=None, num_workers=2, worker_init_fn=ds.init_fails_in_worker_1)
    with pytest.raises(RuntimeError, match="init of worker 1 failed") as err:
        list(loader)
    assert not isinstance(err.value, WorkerDied) and err.value.worker_id == 1


def test_stop_iteration_in_a_map_style_dataset_ends_the_epoch_there_like_torch():
    # torch re-raises the worker's StopIteration, which ends the loop at that batch
    theirs = [int(b) for b in torch.utils.data.DataLoader(ds.StopsAt3(), batch_size=None, num_workers=1)]
    ours = [int(b) for b in DataLoader(ds.StopsAt3(), batch_size=None, num_workers=1)]
    assert ours == theirs == [0, 1, 2]


def test_an_early_break_does_not_wait_for_the_queued_batches():
    slow = iter(DataLoader(SlowEach(0.6), batch_size=None, num_workers=2, prefetch_factor=4))
    next(slow)
    start = time.monotonic()
    workers = slow.workers
    del slow
    assert time.monotonic() - start < 1.5  # the task in hand, not the eight queued
    assert workers.down


def test_ctrl_c_in_the_bookkeeping_ends_the_iterator_cleanly(monkeypatch):
    from shmrdv.loader import batch as wire

    loader = DataLoader(ds.Squares(), batch_size=4, num_workers=2)
    it = iter(loader)
    assert next(it)[1].tolist() == [0, 1, 2, 3]
    real = wire.read
    calls = []

    def interrupted(buf):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(buf)

    monkeypatch.setattr(wire, "read", interrupted)
    pids = [p.pid for p in it.workers.procs]
    with pytest.raises(KeyboardInterrupt):
        next(it)
    with pytest.raises(RuntimeError, match="interrupted"):
        next(it)  # never a batch out of order, never a hang
    assert not any(os.path.exists(f"/proc/{p}") for p in pids)
    monkeypatch.setattr(wire, "read", real)
    assert [b[1].tolist() for b in loader][:2] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # a new epoch is whole


def test_ctrl_c_while_stopping_workers_still_stops_them(monkeypatch):
    loader = DataLoader(SlowEach(5.0), batch_size=None, num_workers=2)
    it = iter(loader)
    procs = list(it.workers.procs)
    pids = [p.pid for p in procs]
    real_join = procs[0].join

    def interrupted_join(timeout=None):  # Ctrl-C, once, while it waits for the workers
        monkeypatch.setattr(procs[0], "join", real_join)
        raise KeyboardInterrupt

    monkeypatch.setattr(procs[0], "join", interrupted_join)
    with pytest.raises(KeyboardInterrupt):
        it.workers.shutdown()
    deadline = time.monotonic() + 5
    while any(os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z" for p in pids) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z" for p in pids)
    del it, loader
