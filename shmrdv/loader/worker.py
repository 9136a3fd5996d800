"""A loader worker: a process that takes tasks (a batch's indices) from its
task key, fetches the samples from its copy of the dataset, and writes each
batch straight into the loader's shared memory under its result key.

Channels, per worker ``w`` of a loader's rendezvous (both FIFO):

=================  ==========  ==============================================
key                written by  messages
=================  ==========  ==============================================
``t{g}.{w}``       trainer     int64 ``[task, -1, index]`` or ``[task, n,
                               index_1 .. index_n]`` (what torch's samplers
                               give: an int, a list of ints); any other
                               index as UTF-8 JSON ``{"i": task, "x":
                               index}``; ``{"reset": n}`` (a new epoch:
                               start the iterable dataset again),
                               ``{"stop": 1}``
``r{g}.{w}``       worker      ``batch.py`` messages, one per task in task
                               order (none for the tasks after an iterable
                               dataset's END), and READY ``{"reset": n}``
                               after reset n
``g`` is the generation of the worker set (each iterator of a loader has
its own, so two live iterators never read each other's messages). While a
worker waits for room to write a batch it sets its producer mark (index
given in its Config) to ``(ROOM_WANTED, bytes, task)``, and clears it once
written or when it exits.
=================  ==========  ==============================================

A worker ignores SIGINT (the trainer handles Ctrl-C and stops it) and exits
by itself once the trainer's process is gone (a thread waits for that).
Nothing a worker sends is pickled.
"""
import importlib.abc
import importlib.util
import json
import os
import random
import select
import signal
import sys
import threading
import time
import traceback
from typing import Any, Callable, List, Optional

import numpy as np

from ..errors import MessageTooLarge, ProtocolError, RendezvousTimeout
from ..rendezvous import Rendezvous
from ..segments import unlink_segment
from ..tensors import is_tensor
from . import batch as wire
from .collate import Leaf, collate, convert

ROOM_WANTED = 1  # a worker's producer mark id while it waits for room in the arena
_ROOM_PATIENCE = 0.2  # seconds of waiting for room before it says so
_ATTACH_WAIT = 60.0  # seconds a worker waits for the trainer to create the loader's rendezvous


def task_key(generation: int, worker_id: int) -> str:
    return f"t{generation}.{worker_id}"


def result_key(generation: int, worker_id: int) -> str:
    return f"r{generation}.{worker_id}"


def _jsonable_index(index: Any) -> Any:
    """A sampler's index as JSON for the task message: ints, strings, None,
    lists of them, and tuples (as ``{"tuple": [...]}``, made tuples again in
    the worker)."""
    if index is None or isinstance(index, (str, bool)):
        return index
    if isinstance(index, (int, np.integer)):
        return int(index)
    if (isinstance(index, np.ndarray) and index.ndim == 0) or (is_tensor(index) and index.dim() == 0):
        return _jsonable_index(index.item())
    if isinstance(index, tuple):
        return {"tuple": [_jsonable_index(i) for i in index]}
    if isinstance(index, (list, range)) or is_tensor(index) or isinstance(index, np.ndarray):
        return [_jsonable_index(i) for i in (index.tolist() if hasattr(index, "tolist") else index)]
    raise TypeError(f"shmrdv.loader hands sampler indices to workers as ints, strings, None, or lists and "
                    f"tuples of them (nothing is pickled); the sampler gave a {type(index).__name__}: {index!r:.80}")


def _index(obj: Any) -> Any:
    """A task's index as the sampler gave it (tuples come as {"tuple": [...]})."""
    if isinstance(obj, list):
        return [_index(x) for x in obj]
    if isinstance(obj, dict):
        return tuple(_index(x) for x in obj["tuple"])
    return obj


def encode_json(obj: Any) -> np.ndarray:
    return np.frombuffer(wire.JSON.encode(obj).encode("utf-8"), np.uint8)


