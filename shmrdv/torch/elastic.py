"""torchrun's ``--rdzv-backend=shmrdv``: the agents of a single-host job
meet in a shared-memory ``Store`` named by ``--rdzv-endpoint`` (default:
``torchrun-RUN_ID``), with torch's own ``DynamicRendezvousHandler`` and its
``C10dRendezvousBackend`` over that Store: the rendezvous' state is one
key changed by ``compare_set``, as with ``c10d``, with no TCP server for it.

torch's handler still starts the TCPStore it shares with the workers for
``env://``; workers that meet through ``init_method="shmrdv://"`` (no
name: the run's Store, see ``init_method``) use shared memory only.

Loaded through ``shmrdv_torchrun`` (the ``torchrun.handlers`` entry point),
which imports nothing until torchrun asks for the backend."""
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

from .store import Store


class ShmrdvRendezvousBackend(C10dRendezvousBackend):
    """``C10dRendezvousBackend`` over a shared-memory Store, named "shmrdv" (torchrun checks the name)."""

    @property
    def name(self) -> str:
        return "shmrdv"


def create_rdzv_handler(params: RendezvousParameters) -> RendezvousHandler:
    """A ``DynamicRendezvousHandler`` whose state lives in the Store ``params.endpoint`` names.
    Each agent's ``shutdown`` closes its Store; the last of ``max_nodes`` removes it."""
    name = (params.endpoint or f"torchrun-{params.run_id}").replace(":", "-").replace("/", "-")
    timeout = float(params.get("store_timeout", 300))
    store: Any = Store(name, timeout=timeout, world_size=params.max_nodes)
    handler = create_handler(store, ShmrdvRendezvousBackend(store, params.run_id), params)
    shutdown = handler.shutdown

    def shutdown_and_close() -> bool:
        try:
            return shutdown()
        finally:
            store.close()

    handler.shutdown = shutdown_and_close  # type: ignore[method-assign]
    return handler
