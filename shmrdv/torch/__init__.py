"""torch.distributed over shmrdv: importing this package registers the
backend "shmrdv" for CPU tensors.

    import torch.distributed as dist
    import shmrdv.torch  # registers "shmrdv"

    dist.init_process_group("shmrdv", rank=rank, world_size=world, init_method="env://")
    dist.all_reduce(tensor)

Every init method torch has works (env://, file://, tcp://): the backend
meets its peers through the Store torch builds from it. Supported:
all_reduce (SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR), broadcast,
reduce, all_gather, all_gather_into_tensor, gather, scatter, reduce_scatter,
reduce_scatter_tensor, all_to_all, all_to_all_single (even or uneven
splits), barrier, new_group, async_op=True, and DistributedDataParallel.

Ranks on one host meet in shared memory (a ``shmrdv.Group``). Ranks on
several hosts run hierarchically: shared memory within each host, gloo
between hosts (``backend``); which ranks share a host is decided from what
they exchange through the Store (``hosts``).

Testing override: set ``SHMRDV_TEST_HOST_ID`` to a different value in
groups of processes on one machine to make each group act as a host of its
own (see ``shmrdv.torch.hosts``); the tests fake multi-host jobs this way.

Only this package needs torch: ``import shmrdv`` does not load it.
"""
import torch.distributed as dist

from .backend import BACKEND_NAME, ProcessGroupShmrdv, create_process_group
from .hosts import TEST_HOST_ENV, HostPlan, host_identity, plan_hosts
from .work import Work

if not hasattr(dist.Backend, BACKEND_NAME.upper()):  # registered once per process
    dist.Backend.register_backend(BACKEND_NAME, create_process_group, extended_api=False, devices=["cpu"])

__all__ = ["BACKEND_NAME", "HostPlan", "ProcessGroupShmrdv", "TEST_HOST_ENV", "Work", "create_process_group",
           "host_identity", "plan_hosts"]
