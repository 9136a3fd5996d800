"""Random bytes written into a live segment while two processes use it:
every trial ends without a crash and without a hang. Each operation
finishes, fails with a documented error (SegmentMismatch among them), or
times out within its timeout; closing ends too. SHMRDV_FUZZ_TRIALS sets the
number of trials (default 40; a soak: 1000)."""
import multiprocessing
import os
import random
import time

import pytest

import shmrdv

from . import workers
from .conftest import MiB, _new_name, _remove_segment
from .segment_bytes import Segment

TRIALS = int(os.environ.get("SHMRDV_FUZZ_TRIALS", "40"))
TRIAL_S = 0.4
SLACK_S = 1.0  # an operation may overrun its timeout by this much (scheduling, a reclaim)


def _damage(seg, rng):
    """A few random bytes somewhere that matters: the header, the process
    table, the key index, the side table or the arena."""
    regions = [(0, 8192), (8192, 8192 + 128 * 256), (seg.index_off, seg.side_off), (seg.side_off, seg.arena_off),
               (seg.arena_off, seg.arena_off + seg.cap)]
    lo, hi = rng.choice(regions)
    off = rng.randrange(lo, hi - 8)
    n = rng.choice((1, 2, 4, 8))
    seg.mem[off:off + n] = bytes(rng.getrandbits(8) for _ in range(n))


@pytest.mark.timeout(60 + TRIALS * 15)
def test_random_damage_to_a_live_segment_never_crashes_or_hangs():
    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    for w in range(2):
        ours, theirs = ctx.Pipe()
        p = ctx.Process(target=workers.fuzz_worker, args=(theirs, w), daemon=True)
        p.start()
        pipes.append(ours)
        procs.append(p)
    rng = random.Random(1234)
    totals, worst = {}, (0.0, "")
    try:
        for trial in range(TRIALS):
            name = _new_name()
            shmrdv.Rendezvous(name, size=1 * MiB, max_keys=64, create=True).close()
            seg = Segment(name)
            try:
                for w, conn in enumerate(pipes):
                    conn.send((name, trial * 2 + w, TRIAL_S))
                end = time.monotonic() + TRIAL_S
                while time.monotonic() < end:
                    time.sleep(rng.uniform(0.01, 0.08))
                    _damage(seg, rng)
                for w, conn in enumerate(pipes):
                    assert procs[w].is_alive(), f"trial {trial}: worker {w} died ({procs[w].exitcode})"
                    assert conn.poll(TRIAL_S + 10 + SLACK_S), f"trial {trial}: worker {w} hung"
                    kind, counts, slowest, what = conn.recv()
                    for k, v in counts.items():
                        totals[k] = totals.get(k, 0) + v
                    worst = max(worst, (slowest, what))
                    assert slowest < workers.FUZZ_OP_TIMEOUT + SLACK_S + 2, \
                        f"trial {trial}: worker {w}'s {what} took {slowest:.2f} s"
            finally:
                seg.close()
                _remove_segment(name)
    finally:
        for conn in pipes:
            try:
                conn.send(None)
            except OSError:
                pass
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
    print(f"fuzz: {TRIALS} trials, outcomes {totals}, slowest operation {worst[0]:.2f} s ({worst[1]})")
