"""A live demo: two processes exchange tensors through one rendezvous and
print what moved and how fast. ``python -m shmrdv demo``."""
import argparse
import multiprocessing as mp
import os
import statistics
import time
import uuid
from typing import List, Tuple

import numpy as np

from ..rendezvous import Rendezvous
from ..units import human_bytes

_ROUND_TRIPS = 2000
_STREAMS: List[Tuple[int, int]] = [(4 << 10, 2000), (1 << 20, 400), (16 << 20, 40)]  # (bytes, count)
_JOIN_TIMEOUT_S = 60


def _pin(cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and cpu < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {cpu})


def _peer(name: str) -> None:
    """Echo the ping-pong, then produce the streams."""
    _pin(1)
    with Rendezvous(name, create=False) as rdv:
        for _ in range(_ROUND_TRIPS):
            rdv.send("pong", rdv.recv("ping"))
        for nbytes, count in _STREAMS:
            n = nbytes // 4
            rdv.recv(f"go-{nbytes}")  # start when the receiver starts its clock
            for i in range(count):
                with rdv.alloc(f"stream-{nbytes}", (n,), np.float32) as buf:
                    buf[0] = buf[-1] = i  # a zero-copy producer writes in place
            block = np.arange(n, dtype=np.float32)
            rdv.recv(f"go-{nbytes}")
            for i in range(count):
                block[0] = i
                rdv.send(f"copy-{nbytes}", block)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo takes no options."""


def run(args: argparse.Namespace) -> int:
    name = f"demo-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    ctx = mp.get_context("spawn")
    _pin(0)
    with Rendezvous(name, size=256 << 20, create=True) as rdv:
        peer = ctx.Process(target=_peer, args=(name,), daemon=True)
        peer.start()
        try:
            ping = np.zeros(16, dtype=np.float32)  # 64 bytes
            rtts = []
            for i in range(_ROUND_TRIPS):
                ping[0] = i
                t0 = time.perf_counter_ns()
                rdv.send("ping", ping)
                back = rdv.recv("pong", timeout=_JOIN_TIMEOUT_S)
                rtts.append(time.perf_counter_ns() - t0)
                assert back[0] == i
                del back
            rtts.sort()
            print(f"shmrdv demo: two processes, rendezvous /dev/shm/shmrdv-{name}")
            print(f"  64 B ping-pong   {_ROUND_TRIPS} round trips   median {statistics.median(rtts) / 1e3:.1f} us   "
                  f"p99 {rtts[int(len(rtts) * 0.99)] / 1e3:.1f} us")
            for nbytes, count in _STREAMS:
                for label in ("stream", "copy"):
                    rdv.send(f"go-{nbytes}", np.zeros(0))
                    start = time.perf_counter()
                    for i in range(count):
                        view = rdv.recv(f"{label}-{nbytes}", timeout=_JOIN_TIMEOUT_S)
                        assert view[0] == i, "messages arrive in FIFO order"
                        del view  # its space returns to the arena
                    dt = time.perf_counter() - start
                    how = "alloc/recv (zero-copy)*" if label == "stream" else "send/recv (one copy)   "
                    print(f"  {human_bytes(nbytes):>7} x {count:<5} {how}  {count * nbytes / dt / 1e9:6.2f} GB/s   "
                          f"{count / dt:9.0f} msg/s")
            print("  * nothing is copied: the producer writes its message in place (here two elements), so this is\n"
                  "    the message's size over the time per message, its overhead, not a copy rate")
            peer.join(_JOIN_TIMEOUT_S)
            if peer.exitcode != 0:
                print(f"peer process failed with exit code {peer.exitcode}")
                return 1
        finally:
            if peer.is_alive():
                peer.kill()
            rdv.unlink()
    return 0
