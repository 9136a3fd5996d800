"""shmrdv's collectives (``shmrdv.Group``) measured against Open MPI and gloo
in one run, on the same cases with the same timing (``collective_peers``),
and the report: a table of medians with ratios, and a plot.

``shmrdv bench --collectives`` runs it; ``--world-size 4`` oversubscribes
the two CPUs of a small machine, where ranks that sleep while they wait
should win by more than ranks that spin."""
import json
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .machine import machine
from .common import write_outputs
from .ddp import BATCH, LAYERS, compare_ddp
from .collective_peers import (ITEM, OPS, _plan, expect, run_gloo, run_mpi, run_rank, run_spawned_ranks,
                               summarize, time_calls)

SHMRDV_COST = (10e-6, 1.0e9)  # (latency s, bytes/s) of a call, pessimistic: iteration counts
PEERS = ("Open MPI", "gloo")

# The goals of the collectives, as ratios peer median / shmrdv median in one
# run (2 ranks, one per CPU): (case, peer, at least).
GOALS: Tuple[Tuple[str, str, float], ...] = (
    ("allreduce 4 KiB", "Open MPI", 1.0),
    ("allreduce 4 KiB", "gloo", 100.0),
    ("allreduce 16 MiB", "Open MPI", 1.5),
    ("allreduce 16 MiB", "gloo", 4.0),
    ("allreduce 64 MiB", "Open MPI", 1.5),
    ("allreduce 64 MiB", "gloo", 4.0),
    ("broadcast 16 MiB", "Open MPI", 1.5),
    ("allgather 16 MiB", "Open MPI", 1.5),
    ("barrier", "Open MPI", 0.5),
)


