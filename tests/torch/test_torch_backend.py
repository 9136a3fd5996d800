"""The torch.distributed backend "shmrdv" (shmrdv.torch): every collective
against the values it must give, on one host with 1, 2 and 3 ranks and on
two fake hosts of two ranks each against gloo; async_op, new_group, the
three init methods, DistributedDataParallel against gloo, and a rank
SIGKILLed mid-training.

The ranks are processes forked from a forkserver that has imported torch
once (importing torch takes seconds; forking it does not). Each child
reports through a queue, every join is bounded, and each test checks that
it left no process and no /dev/shm entry of its own behind.
"""
import datetime
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

import shmrdv  # noqa: E402
import shmrdv.torch  # noqa: E402
from shmrdv.torch import hosts  # noqa: E402

from ..conftest import free_port  # noqa: E402
from .ranks import run_ranks  # noqa: E402

pytestmark = pytest.mark.slow

RANK_TIMEOUT = datetime.timedelta(seconds=30)  # every collective in a child ends within this
KILLED_AT_STEP = 8


# ---- running ranks ----

def _init(rank, world, init_method, backend="shmrdv"):
    dist.init_process_group(backend, rank=rank, world_size=world, init_method=init_method, timeout=RANK_TIMEOUT)


def _file(tmp_path, name="store"):
    return f"file://{tmp_path / name}"


def _loopback(rank):
    return {"GLOO_SOCKET_IFNAME": "lo"}  # the reference gloo groups, on this one machine


# ---- what the ranks run ----

def _value(rank, n=6, dtype=torch.float32):
    """Rank r's tensor in the tests: small integers, so that every sum is exact."""
    return (torch.arange(n) + 10 * rank).to(dtype)


def _check(got, expected, what, exact=True):
    ok = torch.equal(got, expected) if exact else torch.allclose(got.float(), expected.float(), rtol=1e-3)
    assert ok, f"{what}: got {got}, expected {expected}"


def _barrier_waits_for(late, rank, group=None):
    """A barrier holds every rank until the late one has come."""
    if rank == late:
        time.sleep(0.3)
    start = time.monotonic()
    dist.barrier(group=group)
    if rank != late:
        assert time.monotonic() - start > 0.2, "the barrier let a rank through before the late one came"


