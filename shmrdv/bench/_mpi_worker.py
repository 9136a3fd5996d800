"""One rank of the Open MPI measurement, started by ``collective_peers.run_mpi``
as ``mpirun ... python -m shmrdv.bench._mpi_worker '<json>'``.

The JSON holds ``cases``, each ``[name, op, nbytes, iters, warmup]``, and
``lifetime_s``. Every rank times its own calls (``collective_peers.time_calls``);
rank 0 gathers them, keeps each iteration's slowest rank and prints one JSON
line ``{"collective_peers": {name: {"median_us", "p99_us", "iters", "nbytes"}}}``.

A rank that fails calls ``MPI_Abort``: otherwise the others would wait in
their next collective until the launcher's timeout.
"""

from __future__ import annotations
import sys
from typing import Any, Callable, Dict, List, Tuple

import numpy as np

from .collective_peers import expect, ITEM, mpi_rank_main, summarize, time_calls


def _case(MPI: Any, comm: Any, op: str, nbytes: int) -> Tuple[Callable[[], Any], Callable[[], None]]:
    """(call, check) of one case: `check` makes a call on known data and verifies it."""
    rank, size = comm.Get_rank(), comm.Get_size()
    count = nbytes // ITEM
    if op == "allreduce":
        send = np.full(count, rank + 1, dtype=np.float32)
        recv = np.empty_like(send)

        def allreduce() -> None:
            comm.Allreduce(send, recv, op=MPI.SUM)

        def check() -> None:
            allreduce()
            expect(op, recv[[0, -1]], size * (size + 1) / 2)

        return allreduce, check
    if op == "broadcast":
        data = np.full(count, 7.0 if rank == 0 else 0.0, dtype=np.float32)

        def broadcast() -> None:
            comm.Bcast(data, root=0)

        def check() -> None:
            broadcast()
            expect(op, data[[0, -1]], 7.0)

        return broadcast, check
    if op == "allgather":
        part = count // size
        mine = np.full(part, rank + 1, dtype=np.float32)
        out = np.empty(part * size, dtype=np.float32)

        def allgather() -> None:
            comm.Allgather(mine, out)

        def check() -> None:
            allgather()
            # each rank's part, first and last element, holds its rank + 1
            expect(op, out.reshape(size, part)[:, [0, -1]], np.arange(1, size + 1).reshape(size, 1))

        return allgather, check
    if op == "barrier":
        return comm.Barrier, comm.Barrier
    raise ValueError(f"unknown collective {op!r}")


def _measure(MPI: Any, comm: Any, spec: Dict[str, Any]) -> Dict[str, Any]:
    results: Dict[str, Any] = {}
    for name, op, nbytes, iters, warmup in spec["cases"]:
        call, check = _case(MPI, comm, op, nbytes)
        check()
        times = time_calls(call, iters, warmup, comm.Barrier)
        gathered = comm.gather(times, root=0)
        if comm.Get_rank() == 0:
            results[name] = summarize(gathered, nbytes)
    return results


def main(argv: List[str]) -> int:
    return mpi_rank_main(argv, "collective_peers", _measure)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
