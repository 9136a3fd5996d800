"""The three ways a "shmrdv" process group moves tensors, behind one
interface (allreduce, broadcast, allgather, reduce_scatter, reduce,
gather, scatter, alltoall, barrier, failed, abort, close):

- ``Local``: every rank on one host, one ``shmrdv.Group``;
- ``Gloo``: a gloo group of its own (created directly, with its own
  prefixed Store), for ranks spread unevenly over hosts, and inside
  ``Hierarchy``;
- ``Hierarchy``: equal numbers of ranks on several hosts: a Group per host
  for the shared-memory part, a gloo group per local index across hosts.

Each writes its results into the tensors it is given (the backend hands it
contiguous ones).
"""
import datetime
import math
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist

from ..group import Group
from . import hosts

_GLOO_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT,
             "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND,
             "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}
"""The op gloo runs for each (gloo has no mean: a sum, divided afterwards)."""


# ---- helpers shared by the transports ----

def _fill(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy src's elements, in order, into the contiguous tensor dst."""
    dst.view(-1).copy_(src.reshape(-1))


def _options(kind: Callable[[], Any], **fields: Any) -> Any:
    opts = kind()
    for name, value in fields.items():
        setattr(opts, name, value)
    return opts


def _gloo(store: Any, prefix: str, rank: int, size: int, timeout: datetime.timedelta) -> Any:
    """A gloo group on its own part of the Store. Under the testing
    override the fake hosts are one machine, so gloo uses the loopback
    device; otherwise gloo picks its device as it does for torch's own gloo
    groups (the interfaces in GLOO_SOCKET_IFNAME, or the hostname's)."""
    prefixed = dist.PrefixStore(prefix, store)
    if hosts.testing_host_id() is None:
        return dist.ProcessGroupGloo(prefixed, rank, size, timeout)
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    options._timeout = timeout
    return dist.ProcessGroupGloo(prefixed, rank, size, options)


# ---- the transports: collectives on contiguous tensors ----
#
# Each takes contiguous tensors and writes its result into the output it is
# given (into the input itself for allreduce, broadcast and, on the root,
# reduce). op is a shmrdv.Group op name; alltoall's splits are per-rank
# row counts, or None for equal blocks.

class Local:
    """Every rank on one host: one shmrdv.Group."""

    def __init__(self, group: Group) -> None:
        self.group = group

    def allreduce(self, t: torch.Tensor, op: str) -> None:
        self.group.allreduce(t, op, out=t)

    def broadcast(self, t: torch.Tensor, root: int) -> None:
        self.group.broadcast(t, root, out=t)

    def allgather(self, out: torch.Tensor, t: torch.Tensor) -> None:
        _fill(out, self.group.allgather(t))

    def reduce_scatter(self, out: torch.Tensor, t: torch.Tensor, op: str) -> None:
        _fill(out, self.group.reduce_scatter(t.view(self.group.world_size, -1), op))

    def reduce(self, t: torch.Tensor, root: int, op: str) -> None:
        result = self.group.reduce(t, root, op)
        if result is not None:
            _fill(t, result)

    def gather(self, out: Optional[torch.Tensor], t: torch.Tensor, root: int) -> None:
        result = self.group.gather(t, root)
        if out is not None:
            _fill(out, result)

    def scatter(self, out: torch.Tensor, src: Optional[torch.Tensor], root: int) -> None:
        _fill(out, self.group.scatter(src, root))

    def alltoall(self, out: torch.Tensor, t: torch.Tensor, splits: Optional[Sequence[List[int]]]) -> None:
        world = self.group.world_size
        if splits is None:
            _fill(out, self.group.alltoall(t.view(world, -1)))
            return
        # Uneven rows: every rank sends blocks padded to the largest split of any rank.
        out_splits, in_splits = splits
        row = math.prod(t.shape[1:])
        largest = torch.tensor([max(in_splits)], dtype=torch.int64)
        self.group.allreduce(largest, "max", out=largest)
        block = int(largest) * row
        send = t.view(world, block) if all(n * row == block for n in in_splits) else _padded(t, in_splits, row, block)
        received = self.group.alltoall(send)
        if all(n * row == block for n in out_splits):
            _fill(out, received)
        else:
            _unpad(out, received, out_splits, row)

    def barrier(self) -> None:
        self.group.barrier()

    def failed(self, error: BaseException) -> None:
        """Nothing to tell: the Group's own errors reach every rank (a lost
        peer, a mismatch) or abort it (a timeout)."""

    def abort(self, reason: str) -> None:
        if not self.group.closed:
            self.group.abort(reason)

    def close(self) -> None:
        self.group.close()


def _padded(t: torch.Tensor, splits: Sequence[int], row: int, block: int) -> torch.Tensor:
    """t's rows, split as given, each part at the start of a block of its own."""
    send = t.new_zeros((len(splits), block))
    flat, pos = t.reshape(-1), 0
    for j, n in enumerate(splits):
        send[j, : n * row] = flat[pos : pos + n * row]
        pos += n * row
    return send


def _unpad(out: torch.Tensor, received: torch.Tensor, splits: Sequence[int], row: int) -> None:
    flat, pos = out.view(-1), 0
    for j, n in enumerate(splits):
        flat[pos : pos + n * row] = received[j, : n * row]
        pos += n * row


class Gloo:
    """Every collective through one gloo group of all the ranks."""

    def __init__(self, store: Any, prefix: str, rank: int, size: int, timeout: datetime.timedelta) -> None:
        self.rank = rank
        self.size = size
        self.pg = _gloo(store, prefix, rank, size, timeout)

    def allreduce(self, t: torch.Tensor, op: str) -> None:
        self.pg.allreduce([t], _GLOO_OPS[op]).wait()
        if op == "mean":
            t.div_(self.size)

    def broadcast(self, t: torch.Tensor, root: int) -> None:
        self.pg.broadcast([t], _options(dist.BroadcastOptions, rootRank=root)).wait()

    def allgather(self, out: torch.Tensor, t: torch.Tensor) -> None:
        self.pg._allgather_base(out.view(-1), t.view(-1)).wait()

    def reduce_scatter(self, out: torch.Tensor, t: torch.Tensor, op: str) -> None:
        opts = _options(dist.ReduceScatterOptions, reduceOp=_GLOO_OPS[op])
        self.pg._reduce_scatter_base(out.view(-1), t.view(-1), opts).wait()
        if op == "mean":
            out.div_(self.size)

    def reduce(self, t: torch.Tensor, root: int, op: str) -> None:
        buf = t if self.rank == root else t.clone()  # gloo leaves partial sums in non-roots' tensors
        self.pg.reduce([buf], _options(dist.ReduceOptions, rootRank=root, reduceOp=_GLOO_OPS[op])).wait()
        if op == "mean" and self.rank == root:
            t.div_(self.size)

    def gather(self, out: Optional[torch.Tensor], t: torch.Tensor, root: int) -> None:
        outputs = [list(out.unbind(0))] if out is not None else []
        self.pg.gather(outputs, [t], _options(dist.GatherOptions, rootRank=root)).wait()

    def scatter(self, out: torch.Tensor, src: Optional[torch.Tensor], root: int) -> None:
        inputs = [list(src.unbind(0))] if src is not None else []
        self.pg.scatter([out], inputs, _options(dist.ScatterOptions, rootRank=root)).wait()

    def alltoall(self, out: torch.Tensor, t: torch.Tensor, splits: Optional[Sequence[List[int]]]) -> None:
        out_splits, in_splits = splits if splits is not None else ([], [])
        self.pg.alltoall_base(out, t, out_splits, in_splits, dist.AllToAllOptions()).wait()

    def barrier(self) -> None:
        self.pg.barrier(dist.BarrierOptions()).wait()

    def failed(self, error: BaseException) -> None:
        self.abort(f"{type(error).__name__}: {error}")

    def abort(self, reason: str) -> None:
        self.pg.abort()

    def close(self) -> None:
        self.pg.shutdown()


class Hierarchy:
    """Ranks on several hosts, as many on each: a shmrdv.Group per host,
    and a gloo group per local index joining that index's rank on every
    host (its "peers"; local index 0's are the hosts' leaders).

    allreduce moves each byte across hosts once per host: a
    reduce-scatter in shared memory leaves local rank i the reduction of
    block i of its host, the peers allreduce that block through gloo, and
    an allgather in shared memory puts the blocks together (the tensor is
    padded to a multiple of the local size when it must be). broadcast and
    barrier go through the leaders, allgather through the peers then
    shared memory; reduce and reduce_scatter are an allreduce of which the
    rank keeps its part; gather, scatter and alltoall, rarely on a hot
    path, use a flat gloo group of all ranks, made on first use."""

    def __init__(self, plan: hosts.HostPlan, name: str, store: Any, timeout: datetime.timedelta) -> None:
        self.plan = plan
        self.rank = plan.rank
        self.size = sum(len(h) for h in plan.hosts)
        self._store = store
        self._timeout = timeout
        self._flat: Optional[Gloo] = None
        self._order = torch.tensor(plan.order(), dtype=torch.int64)
        self.local = Group(f"{name}.h{plan.host}", plan.local_rank, plan.local_size, timeout=timeout.total_seconds())
        try:
            self.peers = _gloo(store, f"shmrdv/peers{plan.local_rank}/", plan.host, len(plan.hosts), timeout)
        except BaseException:
            self.local.close()
            raise

    @property
    def flat(self) -> Gloo:
        if self._flat is None:  # on the worker thread, at the same call on every rank
            self._flat = Gloo(self._store, "shmrdv/flat/", self.rank, self.size, self._timeout)
        return self._flat

    def allreduce(self, t: torch.Tensor, op: str) -> None:
        flat = t.view(-1)
        n = flat.numel()
        if n == 0:
            return
        local = self.local.world_size
        block = -(-n // local)
        buf = flat if block * local == n else torch.cat([flat, flat.new_zeros(block * local - n)])
        mine = self.local.reduce_scatter(buf.view(local, block), "sum" if op == "mean" else op).view(-1)
        self.peers.allreduce([mine], _GLOO_OPS[op]).wait()
        flat.copy_(self.local.allgather(mine).view(-1)[:n])
        if op == "mean":
            t.div_(self.size)

    def broadcast(self, t: torch.Tensor, root: int) -> None:
        root_host, root_local = self.plan.locate(root)
        mine = self.plan.host == root_host
        if mine:
            self.local.broadcast(t, root_local, out=t)
        if self.plan.local_rank == 0:
            self.peers.broadcast([t], _options(dist.BroadcastOptions, rootRank=root_host)).wait()
        if not mine:
            self.local.broadcast(t, 0, out=t)

    def allgather(self, out: torch.Tensor, t: torch.Tensor) -> None:
        n = t.numel()
        if n == 0:
            return
        from_peers = t.new_empty(len(self.plan.hosts) * n)
        self.peers._allgather_base(from_peers, t.view(-1)).wait()
        every = self.local.allgather(from_peers)  # row i: local rank i's peers' tensors, in host order
        out.view(self.size, n).index_copy_(0, self._order, every.view(-1, n))

    def reduce_scatter(self, out: torch.Tensor, t: torch.Tensor, op: str) -> None:
        total = t.clone()
        self.allreduce(total, op)
        _fill(out, total.view(self.size, -1)[self.rank])

    def reduce(self, t: torch.Tensor, root: int, op: str) -> None:
        self.allreduce(t if self.rank == root else t.clone(), op)

    def gather(self, out: Optional[torch.Tensor], t: torch.Tensor, root: int) -> None:
        self.flat.gather(out, t, root)

    def scatter(self, out: torch.Tensor, src: Optional[torch.Tensor], root: int) -> None:
        self.flat.scatter(out, src, root)

    def alltoall(self, out: torch.Tensor, t: torch.Tensor, splits: Optional[Sequence[List[int]]]) -> None:
        self.flat.alltoall(out, t, splits)

    def barrier(self) -> None:
        self.local.barrier()
        if self.plan.local_rank == 0:
            self.peers.barrier(dist.BarrierOptions()).wait()
        self.local.barrier()

    def failed(self, error: BaseException) -> None:
        """One part failed: abort the others, so that no rank waits on this
        one in shared memory or in gloo."""
        self.abort(f"rank {self.rank}: {type(error).__name__}: {error}")

    def abort(self, reason: str) -> None:
        if not self.local.closed:
            self.local.abort(reason)
        self.peers.abort()
        if self._flat is not None:
            self._flat.abort(reason)

    def close(self) -> None:
        self.local.close()
        self.peers.shutdown()
        if self._flat is not None:
            self._flat.close()


