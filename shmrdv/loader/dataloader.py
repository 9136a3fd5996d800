"""``DataLoader``: torch's DataLoader arguments and order, with worker
processes that write each batch straight into shared memory and a trainer
that receives it without a copy.

How one epoch runs (the same bookkeeping as torch's, so that the order of
batches, of samples and of random draws is torch's):
- the trainer draws the epoch's base seed, then hands out tasks (a batch's
  indices, numbered in sampler order) to the workers in turn, at most
  ``prefetch_factor`` per worker ahead of what it has yielded;
- each worker answers its tasks in order on its own result key, so the
  next batch in sampler order is the head of one worker's key: with
  ``in_order`` the trainer waits on that key; without, on any;
- every wait is in slices of ``_SLICE``, between which the trainer checks
  its workers' processes (a death raises within a slice) and the
  ``timeout``.
"""
import itertools
import multiprocessing
import os
import pickle
import sys
import time
import types
import warnings
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np

from ..errors import InvalidArgument, RendezvousTimeout, SharedMemoryFull
from ..limits import MAX_MARKS, MAX_PROCS
from ..rendezvous import Rendezvous
from ..segments import arena_size, memory_full_error, private_name, unlink_segment
from . import batch as wire
from . import sampling
from .failures import LoaderTimeout, worker_died, worker_exception
from .progress import Progress
from .worker import ROOM_WANTED, Config, Fetcher, encode_json, encode_task, result_key, run, task_key

DEFAULT_SHM_SIZE = 256 << 20
"""Bytes of shared memory a loader with workers reserves (``shm_size``)."""
_SLICE = 0.1  # seconds: how soon a dead worker or a timeout is noticed
_STOP_WAIT = 2.0  # seconds a stopping worker gets before it is killed
_FULL_GRACE = 2.0  # seconds a worker we wait for may lack room before that is an error
_MAX_ANY_KEYS = 64  # keys one recv_any takes (in_order=False waits on every worker's)


def _context(multiprocessing_context: Any) -> Any:
    if multiprocessing_context is None:
        return multiprocessing.get_context()
    if isinstance(multiprocessing_context, str):
        if multiprocessing_context not in multiprocessing.get_all_start_methods():
            raise ValueError(f"multiprocessing_context option should specify a valid start method in "
                             f"{multiprocessing.get_all_start_methods()!r}, but got "
                             f"multiprocessing_context={multiprocessing_context!r}")
        return multiprocessing.get_context(multiprocessing_context)
    if not hasattr(multiprocessing_context, "Process"):
        raise TypeError(f"multiprocessing_context option should be a valid context object or a string "
                        f"specifying the start method, but got multiprocessing_context={multiprocessing_context}")
    return multiprocessing_context


def _is_torch_default(collate_fn: Any, auto_collation: bool) -> bool:
    """Whether collate_fn is what torch would use anyway (default_collate
    when batching, default_convert when not), which the built-in path does
    the same way, without torch's shared-memory tensors in a worker copied
    again into the arena."""
    torch = sys.modules.get("torch")
    if torch is None or collate_fn is None:
        return False
    from torch.utils.data._utils import collate as torch_collate

    return collate_fn is (torch_collate.default_collate if auto_collation else torch_collate.default_convert)


class _Settings:
    """What an iterator needs of its loader, copied when it starts (or
    resets): an iterator holds no reference to the loader, as torch's
    does not."""

    def __init__(self, loader: "DataLoader") -> None:
        self.dataset, self.num_workers, self.prefetch_factor = loader.dataset, loader.num_workers, loader.prefetch_factor
        self.in_order, self.persistent_workers, self.timeout = loader.in_order, loader.persistent_workers, loader.timeout
        self.progress, self.index_sampler, self.generator = loader.progress, loader._index_sampler, loader.generator
        self.torch_order, self.as_torch, self.iterable = loader._torch_order, loader._as_torch, loader._iterable
        self.auto_collation, self.collate_fn, self.drop_last = loader._auto_collation, loader.collate_fn, loader.drop_last
        self.worker_init_fn, self.shm_size = loader.worker_init_fn, loader.shm_size
        self.multiprocessing_context = loader.multiprocessing_context
        self.length = loader._length_or_none()
        self.len_reported = loader._len_reported