def _all_collectives(rank, world, init_method):
    """Every supported collective, on one host, against the values it must give."""
    _init(rank, world, init_method)
    R = range(world)
    every = torch.stack([_value(r) for r in R])
    assert "Local" in repr(dist.group.WORLD)

    folds = {dist.ReduceOp.SUM: every.sum(0), dist.ReduceOp.PRODUCT: every.prod(0),
             dist.ReduceOp.MIN: every.amin(0), dist.ReduceOp.MAX: every.amax(0), dist.ReduceOp.AVG: every.mean(0)}
    for op, expected in folds.items():
        t = _value(rank)
        dist.all_reduce(t, op)
        _check(t, expected, f"all_reduce {op}", exact=op != dist.ReduceOp.AVG)
    bits = [torch.tensor([0b1111, 0b1010, 0b0110, 7], dtype=torch.int32) ^ (r + 1) for r in R]
    for op, fold in [(dist.ReduceOp.BAND, torch.bitwise_and), (dist.ReduceOp.BOR, torch.bitwise_or),
                     (dist.ReduceOp.BXOR, torch.bitwise_xor)]:
        t = bits[rank].clone()
        dist.all_reduce(t, op)
        expected = bits[0]
        for b in bits[1:]:
            expected = fold(expected, b)
        _check(t, expected, f"all_reduce {op}")
    for dtype in (torch.bfloat16, torch.float16):
        t = _value(rank, dtype=dtype)
        dist.all_reduce(t)
        _check(t, every.sum(0).to(dtype), f"all_reduce {dtype}")
    base = torch.zeros(4, 6)
    strided = base[:, ::2]  # not contiguous: staged, and written back
    strided.copy_(_value(rank, 12).view(4, 3))
    dist.all_reduce(strided)
    _check(base[:, ::2], sum(_value(r, 12) for r in R).view(4, 3), "all_reduce of a strided view")
    _check(base[:, 1::2], torch.zeros(4, 3), "the columns between")
    empty = torch.empty(0)
    dist.all_reduce(empty)

    root = world - 1
    t = _value(rank)
    dist.broadcast(t, src=root)
    _check(t, _value(root), "broadcast")

    outs = [torch.empty(6) for _ in R]
    dist.all_gather(outs, _value(rank))
    _check(torch.stack(outs), every, "all_gather")
    out = torch.empty(world * 6)
    dist.all_gather_into_tensor(out, _value(rank))
    _check(out, every.view(-1), "all_gather_into_tensor")

    inputs = [torch.arange(world * 4, dtype=torch.float32) + r for r in R]
    out = torch.empty(4)
    dist.reduce_scatter_tensor(out, inputs[rank])
    _check(out, sum(inputs)[rank * 4 : (rank + 1) * 4], "reduce_scatter_tensor")
    out = torch.empty(6)
    dist.reduce_scatter(out, [_value(rank) + j for j in R], op=dist.ReduceOp.MAX)
    _check(out, every.amax(0) + rank, "reduce_scatter")

    t = _value(rank)
    dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
    if rank == root:
        _check(t, every.amax(0), "reduce")
    gathered = [torch.empty(6) for _ in R] if rank == 0 else None
    dist.gather(_value(rank), gather_list=gathered, dst=0)
    if rank == 0:
        _check(torch.stack(gathered), every, "gather")
    out = torch.empty(6)
    dist.scatter(out, [-_value(j) for j in R] if rank == root else None, src=root)
    _check(out, -_value(rank), "scatter")

    t = torch.arange(world * 2, dtype=torch.float32) + 100 * rank
    out = torch.empty(world * 2)
    dist.all_to_all_single(out, t)
    _check(out, torch.cat([torch.arange(rank * 2, rank * 2 + 2, dtype=torch.float32) + 100 * j for j in R]),
           "all_to_all_single")
    rows = [[(r + j) % world + 1 for j in R] for r in R]  # rows[r][j]: rows rank r sends rank j
    t = torch.cat([torch.full((rows[rank][j], 2), 100.0 * rank + j) for j in R])
    out = torch.empty(sum(rows[j][rank] for j in R), 2)
    dist.all_to_all_single(out, t, output_split_sizes=[rows[j][rank] for j in R],
                           input_split_sizes=rows[rank])
    _check(out, torch.cat([torch.full((rows[j][rank], 2), 100.0 * j + rank) for j in R]), "uneven all_to_all_single")
    outs = [torch.empty(3) for _ in R]
    dist.all_to_all(outs, [torch.full((3,), 10.0 * rank + j) for j in R])
    _check(torch.stack(outs), torch.stack([torch.full((3,), 10.0 * j + rank) for j in R]), "all_to_all")

    dist.barrier()
    _barrier_waits_for(world - 1, rank)

    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank, "text": "x" * rank})  # sizes, then padded bytes
    assert objects == [{"rank": r, "text": "x" * r} for r in R], objects
    shared = [f"from {rank}", rank] if rank == root else [None, None]
    dist.broadcast_object_list(shared, src=root)
    assert shared == [f"from {root}", root], shared

    tensors = [torch.full((5,), float(rank + i)) for i in range(6)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    future = works[-1].get_future()
    for i, (w, t) in enumerate(zip(works, tensors)):
        assert w.wait() is True
        assert w.is_completed() and w.is_success()
        _check(t, torch.full((5,), float(sum(r + i for r in R))), f"async all_reduce {i}")
    assert future.wait()[0] is tensors[-1]
    dist.destroy_process_group()
    return True


def _errors(rank, world, init_method):
    """A mismatch raises on every rank (the group goes on); a wrong op for the dtype raises at the call."""
    _init(rank, world, init_method)
    t = torch.ones(4 + rank)
    with pytest.raises(shmrdv.CollectiveMismatch):
        dist.all_reduce(t)
    work = dist.all_reduce(torch.ones(3, dtype=torch.float64 if rank else torch.float32), async_op=True)
    with pytest.raises(shmrdv.CollectiveMismatch):
        work.wait()
    with pytest.raises(ValueError, match="AVG"):
        dist.all_reduce(torch.ones(2, dtype=torch.int64), dist.ReduceOp.AVG)
    t = torch.ones(3)
    dist.all_reduce(t)
    _check(t, torch.full((3,), float(world)), "all_reduce after the errors")
    dist.destroy_process_group()
    return True


def _interrupted_wait(rank, world, init_method, flag):
    """Rank 0's wait for an async all_reduce rank 1 never joins is interrupted
    (Ctrl-C): the group is aborted at once, on both ranks, and
    destroy_process_group in a finally has nothing left to wait for."""
    _init(rank, world, init_method)
    try:
        if rank == 0:
            work = dist.all_reduce(torch.ones(4), async_op=True)
            with pytest.raises(KeyboardInterrupt):
                threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
                work.wait()
            deadline = time.monotonic() + 10  # far less than the collective's own timeout (RANK_TIMEOUT)
            while not work.is_completed() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert isinstance(work.exception(), shmrdv.Aborted), work.exception()
            open(flag, "w").close()
        else:
            deadline = time.monotonic() + 20
            while not os.path.exists(flag) and time.monotonic() < deadline:
                time.sleep(0.01)
            with pytest.raises(shmrdv.Aborted, match="rank 0: a wait for a collective was interrupted"):
                dist.barrier()
    finally:
        dist.destroy_process_group()
    return True


def _subgroups(rank, world, init_method):
    """Two disjoint new_groups at once: each its own shmrdv Group, neither waits for the other."""
    _init(rank, world, init_method)
    low, high = dist.new_group([0, 1]), dist.new_group([2, 3])
    mine = low if rank < 2 else high
    if rank >= 2:
        time.sleep(1.0)  # the low group's collectives must not wait for this one's
    start = time.monotonic()
    for i in range(20 if rank < 2 else 3):
        t = torch.full((4 + (rank >= 2),), float(rank + i))
        dist.all_reduce(t, group=mine)
        first = 0 if rank < 2 else 2
        _check(t, torch.full_like(t, float(2 * first + 1 + 2 * i)), "subgroup all_reduce")
    elapsed = time.monotonic() - start
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    _check(t, torch.tensor([6.0]), "the default group afterwards")
    dist.destroy_process_group()
    return elapsed


def _one_all_reduce(rank, world, init_method):
    _init(rank, world, init_method)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    dist.barrier()
    dist.destroy_process_group()
    return float(t)


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _train(rank, steps, model, on_step=None):
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)
    for step in range(steps):
        x = torch.randn(16, 8, generator=data)
        y = torch.randn(16, 4, generator=data)
        if on_step is not None:
            on_step(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _ddp_both(rank, world, store_dir):
    """The same training with shmrdv and with gloo."""
    finals = {}
    for backend in ("shmrdv", "gloo"):
        _init(rank, world, f"file://{store_dir}/{backend}", backend)
        torch.manual_seed(42)
        model = _mlp()
        initial = [p.detach().clone() for p in model.parameters()]
        finals[backend] = _train(rank, 50, model)
        dist.destroy_process_group()
        assert any(not torch.equal(a, b) for a, b in zip(initial, finals[backend])), "nothing was trained"
    for a, b in zip(finals["shmrdv"], finals["gloo"]):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max()
    return [p.numpy() for p in finals["shmrdv"]]


def _killed_mid_training(rank, world, init_method):
    """Rank world-1 SIGKILLs itself in step KILLED_AT_STEP; the others must raise, soon."""
    _init(rank, world, init_method)
    hierarchical = "Hierarchy" in repr(dist.group.WORLD)
    mark = {}

    def on_step(step):
        mark["step"], mark["at"] = step, time.monotonic()
        if step == KILLED_AT_STEP and rank == world - 1:
            os.kill(os.getpid(), signal.SIGKILL)

    torch.manual_seed(0)
    try:
        _train(rank, 1000, _mlp(), on_step)
    except Exception as exc:
        raised = (type(exc).__name__, str(exc)[:2000], time.monotonic() - mark["at"], mark["step"], hierarchical)
    else:
        raised = None
    dist.destroy_process_group()
    return raised


def _fake_host(rank):
    # Hosts by rank parity: each host's ranks are not consecutive (0, 2 and 1, 3).
    return {hosts.TEST_HOST_ENV: f"fake-{rank % 2}", "GLOO_SOCKET_IFNAME": "lo"}


def _hierarchical_vs_gloo(rank, world, init_method):
    """On two fake hosts: the same collectives through shmrdv and through gloo give the same results."""
    _init(rank, world, init_method)
    gloo = dist.new_group(backend="gloo")
    assert "Hierarchy" in repr(dist.group.WORLD), repr(dist.group.WORLD)
    checked = []

    def same(name, run, make, exact=True):
        ours, theirs = make(), make()
        run(ours, None)
        run(theirs, gloo)
        _check(ours, theirs, f"hierarchical {name}", exact)
        checked.append(name)

    for n in (8, 7, 1, 15):  # 7, 1 and 15: not a multiple of the 2 ranks of a host (padded)
        base = lambda: (torch.arange(n) % 5 + rank + 1).float()  # noqa: E731 - products stay exact
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
            same(f"all_reduce {op} n={n}", lambda t, g, op=op: dist.all_reduce(t, op, group=g), base)
        ours = base()
        dist.all_reduce(ours, dist.ReduceOp.AVG)
        theirs = base()
        dist.all_reduce(theirs, group=gloo)
        _check(ours, theirs / world, f"hierarchical all_reduce AVG n={n}", exact=False)
        checked.append(f"all_reduce AVG n={n}")
        for root in (0, 1, 2, 3):
            same(f"broadcast root={root} n={n}", lambda t, g, root=root: dist.broadcast(t, root, group=g), base)

        def gather_into(t, g):
            out = torch.empty(world * n)
            dist.all_gather_into_tensor(out, _value(rank, n), group=g)
            t.copy_(out)
        same(f"all_gather_into_tensor n={n}", gather_into, lambda: torch.empty(world * n))

        def scatter_reduce(t, g):
            dist.reduce_scatter_tensor(t, torch.arange(world * n, dtype=torch.float32) * (rank + 1), group=g)
        same(f"reduce_scatter_tensor n={n}", scatter_reduce, lambda: torch.empty(n))

    same("all_reduce bfloat16", lambda t, g: dist.all_reduce(t, group=g), lambda: _value(rank, 9, torch.bfloat16))
    def reduce(t, g):
        buf = t.clone()  # what the other ranks' tensors hold afterwards is not defined
        dist.reduce(buf, 3, group=g)
        if rank == 3:
            t.copy_(buf)
    same("reduce dst=3", reduce, lambda: _value(rank))

    def gather(t, g):
        rows = [torch.empty(6) for _ in range(world)] if rank == 1 else None
        dist.gather(_value(rank), rows, dst=1, group=g)
        if rank == 1:
            t.copy_(torch.stack(rows))
    same("gather dst=1", gather, lambda: torch.zeros(world, 6))
    same("scatter src=2", lambda t, g: dist.scatter(t, [_value(j) for j in range(world)] if rank == 2 else None,
                                                    src=2, group=g), lambda: torch.empty(6))
    same("all_to_all_single", lambda t, g: dist.all_to_all_single(t, torch.arange(world * 3.0) + 100 * rank,
                                                                  group=g), lambda: torch.empty(world * 3))
    for late in (0, 3):  # a leader, and a rank that is not (hosts by parity: 0 and 1 lead)
        _barrier_waits_for(late, rank)
        dist.barrier(group=gloo)
    checked.append("barrier")
    dist.destroy_process_group()
    return checked


def _uneven_hosts(rank, world, init_method):
    """Hosts of 2 and 1 ranks: no hierarchy, a flat gloo group, the same results."""
    _init(rank, world, init_method)
    assert "Gloo" in repr(dist.group.WORLD), repr(dist.group.WORLD)
    t = _value(rank)
    dist.all_reduce(t, dist.ReduceOp.AVG)
    _check(t, torch.stack([_value(r) for r in range(world)]).mean(0), "all_reduce AVG", exact=False)
    out = torch.empty(world * 6)
    dist.all_gather_into_tensor(out, _value(rank))
    _check(out, torch.cat([_value(r) for r in range(world)]), "all_gather_into_tensor")
    dist.destroy_process_group()
    return True


# ---- the tests ----

@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_collective_gives_the_expected_values(ctx, tmp_path, world):
    assert run_ranks(ctx, world, _all_collectives, _file(tmp_path)) == {r: True for r in range(world)}


@pytest.mark.timeout(60)
def test_errors_surface_as_shmrdv_exceptions_and_the_group_goes_on(ctx, tmp_path):
    run_ranks(ctx, 2, _errors, _file(tmp_path))


@pytest.mark.timeout(60)
def test_ctrl_c_in_an_async_wait_aborts_the_group_at_once(ctx, tmp_path):
    run_ranks(ctx, 2, _interrupted_wait, _file(tmp_path), str(tmp_path / "interrupted"))


@pytest.mark.timeout(60)
def test_disjoint_new_groups_run_concurrently(ctx, tmp_path):
    elapsed = run_ranks(ctx, 4, _subgroups, _file(tmp_path))
    assert elapsed[0] < 0.9 and elapsed[1] < 0.9, elapsed  # done while the other group slept


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["env", "file", "tcp"])
def test_init_methods(ctx, tmp_path, how):
    port = free_port()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)} if how == "env" else {}
    method = {"env": "env://", "file": _file(tmp_path), "tcp": f"tcp://127.0.0.1:{port}"}[how]
    assert run_ranks(ctx, 3, _one_all_reduce, method, env=lambda r: env) == {r: 6.0 for r in range(3)}


