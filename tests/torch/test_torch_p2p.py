"""Point-to-point on the "shmrdv" backend (shmrdv/torch/p2p.py) and the
group object's own calling forms: send, recv (also from any source),
isend, irecv, batch_isend_irecv, tags and torch's ordering per (source,
destination, tag), chunked tensors, a sender that exits or dies, fake
hosts (through gloo); bare-tensor calls on the group object, several
tensors per call, the coalesced calls, reduce_scatter with per-rank sizes.
"""
import datetime
import os
import signal
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

import shmrdv  # noqa: E402
import shmrdv.torch  # noqa: E402
from shmrdv.torch import hosts, p2p  # noqa: E402

from .ranks import run_ranks  # noqa: E402
from ..conftest import free_port  # noqa: E402

pytestmark = pytest.mark.slow

TIMEOUT = datetime.timedelta(seconds=20)


def _init(rank, world, port, timeout=TIMEOUT):
    dist.init_process_group("shmrdv", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timeout)


def _pattern(n, rank, dtype=torch.float32):
    return (torch.arange(n) % 251 + rank).to(dtype)


def _exchanges(rank, world, port):
    """A ring of sends with several dtypes and shapes; tags kept apart;
    order per tag; chunked tensors both ways at once."""
    _init(rank, world, port)
    right, left = (rank + 1) % world, (rank - 1) % world
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64, torch.uint8):
        send = _pattern(12, rank, dtype).view(3, 4)
        got = torch.empty(3, 4, dtype=dtype)
        ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, got, left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        assert torch.equal(got, _pattern(12, left, dtype).view(3, 4)), dtype

    # Strided tensors both sides, and an empty one.
    base = torch.zeros(6, 4)
    strided = _pattern(12, rank).view(6, 2)
    dist.isend(strided, right)
    into = torch.zeros(6, 4)
    dist.recv(into[:, ::2], left)
    assert torch.equal(into[:, ::2], _pattern(12, left).view(6, 2)) and not into[:, 1::2].any()
    dist.send(torch.empty(0), right)
    dist.recv(torch.empty(0), left)
    del base

    # Tags are separate channels; one channel keeps its order, whichever receive is waited for first.
    for i in range(5):
        dist.isend(torch.tensor([100 + i]), right, tag=1)
        dist.isend(torch.tensor([200 + i]), right, tag=2)
    firsts = [torch.empty(1, dtype=torch.int64) for _ in range(5)]
    seconds = [torch.empty(1, dtype=torch.int64) for _ in range(5)]
    second_works = [dist.irecv(t, left, tag=2) for t in seconds]
    first_works = [dist.irecv(t, left, tag=1) for t in firsts]
    second_works[-1].wait()  # the last posted on tag 2: takes the four before it first, each into its own
    assert [int(t) for t in seconds] == [200, 201, 202, 203, 204]
    for w in reversed(first_works):
        w.wait()
    assert [int(t) for t in firsts] == [100, 101, 102, 103, 104]

    # More than the arena holds, sent both ways before either receives: chunks, from a thread.
    n = (p2p.ARENA * 3) // 4  # elements of 4 bytes: 3 arenas' worth
    out = _pattern(n, rank)
    work = dist.isend(out, right)
    big = torch.empty(n)
    dist.recv(big, left)
    work.wait()
    assert torch.equal(big, _pattern(n, left))
    dist.barrier()
    dist.destroy_process_group()
    return "ok"


def _any_source(rank, world, port):
    """recv with no source takes from whoever sends first and says who."""
    _init(rank, world, port)
    if rank == 0:
        seen = {}
        for _ in range(world - 1):
            t = torch.empty(2)
            src = dist.recv(t)
            seen[src] = t.tolist()
        assert seen == {r: [float(r), float(r)] for r in range(1, world)}, seen
    else:
        time.sleep(0.05 * (world - rank))
        dist.send(torch.full((2,), float(rank)), 0)
    dist.barrier()
    if rank == 0:
        w = dist.irecv(torch.empty(2))  # an irecv from any source tells the sender once done
        w.wait()
        assert w._source_rank() == world - 1
    elif rank == world - 1:
        dist.send(torch.zeros(2), 0)
    dist.barrier()
    dist.destroy_process_group()
    return "ok"


def _mismatch(rank, world, port):
    _init(rank, world, port)
    if rank == 0:
        dist.send(torch.ones(4), 1)
    else:
        with pytest.raises(ValueError, match="4 elements of float32.*3 of float32"):
            dist.recv(torch.empty(3), 0)
        with pytest.raises(ValueError, match="not another rank"):
            dist.recv(torch.empty(3), 7)
    dist.barrier()
    dist.destroy_process_group()
    return "ok"


