"""Which indices a loader fetches, in which order, and the seed its workers
start from: torch's own samplers when torch is in use, so that the order is
exactly torch's DataLoader's for the same seed; small numpy ones when torch
is not installed."""
import itertools
import sys
from typing import Any, Iterable, Iterator, List, Optional, Tuple


def torch_order(output: str) -> bool:
    """Whether to draw order and seeds with torch: when its output is torch's
    or torch is already loaded (its samplers and generators are in play)."""
    return output == "torch" or "torch" in sys.modules


def is_iterable_dataset(dataset: Any) -> bool:
    """torch's test (an IterableDataset) when torch is loaded; otherwise an
    object that can be iterated and not indexed."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return isinstance(dataset, torch.utils.data.IterableDataset)
    return hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")


class _Sequential:
    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.dataset)))

    def __len__(self) -> int:
        return len(self.dataset)


class _Random:
    """A fresh permutation per pass, from ``generator`` (a numpy Generator)
    or from numpy's global state."""

    def __init__(self, dataset: Any, generator: Any) -> None:
        self.dataset, self.generator = dataset, generator

    def __iter__(self) -> Iterator[int]:
        import numpy as np

        rng = self.generator if self.generator is not None else np.random.default_rng(np.random.randint(2**31))
        return iter(rng.permutation(len(self.dataset)).tolist())

    def __len__(self) -> int:
        return len(self.dataset)


class _Batches:
    def __init__(self, sampler: Iterable[Any], batch_size: int, drop_last: bool) -> None:
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self) -> Iterator[List[Any]]:
        it = iter(self.sampler)
        while True:
            batch = list(itertools.islice(it, self.batch_size))
            if not batch or (self.drop_last and len(batch) < self.batch_size):
                return
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)  # type: ignore[arg-type]
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


def choose(dataset: Any, iterable: bool, batch_size: Optional[int], shuffle: Optional[bool], sampler: Any,
           batch_sampler: Any, drop_last: bool, generator: Any, torch_order: bool) -> Tuple[Any, Any, Optional[int], bool]:
    """(sampler, batch_sampler, batch_size, drop_last) as torch's DataLoader
    settles them, with its checks and its messages."""
    if iterable:
        if shuffle not in (False, None):
            raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle option, "
                             f"but got shuffle={shuffle}")
        if sampler is not None:
            raise ValueError(f"DataLoader with IterableDataset: expected unspecified sampler option, "
                             f"but got sampler={sampler}")
        if batch_sampler is not None:
            raise ValueError(f"DataLoader with IterableDataset: expected unspecified batch_sampler option, "
                             f"but got batch_sampler={batch_sampler}")
    shuffle = bool(shuffle)
    if sampler is not None and shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
                             "and drop_last")
        batch_size, drop_last = None, False
    elif batch_size is None and drop_last:
        raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0):
        raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
    if torch_order:
        from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler
        from torch.utils.data.dataloader import _InfiniteConstantSampler
    else:
        BatchSampler, RandomSampler, SequentialSampler = _Batches, _Random, _Sequential  # type: ignore[assignment,misc]
        _InfiniteConstantSampler = None  # type: ignore[assignment,misc]
    if sampler is None:
        if iterable:
            sampler = _InfiniteConstantSampler() if _InfiniteConstantSampler else _Repeat()
        elif shuffle:
            sampler = RandomSampler(dataset, generator=generator)
        else:
            sampler = SequentialSampler(dataset)
    if batch_size is not None and batch_sampler is None:
        batch_sampler = BatchSampler(sampler, batch_size, drop_last)
    return sampler, batch_sampler, batch_size, drop_last


class _Repeat:
    """An iterable dataset's sampler: None forever (each worker fetches from its own iterator)."""

    def __iter__(self) -> Iterator[None]:
        return itertools.repeat(None)


def base_seed(generator: Any, torch_order: bool) -> int:
    """The seed of an epoch's workers (worker i gets base + i), drawn as
    torch's DataLoader draws it, from ``generator`` or the global state."""
    if torch_order:
        import torch

        return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
    import numpy as np

    rng = generator if generator is not None else np.random
    return int(rng.integers(0, 2**63 - 1)) if hasattr(rng, "integers") else int(rng.randint(0, 2**63 - 1, dtype=np.int64))