@pytest.mark.timeout(90)
def test_ddp_trains_as_with_gloo(ctx, tmp_path):
    params = run_ranks(ctx, 3, _ddp_both, str(tmp_path), env=_loopback)
    for r in (1, 2):  # the replicas stayed in step
        assert all(np.array_equal(a, b) for a, b in zip(params[0], params[r]))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("hosts_", [1, 2])
def test_a_rank_killed_mid_training_makes_the_others_raise(ctx, tmp_path, hosts_):
    # One host: 3 ranks, the survivors see PeerLost. Two fake hosts of 2: the
    # killed rank's host-mate sees PeerLost, its gloo peer a closed connection,
    # and the last rank is told by one of them (an abort, or gloo's error).
    world = 3 if hosts_ == 1 else 4
    raised = run_ranks(ctx, world, _killed_mid_training, _file(tmp_path), exits={world - 1: -signal.SIGKILL},
                       env=_fake_host if hosts_ == 2 else None)
    for rank in range(world - 1):
        assert raised[rank] is not None, f"rank {rank} trained on"
        name, message, seconds, step, hierarchical = raised[rank]
        assert step == KILLED_AT_STEP and hierarchical == (hosts_ == 2), raised[rank]
        assert seconds < 5.0, raised[rank]
        if hosts_ == 1:
            assert "PeerLost" in message or name == "PeerLost", raised[rank]
    if hosts_ == 2:
        assert "PeerLost" in raised[world - 3][1], raised  # the killed rank's host-mate (hosts by parity)