def encode_task(task: int, index: Any) -> np.ndarray:
    """A task's message (above): int64 for an int or a list of ints, else JSON."""
    message = int_task(task, index)
    return message if message is not None else encode_json({"i": task, "x": _jsonable_index(index)})


def int_task(task: int, index: Any) -> Optional[np.ndarray]:
    """A task's int64 message (above) when its index is an int or a list of
    ints, else None (it goes as JSON)."""
    try:
        if type(index) is int:
            return np.array((task, -1, index), np.int64)
        if type(index) is list and all(type(i) is int for i in index):
            return np.array((task, len(index), *index), np.int64)
    except OverflowError:  # beyond int64
        pass
    return None


def decode_task(buf: np.ndarray) -> Any:
    """A task key's message as a dict: ``{"i": task, "x": index}``, a reset or a stop."""
    if buf.dtype == np.int64:
        values = buf.tolist() if buf.ndim == 1 else []
        count = len(values) - 2
        if count < 0 or not (values[1] == count or (values[1] == -1 and count == 1)):
            raise ProtocolError(f"a loader task of shape {buf.shape} does not say how many indices it holds rightly")
        return {"i": values[0], "x": values[2] if values[1] == -1 else values[2:]}
    msg = json.loads(bytes(buf))
    if "x" in msg:
        msg["x"] = _index(msg["x"])
    return msg


class WorkerInfo:
    """What ``get_worker_info()`` returns inside a worker: ``id``,
    ``num_workers``, ``seed`` and ``dataset`` (this worker's copy), as in
    torch."""

    __slots__ = ("id", "num_workers", "seed", "dataset")

    def __init__(self, id: int, num_workers: int, seed: int, dataset: Any) -> None:
        self.id, self.num_workers, self.seed, self.dataset = id, num_workers, seed, dataset

    def __repr__(self) -> str:
        return f"WorkerInfo(id={self.id}, num_workers={self.num_workers}, seed={self.seed}, dataset={self.dataset!r:.80})"


_worker_info: Optional[Any] = None


def get_worker_info() -> Optional[Any]:
    """This worker's ``WorkerInfo`` inside a loader worker, None elsewhere
    (``torch.utils.data.get_worker_info()`` gives the same in a worker when
    torch is loaded there)."""
    return _worker_info


class Config:
    """Everything a worker starts from (pickled to spawn and forkserver workers)."""

    def __init__(self, rdv_name: str, generation: int, worker_id: int, num_workers: int, dataset: Any,
                 iterable: bool, auto_collation: bool, collate_fn: Optional[Callable[[Any], Any]], drop_last: bool,
                 seed: int, worker_init_fn: Optional[Callable[[int], None]], trainer_pid: int, mark: int) -> None:
        self.rdv_name, self.generation, self.mark = rdv_name, generation, mark
        self.worker_id, self.num_workers = worker_id, num_workers
        self.dataset, self.iterable, self.auto_collation = dataset, iterable, auto_collation
        self.collate_fn, self.drop_last, self.seed = collate_fn, drop_last, seed
        self.worker_init_fn, self.trainer_pid = worker_init_fn, trainer_pid


def _exit_with_trainer(pid: int, rdv_name: str) -> None:
    """Exit this process once the trainer's has ended, whatever this process
    is doing (a dataset stuck in __getitem__ included): a daemon thread
    blocked on the trainer's pidfd (polling for it where there are none).
    A trainer killed by a signal could not remove the loader's segment: its
    workers do (the first to notice; the others find it gone)."""
    def wait() -> None:
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            fd = -1
        if fd >= 0:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.poll()  # readable once the process has ended
        else:
            while True:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                except PermissionError:
                    pass
                time.sleep(0.5)
        unlink_segment(rdv_name)
        os._exit(0)

    threading.Thread(target=wait, name="shmrdv-loader-trainer-watch", daemon=True).start()


