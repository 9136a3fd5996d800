"""torch's hook for shmrdv: ``init_process_group("shmrdv")`` with no
``import shmrdv.torch`` first.

torch runs every ``torch.backends`` entry point at the end of ``import
torch`` (unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``). This module is that
entry point: it only registers the backend's name, with a creator that
imports shmrdv (its C core, numpy) when a group of it is first made, so
``import torch`` costs no more than a dictionary entry. It stands outside
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
    if dist.is_available() and not hasattr(dist.Backend, NAME.upper()):
        dist.Backend.register_backend(NAME, _create, extended_api=False, devices=["cpu"])


def _create(store: Any, rank: int, size: int, timeout: Any) -> Any:
    from shmrdv.torch.backend import create_process_group

    return create_process_group(store, rank, size, timeout)
