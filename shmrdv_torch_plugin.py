"""torch's hook for shmrdv: ``init_process_group("shmrdv")`` and
``init_method="shmrdv://NAME"`` with no ``import shmrdv.torch`` first.

torch runs every ``torch.backends`` entry point at the end of ``import
torch`` (unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``). This module is that
entry point: it only registers the backend's name and the rendezvous
scheme, with a creator and a handler that import shmrdv (its C core,
numpy) when first used, so ``import torch`` costs no more than two
dictionary entries. It stands outside
the ``shmrdv`` package because importing anything inside it would load
the package first.
"""
from typing import Any

NAME = "shmrdv"


def register() -> None:
    """Register the "shmrdv" backend with torch.distributed, once."""
    try:
        import torch.distributed as dist
    except ImportError:  # a torch without distributed support: nothing to register with
        return
    if not dist.is_available():
        return
    if not hasattr(dist.Backend, NAME.upper()):
        dist.Backend.register_backend(NAME, _create, extended_api=False, devices=["cpu"])
    try:
        dist.register_rendezvous_handler(NAME, _rendezvous)
    except RuntimeError:  # registered already
        pass


def _rendezvous(url: str, timeout: Any = None, **kwargs: Any) -> Any:
    from shmrdv.torch.init_method import handler

    return handler(url, **({} if timeout is None else {"timeout": timeout}), **kwargs)


def _create(store: Any, rank: int, size: int, timeout: Any) -> Any:
    from shmrdv.torch.backend import create_process_group

    return create_process_group(store, rank, size, timeout)
