"""torch.distributed point-to-point through the "shmrdv" backend, beside
gloo's and beside shmrdv's own Rendezvous send/recv, in one run:

- the 64 B round trip: rank 0 sends, rank 1 receives and sends back
  (``dist.send``/``dist.recv`` for the backends, ``Rendezvous.send``/
  ``recv`` for shmrdv's own), median of batches;
- 16 MiB one way with ``isend``/``irecv``, against ``np.copyto`` of the
  same bytes in one process.

Two processes (spawned), each pinned to a CPU of its own when asked.

    python benchmarks/torch_p2p.py [--rounds N] [--pin] [--repeat K]
"""
from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import statistics
import sys
import time
from typing import Dict, List

import numpy as np

BIG = 16 << 20
TIMEOUT = datetime.timedelta(seconds=120)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pin(cpu: int, pin: bool) -> None:
    if pin:
        os.sched_setaffinity(0, {cpu})


def _torch_rank(backend: str, port: int, rank: int, rounds: int, batches: int, pin: bool, out) -> None:
    import torch
    import torch.distributed as dist
    _pin(rank, pin)
    torch.set_num_threads(1)
    dist.init_process_group(backend, rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=TIMEOUT)
    small = torch.zeros(16, dtype=torch.float32)  # 64 B
    times: List[float] = []
    for _ in range(batches + 1):  # the first batch warms up
        dist.barrier()
        start = time.perf_counter()
        for _ in range(rounds):
            if rank == 0:
                dist.send(small, 1)
                dist.recv(small, 1)
            else:
                dist.recv(small, 0)
                dist.send(small, 0)
        times.append((time.perf_counter() - start) / rounds)
    big = torch.ones(BIG // 4)
    streams: List[float] = []
    for _ in range(4):
        dist.barrier()
        start = time.perf_counter()
        work = dist.isend(big, 1) if rank == 0 else dist.irecv(big, 0)
        work.wait()
        dist.barrier()
        streams.append(time.perf_counter() - start)
    dist.destroy_process_group()
    if rank == 0:
        out.put((statistics.median(times[1:]), min(streams[1:])))


def _rdv_rank(name: str, rank: int, rounds: int, batches: int, pin: bool, out) -> None:
    import shmrdv
    _pin(rank, pin)
    rdv = shmrdv.Rendezvous(name, create=False)
    small = np.zeros(16, dtype=np.float32)
    mine, theirs = (f"to{rank}", f"to{1 - rank}")
    times: List[float] = []
    for _ in range(batches + 1):
        rdv.send(f"sync{1 - rank}", small)
        rdv.recv(f"sync{rank}")
        start = time.perf_counter()
        for _ in range(rounds):
            if rank == 0:
                rdv.send(theirs, small)
                rdv.recv(mine)
            else:
                rdv.recv(mine)
                rdv.send(theirs, small)
        times.append((time.perf_counter() - start) / rounds)
    rdv.close()
    if rank == 0:
        out.put(statistics.median(times[1:]))


def _run(target, args_of, ctx) -> object:
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=args_of(r) + (out,), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    value = out.get(timeout=600)
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            raise RuntimeError(f"a rank of {target.__name__} failed (exit code {p.exitcode})")
    return value


def _copyto() -> float:
    src, dst = np.ones(BIG, dtype=np.uint8), np.empty(BIG, dtype=np.uint8)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return best


def measure(rounds: int, batches: int, pin: bool) -> Dict[str, float]:
    """One round of every case; seconds."""
    import shmrdv
    ctx = multiprocessing.get_context("spawn")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    figures: Dict[str, float] = {}
    for backend in ("shmrdv", "gloo"):
        port = _free_port()
        rtt, stream = _run(_torch_rank, lambda r: (backend, port, r, rounds, batches, pin), ctx)
        figures[f"{backend} dist.send/recv 64 B round trip"] = rtt
        figures[f"{backend} isend/irecv 16 MiB"] = stream
    with shmrdv.Rendezvous(f"bench-p2p-{os.getpid()}", size=1 << 20, create=True) as rdv:
        try:
            figures["shmrdv Rendezvous send/recv 64 B round trip"] = _run(
                _rdv_rank, lambda r: (rdv.name, r, rounds, batches, pin), ctx)
        finally:
            rdv.unlink()
    figures["np.copyto 16 MiB"] = _copyto()
    return figures


def report(figures: Dict[str, float]) -> str:
    own = figures["shmrdv Rendezvous send/recv 64 B round trip"]
    rtt, gloo = figures["shmrdv dist.send/recv 64 B round trip"], figures["gloo dist.send/recv 64 B round trip"]
    copy, stream = figures["np.copyto 16 MiB"], figures["shmrdv isend/irecv 16 MiB"]
    lines = [f"{name:45s} {value * 1e6:10.1f} us" for name, value in figures.items()]
    lines += [f"dist.send/recv round trip: {gloo / rtt:.1f}x gloo's, {rtt / own:.2f}x shmrdv's own send/recv",
              f"16 MiB isend/irecv: {copy / stream:.2f}x np.copyto's speed, "
              f"{figures['gloo isend/irecv 16 MiB'] / stream:.1f}x gloo's"]
    return "\n".join(lines)


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000, help="round trips per batch")
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=1, help="whole runs, one after another")
    parser.add_argument("--pin", action="store_true", help="each rank on a CPU of its own")
    args = parser.parse_args(argv)
    for i in range(args.repeat):
        print(f"-- run {i + 1}{' (pinned)' if args.pin else ''}")
        print(report(measure(args.rounds, args.batches, args.pin)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
