"""The "shmrdv" process group: torch.distributed's collectives on CPU
tensors, through shared memory among the ranks of one host and
hierarchically through gloo across hosts.

Creating a group (``create_process_group``, which torch calls on every
member, for the default group and for each ``new_group``):

1. rank 0 draws a random group name and publishes it in the group's Store
   (a prefixed one per group), so that two jobs, or two groups of one job,
   never meet in the same segment;
2. the ranks exchange host identities through the Store (``hosts``) and
   plan: all on one host, a ``shmrdv.Group`` of all of them (``Local``);
   on several hosts with as many ranks each, a Group per host plus a gloo
   group per local index across hosts (``Hierarchy``); on hosts with
   unequal rank counts, one flat gloo group of all ranks (``Gloo``, with
   a warning: correct, without the shared-memory path).

The ProcessGroup itself only adapts torch's calling conventions (lists of
tensors, options objects, non-contiguous tensors) to those three
transports, and runs every call through its worker (``work``: on the
worker's thread, or on the caller's for a call torch waits for at once
with nothing pending before it). Results
are written into the caller's tensors: a contiguous tensor is handed to
the transport as it is (input and output at once where the collective is
in place); only a non-contiguous one is staged through a contiguous copy.
"""
import contextlib
import datetime
import logging
import os
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from ..errors import InvalidArgument, InvalidType, RendezvousError
from ..group import Group
from . import hosts
from .p2p import GlooPeers, SharedPeers
from .transports import Gloo, Hierarchy, Local
from .work import Work, Worker

BACKEND_NAME = "shmrdv"
"""The name to pass to ``torch.distributed.init_process_group``."""

_log = logging.getLogger(__name__)
_KEY_NAME = "shmrdv/name"
_RED = dist.ReduceOp.RedOpType
_OPS = {int(_RED.SUM): "sum", int(_RED.AVG): "mean", int(_RED.PRODUCT): "prod", int(_RED.MIN): "min",
        int(_RED.MAX): "max", int(_RED.BAND): "band", int(_RED.BOR): "bor", int(_RED.BXOR): "bxor"}
"""torch's reduce ops, as shmrdv.Group names them."""


def _agree_name(store: Any, rank: int) -> str:
    """The group's shmrdv name: random, drawn by rank 0, read by the others from the Store."""
    if rank == 0:
        name = f"torch-{os.urandom(8).hex()}"
        store.set(_KEY_NAME, name)
        return name
    return store.get(_KEY_NAME).decode()


