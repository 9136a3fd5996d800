"""torch.distributed over shmrdv: the backend "shmrdv" for CPU tensors.

    import torch.distributed as dist

    dist.init_process_group("shmrdv", rank=rank, world_size=world, init_method="env://")
    dist.all_reduce(tensor)

torch registers the name at ``import torch`` through shmrdv's
``torch.backends`` entry point (``shmrdv_torch_plugin``), loading nothing
of shmrdv until a group is made; with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``,
``import shmrdv.torch`` registers it.

Every init method torch has works (env://, file://, tcp://): the backend
meets its peers through the Store torch builds from it. Supported:
all_reduce (SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR), broadcast,
reduce, all_gather, all_gather_into_tensor, gather, scatter, reduce_scatter,
reduce_scatter_tensor, all_to_all, all_to_all_single (even or uneven
splits), barrier, the coalesced calls, send, recv (also from any source),
isend, irecv, batch_isend_irecv (``p2p``), new_group, async_op=True, and
DistributedDataParallel; the group object's own short forms
(``group.allreduce(tensor)``) and gloo's several tensors per call.

Ranks on one host meet in shared memory (a ``shmrdv.Group``). Ranks on
several hosts run hierarchically: shared memory within each host, gloo
between hosts (``backend``); which ranks share a host is decided from what
they exchange through the Store (``hosts``).

Testing override: set ``SHMRDV_TEST_HOST_ID`` to a different value in
groups of processes on one machine to make each group act as a host of its
own (see ``shmrdv.torch.hosts``); the tests fake multi-host jobs this way.

``Store`` is a ``torch.distributed.Store`` in shared memory
(``shmrdv.torch.store``); ``init_method="shmrdv://NAME"`` meets through one
(``init_method``), and torchrun's ``--rdzv-backend=shmrdv`` too
(``elastic``).

Only this package needs torch: ``import shmrdv`` does not load it.

``recv(rdv, key)`` receives a message of a Rendezvous as a torch tensor
sharing its shared memory (``Rendezvous.recv(..., as_torch=True)``).
"""
import datetime
from typing import Any, Optional

import torch
import torch.distributed as dist

from . import init_method
from .backend import BACKEND_NAME, ProcessGroupShmrdv, create_process_group
from .hosts import TEST_HOST_ENV, HostPlan, host_identity, plan_hosts
from .store import Store
from .work import Work

if not hasattr(dist.Backend, BACKEND_NAME.upper()):  # registered once per process
    dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=False, devices=["cpu"])
try:
    dist.register_rendezvous_handler(init_method.SCHEME, init_method.handler)  # init_method="shmrdv://NAME"
except RuntimeError:
    pass  # registered by an earlier import



def monitored_barrier(group: Any = None, timeout: Optional[datetime.timedelta] = None,
                      wait_all_ranks: bool = False) -> None:
    """torch's ``dist.monitored_barrier`` for a "shmrdv" group (torch's own
    refuses every backend but gloo by name): a barrier that raises, on rank
    0, naming the first rank that did not come within ``timeout`` (default:
    the group's), or every such rank with ``wait_all_ranks``; the other
    ranks raise that rank 0 did not let them through. ``group``: the
    default group when None. Blocks until every rank came, or timeout."""
    pg = dist.group.WORLD if group is None else group
    if not isinstance(pg, ProcessGroupShmrdv):
        return dist.monitored_barrier(pg, timeout, wait_all_ranks)  # type: ignore[no-any-return]
    pg.monitored_barrier(timeout, wait_all_ranks)


def recv(rdv: Any, key: str, *, timeout: Optional[float] = None, lease: bool = False,
         writable: Optional[bool] = None) -> torch.Tensor:
    """The oldest message under ``key`` in ``rdv`` (a ``shmrdv.Rendezvous``)
    as a torch tensor over the received shared memory: no copy, the sent
    dtype and shape (torch.bfloat16 for bfloat16), and no warning about
    read-only arrays. ``timeout`` and ``lease`` as in ``Rendezvous.recv``.

    The tensor is writable: torch has no read-only tensors. ``writable``
    (None: not ``lease``) says whether writing into it is allowed. An
    ordinary message is this receiver's alone, so writing into it touches
    nobody else's data (the sender's tensor is never affected). A leased
    message goes back to its key if this process dies while the tensor is
    alive: with ``writable=False`` (the default for ``lease=True``) the
    tensor is read-only by contract only, and must not be written into;
    with ``writable=True`` what was written goes back with it.

    The tensor keeps the message alive (and its arena space taken) until it
    and every tensor sharing its memory are gone: ``.clone()`` it to keep
    the values longer."""
    if writable is None:
        writable = not lease
    return rdv.recv(key, timeout=timeout, lease=lease, writable=writable, as_torch=True)  # type: ignore[no-any-return]


__all__ = ["BACKEND_NAME", "HostPlan", "ProcessGroupShmrdv", "Store", "TEST_HOST_ENV", "Work", "create_process_group",
           "host_identity", "monitored_barrier", "plan_hosts", "recv"]
