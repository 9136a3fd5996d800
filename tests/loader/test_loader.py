"""shmrdv.loader.DataLoader against torch's DataLoader on the same dataset,
sampler and seed: order and content (map-style and iterable, with and
without drop_last, nested batches, custom collate_fn, batch_size=None),
seeds and worker info, epochs (persistent or not), in_order=False, start
methods, output="numpy", zero-copy writable batches, back-pressure, and
the trainer's memory. Every test has a timeout and leaves no process, fd
or /dev/shm entry behind (the ``no_leaks`` fixture)."""
import contextlib
import gc
import mmap
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import BatchSampler, DataLoader as TorchLoader, SequentialSampler  # noqa: E402

from shmrdv.loader import DataLoader  # noqa: E402
from tests.loader import loader_datasets as ds  # noqa: E402
from tests.conftest import child_processes  # noqa: E402
from tests.loader.loader_late_torch import LateTorch  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _multiprocessing_helper(pid: str) -> bool:
    # spawn and forkserver start helpers of multiprocessing's own that live
    # as long as this process (its resource tracker, its fork server)
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return b"resource_tracker" in cmdline or b"forkserver" in cmdline


def _children() -> set:
    return {pid for pid, state in child_processes() if state != "Z" and not _multiprocessing_helper(str(pid))}


def _shm() -> set:
    return {e for e in os.listdir("/dev/shm") if e.startswith(f"shmrdv-private-{os.getpid()}-")}


def _fds() -> int:
    """Open fds but torch's shared-memory storages: torch keeps one for each
    tensor it moved there (to pickle it for a spawned worker) while the
    tensor lives, and a test's dataset outlives its test."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += not os.readlink(f"/proc/self/fd/{fd}").startswith("/dev/shm/torch_")
        except OSError:  # the fd of the listing itself, closed by now
            pass
    return count


@contextlib.contextmanager
def nothing_left_behind():
    """No worker process, fd or segment of ours outlives the block (once its loaders are dropped)."""
    # multiprocessing's own helpers (and their fds) live as long as this
    # process: started before counting
    multiprocessing.resource_tracker.ensure_running()
    multiprocessing.forkserver.ensure_running()
    gc.collect()
    children, fds = _children(), _fds()
    yield
    gc.collect()
    deadline = time.monotonic() + 10
    while _children() - children and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _children() - children == set(), "worker processes left behind"
    assert _shm() == set(), "segments left in /dev/shm"
    assert _fds() <= fds, "fds left open"


@pytest.fixture(autouse=True)
def no_leaks():
    with nothing_left_behind():
        yield


def same(a, b) -> bool:
    """Equal values of equal types, structure included (tensor dtypes too)."""
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and bool(torch.equal(a, b)))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def both(dataset, seed: int = 0, epochs: int = 1, **kwargs):
    """Every batch of ``epochs`` epochs from torch's DataLoader and from ours, each after seeding torch alike."""
    out = []
    for cls in (TorchLoader, DataLoader):
        torch.manual_seed(seed)
        extra = {} if cls is TorchLoader else {"output": "torch"}
        gen = kwargs.pop("generator_seed", None)
        if gen is not None:
            kwargs["generator"] = torch.Generator().manual_seed(gen)
        loader = cls(dataset, **kwargs, **extra)
        if gen is not None:
            kwargs["generator_seed"] = gen
            del kwargs["generator"]
        out.append([list(loader) for _ in range(epochs)])
        del loader
    return out