def _connect(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Tuple[Any, Any]:
    """The transport for this group, as planned from the ranks' hosts, and
    its point-to-point path: shared memory among the ranks of one host;
    across hosts, a gloo group of all the ranks (made here, as every rank
    makes its group)."""
    name = _agree_name(store, rank)
    plan = hosts.plan_hosts(hosts.exchange_identities(store, rank, size), rank)
    if plan.single_host:
        # Every rank attaches to rank 0's point-to-point rendezvous before
        # joining the Group, whose join returns once all have joined: rank
        # 0 cannot send, close it and exit before a peer has attached.
        peers = SharedPeers(store, rank, size, timeout)
        try:
            group = Group(name, rank, size, timeout=timeout.total_seconds())
        except BaseException:
            peers.close()
            raise
        peers.pid_of = group.pid
        return Local(group), peers
    if not plan.uniform:
        if rank == 0:
            _log.warning("shmrdv: the ranks are spread unevenly over hosts (%s); every collective of this group "
                         "goes through gloo, without shared memory", plan.describe())
        transport: Any = Gloo(store, "shmrdv/flat/", rank, size, timeout)
    elif plan.local_size == 1:  # one rank per host: nothing to share
        transport = Gloo(store, "shmrdv/flat/", rank, size, timeout)
    else:
        _log.debug("shmrdv: hierarchical group %s: %s", name, plan.describe())
        transport = Hierarchy(plan, name, store, timeout)
    try:
        return transport, GlooPeers(transport.pg if isinstance(transport, Gloo) else transport.flat.pg)
    except BaseException:
        transport.close()
        raise


# ---- torch's conventions ----

def _listed(tensors: Any) -> List[torch.Tensor]:
    """A call's tensors as a list: torch passes lists (one tensor per
    device), the group object's own methods also take a bare tensor."""
    return [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)


def _given(tensors: Any, what: str) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """A call's tensors as given (what its Work's result holds), and as the
    CPU tensors it works on; at least one."""
    given = _listed(tensors)
    if not given:
        raise InvalidArgument(f"{what}: no tensor given")
    return given, [_cpu(t, what) for t in given]


def _one(tensors: Any, what: str) -> torch.Tensor:
    """The one CPU tensor of a call (torch passes lists, one tensor per device)."""
    tensors = _listed(tensors)
    if len(tensors) != 1:
        raise InvalidArgument(f"{what}: the shmrdv backend takes one tensor per call, got {len(tensors)}")
    return _cpu(tensors[0], what)


def _options(given: Any, kind: Any, **fields: Any) -> Any:
    """torch's options object for a call: ``given`` when it is one; else a
    new one with the fields of the group object's short forms (an op, a
    root) that were given."""
    if isinstance(given, kind):
        return given
    opts = kind()
    for name, value in fields.items():
        if value is not None:
            setattr(opts, name, value if name != "reduceOp" or isinstance(value, dist.ReduceOp)
                    else dist.ReduceOp(value))
    return opts


def _combine(acc: torch.Tensor, other: torch.Tensor, op: str) -> None:
    """acc = acc op other, in place (several tensors of one rank, before
    the collective)."""
    if op in ("sum", "mean"):
        acc.add_(other)
    elif op == "prod":
        acc.mul_(other)
    elif op == "min":
        torch.minimum(acc, other, out=acc)
    elif op == "max":
        torch.maximum(acc, other, out=acc)
    elif op == "band":
        acc.bitwise_and_(other)
    elif op == "bor":
        acc.bitwise_or_(other)
    else:
        acc.bitwise_xor_(other)


def _alike(tensors: Sequence[torch.Tensor], what: str) -> None:
    """The tensors of one call (several per call, gloo's form) share
    layout, dtype and shape; else say which one differs, and how."""
    first = tensors[0]
    for i, t in enumerate(tensors[1:], 1):
        if t.layout != first.layout:
            differs = f"tensor {i} is {t.layout}, tensor 0 {first.layout}"
        elif t.dtype != first.dtype:
            differs = f"tensor {i} has dtype {t.dtype}, tensor 0 {first.dtype}"
        elif t.shape != first.shape:
            differs = f"tensor {i} has shape {tuple(t.shape)}, tensor 0 {tuple(first.shape)}"
        else:
            continue
        raise InvalidArgument(f"{what}: {differs}; the tensors of one call must match")


def _root_tensor(opts: Any, count: int, what: str) -> int:
    """opts.rootTensor, checked against the count of tensors given."""
    index = int(getattr(opts, "rootTensor", 0))
    if not 0 <= index < count:
        raise InvalidArgument(f"{what}: rootTensor {index} is not one of the {count} tensors given")
    return index


def _cpu(t: torch.Tensor, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise InvalidType(f"{what}: expected a tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise InvalidType(f"{what}: a {t.device.type} tensor; the shmrdv backend moves CPU tensors")
    return t.detach()


def _waited(opts: Any) -> bool:
    """Whether torch waits for the call as soon as it returns (a call with
    async_op=False): then it may run on the caller's thread (``work``)."""
    return opts is not None and not getattr(opts, "asyncOp", True)


def _reduction(opts: Any, t: torch.Tensor, what: str) -> str:
    """The Group op for opts.reduceOp, checked against t's dtype here, on
    the caller's thread, so that a wrong call raises before it starts."""
    code = int(opts.reduceOp.op)
    op = _OPS.get(code)
    if op is None:
        raise InvalidArgument(f"{what}: the shmrdv backend does not support {opts.reduceOp.op}")
    fractional = t.is_floating_point() or t.is_complex()
    if op == "mean" and not fractional:
        raise InvalidArgument(f"{what}: ReduceOp.AVG needs a floating dtype, not {t.dtype}; use SUM and divide")
    if op in ("band", "bor", "bxor") and fractional:
        raise InvalidArgument(f"{what}: {opts.reduceOp.op} is for integer and bool tensors, not {t.dtype}")
    if op in ("min", "max") and t.is_complex():
        raise InvalidArgument(f"{what}: {opts.reduceOp.op} is not defined for complex tensors")
    return op


@contextlib.contextmanager
def _writable(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """t itself when contiguous (the result goes straight into it), else a
    contiguous copy whose result is copied back into t."""
    if t.is_contiguous():
        yield t
        return
    staged = t.contiguous()
    yield staged
    t.copy_(staged)


def _same(tensors: Sequence[torch.Tensor], like: torch.Tensor, count: int, what: str,
          each: str = "rank") -> List[torch.Tensor]:
    """count CPU tensors of like's shape and dtype (one per ``each``)."""
    if len(tensors) != count:
        raise InvalidArgument(f"{what}: expected {count} tensors (one per {each}), got {len(tensors)}")
    checked = [_cpu(t, what) for t in tensors]
    for t in checked:
        if t.shape != like.shape or t.dtype != like.dtype:
            raise InvalidArgument(f"{what}: every tensor must have shape {tuple(like.shape)} and dtype "
                                  f"{like.dtype}, got {tuple(t.shape)} and {t.dtype}")
    return checked


def _sized(t: torch.Tensor, like: torch.Tensor, factor: int, what: str) -> None:
    if t.numel() != factor * like.numel() or t.dtype != like.dtype:
        raise InvalidArgument(f"{what}: expected {factor} x {like.numel()} elements of {like.dtype}, got "
                              f"{t.numel()} of {t.dtype}")


def _splits(given: Sequence[int], rows: int, world: int, what: str) -> List[int]:
    splits = [int(n) for n in given] if len(given) else [rows // world] * world
    if len(splits) != world or sum(splits) != rows or min(splits) < 0 or (not len(given) and rows % world):
        raise InvalidArgument(f"{what}: splits {list(given)} do not divide {rows} rows among {world} ranks")
    return splits


class ProcessGroupShmrdv(dist.ProcessGroup):
    """torch.distributed's process group over shmrdv (see the module docstring)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)
        self._group_name = ""
        self._group_desc = ""
        self._world = size
        self._rank = rank
        self._closed = False
        self._timeout = timeout
        self._transport, self._peers = _connect(store, rank, size, timeout)  # every rank attached (see _connect)
        self._worker = Worker(f"shmrdv-pg-r{rank}", self._transport.failed, self._abandoned)

    def _abandoned(self, exc: BaseException) -> None:
        self._transport.abort(f"rank {self.rank()}: a wait for a collective was interrupted ({type(exc).__name__})")

    def __repr__(self) -> str:
        return f"ProcessGroupShmrdv(rank={self.rank()}, size={self.size()}, {type(self._transport).__name__})"

    # ---- names torch sets and reads ----

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def _get_backend(self, device: Any) -> "ProcessGroupShmrdv":
        """torch asks a group for its backend on a device (torch 2.15's
        batch_isend_irecv does, to learn whether it coalesces): a "shmrdv"
        group is its own backend."""
        return self

    supports_coalescing = False
    """Point-to-point calls run one by one (torch's batch_isend_irecv then issues them so)."""

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    # ---- the collectives ----

    def allreduce(self, tensors: Any, opts: Any = None, op: Any = None, timeout: Any = None) -> Work:
        """One tensor, or several (gloo's form: the reduction of every
        tensor of every rank lands in each of them). Also the group
        object's short form, ``allreduce(tensor, op)``."""
        if opts is not None and not isinstance(opts, dist.AllreduceOptions):
            opts, op = None, opts
        opts = _options(opts, dist.AllreduceOptions, reduceOp=op)
        given, listed = _given(tensors, "allreduce")
        t = listed[0]
        _alike(listed, "allreduce")
        if t.is_sparse:
            return self._sparse_allreduce(given, listed, opts)
        op = _reduction(opts, t, "allreduce")

        def run() -> None:
            with _writable(t) as buf:
                for other in listed[1:]:
                    _combine(buf, other, op)
                self._transport.allreduce(buf, op)
            for other in listed[1:]:
                other.copy_(t)
        return self._worker.submit(run, given, waited=_waited(opts))

    def _sparse_allreduce(self, given: List[torch.Tensor], listed: List[torch.Tensor], opts: Any) -> Work:
        """Sparse COO tensors, summed as gloo sums them: every rank's
        indices and values gathered (padded to the largest count), added
        up and coalesced; the sum replaces each tensor given."""
        if int(opts.reduceOp.op) != int(_RED.SUM):
            raise InvalidArgument(f"allreduce: sparse tensors are summed only (ReduceOp.SUM), not {opts.reduceOp.op}")

        def run() -> None:
            local = listed[0].coalesce()
            for other in listed[1:]:
                local = (local + other).coalesce()
            total = _sparse_sum(self._transport, local, self._world)
            with torch.no_grad():  # into the tensors given: a detached alias would take the new nnz alone
                for t in given:
                    t.copy_(total)
        return self._worker.submit(run, given, waited=_waited(opts))

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> Work:
        """The tensors reduced as one flat buffer per dtype (one collective
        each); a tensor listed twice is reduced once and written twice."""
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        given, listed = _given(tensors, "allreduce_coalesced")
        for i, t in enumerate(listed):
            if t.layout != torch.strided:
                raise InvalidArgument(f"allreduce_coalesced: tensor {i} is {t.layout}; coalesced calls take dense "
                                      f"tensors (allreduce a sparse tensor on its own)")
        unique = list({(t.data_ptr(), t.dtype, tuple(t.shape), t.stride()): t for t in listed}.values())
        by_dtype: dict = {}
        for t in unique:
            by_dtype.setdefault(t.dtype, []).append(t)
        ops = {dtype: _reduction(opts, ts[0], "allreduce_coalesced") for dtype, ts in by_dtype.items()}

        def run() -> None:
            for dtype, ts in by_dtype.items():
                flat = torch.cat([t.reshape(-1) for t in ts])
                self._transport.allreduce(flat, ops[dtype])
                at = 0
                for t in ts:
                    t.copy_(flat[at:at + t.numel()].view(t.shape))
                    at += t.numel()
            for t in listed:  # a view listed beside its base, and so on: every listed tensor gets its result
                if all(t is not u for u in unique):
                    twin = next(u for u in unique if u.data_ptr() == t.data_ptr() and u.shape == t.shape)
                    t.copy_(twin)
        return self._worker.submit(run, given, waited=_waited(opts))

    def broadcast(self, tensors: Any, opts: Any = None, root: Optional[int] = None, timeout: Any = None) -> Work:
        """One tensor, or several (gloo's form: the root's tensor number
        ``opts.rootTensor`` lands in every tensor of every rank). Also the
        group object's short form, ``broadcast(tensor, root)``."""
        if isinstance(opts, int):
            opts, root = None, opts
        opts = _options(opts, dist.BroadcastOptions, rootRank=root)
        given, listed = _given(tensors, "broadcast")
        t = listed[_root_tensor(opts, len(listed), "broadcast")]
        _alike(listed, "broadcast")
        root = self._root(opts, "broadcast")

        def run() -> None:
            with _writable(t) as buf:
                self._transport.broadcast(buf, root)
            for other in listed:
                if other is not t:
                    other.copy_(t)
        return self._worker.submit(run, given, waited=_waited(opts))

    def reduce(self, tensors: Any, opts: Any = None, op: Any = None, timeout: Any = None) -> Work:
        """Also the group object's short form, ``reduce(tensor, root, op)``."""
        root = None
        if isinstance(opts, int):
            opts, root = None, opts
        opts = _options(opts, dist.ReduceOptions, rootRank=root, reduceOp=op)
        _root_tensor(opts, len(_listed(tensors)), "reduce")
        t = _one(tensors, "reduce")
        op = _reduction(opts, t, "reduce")
        root = self._root(opts, "reduce")

        def run() -> None:
            with _writable(t) as buf:
                self._transport.reduce(buf, root, op)
        return self._worker.submit(run, _listed(tensors), waited=_waited(opts))

    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None, timeout: Any = None) -> Work:
        """One tensor, or several (gloo's form: with n inputs, each of the n
        output lists gets every rank's n inputs, rank by rank). Also the
        group object's short form, ``allgather(outputs, tensor)``."""
        if isinstance(input_tensors, torch.Tensor):
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        inputs = [_cpu(t, "all_gather") for t in input_tensors]
        if not inputs:
            raise InvalidArgument("all_gather: no tensor given")
        if len(output_tensors) != len(inputs):
            raise InvalidArgument(f"all_gather: {len(inputs)} inputs but {len(output_tensors)} output lists "
                                  f"(one list per input)")
        _alike(inputs, "all_gather")
        t, n = inputs[0], len(inputs)
        each = "rank" if n == 1 else f"input of each rank, {n} per rank"
        outputs = [_same(outs, t, self._world * n, "all_gather", each) for outs in output_tensors]

        def run() -> None:
            mine = t.contiguous() if n == 1 else torch.stack(inputs)
            gathered = t.new_empty((self._world,) + tuple(mine.shape))
            self._transport.allgather(gathered, mine)
            rows = gathered.view((self._world * n,) + tuple(t.shape))
            for outs in outputs:
                for out, row in zip(outs, rows):
                    out.copy_(row)
        value: List[Any] = _flattened(output_tensors) if n == 1 else [list(outs) for outs in output_tensors]
        return self._worker.submit(run, value, waited=_waited(opts))

    def allgather_coalesced(self, output_lists: List[List[torch.Tensor]], input_list: Any,
                            opts: Any = None) -> Work:
        """``output_lists[r][i]`` gets rank r's input i (torch's layout)."""
        inputs = [_cpu(t, "all_gather_coalesced") for t in _listed(input_list)]
        if len(output_lists) != self._world:
            raise InvalidArgument(f"all_gather_coalesced: expected {self._world} output lists (one per rank), "
                                  f"got {len(output_lists)}")
        outputs = []
        for r, outs in enumerate(output_lists):
            if len(outs) != len(inputs):
                raise InvalidArgument(f"all_gather_coalesced: output list {r} has {len(outs)} tensors for "
                                      f"{len(inputs)} inputs")
            outputs.append([_same([o], t, 1, "all_gather_coalesced")[0] for o, t in zip(outs, inputs)])

        def run() -> None:
            for i, t in enumerate(inputs):
                gathered = t.new_empty((self._world,) + tuple(t.shape))
                self._transport.allgather(gathered, t.contiguous())
                for r in range(self._world):
                    outputs[r][i].copy_(gathered[r])
        return self._worker.submit(run, _flattened(output_lists), waited=_waited(opts))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        return self.all_gather_single_coalesced([output], [input], opts)

    def all_gather_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                                    opts: Any = None) -> Work:
        pairs = self._pairs(outputs, inputs, "all_gather_into_tensor")
        for out, t in pairs:
            _sized(out, t, self._world, "all_gather_into_tensor")

        def run() -> None:
            for out, t in pairs:
                with _writable(out) as buf:
                    self._transport.allgather(buf, t.contiguous())
        return self._worker.submit(run, list(outputs), waited=_waited(opts))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors: Any, input_tensors: Any, opts: Any = None, timeout: Any = None) -> Work:
        """Also the group object's short form, ``gather(outputs, tensor, root)``."""
        if isinstance(input_tensors, torch.Tensor):
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        opts = _options(opts, dist.GatherOptions, rootRank=opts if isinstance(opts, int) else None)
        t = _one(input_tensors, "gather")
        root = self._root(opts, "gather")
        if self.rank() != root and any(len(outs) for outs in output_tensors if outs is not None):
            raise InvalidArgument(f"gather: outputs are given on the root only; rank {self.rank()} is not root {root}")
        outputs = (_same(_one_list(output_tensors, "gather"), t, self._world, "gather")
                   if self.rank() == root else None)

        def run() -> None:
            gathered = t.new_empty((self._world,) + tuple(t.shape)) if outputs is not None else None
            self._transport.gather(gathered, t.contiguous(), root)
            if outputs is not None:
                for out, row in zip(outputs, gathered):
                    out.copy_(row)
        return self._worker.submit(run, _flattened(output_tensors), waited=_waited(opts))

    def scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None, timeout: Any = None) -> Work:
        """Also the group object's short form, ``scatter(tensor, inputs, root)``."""
        if isinstance(output_tensors, torch.Tensor):
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        opts = _options(opts, dist.ScatterOptions, rootRank=opts if isinstance(opts, int) else None)
        t = _one(output_tensors, "scatter")
        root = self._root(opts, "scatter")
        if self.rank() != root and any(len(ins) for ins in input_tensors if ins is not None):
            raise InvalidArgument(f"scatter: inputs are given on the root only; rank {self.rank()} is not root {root}")
        inputs = _same(_one_list(input_tensors, "scatter"), t, self._world, "scatter") if self.rank() == root else None

        def run() -> None:
            with _writable(t) as buf:
                self._transport.scatter(buf, torch.stack(inputs) if inputs is not None else None, root)
        return self._worker.submit(run, _listed(output_tensors), waited=_waited(opts))

    def reduce_scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None, timeout: Any = None) -> Work:
        """Input r is what rank r gets the reduction of; inputs may differ
        in size from rank to rank (as gloo allows), each the size of its
        rank's output. Also the group object's short form,
        ``reduce_scatter(tensor, inputs, op)``."""
        op_given = None
        if isinstance(output_tensors, torch.Tensor):
            output_tensors, input_tensors = [output_tensors], [input_tensors]
            if opts is not None and not isinstance(opts, dist.ReduceScatterOptions):
                opts, op_given = None, opts
        opts = _options(opts, dist.ReduceScatterOptions, reduceOp=op_given)
        t = _one(output_tensors, "reduce_scatter")
        given = _one_list(input_tensors, "reduce_scatter")
        op = _reduction(opts, t, "reduce_scatter")
        if all(isinstance(i, torch.Tensor) and i.shape == t.shape for i in given):
            inputs = _same(given, t, self._world, "reduce_scatter")

            def run() -> None:
                with _writable(t) as buf:
                    self._transport.reduce_scatter(buf, torch.stack(inputs), op)
            return self._worker.submit(run, _listed(output_tensors), waited=_waited(opts))
        uneven = [_cpu(i, "reduce_scatter") for i in given]
        if len(uneven) != self._world or any(i.dtype != t.dtype for i in uneven) \
                or uneven[self.rank()].numel() != t.numel():
            raise InvalidArgument(f"reduce_scatter: expected {self._world} inputs of {t.dtype}, this rank's with "
                                  f"{t.numel()} elements like its output")

        def run_uneven() -> None:  # one allreduce of every input, of which this rank keeps its part
            flat = torch.cat([i.reshape(-1) for i in uneven])
            self._transport.allreduce(flat, op)
            at = sum(i.numel() for i in uneven[:self.rank()])
            t.copy_(flat[at:at + t.numel()].view(t.shape))
        return self._worker.submit(run_uneven, _listed(output_tensors), waited=_waited(opts))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        return self.reduce_scatter_single_coalesced([output], [input], opts)

    def reduce_scatter_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor],
                                        opts: Any = None) -> Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        pairs = self._pairs(outputs, inputs, "reduce_scatter_tensor")
        ops = []
        for out, t in pairs:
            _sized(t, out, self._world, "reduce_scatter_tensor")
            ops.append(_reduction(opts, t, "reduce_scatter_tensor"))

        def run() -> None:
            for (out, t), op in zip(pairs, ops):
                with _writable(out) as buf:
                    self._transport.reduce_scatter(buf, t.contiguous(), op)
        return self._worker.submit(run, list(outputs), waited=_waited(opts))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: Sequence[int],
                          input_split_sizes: Sequence[int], opts: Any = None) -> Work:
        out, t = _cpu(output, "all_to_all_single"), _cpu(input, "all_to_all_single")
        if out.dtype != t.dtype or (out.dim() and t.dim() and out.shape[1:] != t.shape[1:]):
            raise InvalidArgument(f"all_to_all_single: output {tuple(out.shape)} {out.dtype} and input "
                                  f"{tuple(t.shape)} {t.dtype} must share dtype and row shape")
        if len(output_split_sizes) or len(input_split_sizes):
            rows_out = out.shape[0] if out.dim() else 0
            rows_in = t.shape[0] if t.dim() else 0
            splits: Optional[Sequence[List[int]]] = (
                _splits(output_split_sizes, rows_out, self._world, "all_to_all_single: output_split_sizes"),
                _splits(input_split_sizes, rows_in, self._world, "all_to_all_single: input_split_sizes"))
        else:
            if t.dim() == 0 or t.shape[0] % self._world or out.shape != t.shape:
                raise InvalidArgument(f"all_to_all_single: without splits, input and output need the same shape "
                                      f"with rows divisible by {self._world}, got {tuple(t.shape)} and "
                                      f"{tuple(out.shape)}")
            splits = None

        def run() -> None:
            with _writable(out) as buf:
                self._transport.alltoall(buf, t.contiguous(), splits)
        return self._worker.submit(run, [output], waited=_waited(opts))

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor],
                 opts: Any = None) -> Work:
        if not input_tensors:
            raise InvalidArgument("all_to_all: no input tensors")
        first = _cpu(input_tensors[0], "all_to_all")
        inputs = _same(input_tensors, first, self._world, "all_to_all")
        outputs = _same(output_tensors, first, self._world, "all_to_all (outputs must match the inputs' shape)")

        def run() -> None:
            received = first.new_empty((self._world,) + tuple(first.shape))
            self._transport.alltoall(received, torch.stack(inputs), None)
            for out, row in zip(outputs, received):
                out.copy_(row)
        return self._worker.submit(run, _listed(output_tensors), waited=_waited(opts))

    # ---- point-to-point (p2p.py) ----

    def send(self, tensors: Any, dstRank: int, tag: int = 0) -> Any:
        return self._peers.send(self._p2p_tensor(tensors, "send"), self._peer(dstRank, "send"), int(tag))

    def recv(self, tensors: Any, srcRank: int, tag: int = 0) -> Any:
        return self._peers.recv(self._p2p_tensor(tensors, "recv"), self._peer(srcRank, "recv"), int(tag))

    @staticmethod
    def _p2p_tensor(tensors: Any, what: str) -> torch.Tensor:
        """The one CPU tensor of a point-to-point call: what ``_one`` checks,
        in fewer steps for the case torch always passes (a list of one CPU
        tensor), as a round trip is mostly such per-call costs."""
        if type(tensors) is list and len(tensors) == 1:
            t = tensors[0]
            if type(t) is torch.Tensor and t.is_cpu:
                return t.detach() if t.requires_grad else t
        return _one(tensors, what)

    def recv_anysource(self, tensors: Any, tag: int = 0) -> Any:
        return self._peers.recv_any(_one(tensors, "recv"), int(tag))

    def monitored_barrier(self, timeout: Optional[datetime.timedelta] = None, wait_all_ranks: bool = False) -> None:
        """A barrier that names the ranks that did not come within timeout
        (default: the group's): rank 0 raises naming the first (every one,
        with ``wait_all_ranks``), the others raise that rank 0 did not let
        them through. torch's ``dist.monitored_barrier`` refuses every
        backend but gloo by name: call ``shmrdv.torch.monitored_barrier``."""
        seconds = (timeout if timeout is not None else self._timeout).total_seconds()
        self._peers.monitored_barrier(seconds, wait_all_ranks)

    def _peer(self, rank: int, what: str) -> int:
        if not 0 <= rank < self._world or rank == self._rank:
            raise InvalidArgument(f"{what}: rank {rank} is not another rank of this group of {self._world}")
        return rank

    def barrier(self, opts: Any = None, timeout: Any = None) -> Work:
        return self._worker.submit(self._transport.barrier, [], waited=_waited(opts))

    def _root(self, opts: Any, what: str) -> int:
        root = int(opts.rootRank)
        if not 0 <= root < self._world:
            raise InvalidArgument(f"{what}: root {root} is not a rank of this group of {self._world}")
        return root

    def _pairs(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], what: str) -> List[Any]:
        if len(outputs) != len(inputs):
            raise InvalidArgument(f"{what}: {len(outputs)} outputs but {len(inputs)} inputs")
        return [(_cpu(o, what), _cpu(i, what)) for o, i in zip(outputs, inputs)]

    # ---- lifetime ----

    def shutdown(self) -> None:
        """Finish the queued collectives, then leave the group (destroy_process_group)."""
        if self._closed:
            return
        self._worker.close(timeout=30)
        if self._worker.running:  # a collective still waits for a peer that will not come
            self._transport.abort(f"rank {self.rank()} shut the process group down with collectives pending")
            self._worker.close(timeout=5)
        self._close()

    def abort(self) -> None:
        """End every pending collective, here and on the peers (they raise Aborted)."""
        if self._closed:
            return
        self._transport.abort(f"rank {self.rank()} aborted the process group")
        self._peers.abort(f"rank {self.rank()} aborted the process group")
        self._worker.close(timeout=5)
        self._close()

    def _close(self) -> None:
        self._closed = True
        self._peers.close()
        self._transport.close()


