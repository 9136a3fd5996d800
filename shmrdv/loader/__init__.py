"""A data loader whose workers write batches straight into shared memory:
``DataLoader`` takes torch's DataLoader arguments, gives torch's order,
and yields zero-copy, writable tensors (or numpy arrays). torch is optional."""
from .dataloader import DEFAULT_SHM_SIZE, DataLoader
from .failures import LoaderTimeout, WorkerDied, WorkerError
from .worker import WorkerInfo, get_worker_info

__all__ = ["DEFAULT_SHM_SIZE", "DataLoader", "LoaderTimeout", "WorkerDied", "WorkerError", "WorkerInfo", "get_worker_info"]
