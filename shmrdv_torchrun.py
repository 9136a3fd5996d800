"""torchrun's ``torchrun.handlers`` entry point for ``--rdzv-backend=shmrdv``.

torchrun loads every such entry point whenever it starts, so this module
imports nothing: neither torch nor shmrdv's compiled core is loaded until
torchrun creates a handler of this backend (``shmrdv.torch.elastic``)."""
from typing import Any, Callable


def handler() -> Callable[[Any], Any]:
    """What torchrun registers under "shmrdv": a factory of rendezvous handlers."""

    def create(params: Any) -> Any:
        from shmrdv.torch.elastic import create_rdzv_handler

        return create_rdzv_handler(params)

    return create