def assert_same(theirs, ours) -> None:
    assert len(theirs) == len(ours)
    for epoch, (t, o) in enumerate(zip(theirs, ours)):
        assert len(t) == len(o), f"epoch {epoch}: {len(t)} batches from torch, {len(o)} from shmrdv"
        for i, (a, b) in enumerate(zip(t, o)):
            assert same(a, b), f"epoch {epoch} batch {i}:\ntorch  {a}\nshmrdv {b}"


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kwargs", [
    dict(batch_size=4),
    dict(batch_size=5, drop_last=True),
    dict(batch_size=4, shuffle=True),
    dict(batch_size=3, shuffle=True, drop_last=True, generator_seed=7),
    dict(batch_size=None),
    dict(batch_size=None, shuffle=True),
], ids=["b4", "b5-drop", "b4-shuffle", "b3-shuffle-drop-gen", "nobatch", "nobatch-shuffle"])
def test_map_style_nested_like_torch(workers, kwargs):
    theirs, ours = both(ds.Nested(), num_workers=workers, **kwargs)
    assert_same(theirs, ours)


def test_batch_sampler_and_sampler_like_torch():
    sampler = BatchSampler(SequentialSampler(range(37)), 6, drop_last=False)
    assert_same(*both(ds.Squares(), batch_sampler=sampler, num_workers=2))
    assert_same(*both(ds.Squares(), sampler=list(range(36, -1, -3)), batch_size=4, num_workers=2))


@pytest.mark.parametrize("workers", [0, 2, 3])
@pytest.mark.parametrize("kwargs", [dict(batch_size=4), dict(batch_size=4, drop_last=True), dict(batch_size=None)],
                         ids=["b4", "b4-drop", "nobatch"])
def test_iterable_sharded_like_torch(workers, kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns of 3 workers on 2 CPUs
        assert_same(*both(ds.Shards(), num_workers=workers, **kwargs))


@pytest.fixture
def exit_codes(monkeypatch):
    """pid -> exit code of every worker process a loader closes, in order."""
    codes = {}
    real_close = multiprocessing.process.BaseProcess.close

    def close(process):
        codes[process.pid] = process.exitcode
        real_close(process)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "close", close)
    return codes


def test_an_iterable_worker_that_ran_out_is_stopped_not_killed(exit_codes):
    # Its END comes while tasks are still queued for it; the stop sent then
    # must survive those tasks being taken back when the epoch ends.
    for _ in range(10):
        assert len(list(DataLoader(ds.Shards(), batch_size=7, num_workers=1, prefetch_factor=8))) == 3
    assert list(exit_codes.values()) == [0] * 10


def test_taking_back_queued_tasks_keeps_a_stop_already_sent(exit_codes):
    it = iter(DataLoader(ds.Slow(0.5), batch_size=None, num_workers=1))
    it.workers.stop(0)  # as when its END arrives, while it is busy with batch 0 ...
    it.workers.take_back_tasks()  # ... and the epoch ends
    del it
    assert list(exit_codes.values()) == [0]


def test_len_like_torch():
    for kwargs in (dict(batch_size=4), dict(batch_size=4, drop_last=True), dict(batch_size=None)):
        assert len(DataLoader(ds.Squares(), **kwargs)) == len(TorchLoader(ds.Squares(), **kwargs))
        assert len(DataLoader(ds.Sized(), **kwargs)) == len(TorchLoader(ds.Sized(), **kwargs))


def test_seeds_and_worker_info_like_torch():
    theirs, ours = both(ds.Random(), seed=123, batch_size=2, num_workers=2, shuffle=True)
    assert_same(theirs, ours)
    assert {int(w) for batch in ours[0] for w in batch[:, 3]} == {0, 1}


def test_worker_init_fn_runs_in_each_worker():
    out = list(DataLoader(ds.InitSeen(), batch_size=None, num_workers=2, worker_init_fn=ds.record_init))
    assert sorted(int(x) for x in out) == [0, 0, 1, 1]


@pytest.mark.parametrize("persistent", [False, True])
def test_epochs_like_torch(persistent):
    theirs, ours = both(ds.Squares(), epochs=3, batch_size=4, shuffle=True, num_workers=2,
                        persistent_workers=persistent, generator_seed=3)
    assert_same(theirs, ours)