@pytest.mark.timeout(120)
def test_two_hosts_of_two_ranks_match_gloo(ctx, tmp_path):
    checked = run_ranks(ctx, 4, _hierarchical_vs_gloo, _file(tmp_path), env=_fake_host)
    assert len(set(map(tuple, checked.values()))) == 1
    assert {"barrier", "all_reduce AVG n=7", "broadcast root=1 n=7", "reduce_scatter_tensor n=15"} <= set(checked[0])


@pytest.mark.timeout(60)
def test_ranks_spread_unevenly_over_hosts_use_flat_gloo(ctx, tmp_path):
    env = lambda r: {hosts.TEST_HOST_ENV: "a" if r < 2 else "b", "GLOO_SOCKET_IFNAME": "lo"}  # noqa: E731
    run_ranks(ctx, 3, _uneven_hosts, _file(tmp_path), env=env)


def test_plan_of_hosts():
    ids = ["b", "a", "b", "a", "c", "c"]
    plan = hosts.plan_hosts(ids, 3)
    assert plan.hosts == ((0, 2), (1, 3), (4, 5))
    assert (plan.host, plan.local_rank, plan.local_size) == (1, 1, 2)
    assert plan.peers() == (2, 3, 5) and plan.uniform and not plan.single_host
    assert plan.locate(4) == (2, 0)
    assert plan.order() == [0, 1, 4, 2, 3, 5]
    assert hosts.plan_hosts(["x"] * 3, 0).single_host
    assert not hosts.plan_hosts(["x", "x", "y"], 0).uniform


