"""Round trips of a 64 B array between two processes, for two builds of
shmrdv side by side: ``python benchmarks/ab_round_trip.py OLD_PYTHON
NEW_PYTHON [--pairs 8] [--rounds 20000]`` runs each interpreter's shmrdv in
turn, alternating, with the two processes pinned apart (two CPUs) and on
one CPU, and prints each build's medians per run, sorted, and their median:
the way to compare a hot-path change with the build before it on a noisy
machine. Run it from outside the checkout, so that each interpreter imports
its own installed shmrdv."""
import multiprocessing
import os
import statistics
import sys
import time

import ab_builds  # a sibling: the script runs as a file, from outside the checkout


def echo(name: str, cpu: int, rounds: int) -> None:
    import shmrdv

    os.sched_setaffinity(0, {cpu})
    with shmrdv.Rendezvous(name, create=False) as rdv:
        for _ in range(rounds):
            rdv.send("pong", rdv.recv("ping", timeout=30))


def measure(placement: str, rounds: int) -> None:
    """One run in this interpreter: print the median round trip in µs."""
    import numpy as np

    import shmrdv

    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[0]})
    name = f"ab-{os.getpid()}"
    with shmrdv.Rendezvous(name, create=True) as rdv:
        try:
            child = multiprocessing.get_context("spawn").Process(
                target=echo, args=(name, cpus[1] if placement == "apart" else cpus[0], rounds))
            child.start()
            array = np.zeros(16, np.float32)
            times = []
            for _ in range(rounds):
                begin = time.perf_counter_ns()
                rdv.send("ping", array)
                del array  # the last echo's view: its block goes back before the next one comes
                array = rdv.recv("pong", timeout=30)
                times.append(time.perf_counter_ns() - begin)
            child.join(30)
        finally:
            rdv.unlink()
    print(statistics.median(times[rounds // 10:]) / 1000)


def main() -> None:
    parser = ab_builds.parser(__doc__, pairs=8)
    parser.add_argument("--rounds", type=int, default=20000)
    args = parser.parse_args()
    for placement in ("apart", "same"):
        runs = ab_builds.alternate(args, __file__, [placement, str(args.rounds)])
        for build, figures in runs.items():
            medians = [f[0] for f in figures]
            print(f"64 B round trip, {placement}, {build}: median {statistics.median(medians):.2f} us over "
                  f"{args.pairs} runs (runs: {', '.join(f'{m:.2f}' for m in sorted(medians))})")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--run":
        measure(sys.argv[2], int(sys.argv[3]))
    else:
        main()
