"""How many receivers one send wakes: ten processes wait in line on one key,
asleep in the kernel; a sender process, run under strace, sends one message.
Prints the sender's shared FUTEX_WAKE calls with how many sleepers each woke,
and how many receivers got the message (the others time out after 5 s).
Needs strace. Run ``python benchmarks/futex_wakeups.py`` from outside the
checkout with the shmrdv build to measure installed (the previous build's
too, for a side-by-side figure)."""
import multiprocessing
import os
import subprocess
import sys
import time

RECEIVERS = 10
KEY = "k"


def receive(name: str, results) -> None:
    import shmrdv

    with shmrdv.Rendezvous(name, create=False) as rdv:
        try:
            rdv.recv(KEY, timeout=5)
            results.put("got")
        except shmrdv.RendezvousTimeout:
            results.put("timed out")


def main() -> None:
    import shmrdv

    name = f"futex-wakeups-{os.getpid()}"
    trace = f"/tmp/shmrdv-{name}.trace"
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with shmrdv.Rendezvous(name, create=True) as rdv:
        try:
            receivers = [context.Process(target=receive, args=(name, results)) for _ in range(RECEIVERS)]
            for p in receivers:
                p.start()
            while rdv.stats().waiters < RECEIVERS:
                time.sleep(0.05)
            time.sleep(0.5)  # every receiver asleep in the kernel by now
            send = (f"import shmrdv, numpy as np; r = shmrdv.Rendezvous({name!r}, create=False); "
                    f"r.send({KEY!r}, np.ones(4)); r.close()")
            subprocess.run(["strace", "-f", "-e", "trace=futex", "-o", trace, sys.executable, "-c", send], check=True)
            outcomes = [results.get(timeout=30) for _ in range(RECEIVERS)]
            for p in receivers:
                p.join(30)
        finally:
            rdv.unlink()
    with open(trace) as f:
        wakes = [line.strip() for line in f if "FUTEX_WAKE" in line and "PRIVATE" not in line]
    os.unlink(trace)
    woken = [line.rsplit("=", 1)[1].strip() for line in wakes]
    print(f"shmrdv {shmrdv.__version__}: the sender made {len(wakes)} shared FUTEX_WAKE call(s), waking {woken}; "
          f"receivers: {outcomes.count('got')} got the message, {outcomes.count('timed out')} timed out")


if __name__ == "__main__":
    main()
