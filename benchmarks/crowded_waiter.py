"""A receiver's CPU per message on a crowded machine, for two builds of
shmrdv side by side: ``python benchmarks/crowded_waiter.py OLD_PYTHON
NEW_PYTHON [--pairs 3] [--messages 20000]`` runs, for each gap, each
interpreter's shmrdv in turn, alternating: a sender that sends a 64 B array
every GAP µs (busy-waiting between), a receiver, and two busy hogs, so more
tasks are runnable than two CPUs. It prints the receiver's CPU per message
per run, sorted, and the hogs' work per second (what a spinning receiver
takes from them). Run it from outside the checkout, so that each interpreter
imports its own installed shmrdv."""
import multiprocessing
import os
import statistics
import sys
import time

import ab_builds  # a sibling: the script runs as a file, from outside the checkout

GAPS_US = (30, 100, 300)


def hog(stop, done) -> None:
    rounds = 0
    while not stop.is_set():
        for _ in range(10000):
            pass
        rounds += 1
    done.value = rounds


def paced_sender(name: str, gap_s: float, messages: int) -> None:
    import numpy as np

    import shmrdv

    with shmrdv.Rendezvous(name, create=False) as rdv:
        array = np.zeros(16, np.float32)
        due = time.perf_counter()
        for _ in range(messages):
            due += gap_s
            while time.perf_counter() < due:
                pass
            rdv.send("k", array)


def measure(gap_us: float, messages: int) -> None:
    """One run in this interpreter: print receiver CPU µs per message and hog rounds per second."""
    import shmrdv

    context = multiprocessing.get_context("fork")
    name = f"crowd-{os.getpid()}"
    with shmrdv.Rendezvous(name, create=True) as rdv:
        stop = context.Event()
        done = [context.Value("q", 0) for _ in range(2)]
        hogs = [context.Process(target=hog, args=(stop, d)) for d in done]
        sender = context.Process(target=paced_sender, args=(name, gap_us * 1e-6, messages))
        try:
            for process in hogs:
                process.start()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            sender.start()
            for _ in range(messages):
                rdv.recv("k", timeout=60)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        finally:
            stop.set()
            for process in (sender, *hogs):
                process.join(30)
                if process.is_alive():
                    process.kill()
                    process.join()
            rdv.unlink()
    print(cpu / messages * 1e6, sum(d.value for d in done) / wall)


def main() -> None:
    parser = ab_builds.parser(__doc__, pairs=3)
    parser.add_argument("--messages", type=int, default=20000)
    args = parser.parse_args()
    for gap in GAPS_US:
        runs = ab_builds.alternate(args, __file__, [str(gap), str(args.messages)])
        for build, figures in runs.items():
            cpu = sorted(f[0] for f in figures)
            hogs = statistics.median(f[1] for f in figures)
            print(f"gap {gap} us, {build}: receiver CPU per message {', '.join(f'{c:.1f}' for c in cpu)} us; "
                  f"hogs {hogs:.0f} rounds/s (median)")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--run":
        measure(float(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
