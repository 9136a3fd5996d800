"""One rank of the Open MPI point-to-point measurement, started by
``mpi_p2p.run`` as ``mpirun -np 2 ... python -m shmrdv.bench._mpi_p2p_worker '<json>'``.

The JSON holds ``cpus`` (the CPU each rank pins itself to), ``stream``
(``[nbytes, target_s, max_count]`` each: rank 1 sends, rank 0 receives and
checks), ``round_trip`` (``[nbytes, target_s, max_count, warmup]`` each:
rank 0 times ``Send`` then ``Recv`` of the echo) and ``lifetime_s``. Rank 0
prints one JSON line ``{"mpi_p2p": {"stream": [...], "round_trip": [...]}}``
with the same figures ``shmrdv bench`` takes of its other transports.

Messages are float32 numpy arrays stamped with their number in the first and
last element (``transports.stamp``/``check``), from ``POOL`` source arrays in
turn, received into one preallocated buffer, as ``mp.Pipe``'s are. A rank
that fails calls ``MPI_Abort``.
"""

from __future__ import annotations
import os
import sys
import time
from typing import Any, Dict, List

import numpy as np

from .collective_peers import mpi_rank_main
from .common import DATA_DTYPE, POOL
from .transports import check, stamp

_DATA, _ECHO = 1, 2  # tags


def _stream(comm: Any, rank: int, nbytes: int, count: int, first: int) -> float:
    """Seconds for rank 1 to send and rank 0 to receive and check `count` messages."""
    if rank == 1:
        pool = [np.full(nbytes // 4, i, dtype=DATA_DTYPE) for i in range(POOL)]
        for number in range(first, first + count):
            source = pool[number % POOL]
            stamp(source, number)
            comm.Send(source, dest=0, tag=_DATA)
        return 0.0
    buffer = np.empty(nbytes // 4, dtype=DATA_DTYPE)
    start = time.perf_counter()
    for number in range(first, first + count):
        comm.Recv(buffer, source=1, tag=_DATA)
        check(buffer, number, nbytes)
    return time.perf_counter() - start


def _streams(comm: Any, rank: int, cases: List[List[Any]]) -> List[Dict[str, Any]]:
    rows, number = [], 0
    for nbytes, target_s, max_count in cases:
        count = min(POOL, max_count)
        while True:  # warm-up, growing until one lasts a fifth of the target (rank 0 decides)
            elapsed = _stream(comm, rank, nbytes, count, number)
            number += count
            if comm.bcast(elapsed >= target_s / 5 or count >= max_count, root=0):
                break
            count = min(max_count, count * 4)
        timed = comm.bcast(int(min(max_count, max(3, count * target_s / max(elapsed, 1e-9)))), root=0)
        seconds = _stream(comm, rank, nbytes, timed, number)
        number += timed
        rows.append({"bytes": nbytes, "messages": timed, "seconds": seconds})
    return rows


def _round_trips(comm: Any, rank: int, nbytes: int, count: int, first: int) -> List[int]:
    buffer = np.zeros(nbytes // 4, dtype=DATA_DTYPE)
    if rank == 1:
        for _ in range(count):
            comm.Recv(buffer, source=0, tag=_ECHO)
            comm.Send(buffer, dest=0, tag=_ECHO)
        return []
    payload, echo = np.zeros(nbytes // 4, dtype=DATA_DTYPE), np.empty(nbytes // 4, dtype=DATA_DTYPE)
    clock, times = time.perf_counter_ns, []
    for number in range(first, first + count):
        stamp(payload, number)
        start = clock()
        comm.Send(payload, dest=1, tag=_ECHO)
        comm.Recv(echo, source=1, tag=_ECHO)
        times.append(clock() - start)
        check(echo, number, nbytes)
    return times


def _round_trip_rows(comm: Any, rank: int, cases: List[List[Any]]) -> List[Dict[str, Any]]:
    rows, number = [], 0
    for nbytes, target_s, max_count, warmup in cases:
        warm = _round_trips(comm, rank, nbytes, warmup, number)
        number += warmup
        per_trip = sorted(warm)[len(warm) // 2] / 1e9 if warm else 1.0
        count = comm.bcast(int(min(max_count, max(50, target_s / max(per_trip, 1e-9)))), root=0)
        times = _round_trips(comm, rank, nbytes, count, number)
        number += count
        if rank == 0:
            rows.append({"bytes": nbytes, "times_s": [t / 1e9 for t in times]})
    return rows


def _measure(MPI: Any, comm: Any, spec: Dict[str, Any]) -> Dict[str, Any]:
    rank = comm.Get_rank()
    os.sched_setaffinity(0, {spec["cpus"][rank]})
    return {"stream": _streams(comm, rank, spec["stream"]), "round_trip": _round_trip_rows(comm, rank, spec["round_trip"])}


def main(argv: List[str]) -> int:
    return mpi_rank_main(argv, "mpi_p2p", _measure)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