def _case(group: Any, op: str, nbytes: int, rank: int, size: int) -> Tuple[Callable[[], Any], Callable[[], None]]:
    """(call, check) of one case, as the peers run it (collective_peers._gloo_case)."""
    count = nbytes // ITEM
    if op == "allreduce":
        data = np.empty(count, np.float32)

        def check() -> None:
            data.fill(rank + 1)
            group.allreduce(data, out=data)
            expect(op, data[[0, -1]], size * (size + 1) / 2)
            data.fill(0)  # in place: keep the sums from growing to inf

        return (lambda: group.allreduce(data, out=data)), check
    if op == "broadcast":
        data = np.full(count, 7.0 if rank == 0 else 0.0, np.float32)

        def check() -> None:
            group.broadcast(data, 0, out=None if rank == 0 else data)
            expect(op, data[[0, -1]], 7.0)

        return (lambda: group.broadcast(data, 0, out=None if rank == 0 else data)), check
    if op == "allgather":
        mine = np.full(count // size, rank + 1, np.float32)

        def check() -> None:
            out = group.allgather(mine)
            expect(op, out[:, [0, -1]], np.arange(1, size + 1).reshape(size, 1))

        return (lambda: group.allgather(mine)), check
    if op == "barrier":
        return group.barrier, group.barrier
    raise ValueError(f"unknown collective {op!r}")


def _shmrdv_rank(rank: int, size: int, name: str, cpu: Optional[int], plan: List[List[Any]], lifetime_s: int,
                 results: Any) -> None:
    """One shmrdv rank (spawned)."""

    def measure() -> Dict[str, Any]:
        import shmrdv

        with shmrdv.Group(name, rank, size, timeout=lifetime_s) as group:
            times = {}
            for case, op, nbytes, iters, warmup in plan:
                call, check = _case(group, op, nbytes, rank, size)
                check()
                times[case] = time_calls(call, iters, warmup, group.barrier)
            group.barrier()
        return {"times": times}

    run_rank(results, f"rank {rank}", cpu, lifetime_s, measure)


def run_shmrdv(cases: Sequence[Tuple[str, int]] = OPS, world_size: int = 2, pin: bool = True,
               timeout_s: float = 180.0, smoke: bool = False) -> Dict[str, Dict[str, Any]]:
    """Every case with shmrdv.Group in `world_size` spawned processes; the
    same timing and return value as ``collective_peers.run_gloo``."""
    plan = _plan(cases, world_size, None, smoke, SHMRDV_COST)
    name = f"bench-{os.getpid()}-{os.urandom(4).hex()}"
    answers = run_spawned_ranks("shmrdv", _shmrdv_rank, world_size, pin, timeout_s,
                                lambda rank, cpu, lifetime_s: (rank, world_size, name, cpu, plan, lifetime_s))
    return {case: summarize([answers[rank]["times"][case] for rank in range(world_size)], nbytes)
            for case, _op, nbytes, _iters, _warmup in plan}


def compare(world_size: int = 2, smoke: bool = False, cases: Sequence[Tuple[str, int]] = OPS) -> Dict[str, Any]:
    """shmrdv, Open MPI and gloo on the same cases, one after the other (never
    at once: they would share the CPUs). A missing peer is None."""
    return {"world_size": world_size, "smoke": smoke,
            "shmrdv": run_shmrdv(cases, world_size, smoke=smoke),
            "Open MPI": run_mpi(cases, world_size, smoke=smoke),
            "gloo": run_gloo(cases, world_size, smoke=smoke)}


def _time(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} µs"


def ratios(results: Dict[str, Any]) -> Dict[str, Dict[str, Optional[float]]]:
    """peer median / shmrdv median for every case and peer (None: peer missing)."""
    out: Dict[str, Dict[str, Optional[float]]] = {}
    for case, ours in results["shmrdv"].items():
        out[case] = {}
        for peer in PEERS:
            theirs = (results.get(peer) or {}).get(case)
            out[case][peer] = theirs["median_us"] / ours["median_us"] if theirs and ours["median_us"] > 0 else None
    return out


def goals(results: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Each goal of GOALS with the ratio measured in this run (2 ranks only)."""
    found = ratios(results)
    return [{"case": case, "peer": peer, "goal": goal, "ratio": found.get(case, {}).get(peer),
             "met": (found.get(case, {}).get(peer) or 0.0) >= goal} for case, peer, goal in GOALS]


def markdown(results: Dict[str, Any]) -> str:
    """The table: median (p99) per call of each, and how many times faster shmrdv is."""
    found = ratios(results)
    head = "| op | shmrdv | Open MPI | gloo | vs Open MPI | vs gloo |"
    lines = [head, "|---|---:|---:|---:|---:|---:|"]
    for case, ours in results["shmrdv"].items():
        cells = [case, f"{_time(ours['median_us'])} ({_time(ours['p99_us'])})"]
        for peer in PEERS:
            theirs = (results.get(peer) or {}).get(case)
            cells.append(f"{_time(theirs['median_us'])} ({_time(theirs['p99_us'])})" if theirs else "skipped")
        for peer in PEERS:
            r = found[case][peer]
            cells.append(f"{r:.2f}×" if r is not None else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: Dict[str, Any], path: str) -> None:
    """Bars of median time per call (log scale), one group per case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(results["shmrdv"])
    series = [("shmrdv", results["shmrdv"])] + [(p, results[p]) for p in PEERS if results.get(p)]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(series)
    for k, (label, data) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(cases))]
        ax.bar(xs, [data[c]["median_us"] if c in data else 0 for c in cases], width, label=label)
    ax.set_yscale("log")
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases, rotation=20, ha="right")
    ax.set_ylabel("median time per call (µs, log)")
    ax.set_title(f"collectives, {results['world_size']} ranks, float32 (lower is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_command(args: Any) -> int:
    """``shmrdv bench --collectives``: measure, print the table and the goals, save --json and --plot."""
    if args.from_json:
        with open(args.from_json) as saved:
            results = json.load(saved)
    else:
        results = compare(args.world_size, smoke=args.smoke)
        try:
            import torch  # noqa: F401
        except ImportError:
            print("skipped the DDP step: torch is not installed")
        else:
            results["ddp"] = compare_ddp(args.world_size, smoke=args.smoke)
        results["machine"] = machine()
        results["date"] = time.strftime("%Y-%m-%d")
    print(f"collectives, {results['world_size']} ranks, float32, median (p99) per call"
          + (" (smoke run: the figures mean nothing)" if results.get("smoke") else ""))
    print(markdown(results))
    if results.get("ddp"):
        d = results["ddp"]
        print(f"DDP step, MLP {'-'.join(map(str, LAYERS))}, batch {BATCH}: shmrdv {_time(d['shmrdv']['median_us'])}, "
              f"gloo {_time(d['gloo']['median_us'])}: {d['ratio']:.2f}x faster (goal >= 3x)")
    if results["world_size"] == 2:
        for g in goals(results):
            ratio = "–" if g["ratio"] is None else f"{g['ratio']:.2f}×"
            print(f"  {'met ' if g['met'] else 'MISS'} {g['case']} vs {g['peer']}: {ratio} (goal ≥ {g['goal']}×)")
    write_outputs(results, args, plot)
    return 0


__all__ = ["run_command", "compare", "goals", "markdown", "plot", "ratios", "run_shmrdv"]