class _Arena:
    """A loader's shared memory and who uses it: its rendezvous (named
    before it exists, so that workers can start first), the generations of
    worker sets (each iterator's own keys), the producer marks they hold,
    and the worker sets alive. ``release`` frees it all, in the process
    that made the arena only (see ``_Workers.shutdown``)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.name = private_name()
        self.rdv: Optional[Rendezvous] = None
        self.generations = itertools.count()
        self.free_marks = set(range(MAX_MARKS))
        self.workers: "weakref.WeakSet[_Workers]" = weakref.WeakSet()
        self.released = False

    def open(self, size: int) -> Rendezvous:
        if self.released:
            raise RuntimeError("this DataLoader is closed: make a new one")
        if self.rdv is None:
            # Not prefaulted: the trainer wants its first batch, not the whole
            # arena mapped first (256 MiB: ~100 ms of a CPU the starting
            # workers need); each page is faulted in as batches first reach it.
            try:
                self.rdv = Rendezvous(self.name, size=size, create=True, prefault=False)
            except SharedMemoryFull:
                # a memfd: the memory (its cgroup), not /dev/shm, had no room
                raise memory_full_error("DataLoader: cannot reserve its shared memory", size, None,
                                        size_word="shm_size") from None
        return self.rdv

    def release(self) -> None:
        if os.getpid() != self.pid:
            return  # a forked child's copy: the trainer's memory, not the child's to free
        self.released = True
        for workers in list(self.workers):
            workers.shutdown()
        rdv, self.rdv = self.rdv, None
        if rdv is not None:
            rdv.close()
            unlink_segment(self.name)


class _Owner:
    """Held by a loader and by each of its iterators: the arena is released
    once the last of them is gone (or at ``close``)."""

    def __init__(self) -> None:
        self.arena = _Arena()
        self._finalizer = weakref.finalize(self, self.arena.release)

    def close(self) -> None:
        self._finalizer()


class _Workers:
    """The worker processes of one iterator (persistent: of every epoch),
    and their channels: keys of their own generation in the loader's
    rendezvous, so that two live iterators of one loader never meet."""

    def __init__(self, settings: _Settings, arena: _Arena, seed: int) -> None:
        n = settings.num_workers
        self.procs: List[Any] = []
        self.stopped = [False] * n
        self.down = False
        self.trainer_pid = os.getpid()
        self.arena = arena
        self.gen = next(arena.generations)
        self.task_keys = [task_key(self.gen, w) for w in range(n)]
        self.result_keys = [result_key(self.gen, w) for w in range(n)]
        marks = sorted(arena.free_marks)[:n]
        arena.free_marks.difference_update(marks)
        self.marks = marks + [-1] * (n - len(marks))  # a worker past the 64 marks cannot say it lacks room
        ctx = _context(settings.multiprocessing_context)
        # A spawned (or forkserver) worker takes a while to start: the arena
        # is reserved meanwhile, and the worker attaches once it exists. A
        # forked one starts at once and finds it made.
        self.rdv: Optional[Rendezvous] = None if ctx.get_start_method() != "fork" else arena.open(settings.shm_size)
        arena.workers.add(self)
        try:
            for w in range(n):
                cfg = Config(arena.name, self.gen, w, n, settings.dataset, settings.iterable,
                             settings.auto_collation, settings.collate_fn, settings.drop_last, seed,
                             settings.worker_init_fn, os.getpid(), self.marks[w])
                p = ctx.Process(target=run, args=(cfg,), name=f"shmrdv-loader-worker-{w}", daemon=True)
                try:
                    p.start()
                except (TypeError, AttributeError, pickle.PicklingError):
                    method = ctx.get_start_method()
                    if method != "fork":  # torch's warning, which users search for, with what to do
                        warnings.warn(f"Got pickle error when starting DataLoader worker {w}: the {method!r} start "
                                      f"method pickles what a worker starts from (the dataset, collate_fn and "
                                      f"worker_init_fn); define them at the top level of a module, not in a "
                                      f"function, or pass multiprocessing_context='fork'", stacklevel=4)
                    raise
                self.procs.append(p)
            self.rdv = arena.open(settings.shm_size)
            for mark in self.marks:
                if mark >= 0:
                    self.rdv.set_mark(mark, 0, 0, 0)  # whatever a killed worker of an earlier set left
        except BaseException:
            self.shutdown()
            raise

    def send(self, w: int, msg: Dict[str, Any]) -> None:
        assert self.rdv is not None
        self.rdv.send(self.task_keys[w], encode_json(msg))

    def send_task(self, w: int, task: int, index: Any) -> None:
        assert self.rdv is not None
        self.rdv.send(self.task_keys[w], encode_task(task, index))

    def dead(self) -> Optional[int]:
        """A worker whose process ended without being told to stop, or None."""
        for w, p in enumerate(self.procs):
            if not self.stopped[w] and p.exitcode is not None:
                return w
        return None

    def stop(self, w: int) -> None:
        if not self.stopped[w]:
            self.stopped[w] = True
            self._send_stop(w)

    def _send_stop(self, w: int) -> None:
        try:
            self.send(w, {"stop": 1})
        except Exception:
            pass  # shutdown kills it if it does not exit

    def take_back_tasks(self) -> None:
        """Tasks no worker has started: taken back, so that a stop or a
        reset is read next (not after prefetch_factor batches of work). A
        stop already sent (an iterable worker's, at its END) is taken back
        with them, and sent again."""
        self._drain(tasks=True, results=False)
        for w, stopped in enumerate(self.stopped):
            if stopped:
                self._send_stop(w)

    def _drain(self, tasks: bool, results: bool = True) -> None:
        if self.rdv is None or self.rdv.closed:
            return
        for w in range(len(self.procs)):
            keys = ([self.result_keys[w]] if results else []) + ([self.task_keys[w]] if tasks else [])
            for key in keys:
                try:
                    while self.rdv.try_recv(key) is not None:
                        pass
                except Exception:
                    break

    def shutdown(self) -> None:
        """Stop every worker (killing one that does not exit within
        ``_STOP_WAIT``), wait for them all, and free what they left queued.
        Idempotent, and complete even if interrupted (Ctrl-C) while it
        waits; batches already delivered stay valid. Only in the trainer:
        a process forked from it (a worker of another iterator) inherits
        this object, and its garbage collector may finalize it there, where
        these workers are not its children and their keys not its own."""
        if self.down or os.getpid() != self.trainer_pid:
            return
        self.down = True
        try:
            self.take_back_tasks()
            self._drain(tasks=False)  # a worker waiting for room to write finishes, then reads its stop
            for w in range(len(self.procs)):
                self.stop(w)
            deadline = time.monotonic() + _STOP_WAIT
            for p in self.procs:
                p.join(max(0.0, deadline - time.monotonic()))
        finally:
            for p in self.procs:
                if p.exitcode is None:
                    p.kill()
                    p.join()
                p.close()
            self._drain(tasks=True)
            self.arena.free_marks.update(m for m in self.marks if m >= 0)
            self.marks = []


class _Epochs:
    """An iterator over a loader's batches (torch's _MultiProcessingDataLoaderIter);
    with persistent workers, one serves every epoch (``reset``)."""

    def __init__(self, settings: _Settings, owner: _Owner) -> None:
        self.settings = settings
        self.owner: Optional[_Owner] = owner  # the loader's memory stays while this iterator may use it
        self.sampler_iter = iter(settings.index_sampler)
        self.seed = sampling.base_seed(settings.generator, settings.torch_order)
        self.workers = _Workers(settings, owner.arena, self.seed)
        self._finalizer = weakref.finalize(self, self.workers.shutdown)
        self.error: Optional[BaseException] = None
        self.full_since: Optional[float] = None  # since when a worker we wait for has had no room
        self.progress: Optional[Progress] = None
        self.resets = 0
        try:
            self.reset(settings, first=True)
        except BaseException:
            self._close()
            raise

    def reset(self, settings: _Settings, first: bool = False) -> None:
        self.settings = settings
        n = settings.num_workers
        if not first:
            if self.progress is not None:
                self.progress.close()
            self.sampler_iter = iter(settings.index_sampler)
            try:
                self._resume()
            except BaseException as exc:
                raise self._failed(exc)
        self.sent = self.rcvd = 0
        self.yielded = 0
        self.task_worker: Dict[int, int] = {}
        self.outstanding = 0
        self.active = [True] * n
        self.num_tasks = [0] * n
        self.pending: Optional[Any] = None  # an index no worker had room for (in_order=False)
        self.cycle = itertools.cycle(range(n))
        self.done = False
        self.progress = Progress(settings.length) if settings.progress else None
        try:
            for _ in range(settings.prefetch_factor * n):
                self._put_task()
        except BaseException as exc:
            raise self._failed(exc)

    def _resume(self) -> None:
        # Every worker restarts its iterable; what it answers before the
        # READY of this reset belongs to the epoch left behind and is dropped.
        self.workers.take_back_tasks()
        self.resets += 1
        for w in range(self.settings.num_workers):
            self.workers.send(w, {"reset": self.resets})
        for w in range(self.settings.num_workers):
            while True:
                _w, kind, _task, meta, _buf = self._receive([w])
                if kind == wire.READY and meta.get("reset") == self.resets:
                    break

    def __iter__(self) -> "_Epochs":
        return self

    def _put_task(self) -> None:
        st = self.settings
        max_tasks = st.prefetch_factor * st.num_workers
        if self.pending is None:
            try:
                self.pending = next(self.sampler_iter)
            except StopIteration:
                return
        for _ in range(st.num_workers):
            w = next(self.cycle)
            if self.active[w] and (st.in_order or self.num_tasks[w] < max_tasks // sum(self.active)):
                break
        else:
            return  # kept in self.pending for the next free slot
        index, self.pending = self.pending, None
        self.workers.send_task(w, self.sent, index)
        self.task_worker[self.sent] = w
        self.num_tasks[w] += 1
        self.outstanding += 1
        self.sent += 1

    def _failed(self, err: BaseException) -> BaseException:
        """Stop this iterator for good: every later next() raises ``err``
        (or, for an interruption, says the iterator was interrupted)."""
        if isinstance(err, Exception):
            self.error = err
        else:  # Ctrl-C in the middle of handing out or taking a batch: the bookkeeping is not whole
            self.error = RuntimeError("this DataLoader iterator was interrupted while it handed out or received a "
                                      "batch and cannot go on (no batch is lost or repeated silently): start a "
                                      "new epoch with iter(loader)")
        self._close()
        # The error's traceback holds this iterator's frames, and the iterator
        # holds the error: a cycle, freed at the garbage collector's next pass.
        # Its workers are stopped now; its hold on the loader's memory goes now
        # too (the memory is freed here if the loader is gone).
        self.owner = None
        return err

    def _check(self, deadline: Optional[float], waiting_for: List[int]) -> None:
        """Between two slices of a wait for one of ``waiting_for``'s batches:
        a dead worker, the timeout, or a worker that cannot write its batch
        because the arena is full (nothing can free it while we wait) raise."""
        self._check_room(waiting_for)
        w = self.workers.dead()
        if w is not None:
            p = self.workers.procs[w]
            mine = [t for t, owner in self.task_worker.items() if owner == w]
            raise self._failed(worker_died(w, p.pid, min(mine) if mine else None, p.exitcode))
        if deadline is not None and time.monotonic() >= deadline:
            # as torch's: the wait ends, the iterator stays usable (nothing was taken)
            raise LoaderTimeout(f"DataLoader timed out after {self.settings.timeout} seconds")

    def _check_room(self, waiting_for: List[int]) -> None:
        rdv = self.workers.rdv
        assert rdv is not None
        for w in waiting_for:
            mark_index = self.workers.marks[w]
            if mark_index < 0:
                continue
            mark, nbytes, task = rdv.mark(mark_index)
            if mark != ROOM_WANTED:
                continue
            if self.full_since is None:
                self.full_since = time.monotonic()
            elif time.monotonic() - self.full_since >= _FULL_GRACE:
                raise self._failed(RuntimeError(
                    f"DataLoader worker {w} cannot write batch {task}: it has waited "
                    f"{time.monotonic() - self.full_since:.0f} s for {nbytes} bytes of the loader's shared memory, "
                    f"which is full ({rdv.capacity} bytes: shm_size) of batches this process holds or has not "
                    f"taken yet, and none will come back while it waits. Drop batches you no longer need (a "
                    f"tensor kept from a batch keeps the whole batch's memory: keep a copy, .clone()), or pass a "
                    f"larger shm_size= (room for prefetch_factor * num_workers = "
                    f"{self.settings.prefetch_factor * self.settings.num_workers} batches and those you keep)"))
            return
        self.full_since = None

    def _deadline(self) -> Optional[float]:
        return time.monotonic() + self.settings.timeout if self.settings.timeout > 0 else None

    def _receive(self, workers: List[int]) -> Any:
        """(worker, kind, task, meta, message) of the next message from one of
        ``workers``, waiting in slices with ``_check`` between them."""
        rdv, deadline = self.workers.rdv, self._deadline()
        assert rdv is not None
        keys = self.workers.result_keys
        while True:
            try:
                if len(workers) == 1:
                    w = workers[0]
                    buf = rdv.recv(keys[w], timeout=_SLICE, writable=True)
                else:
                    key, buf = rdv.recv_any([keys[w] for w in workers], timeout=_SLICE, writable=True)
                    w = keys.index(key)
            except RendezvousTimeout:
                self._check(deadline, workers)
                continue
            self.full_since = None
            kind, task, meta = wire.read(buf)
            return w, kind, task, meta, buf

    def __next__(self) -> Any:
        if self.error is not None:
            raise self.error
        if self.done:
            raise StopIteration
        if self.workers.down:
            raise RuntimeError("this DataLoader was closed (close(), or the loader deleted) while iterating: "
                               "its workers are stopped; batches already received stay valid")
        try:
            outcome, value = self._next()
        except StopIteration:
            raise
        except LoaderTimeout:
            raise
        except Exception as exc:
            if self.error is None:  # a malformed message, a failed send: this iterator cannot go on
                self._failed(exc)
            raise
        except BaseException as exc:  # Ctrl-C in the bookkeeping
            if self.error is None:
                self._failed(exc)
            raise
        if outcome == "error":
            try:
                raise value
            finally:
                # The traceback keeps this frame, which keeps the iterator: without
                # the exception in it, that is no cycle, and dropping both stops the
                # workers at once (not at the garbage collector's next pass).
                value = None
        self.yielded += 1
        _check_reported_length(self.settings, self.yielded)
        return value

    def _next(self) -> Any:
        st = self.settings
        while True:
            while self.rcvd < self.sent:
                w = self.task_worker.get(self.rcvd)
                if w is not None:
                    if self.active[w]:
                        break
                    del self.task_worker[self.rcvd]
                self.rcvd += 1
            else:
                self.done = True
                if self.progress is not None:
                    self.progress.close()
                if not st.persistent_workers:
                    self._close()
                raise StopIteration
            waiting_for = ([self.task_worker[self.rcvd]] if st.in_order
                           else [w for w in range(st.num_workers) if self.num_tasks[w] > 0])
            sender, kind, task, meta, buf = self._receive(waiting_for)
            if kind == wire.ERROR and task < 0:  # its worker_init_fn (or its dataset's iter()) failed
                raise self._failed(worker_exception(sender, self.workers.procs[sender].pid, None, meta))
            w = self.task_worker.pop(task, None)
            if w is None or w != sender or (st.in_order and task != self.rcvd):
                raise self._failed(RuntimeError(f"shmrdv.loader: worker {sender} answered task {task}, which is "
                                                f"not the one expected (a bug: please report it)"))
            self.outstanding -= 1
            self.num_tasks[w] -= 1
            if kind == wire.END:
                self.active[w] = False
                if not st.persistent_workers:
                    self.workers.stop(w)
                self._put_task()
                continue
            if task == self.rcvd:
                self.rcvd += 1
            self._put_task()
            if kind == wire.ERROR:
                return "error", worker_exception(w, self.workers.procs[w].pid, task, meta)
            data = wire.build(buf, meta, st.as_torch)
            if self.progress is not None:
                self.progress.update(buf.nbytes)
            return "batch", data

    def _close(self) -> None:
        if self.progress is not None:
            self.progress.close()
        self._finalizer()

    def __del__(self) -> None:
        finalizer = getattr(self, "_finalizer", None)  # None: __init__ failed before the workers were up
        if finalizer is not None:
            finalizer()


def _check_reported_length(settings: _Settings, yielded: int) -> None:
    """torch's warning when an iterable dataset yields more than the length
    ``len(loader)`` reported (usually: every worker yields all of it)."""
    reported = settings.len_reported
    if reported is not None and yielded > reported:
        hint = (" For multiprocessing data-loading, this could be caused by not properly configuring the "
                "IterableDataset replica at each worker: give each worker its share in __iter__, by "
                "torch.utils.data.get_worker_info() (torch's IterableDataset documentation shows how)."
                if settings.num_workers else "")
        warnings.warn(f"Length of IterableDataset {settings.dataset!r:.100} was reported to be {reported} (when "
                      f"accessing len(dataloader)), but {yielded} samples have been fetched.{hint}", stacklevel=3)


class _InProcess:
    """``num_workers=0``: batches built in the trainer's process, in the
    same order, with the same draws."""

    def __init__(self, settings: _Settings) -> None:
        self.progress: Optional[Progress] = None  # first: __del__ runs even when what follows raises
        self.settings = settings
        self.yielded = 0
        self.sampler_iter = iter(settings.index_sampler)
        sampling.base_seed(settings.generator, settings.torch_order)  # drawn by torch too: the same generator state
        cfg = Config("", 0, 0, 1, settings.dataset, settings.iterable, settings.auto_collation, settings.collate_fn,
                     settings.drop_last, 0, None, os.getpid(), -1)
        self.fetcher = Fetcher(cfg)
        self.progress = Progress(settings.length) if settings.progress else None

    def __iter__(self) -> "_InProcess":
        return self

    def __next__(self) -> Any:
        try:
            index = next(self.sampler_iter)
            plan = self.fetcher.plan(0, index)
        except StopIteration:
            if self.progress is not None:
                self.progress.close()
            raise
        buf = np.empty(plan.nbytes, np.uint8)
        plan.write(buf)
        _kind, _task, meta = wire.read(buf)
        if self.progress is not None:
            self.progress.update(buf.nbytes)
        self.yielded += 1
        _check_reported_length(self.settings, self.yielded)
        return wire.build(buf, meta, self.settings.as_torch)

    def __del__(self) -> None:
        if self.progress is not None:
            self.progress.close()


class DataLoader:
    """torch's ``DataLoader`` (its common arguments, its order, its seeds),
    with workers that write batches straight into shared memory.

    Iterating yields batches structured as torch's ``default_collate`` makes
    them (or as ``collate_fn`` returns them), their tensors or arrays
    zero-copy views of shared memory, **writable** and the trainer's own:
    valid until dropped, when their memory returns to the loader's arena.
    ``output="torch"`` (the default when torch is installed) yields torch
    tensors, ``"numpy"`` numpy arrays.

    Datasets: map-style (``__getitem__``, ``__len__``; ``__getitems__`` is
    used when present) or iterable (``torch.utils.data.IterableDataset``, or
    without torch any object with ``__iter__`` and no ``__getitem__``);
    inside a worker ``shmrdv.loader.get_worker_info()`` (and torch's) tells
    which worker it is, so torch's sharding idioms work.

    Workers (``num_workers``, started by ``multiprocessing_context``: fork,
    spawn or forkserver) get each batch's indices, fetch and collate, and
    write the batch into ``shm_size`` bytes of shared memory (default 256
    MiB, reserved when the first epoch starts, each page mapped in by its
    first use: it must hold ``prefetch_factor * num_workers`` batches plus
    those the trainer keeps).
    Nothing a worker sends is pickled: batches hold arrays, tensors,
    numbers, strings, bytes, and lists, tuples, dicts and named tuples of
    them; sampler indices are ints, strings, None or lists of them.

    Failures: an exception in a worker is raised in the trainer (a builtin
    type as itself, others as ``WorkerError``) with the worker id, its pid,
    the batch index and the worker's traceback; a worker killed by a signal
    raises ``WorkerDied`` within a tenth of a second of the trainer next
    waiting for it; ``timeout`` > 0 raises ``LoaderTimeout`` (a
    ``RuntimeError``, as torch's) when a batch takes longer, and the next
    call waits again. Ending an epoch early (``break``), deleting the loader or
    its iterator, or ``close()`` stops the workers and frees the memory;
    batches already delivered stay valid.

    ``progress=True`` shows a progress bar with batches/s and GB/s (tqdm's
    when tqdm is installed, a line on stderr otherwise).
    """

    # DataLoader[Batch] in annotations, as torch's DataLoader (a Generic) takes it
    __class_getitem__ = classmethod(types.GenericAlias)
    # What an iterator's sampling is built from: fixed once the loader is made, as in torch
    _FIXED = frozenset(("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"))
    _initialized = False

    def __init__(self, dataset: Any, batch_size: Optional[int] = 1, shuffle: Optional[bool] = None,
                 sampler: Any = None, batch_sampler: Any = None, num_workers: int = 0,
                 collate_fn: Optional[Callable[[Any], Any]] = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn: Optional[Callable[[int], None]] = None,
                 multiprocessing_context: Any = None, generator: Any = None, *,
                 prefetch_factor: Optional[int] = None, persistent_workers: bool = False, in_order: bool = True,
                 output: Optional[str] = None, progress: bool = False, shm_size: Optional[int] = None) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable "
                             "multiprocessing.")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:  # NaN too
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing. let "
                             "num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None.")
        if prefetch_factor is None:
            prefetch_factor = 2
        if isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, int) or prefetch_factor < 1:
            raise ValueError(f"prefetch_factor option should be a positive integer, got {prefetch_factor!r}")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if output is None:
            import importlib.util

            output = "torch" if importlib.util.find_spec("torch") is not None else "numpy"
        if output not in ("torch", "numpy"):
            raise InvalidArgument(f"output must be 'torch' or 'numpy', got {output!r}")
        if multiprocessing_context is not None:
            if num_workers == 0:
                raise ValueError(f"multiprocessing_context can only be used with multi-process loading "
                                 f"(num_workers > 0), but got num_workers={num_workers}: drop "
                                 f"multiprocessing_context, or pass num_workers > 0")
            _context(multiprocessing_context)  # checked now, not at the first epoch
        if num_workers + 1 > MAX_PROCS or (not in_order and num_workers > _MAX_ANY_KEYS):
            raise ValueError(f"num_workers={num_workers}: a loader's shared memory serves at most {MAX_PROCS - 1} "
                             f"workers ({_MAX_ANY_KEYS} with in_order=False)")
        shm_size = DEFAULT_SHM_SIZE if shm_size is None else arena_size(shm_size, "shm_size")
        if pin_memory:
            warnings.warn("shmrdv.loader ignores pin_memory=True: its batches are CPU tensors in shared memory "
                          "(copy them to a device with .to(device, non_blocking=True))", stacklevel=2)
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory  # accepted for compatibility: CPU batches are already in shared memory
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.in_order = in_order
        self.persistent_workers = persistent_workers
        self.output = output
        self.progress = progress
        self.shm_size = shm_size
        self._torch_order = sampling.torch_order(output)
        self._as_torch = output == "torch"
        self._iterable = sampling.is_iterable_dataset(dataset)
        self.sampler, self.batch_sampler, self.batch_size, self.drop_last = sampling.choose(
            dataset, self._iterable, batch_size, shuffle, sampler, batch_sampler, drop_last, generator,
            self._torch_order)
        self.generator = generator
        self.collate_fn = None if _is_torch_default(collate_fn, self.batch_sampler is not None) else collate_fn
        self._owner = _Owner()
        self._persistent: Optional[_Epochs] = None
        # An iterable dataset's len() once len(loader) has been asked: its
        # iterators warn past it, as torch's do.
        self._len_reported: Optional[int] = None
        self._initialized = True

    def __setattr__(self, attr: str, value: Any) -> None:
        if self._initialized and attr in self._FIXED:
            raise ValueError(f"{attr} attribute should not be set after {type(self).__name__} is initialized: "
                             f"make a new {type(self).__name__} with {attr}={value!r:.60}")
        super().__setattr__(attr, value)

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self) -> Any:
        return self.batch_sampler if self._auto_collation else self.sampler

    def __iter__(self) -> Iterator[Any]:
        if self._owner.arena.released:
            raise RuntimeError("this DataLoader is closed: make a new one")
        settings = _Settings(self)
        if self.num_workers == 0:
            return _InProcess(settings)
        if not self.persistent_workers:
            return _Epochs(settings, self._owner)
        if self._persistent is None or self._persistent.error is not None:
            self._persistent = _Epochs(settings, self._owner)
        else:
            self._persistent.reset(settings)
        return self._persistent

    def __len__(self) -> int:
        if self._iterable:
            self._len_reported = len(self.dataset)
        return self._length()

    def _length(self) -> int:
        if not self._iterable:
            return len(self._index_sampler)
        length = len(self.dataset)
        if self.batch_size is not None:
            length = length // self.batch_size if self.drop_last else -(-length // self.batch_size)
        return length

    def _length_or_none(self) -> Optional[int]:
        try:
            return self._length()
        except TypeError:
            return None

    def close(self) -> None:
        """Stop persistent workers and free the loader's shared memory
        (batches already delivered stay valid); idempotent. Deleting the
        loader does the same."""
        self._persistent = None
        self._owner.close()

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
