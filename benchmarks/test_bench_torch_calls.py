"""torch.distributed's synchronous calls through the "shmrdv" backend and
through gloo, under pytest-benchmark: this process is rank 0, a spawned
child rank 1 (pinned to different CPUs when there are two); both make the
same number of calls. What it shows is the backend's own cost per call
(shmrdv.torch.work: a call torch waits for at once runs on the caller's
thread), which a small collective is mostly. Under
``--benchmark-disable`` each body runs once."""

from __future__ import annotations

import datetime
import multiprocessing
import os

import pytest

from shmrdv.bench.collective_peers import _free_port

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is needed", allow_module_level=True)

CASES = [("all_reduce", 4 << 10), ("barrier", 0)]
ROUNDS, WARMUP = 2000, 50
TIMEOUT = datetime.timedelta(seconds=60)
JOIN_S = 120


def _call(op: str, nbytes: int):
    if op == "barrier":
        return dist.barrier
    data = torch.ones(nbytes // 4)
    return lambda: dist.all_reduce(data)


def _init(backend: str, port: int, rank: int) -> None:
    if backend == "shmrdv":
        import shmrdv.torch  # noqa: F401  (registers the backend)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=TIMEOUT)


def _rank1(backend: str, port: int, op: str, nbytes: int, calls: int, cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    _init(backend, port, 1)
    try:
        call = _call(op, nbytes)
        for _ in range(calls):
            call()
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["shmrdv", "gloo"])
@pytest.mark.parametrize("op,nbytes", CASES, ids=[f"{op}-{n}B" for op, n in CASES])
def test_sync_call(benchmark, shmrdv, monkeypatch, backend: str, op: str, nbytes: int) -> None:
    benchmark.group = f"torch-sync-{op}-{nbytes}B"
    rounds = ROUNDS if benchmark.enabled else 1
    warmup = WARMUP if benchmark.enabled else 0
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # the child inherits it: loopback only
    cpus = sorted(os.sched_getaffinity(0))
    port = _free_port()
    child = multiprocessing.get_context("spawn").Process(
        target=_rank1, args=(backend, port, op, nbytes, rounds + warmup, cpus[-1]), daemon=True)
    child.start()
    saved = os.sched_getaffinity(0)
    threads = torch.get_num_threads()
    try:
        os.sched_setaffinity(0, {cpus[0]})
        torch.set_num_threads(1)
        _init(backend, port, 0)
        try:
            benchmark.pedantic(_call(op, nbytes), rounds=rounds, warmup_rounds=warmup, iterations=1)
            dist.barrier()
        finally:
            dist.destroy_process_group()
    finally:
        os.sched_setaffinity(0, saved)
        torch.set_num_threads(threads)
        child.join(JOIN_S)
        if child.is_alive():
            child.kill()
            child.join(JOIN_S)
    assert child.exitcode == 0, f"rank 1 failed (exit code {child.exitcode})"