def _sparse_sum(transport: Any, local: torch.Tensor, world: int) -> torch.Tensor:
    """The sum over the ranks of a coalesced sparse tensor, through allgathers."""
    indices, values = local.indices(), local.values()
    counts = torch.empty(world, dtype=torch.int64)
    transport.allgather(counts, torch.tensor([indices.shape[1]], dtype=torch.int64))
    most = int(counts.max())
    padded_indices = indices.new_zeros((indices.shape[0], most))
    padded_indices[:, :indices.shape[1]] = indices
    padded_values = values.new_zeros((most,) + tuple(values.shape[1:]))
    padded_values[:values.shape[0]] = values
    all_indices = indices.new_empty((world,) + tuple(padded_indices.shape))
    all_values = values.new_empty((world,) + tuple(padded_values.shape))
    transport.allgather(all_indices, padded_indices)
    transport.allgather(all_values, padded_values)
    n = [int(c) for c in counts]
    return torch.sparse_coo_tensor(torch.cat([all_indices[r][:, :n[r]] for r in range(world)], dim=1),
                                   torch.cat([all_values[r][:n[r]] for r in range(world)]),
                                   local.shape).coalesce()


def _flattened(lists: Sequence[Sequence[torch.Tensor]]) -> List[torch.Tensor]:
    return [t for ts in lists for t in ts]


def _one_list(lists: Sequence[Sequence[torch.Tensor]], what: str) -> Sequence[torch.Tensor]:
    if len(lists) != 1:
        raise InvalidArgument(f"{what}: the shmrdv backend takes one list of tensors per call, got {len(lists)}")
    return lists[0]


def create_process_group(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> ProcessGroupShmrdv:
    """The creator torch calls on every member of a new group (the default
    one and each new_group), with a Store of that group's own."""
    if not isinstance(timeout, datetime.timedelta):
        raise RendezvousError(f"the shmrdv backend expects a timedelta timeout, got {type(timeout).__name__}")
    return ProcessGroupShmrdv(store, rank, size, timeout)


__all__ = ["BACKEND_NAME", "ProcessGroupShmrdv", "create_process_group"]
