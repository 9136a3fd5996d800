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

from .. import workers
from ..conftest import MiB, _new_name, _remove_segment
from ..segment_bytes import Segment

pytestmark = pytest.mark.slow

TRIALS = int(os.environ.get("SHMRDV_FUZZ_TRIALS", "40"))
TRIAL_S = 0.5
SLACK_S = 1.0  # an operation may overrun its timeout by this much (scheduling, a reclaim)


def _damage(seg, rng):
    """A few random bytes somewhere that matters: the header, the process
    table, the key index, the side table or the arena; or a small number in
    a word (the value a lock word has when a live process holds it, a short
    link, a count)."""
    regions = [(0, 8192), (8192, 8192 + 128 * 256), (seg.index_off, seg.side_off), (seg.side_off, seg.arena_off),
               (seg.arena_off, seg.arena_off + seg.cap)]
    lo, hi = rng.choice(regions)
    if rng.random() < 0.3:
        off = rng.randrange(lo, hi - 4) & ~3
        seg.mem[off:off + 4] = rng.randrange(1, 4).to_bytes(4, "little")
        return
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
                    time.sleep(rng.uniform(0.002, 0.02))
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


@pytest.mark.timeout(60)
@pytest.mark.parametrize("whose", ["ours", "another live process's"])
def test_a_lock_word_damaged_to_name_a_live_process_is_freed(rdv, whose):
    """A key's lock word set to a live process's value (entry + 1) that holds
    no lock: the next operation on the key frees it after a few
    milliseconds of checks, instead of spinning forever."""
    import numpy as np

    other = None
    if whose != "ours":
        ctx = multiprocessing.get_context("spawn")
        ready, other = ctx.Event(), None
        other = ctx.Process(target=workers.attach_and_wait, args=(rdv.name, ready), daemon=True)
        other.start()
        assert ready.wait(60)
    try:
        rdv.send("k", np.arange(3))
        seg = Segment(rdv.name)
        try:
            slot = seg.slot_with_key_count(1)
            me = next(p.entry for p in rdv.processes() if p.pid == (os.getpid() if other is None else other.pid))
            seg.u32(slot, me + 1)  # the lock word: "held" by that live process
            started = time.monotonic()
            assert list(rdv.recv("k", timeout=5)) == [0, 1, 2]
            assert time.monotonic() - started < 5
            assert seg.u32(slot) == 0
        finally:
            seg.close()
    finally:
        if other is not None:
            other.kill()
            other.join(10)


@pytest.mark.timeout(90)
def test_a_new_key_over_lock_words_damaged_to_name_ourselves_is_inserted(rdv):
    """An insert holds the home slot's insert lock while it takes a free
    slot's lock; a word damaged to name the inserting process itself was
    counted as held by it (its insert lock), so it waited for itself
    forever. It is freed after the stale checks, and the message arrives."""
    ctx = multiprocessing.get_context("spawn")
    result = ctx.Queue()
    child = ctx.Process(target=workers.insert_over_locks_naming_us, args=(rdv.name, result), daemon=True)
    child.start()
    try:
        assert result.get(timeout=60) == [0, 1, 2]
        child.join(30)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
            child.join(10)