def _send_and_exit(rank, world, store_file):
    """The sender's process may be gone before the receiver receives, and
    before the receiver has even finished joining (a FileStore lets rank 0
    through init_process_group as soon as it has written its part)."""
    if rank == 1:
        time.sleep(1.0)
    dist.init_process_group("shmrdv", rank=rank, world_size=world, init_method=f"file://{store_file}",
                            timeout=TIMEOUT)
    if rank == 0:
        dist.send(torch.arange(10.), 1)
        dist.send(torch.arange(p2p.CHUNK // 2, dtype=torch.int32).repeat(3), 1)  # chunked
        dist.destroy_process_group()
        return "sent"
    time.sleep(1.0)
    small, chunked = torch.empty(10), torch.empty(3 * (p2p.CHUNK // 2), dtype=torch.int32)
    dist.recv(small, 0)
    dist.recv(chunked, 0)
    assert torch.equal(small, torch.arange(10.))
    assert torch.equal(chunked, torch.arange(p2p.CHUNK // 2, dtype=torch.int32).repeat(3))
    dist.destroy_process_group()
    return "received"


def _dead_sender(rank, world, port):
    """A receive from a rank that died fails within a slice, naming it."""
    _init(rank, world, port, timeout=datetime.timedelta(seconds=60))
    dist.barrier()
    if rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(shmrdv.PeerLost, match="rank 0, the sender, has exited"):
        dist.recv(torch.empty(1), 0)
    assert time.monotonic() - start < 5
    return "ok"


def _monitored_barrier(rank, world, port):
    """shmrdv.torch.monitored_barrier names the ranks that did not come."""
    _init(rank, world, port)
    short = datetime.timedelta(seconds=1)
    shmrdv.torch.monitored_barrier(timeout=short)
    shmrdv.torch.monitored_barrier(timeout=short, wait_all_ranks=True)
    if rank == 0:
        with pytest.raises(RuntimeError, match=f"^Rank {world - 1} failed to pass monitoredBarrier in 1000 ms"):
            shmrdv.torch.monitored_barrier(timeout=short)
    elif rank < world - 1:
        with pytest.raises(RuntimeError, match=f"Rank {rank} successfully reached monitoredBarrier, but received "
                                               f"errors while waiting for send/recv from rank 0"):
            shmrdv.torch.monitored_barrier(timeout=short)
    dist.barrier()
    if rank == 0:
        with pytest.raises(RuntimeError, match=f"^Ranks {', '.join(map(str, range(1, world)))} failed"):
            shmrdv.torch.monitored_barrier(timeout=short, wait_all_ranks=True)
        with pytest.raises(RuntimeError, match="^Rank 0 timed out in monitoredBarrier after 0 ms"):
            shmrdv.torch.monitored_barrier(timeout=datetime.timedelta(0))
    dist.barrier()
    dist.destroy_process_group()
    return "ok"


def _group_object_forms(rank, world, port):
    """The group object's own short forms, as torch's ProcessGroup takes
    them, several tensors per call, the coalesced calls, uneven
    reduce_scatter."""
    _init(rank, world, port)
    pg = dist.group.WORLD
    t = torch.full((3,), float(rank + 1))
    pg.allreduce(t).wait()
    assert t.tolist() == [3.0] * 3
    t = torch.full((3,), float(rank + 1))
    pg.allreduce(t, dist.ReduceOp.MAX).wait()
    assert t.tolist() == [2.0] * 3
    b = torch.full((2,), float(rank))
    pg.broadcast(b, 1).wait()
    assert b.tolist() == [1.0, 1.0]
    r = torch.full((2,), float(rank + 1))
    pg.reduce(r, 0, dist.ReduceOp.PRODUCT).wait()
    if rank == 0:
        assert r.tolist() == [2.0, 2.0]
    outs = [torch.empty(2) for _ in range(world)]
    pg.allgather(outs, torch.full((2,), float(rank))).wait()
    assert [o.tolist() for o in outs] == [[0.0, 0.0], [1.0, 1.0]]
    assert pg.name() == "shmrdv"

    # Several tensors per call: every tensor of every rank reduced into each.
    a, c = torch.full((2,), 1.0 + rank), torch.full((2,), 10.0 * (rank + 1))
    dist.all_reduce_coalesced([a, a])  # one tensor listed twice is reduced once
    assert a.tolist() == [3.0, 3.0]
    pg.allreduce([a, c]).wait()  # gloo's form: (3 + 10) + (3 + 20) into both
    assert a.tolist() == c.tolist() == [36.0, 36.0]
    bs = [torch.full((1,), float(10 * rank + i)) for i in range(3)]
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 1, 2
    pg.broadcast(bs, opts).wait()
    assert [x.item() for x in bs] == [12.0, 12.0, 12.0]

    # all_gather_coalesced: out[r][i] is rank r's input i.
    out = [[torch.empty(1), torch.empty(2)] for _ in range(world)]
    dist.all_gather_coalesced(out, [torch.tensor([float(rank)]), torch.tensor([10. * rank, 10. * rank + 1])])
    assert [[x.tolist() for x in o] for o in out] == [[[0.0], [0.0, 1.0]], [[1.0], [10.0, 11.0]]]

    # reduce_scatter with per-rank sizes: rank r gets the sum of input r, sized like its output.
    sizes = [2, 3]
    inputs = [torch.full((n,), float(rank + 1) * (i + 1)) for i, n in enumerate(sizes)]
    mine = torch.empty(sizes[rank])
    dist.reduce_scatter(mine, inputs)
    assert mine.tolist() == [3.0 * (rank + 1)] * sizes[rank]
    dist.destroy_process_group()
    return "ok"


def _sparse(rank, world, port):
    """Sparse tensors are summed as gloo sums them; DDP with sparse gradients
    gives every rank the same model."""
    _init(rank, world, port)

    def made(r, sparse_dims, dense_dims):  # rank r's: rows 0..r of the first sparse dimension (as upstream's tests)
        indices = torch.cat([torch.arange(r + 1).view(1, -1)] + [torch.zeros(1, r + 1, dtype=torch.int64)] *
                            (sparse_dims - 1))
        return torch.sparse_coo_tensor(indices, torch.ones([r + 1] + [2] * dense_dims),
                                       [world] * sparse_dims + [2] * dense_dims)
    for sparse_dims, dense_dims in [(1, 0), (2, 0), (3, 0), (1, 1), (1, 3)]:
        t = made(rank, sparse_dims, dense_dims)
        dist.all_reduce(t)
        assert t.is_sparse
        expected = sum(made(r, sparse_dims, dense_dims).to_dense() for r in range(world))
        assert torch.equal(t.to_dense(), expected), (t, expected)
    with pytest.raises(ValueError, match="sparse tensors are summed only"):
        dist.all_reduce(torch.eye(3).to_sparse(), dist.ReduceOp.MAX)

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.EmbeddingBag(50, 4, sparse=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(5):
        ids = torch.randint(0, 50, (8, 3), generator=torch.Generator().manual_seed(step * world + rank))
        model(ids).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    weights = [torch.empty(50, 4) for _ in range(world)]
    dist.all_gather(weights, model.module.weight.detach())
    assert all(torch.equal(w, weights[0]) for w in weights)
    dist.destroy_process_group()
    return "ok"


def _across_fake_hosts(rank, world, port):
    """Ranks on two (fake) hosts: p2p across them through gloo, within a host through shared memory."""
    _init(rank, world, port)
    assert "Hierarchy" in repr(dist.group.WORLD)
    peer = (rank + 2) % world  # the same local rank on the other host
    got = torch.empty(4)
    work = dist.isend(_pattern(4, rank), peer)
    dist.recv(got, peer)
    work.wait()
    assert torch.equal(got, _pattern(4, peer))
    neighbour = rank ^ 1  # the other rank of this host
    work = dist.isend(_pattern(4, rank), neighbour, tag=5)
    dist.recv(got, neighbour, tag=5)
    work.wait()
    assert torch.equal(got, _pattern(4, neighbour))
    dist.barrier()
    dist.destroy_process_group()
    return "ok"


@pytest.mark.parametrize("world", [2, 3])
def test_sends_and_receives_keep_values_tags_and_order(ctx, world):
    assert run_ranks(ctx, world, _exchanges, free_port()) == {r: "ok" for r in range(world)}


def test_a_receive_from_any_source_says_who_sent(ctx):
    assert run_ranks(ctx, 3, _any_source, free_port()) == {r: "ok" for r in range(3)}


def test_a_receive_into_a_tensor_of_another_size_says_both(ctx):
    assert run_ranks(ctx, 2, _mismatch, free_port()) == {0: "ok", 1: "ok"}


def test_what_a_rank_sent_before_it_exited_is_still_received(ctx, tmp_path):
    assert run_ranks(ctx, 2, _send_and_exit, str(tmp_path / "store")) == {0: "sent", 1: "received"}


def test_a_receive_from_a_dead_rank_fails_at_once(ctx):
    assert run_ranks(ctx, 2, _dead_sender, free_port(), exits={0: -signal.SIGKILL}) == {1: "ok"}


def test_a_monitored_barrier_names_who_did_not_come(ctx):
    assert run_ranks(ctx, 3, _monitored_barrier, free_port()) == {r: "ok" for r in range(3)}


def test_the_group_object_takes_torchs_short_forms_and_several_tensors(ctx):
    assert run_ranks(ctx, 2, _group_object_forms, free_port()) == {0: "ok", 1: "ok"}


@pytest.mark.parametrize("world", [2, 3])
def test_sparse_tensors_are_summed_and_ddp_takes_sparse_gradients(ctx, world):
    assert run_ranks(ctx, world, _sparse, free_port()) == {r: "ok" for r in range(world)}


def test_point_to_point_across_fake_hosts(ctx):
    env = lambda rank: {hosts.TEST_HOST_ENV: f"host{rank // 2}", "GLOO_SOCKET_IFNAME": "lo"}  # noqa: E731
    assert run_ranks(ctx, 4, _across_fake_hosts, free_port(), env=env) == {r: "ok" for r in range(4)}
