"""Kill test: workers do random send/send_many/alloc/recv/recv_many on many keys with self-checking payloads while
the controller SIGKILLs random ones at random moments and starts new ones, for a bounded time.

Checked at the end: no payload ever arrived corrupted; no message arrived twice; every message
whose send completed was received or is still pending, except at most a batch (recv_many) per
killed worker (messages it had received but was killed before it could log them); after draining, the arena
is back to empty and no key or waiter remains; every worker stopped when asked.

SHMRDV_SOAK_SECONDS sets the duration (default 8; e.g. 300 for a long run)."""
import os
import random
import signal
import struct
import time

import pytest

import shmrdv

from .. import workers

pytestmark = pytest.mark.slow

SECONDS = float(os.environ.get("SHMRDV_SOAK_SECONDS", "8"))
WORKERS = 4
KEYS = 24


def _read_log(path):
    if not path.exists():
        return []  # killed before it opened its log
    data = path.read_bytes()
    size = struct.calcsize(workers.SOAK_RECORD)
    return [struct.unpack_from(workers.SOAK_RECORD, data, i) for i in range(0, len(data) - size + 1, size)]


@pytest.mark.timeout(SECONDS + 120)
def test_kill_soak(rdv_name, children, tmp_path):
    stop = tmp_path / "stop"
    rng = random.Random(int(os.environ.get("SHMRDV_SOAK_SEED", "1")))
    incarnation = 0
    logs = []

    def start(slot):
        nonlocal incarnation
        incarnation += 1
        log = tmp_path / f"worker-{incarnation}.log"
        logs.append(log)
        return children.start(workers.soak_worker, rdv_name, incarnation, KEYS, str(log), str(stop), incarnation)

    with shmrdv.Rendezvous(rdv_name, size=2 << 20, max_keys=256, create=True) as rdv:
        running = [start(i) for i in range(WORKERS)]
        kills = 0
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.05, 0.5))  # workers take ~0.2 s to start
            victim = rng.randrange(WORKERS)
            os.kill(running[victim].pid, signal.SIGKILL)
            running[victim].join(10)
            kills += 1
            running[victim] = start(victim)
        stop.touch()
        for process in running:
            process.join(60)
        assert all(not p.is_alive() for p in running), "a worker did not stop when asked"
        assert all(p.exitcode == 0 for p in running), [p.exitcode for p in running]

        rdv.collect_garbage()
        drained = []
        for k in range(KEYS):
            while (view := rdv.try_recv(f"soak-{k}")) is not None:
                drained.append(workers.soak_check(view))
                del view

        records = [r for log in logs for r in _read_log(log)]
        sent = [mid for kind, mid, _ in records if kind == workers.SOAK_SENT]
        received = [mid for kind, mid, _ in records if kind == workers.SOAK_RECEIVED] + [m for m, ok in drained if ok]
        corrupt = [mid for kind, mid, _ in records if kind == workers.SOAK_CORRUPT] + [m for m, ok in drained if not ok]
        unaccounted = set(sent) - set(received)
        stats = rdv.stats()
        print(
            f"\nkill soak: {SECONDS:.0f} s, {kills} kills, {len(records)} operations, {len(received)} messages "
            f"checked ({len(drained)} drained at the end), {len(corrupt)} corrupted, "
            f"{len(unaccounted)} received by a worker killed before it logged them, "
            f"{stats.bytes_used} bytes still used after drain"
        )
        assert corrupt == []
        assert len(received) == len(set(received)), "a message was delivered twice"
        assert len(unaccounted) <= kills * workers.SOAK_BATCH
        assert (stats.bytes_used, stats.pending_messages, stats.keys, stats.waiters) == (0, 0, 0, 0)
        assert [p.pid for p in rdv.processes()] == [os.getpid()]
        rdv.unlink()