def test_the_group_name_is_drawn_by_rank_0_and_read_by_the_others():
    from shmrdv.torch.backend import _agree_name

    store, other = dist.HashStore(), dist.HashStore()
    name = _agree_name(store, 0)
    assert _agree_name(store, 1) == _agree_name(store, 2) == name
    assert _agree_name(other, 0) != name  # another job (or group) draws its own
    group_store = dist.PrefixStore("g/", store)  # as torch hands each group a store of its own
    group_store.set("shmrdv/host/1", "elsewhere")  # what rank 1, on another host, would set
    identities = hosts.exchange_identities(group_store, 0, 2)
    assert identities == [hosts.host_identity(), "elsewhere"]
    assert hosts.exchange_identities(group_store, 1, 2) == identities  # rank 1 reads what rank 0 published
    assert hosts.plan_hosts(identities, 0).hosts == ((0,), (1,))


def test_host_identity_joins_boot_id_shm_device_and_hostname(monkeypatch):
    monkeypatch.delenv(hosts.TEST_HOST_ENV, raising=False)
    plain = hosts.host_identity()
    with open("/proc/sys/kernel/random/boot_id") as f:
        assert plain.startswith(f.read().strip())
    assert str(os.stat("/dev/shm").st_dev) in plain and os.uname().nodename in plain
    monkeypatch.setenv(hosts.TEST_HOST_ENV, "7")
    assert hosts.host_identity() == plain + "/test:7"


@pytest.mark.timeout(60)
def test_import_shmrdv_does_not_load_torch():
    # nor ml_dtypes, which takes about a second to import: every process that
    # imports shmrdv would pay it
    code = "import sys, shmrdv; print('torch' in sys.modules, 'ml_dtypes' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=True)
    assert out.stdout.strip() == "False False"