def _seed(seed: int, worker_id: int, base: int) -> None:
    # As torch seeds its workers: random with base + id, numpy from a
    # SeedSequence of (id, base) (torch's _generate_state is the same hash);
    # torch itself in _torch_worker.
    random.seed(seed)
    state = np.random.SeedSequence([worker_id, base & 0xFFFFFFFF, base >> 32, 0]).generate_state(4)
    np.random.seed(state)


def _torch_worker(torch: Any, cfg: Config, seed: int) -> None:
    """Make this process a torch worker as torch's DataLoader makes its own:
    one intra-op thread (several workers' thread pools only fight over the
    CPUs, and one inherited through fork is dead), torch's generator seeded
    with base + id, and torch's get_worker_info() answering."""
    from torch.utils.data._utils import worker as torch_worker

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    torch_worker._worker_info = torch_worker.WorkerInfo(id=cfg.worker_id, num_workers=cfg.num_workers, seed=seed,
                                                        dataset=cfg.dataset)


class _WhenImported(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` once module ``name`` has been imported, for a
    dataset that imports torch only when it first needs it: the worker is
    made torch's then, without importing torch (a second or more) into
    workers whose datasets never use it."""

    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, then = spec.loader, self.then
        exec_module = loader.exec_module

        def exec_then(module: Any) -> None:
            exec_module(module)
            then(module)

        loader.exec_module = exec_then  # type: ignore[method-assign]
        return spec


def _set_worker_info(cfg: Config, seed: int) -> None:
    global _worker_info
    _worker_info = WorkerInfo(cfg.worker_id, cfg.num_workers, seed, cfg.dataset)
    torch = sys.modules.get("torch")
    if torch is not None:
        _torch_worker(torch, cfg, seed)
    else:
        sys.meta_path.insert(0, _WhenImported("torch", lambda module: _torch_worker(module, cfg, seed)))


class Fetcher:
    """One task's batch as a plan: samples fetched, then collated (or converted)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.it: Any = None
        self.ended = False
        if cfg.iterable:
            self.reset()

    def reset(self) -> None:
        if self.cfg.iterable:  # a map-style dataset has nothing to start again
            self.it = iter(self.cfg.dataset)
        self.ended = False

    def samples(self, index: Any) -> Any:
        cfg = self.cfg
        if not cfg.iterable:
            if not cfg.auto_collation:
                return cfg.dataset[index]
            getitems = getattr(cfg.dataset, "__getitems__", None)
            return getitems(index) if getitems is not None else [cfg.dataset[i] for i in index]
        if self.ended:
            raise StopIteration
        if not cfg.auto_collation:
            try:
                return next(self.it)
            except StopIteration:
                self.ended = True
                raise
        data: List[Any] = []
        for _ in index:
            try:
                data.append(next(self.it))
            except StopIteration:
                self.ended = True
                break
        if not data or (cfg.drop_last and len(data) < len(index)):
            raise StopIteration
        return data

    def plan(self, task: int, index: Any) -> wire.Plan:
        cfg = self.cfg
        data = self.samples(index)
        leaves: List[Leaf] = []
        if cfg.collate_fn is not None:
            tree = convert(cfg.collate_fn(data), leaves, arrays_as_tensors=False)
        elif cfg.auto_collation:
            tree = collate(data, leaves)
        else:
            tree = convert(data, leaves)
        return wire.batch_plan(task, tree, leaves)


def error_plan(task: int, exc: BaseException) -> wire.Plan:
    kind = type(exc)
    meta = {"type": kind.__qualname__, "module": kind.__module__, "message": str(exc),
            "traceback": "".join(traceback.format_exception(kind, exc, exc.__traceback__))}
    return wire.Plan(wire.ERROR, task, meta, [])


class _Channel:
    def __init__(self, rdv: Rendezvous, cfg: Config) -> None:
        self.rdv, self.mark = rdv, cfg.mark
        self.tasks, self.results = task_key(cfg.generation, cfg.worker_id), result_key(cfg.generation, cfg.worker_id)

    def next_task(self) -> Any:
        return decode_task(self.rdv.recv(self.tasks))

    def put(self, plan: wire.Plan) -> None:
        """Write plan as the next result, waiting while the arena is full
        (the trainer holds too many batches). A wait longer than a moment
        is shown in this worker's producer mark, ``(ROOM_WANTED, bytes,
        task)``, for the trainer to tell a full arena from a slow worker."""
        try:
            try:
                alloc = self.rdv.alloc(self.results, (plan.nbytes,), np.uint8, timeout=_ROOM_PATIENCE)
                buf = alloc.open()
            except RendezvousTimeout:
                if self.mark >= 0:
                    self.rdv.set_mark(self.mark, ROOM_WANTED, plan.nbytes, max(plan.task, 0))
                try:
                    alloc = self.rdv.alloc(self.results, (plan.nbytes,), np.uint8)
                    buf = alloc.open()
                finally:
                    if self.mark >= 0:
                        self.rdv.set_mark(self.mark, 0, 0, 0)
            try:
                plan.write(buf)
            except BaseException:
                alloc.discard()
                raise
            alloc.publish()
        except MessageTooLarge:
            raise MessageTooLarge(f"a batch of {plan.nbytes} bytes does not fit the loader's shared memory "
                                  f"({self.rdv.capacity} bytes, less what a message needs): pass "
                                  f"DataLoader(..., shm_size=) of at least {2 * plan.nbytes} bytes "
                                  f"(room for prefetch_factor * num_workers batches and those "
                                  f"the trainer keeps)") from None


def _attach(name: str) -> Rendezvous:
    """The loader's rendezvous, which the trainer may still be creating
    (spawned workers start first); the wait ends with the trainer (above)."""
    deadline = time.monotonic() + _ATTACH_WAIT
    while True:
        try:
            return Rendezvous(name, create=False)
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.002)


def run(cfg: Config) -> None:
    """A worker's life: set up as torch does, then serve tasks until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_trainer(cfg.trainer_pid, cfg.rdv_name)
    rdv = _attach(cfg.rdv_name)
    try:
        channel = _Channel(rdv, cfg)
        seed = cfg.seed + cfg.worker_id
        _seed(seed, cfg.worker_id, cfg.seed)
        _set_worker_info(cfg, seed)
        try:
            if cfg.worker_init_fn is not None:
                cfg.worker_init_fn(cfg.worker_id)
            fetcher = Fetcher(cfg)
        except Exception as exc:
            # The trainer raises it, naming this worker, when it next needs
            # it; meanwhile this worker lives (an exit would read as a death).
            channel.put(error_plan(-1, exc))
            while "stop" not in channel.next_task():
                pass
            return
        _serve(channel, fetcher)
    finally:
        rdv.close()


def _serve(channel: _Channel, fetcher: Fetcher) -> None:
    exhausted = False  # END sent: an iterable answers nothing more until a reset, as in torch
    while True:
        msg = channel.next_task()
        if "stop" in msg:
            return
        if "reset" in msg:
            try:
                fetcher.reset()
                answer = wire.Plan(wire.READY, -1, {"reset": msg["reset"]}, [])
            except Exception as exc:  # its iter() failed: the trainer raises it
                answer = error_plan(-1, exc)
            exhausted = False
            channel.put(answer)
            continue
        if exhausted:
            continue
        task = int(msg["i"])
        try:
            plan = fetcher.plan(task, msg["x"])
        except StopIteration as exc:
            if fetcher.cfg.iterable:  # the end of this worker's share
                plan, exhausted = wire.Plan(wire.END, task, {}, []), True
            else:  # a map-style dataset's StopIteration is an error, as in torch
                plan = error_plan(task, exc)
        except Exception as exc:
            plan = error_plan(task, exc)
        try:
            channel.put(plan)
        except Exception as exc:  # it does not fit, or a leaf cannot be written
            channel.put(error_plan(task, exc))
        # The samples go now, not when the next task's replace them: the
        # allocator then reuses their memory (two big buffers alive at once
        # make glibc give memory back and fault it in again, every batch).
        del plan
