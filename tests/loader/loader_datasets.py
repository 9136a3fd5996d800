"""Datasets for the shmrdv.loader tests, at module level so that spawn and
forkserver workers can import them. Each is torch's kind of dataset (the
tests compare against torch's DataLoader)."""
import ctypes
import gc
import os
import random
import signal
import time
from collections import OrderedDict, namedtuple

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

import shmrdv.loader

Point = namedtuple("Point", "x y")


class Nested(Dataset):
    """Samples of every kind default_collate handles, nested."""

    def __init__(self, n: int = 23) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return {
            "tensor": torch.full((3, 2), float(i)),
            "array": np.arange(4, dtype=np.int16) + i,
            "int": i,
            "float": i / 2,
            "bool": i % 2 == 0,
            "str": f"s{i}",
            "bytes": bytes([i % 256]),
            "np_scalar": np.float32(i) / 3,
            "point": Point(i, (np.uint8(i), [i, -i])),
            "ordered": OrderedDict([("b", torch.tensor([i], dtype=torch.int64)), ("a", np.bool_(i % 3 == 0))]),
            "bf16": torch.full((2,), i / 4, dtype=torch.bfloat16),
            "empty": np.zeros((0, 2), np.float64),
            "scalar_tensor": torch.tensor(i * 1.5, dtype=torch.float64),
        }


class Squares(Dataset):
    def __init__(self, n: int = 37) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.tensor([i, i * i]), i


class Random(Dataset):
    """Draws from every generator a worker seeds."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int):
        info = get_worker_info()
        mine = shmrdv.loader.get_worker_info()
        wid = -1 if info is None else info.id
        seed = -1 if info is None else info.seed
        assert mine is None or (mine.id, mine.seed, mine.num_workers) == (wid, seed, info.num_workers)
        return torch.tensor([random.random(), float(np.random.rand()), float(torch.rand(1)), wid, seed % 1000003])


class Shards(IterableDataset):
    """Worker w of n yields w, w+n, ... up to its own end (uneven shards)."""

    def __init__(self, end: int = 21) -> None:
        self.end = end

    def __iter__(self):
        info = get_worker_info()
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(torch.tensor([x]) for x in range(w, self.end + 3 * w, n))


class Sized(IterableDataset):
    def __len__(self) -> int:
        return 10

    def __iter__(self):
        return iter(range(10))


class Big(Dataset):
    """Samples of ``nbytes`` float32 each."""

    def __init__(self, nbytes: int, n: int = 8) -> None:
        self.numel, self.n = nbytes // 4, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((self.numel,), float(i))


class Failing(Dataset):
    """Sample ``bad`` fails the way ``how`` says; the others are their index."""

    def __init__(self, how: str, bad: int = 5, n: int = 12) -> None:
        self.how, self.bad, self.n = how, bad, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.bad:
            fail(self.how)
        return np.array([i])


class DatasetBroke(Exception):
    pass


def fail(how: str) -> None:
    if how == "value":
        raise ValueError("sample 5 is broken")
    if how == "custom":
        raise DatasetBroke("custom failure")
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "segfault":
        ctypes.string_at(0)
    if how == "exit":
        os._exit(3)
    if how == "hang":
        time.sleep(60)
    if how == "object":
        return
    raise AssertionError(how)


class FailingIter(IterableDataset):
    """An iterable dataset whose iter() fails."""

    def __iter__(self):
        raise RuntimeError("iter() of this dataset failed")


class Pairs(Dataset):
    """Named tuples made in a class body, as torch's own tests make them:
    there is no name to import them by."""

    Pair = namedtuple("Pair", "inner tensor")
    Inner = namedtuple("Inner", "value label")

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        return self.Pair(self.Inner(i, str(i)), torch.tensor([i, -i]))


def point_class():
    """A named tuple class made anew by each call, with Point's module, name and fields."""
    return namedtuple("Point", "x y")


class Points(Dataset):
    """Samples of two classes that point_class() made (and Point is a third)."""

    def __init__(self) -> None:
        self.kinds = (point_class(), point_class())

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        return self.kinds[i % 2](i, -i)


class Unshippable(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return {"x": object()}


class Slow(Dataset):
    """Index 0 takes ``delay`` seconds; the rest are immediate."""

    def __init__(self, delay: float, n: int = 8) -> None:
        self.delay, self.n = delay, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == 0:
            time.sleep(self.delay)
        return np.array([i])


def numpy_collate(batch):
    """A custom collate_fn that returns numpy arrays (kept as arrays)."""
    xs = np.stack([np.asarray(x) for x, _ in batch])
    return {"x": xs, "y": torch.tensor([y for _, y in batch]), "n": len(batch)}


def record_init(worker_id: int) -> None:
    os.environ["SHMRDV_TEST_INIT"] = str(worker_id)


class InitSeen(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return int(os.environ.get("SHMRDV_TEST_INIT", "-1"))


def collect_garbage(worker_id: int) -> None:
    """A worker_init_fn: the worker's garbage collector runs on what it inherited."""
    gc.collect()


def failing_init(worker_id: int) -> None:
    raise RuntimeError(f"init of worker {worker_id} failed")



class Records(Dataset):
    """Tuple samples with a string and a number that is an int or a float."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        return f"name{i}", (i if i % 2 == 0 else i / 4), bytes([i])


def tuple_collate(batch):
    """A custom collate_fn returning a tuple with a numpy scalar in it."""
    return torch.stack([x for x, _ in batch]), np.float32(len(batch))


class MapWithIter(Dataset):
    """Map-style, with an __iter__ that must not be called."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        return i

    def __iter__(self):
        raise AssertionError("a map-style dataset is never iterated")


class StopsAt3(Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        if i == 3:
            raise StopIteration
        return i


def init_fails_in_worker_1(worker_id: int) -> None:
    if worker_id == 1:
        raise RuntimeError("init of worker 1 failed")