@pytest.mark.parametrize("persistent", [False, True])
def test_early_break_then_a_whole_epoch(persistent):
    loader = DataLoader(ds.Squares(), batch_size=4, num_workers=2, persistent_workers=persistent)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    assert_same([list(TorchLoader(ds.Squares(), batch_size=4))], [list(loader)])
    it = iter(loader)
    next(it)
    del it
    assert_same([list(TorchLoader(ds.Squares(), batch_size=4))], [list(loader)])
    loader.close()


def test_persistent_iterable_restarts_each_epoch():
    assert_same(*both(ds.Shards(), epochs=2, batch_size=4, num_workers=2, persistent_workers=True))


def test_custom_collate_keeps_arrays_arrays():
    theirs, ours = both(ds.Squares(), batch_size=5, num_workers=2, collate_fn=ds.numpy_collate)
    assert_same(theirs, ours)
    assert isinstance(ours[0][0]["x"], np.ndarray) and ours[0][0]["x"].flags.writeable


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_start_methods(method):
    assert_same(*both(ds.Squares(), batch_size=4, shuffle=True, num_workers=2, multiprocessing_context=method))


def test_numpy_output():
    ours = list(DataLoader(ds.Squares(), batch_size=4, num_workers=2, output="numpy"))
    theirs = list(TorchLoader(ds.Squares(), batch_size=4))
    for (x, y), (tx, ty) in zip(ours, theirs):
        assert type(x) is np.ndarray and type(y) is np.ndarray
        assert np.array_equal(x, tx.numpy()) and x.dtype == tx.numpy().dtype and np.array_equal(y, ty.numpy())


def test_in_order_false_does_not_wait_for_a_slow_batch():
    loader = DataLoader(ds.Slow(2.0), batch_size=1, num_workers=2, in_order=False)
    first = [int(b) for b in loader]
    assert sorted(first) == list(range(8))
    assert first[0] != 0  # batch 0 took 2 s; the others came first
    assert [int(b) for b in DataLoader(ds.Slow(0.3), batch_size=1, num_workers=2)] == list(range(8))


