"""shmrdv.Group's collectives under pytest-benchmark: this process is rank
0, a forked child rank 1, pinned to different CPUs when there are two;
both make the same number of calls (pedantic rounds: the child knows how
many). Open MPI and gloo run the same cases in ``shmrdv bench
--collectives`` (they need launchers of their own: mpirun, spawned
ranks), which states the ratios; here each case is timed on its own.
Under ``--benchmark-disable`` each body runs once."""

from __future__ import annotations

import os
import signal
import uuid

import numpy as np
import pytest

CASES = [("allreduce", 4 << 10), ("allreduce", 1 << 20), ("allreduce", 16 << 20), ("broadcast", 16 << 20),
         ("allgather", 16 << 20), ("barrier", 0)]
ROUNDS = {0: 2000, 4 << 10: 2000, 1 << 20: 200, 16 << 20: 20}
WARMUP = 5


def _call(group, op: str, nbytes: int, rank: int):
    if op == "barrier":
        return group.barrier
    data = np.full(nbytes // 4 // (group.world_size if op == "allgather" else 1), rank + 1, np.float32)
    if op == "allreduce":
        return lambda: group.allreduce(data, out=data)
    if op == "broadcast":
        return lambda: group.broadcast(data, 0, out=None if rank == 0 else data)
    return lambda: group.allgather(data)


def _rank1(shmrdv, name: str, op: str, nbytes: int, calls: int) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        os.sched_setaffinity(0, {cpus[1]})
    with shmrdv.Group(name, 1, 2, timeout=120) as group:
        call = _call(group, op, nbytes, 1)
        for _ in range(calls):
            call()
        group.barrier()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("op,nbytes", CASES, ids=[f"{op}-{n}B" for op, n in CASES])
def test_collective(benchmark, shmrdv, op: str, nbytes: int) -> None:
    benchmark.group = f"collectives-{op}-{nbytes}B"
    rounds = ROUNDS[nbytes] if benchmark.enabled else 1
    warmup = WARMUP if benchmark.enabled else 0
    name = f"bench-coll-{uuid.uuid4().hex[:12]}"
    saved = os.sched_getaffinity(0)
    pid = os.fork()
    if pid == 0:  # rank 1: exits without running anything of pytest's
        code = 1
        try:
            _rank1(shmrdv, name, op, nbytes, rounds + warmup)
            code = 0
        finally:
            os._exit(code)
    done = False
    try:
        os.sched_setaffinity(0, {sorted(saved)[0]})
        with shmrdv.Group(name, 0, 2, timeout=120) as group:
            call = _call(group, op, nbytes, 0)
            benchmark.pedantic(call, rounds=rounds, warmup_rounds=warmup, iterations=1)
            group.barrier()
        done = True
    finally:
        os.sched_setaffinity(0, saved)
        if not done:  # rank 1 would wait for us until its timeout
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    assert status == 0, f"rank 1 failed (status {status})"