def test_batches_are_zero_copy_writable_and_stay_valid():
    loader = DataLoader(ds.Big(1 << 20, n=6), batch_size=2, num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept = list(loader)
    del loader
    gc.collect()
    for i, batch in enumerate(kept):
        assert batch.shape == (2, 1 << 18) and float(batch[1, -1]) == 2 * i + 1  # valid after the loader is gone
        batch.add_(1)  # writable: the trainer's own
        assert float(batch[0, 0]) == 2 * i + 1
    arrays = list(DataLoader(ds.Big(4096, n=4), batch_size=2, num_workers=1, output="numpy"))
    assert all(a.flags.writeable and not a.flags.owndata for a in arrays)


def test_bfloat16_and_requires_grad_samples():
    class Grad(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.full((2,), float(i), requires_grad=True).to(torch.bfloat16)

    out = list(DataLoader(Grad(), batch_size=2, num_workers=1, multiprocessing_context="fork"))
    assert out[1].dtype == torch.bfloat16 and out[1].tolist() == [[2.0, 2.0], [3.0, 3.0]]


def test_prefetch_is_bounded_by_prefetch_factor():
    counts = np.frombuffer(mmap.mmap(-1, 16), np.int64)  # shared with forked workers, a slot each

    class Counted(torch.utils.data.Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, i):
            counts[torch.utils.data.get_worker_info().id] += 1
            return np.array([i])

    loader = DataLoader(Counted(), batch_size=1, num_workers=2, prefetch_factor=3, multiprocessing_context="fork")
    it = iter(loader)
    for consumed in range(1, 6):
        next(it)
        time.sleep(0.3)  # a slow trainer: the workers wait for it
        assert consumed <= counts.sum() <= consumed + 3 * 2
    del it


def test_trainer_memory_does_not_grow():
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    loader = DataLoader(ds.Big(1 << 20, n=400), batch_size=None, num_workers=2, persistent_workers=True)
    it = iter(loader)
    for _ in range(40):
        next(it)
    before = rss()
    for batch in it:
        float(batch[0])
    del batch
    # 360 more batches of 1 MiB went through; the trainer's pages are the arena's, reused
    assert rss() - before < 64 << 20
    loader.close()


def test_the_arena_is_mapped_in_as_batches_reach_it():
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    loader = DataLoader(ds.Big(1 << 20, n=8), batch_size=None, num_workers=2)
    try:
        before = rss()
        it = iter(loader)
        float(next(it)[0])
        assert it.workers.rdv.stats().prefault is False and loader.shm_size == 256 << 20
        # the 256 MiB arena is reserved, but not mapped in ahead of the batches (that would delay the first one)
        assert rss() - before < 64 << 20
        del it
    finally:
        loader.close()


def test_progress_bar(capsys, monkeypatch):
    assert len(list(DataLoader(ds.Squares(), batch_size=4, num_workers=1, progress=True))) == 10
    monkeypatch.setitem(__import__("sys").modules, "tqdm", None)  # without tqdm: a line on stderr
    list(DataLoader(ds.Squares(), batch_size=4, progress=True))
    assert "batches/s" in capsys.readouterr().err


def test_arguments_checked_like_torch():
    for kwargs, word in ((dict(num_workers=-1), "num_workers"), (dict(timeout=-1), "timeout"),
                         (dict(prefetch_factor=2), "prefetch_factor"), (dict(persistent_workers=True), "persistent"),
                         (dict(batch_size=None, drop_last=True), "drop_last"),
                         (dict(sampler=[0], shuffle=True), "shuffle"),
                         (dict(batch_sampler=[[0]], batch_size=2), "batch_sampler"),
                         (dict(num_workers=1, multiprocessing_context="nope"), "nope"),
                         (dict(multiprocessing_context="fork"), r"multi-process loading \(num_workers > 0\)")):
        with pytest.raises(ValueError, match=word):
            DataLoader(ds.Squares(), **kwargs)
        with pytest.raises(ValueError, match=word):
            TorchLoader(ds.Squares(), **kwargs)
    for timeout in (float("nan"), True):  # which torch takes, to wait forever or for a second
        with pytest.raises(ValueError, match="timeout"):
            DataLoader(ds.Squares(), timeout=timeout)
    with pytest.raises(ValueError, match="output"):
        DataLoader(ds.Squares(), output="jax")
    with pytest.raises(ValueError, match="shuffle"):
        DataLoader(ds.Shards(), shuffle=True)


def test_a_dropped_batch_frees_its_memory_at_once():
    gc.disable()  # no cycle collector to help: reference counting alone frees a batch
    try:
        loader = DataLoader(ds.Nested(), batch_size=4, num_workers=1, prefetch_factor=1)
        it = iter(loader)
        batch = next(it)
        rdv = it.workers.rdv
        time.sleep(0.5)  # the worker has written the one batch it may be ahead
        held = rdv.stats().bytes_used
        del batch
        assert rdv.stats().bytes_used < held
        del it, rdv
        loader.close()
    finally:
        gc.enable()


def test_close_stops_the_workers_of_a_live_iterator():
    loader = DataLoader(ds.Squares(), batch_size=4, num_workers=2)
    it = iter(loader)
    kept = next(it)
    pids = [p.pid for p in it.workers.procs]
    loader.close()
    assert not any(os.path.exists(f"/proc/{p}") for p in pids)
    with pytest.raises(RuntimeError, match="closed"):
        next(it)
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)
    assert kept[1].tolist() == [0, 1, 2, 3]  # delivered batches stay valid


@pytest.mark.slow
def test_a_worker_whose_dataset_imports_torch_late_is_torch_s_worker():
    # the dataset's module imports no torch; its __getitem__ does, in a spawned worker
    out = list(DataLoader(LateTorch(), batch_size=None, num_workers=2, multiprocessing_context="spawn"))
    theirs = list(TorchLoader(LateTorch(), batch_size=None, num_workers=2, multiprocessing_context="spawn"))
    assert [o[:2] for o in out] == [t[:2] for t in theirs] == [[0, 1], [1, 1], [0, 1], [1, 1]]


def test_two_live_iterators_of_one_loader_keep_their_own_batches():
    loader = DataLoader(ds.Squares(), batch_size=4, shuffle=True, num_workers=2,
                        generator=torch.Generator().manual_seed(5))
    theirs = TorchLoader(ds.Squares(), batch_size=4, shuffle=True, num_workers=2,
                         generator=torch.Generator().manual_seed(5))  # its workers draw when iter() primes them, as ours
    expect_a, expect_b = map(list, zip(*zip(theirs, theirs)))  # torch's, interleaved the same way
    a, b = iter(loader), iter(loader)
    got_a, got_b = [], []
    for x, y in zip(a, b):  # interleaved, as zip(loader, loader) does
        got_a.append(x)
        got_b.append(y)
    assert_same([expect_a, expect_b], [got_a, got_b])
    del a, b


def test_strings_of_tuple_samples_and_mixed_numbers_like_torch():
    assert_same(*both(ds.Records(), batch_size=4, num_workers=2))
    assert_same(*both(ds.Squares(), batch_size=4, num_workers=2, collate_fn=ds.tuple_collate))


@pytest.mark.parametrize("workers, method", [(0, None), (2, "fork"), (2, "spawn")])
@pytest.mark.parametrize("batch_size", [2, None])
def test_named_tuples_made_in_a_class_body_like_torch(workers, method, batch_size):
    theirs = list(TorchLoader(ds.Pairs(), batch_size=batch_size))  # torch's workers cannot pickle them
    ours = list(DataLoader(ds.Pairs(), batch_size=batch_size, num_workers=workers, multiprocessing_context=method))
    assert_same([theirs], [ours])
    assert type(ours[0]) is ds.Pairs.Pair and type(ours[0].inner) is ds.Pairs.Inner


@pytest.mark.parametrize("workers", [0, 2])
def test_named_tuple_classes_of_one_name_and_fields_stay_apart(workers):
    dataset = ds.Points()
    ours = list(DataLoader(dataset, batch_size=None, num_workers=workers))
    assert [type(p) for p in ours] == [dataset.kinds[i % 2] for i in range(6)]
    assert [tuple(p) for p in ours] == [(i, -i) for i in range(6)]


def test_tensor_chunks_as_sampler_indices():
    chunks = list(torch.arange(5).split(2))  # the last chunk has one element: still a batch of one
    # torch's own workers would pass these tensors through fds of theirs: compare with its one process
    theirs = list(TorchLoader(ds.Squares(), batch_sampler=chunks))
    assert_same([theirs], [list(DataLoader(ds.Squares(), batch_sampler=chunks, num_workers=2))])


def test_a_persistent_map_style_dataset_is_never_iterated():
    assert_same(*both(ds.MapWithIter(), epochs=2, batch_size=2, num_workers=2, persistent_workers=True))


def test_a_temporary_persistent_loader_works():
    batch = next(iter(DataLoader(ds.Squares(), batch_size=4, num_workers=2, persistent_workers=True)))
    assert batch[1].tolist() == [0, 1, 2, 3]


def test_loader_limits_are_checked_when_it_is_made():
    with pytest.raises(ValueError, match="shm_size"):
        DataLoader(ds.Squares(), num_workers=1, shm_size=1000)
    with pytest.raises(ValueError, match="num_workers=200"):
        DataLoader(ds.Squares(), num_workers=200)
    with pytest.warns(UserWarning, match="pin_memory"):
        DataLoader(ds.Squares(), pin_memory=True)


def test_torch_s_default_collate_passed_explicitly_is_the_built_in_one():
    from torch.utils.data import default_collate, default_convert

    assert DataLoader(ds.Nested(), batch_size=4, collate_fn=default_collate).collate_fn is None
    assert DataLoader(ds.Nested(), batch_size=4, collate_fn=default_convert).collate_fn is default_convert
    assert_same(*both(ds.Nested(), batch_size=4, num_workers=2, collate_fn=default_collate))
