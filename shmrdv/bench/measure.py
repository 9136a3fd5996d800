"""Measurement loops: streams, round trips, and how costs grow."""

from __future__ import annotations
import math
import statistics
import time
from multiprocessing.connection import Connection
from typing import Any, Dict, List, Sequence, Tuple
import numpy as np

from .common import CHILD_LIFETIME_S, DATA_DTYPE, MESSAGE_TIMEOUT_S, POOL, KiB, MiB, arena_bytes
from .processes import Children, _reply, allowed_cpus
from .transports import TRANSPORTS, Peer, check, stamp

# ---------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------


def timed_stream(peer: Any, target_s: float, max_count: int = 10_000_000, min_count: int = 3) -> Tuple[int, float]:
    """(messages, seconds) of one timed stream lasting about `target_s`.

    Warm-up streams first: POOL messages (every source array and ring slot
    built and touched), then growing until one lasts a fifth of the target,
    then up to two passes over the shmrdv arena (every page touched by both
    processes). Then one timed stream sized from the warm-up rate.
    """
    count = min(POOL, max_count)
    warmed = 0
    while True:
        elapsed = peer.stream(count)
        warmed += count
        if elapsed >= target_s / 5 or count >= max_count:
            break
        count = min(max_count, count * 4)
    arena_passes = 2 * arena_bytes(peer.nbytes) // max(peer.nbytes, 1)
    if warmed < arena_passes and peer.nbytes >= 64 * KiB:
        peer.stream(min(arena_passes - warmed, max_count))
    count = int(min(max_count, max(min_count, count * target_s / max(elapsed, 1e-9))))
    return count, peer.stream(count)


def timed_round_trips(peer: Peer, target_s: float, max_count: int, warmup: int = 100) -> List[float]:
    """Round-trip times after `warmup` untimed ones; as many as fit `target_s` (at most `max_count`)."""
    warm = peer.round_trips(warmup)
    per_trip = statistics.median(warm)
    count = int(min(max_count, max(50, target_s / max(per_trip, 1e-9))))
    return peer.round_trips(count)


def throughput_row(transport: str, where: str, nbytes: int, messages: int, seconds: float) -> Dict[str, Any]:
    """One throughput figure, as JSON and the tables have it."""
    return {"transport": transport, "label": TRANSPORTS[transport].label, "placement": where, "bytes": nbytes,
            "messages": messages, "seconds": seconds, "gbps": messages * nbytes / seconds / 1e9,
            "msgs_per_s": messages / seconds}


def round_trip_row(transport: str, where: str, nbytes: int, times: Sequence[float]) -> Dict[str, Any]:
    """One round-trip figure (times in seconds), as JSON and the tables have it."""
    return {"transport": transport, "label": TRANSPORTS[transport].label, "placement": where, "bytes": nbytes,
            "round_trips": len(times), "median_us": statistics.median(times) * 1e6, "p99_us": p99(times) * 1e6}


def p99(data: Sequence[float]) -> float:
    """99th percentile (nearest rank)."""
    ordered = sorted(data)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def rss_kib() -> Dict[str, int]:
    """This process's resident memory by kind (kB from /proc/self/status)."""
    fields = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssFile", "RssShmem", "VmRSS"):
                fields[name] = int(value.split()[0])
    return fields


def _growth_worker(role: str, name: str, key: str, nbytes: int, count: int, control: Connection) -> None:
    """One producer or consumer of the process-count scaling run; reports (start, end) monotonic times."""
    import shmrdv

    with shmrdv.Rendezvous(name, create=False) as rdv:
        source = np.zeros(nbytes // 4, dtype=DATA_DTYPE)
        control.send("ready")
        if control.recv() != "go":
            return
        start = time.monotonic()
        for number in range(count):
            if role == "producer":
                stamp(source, number)
                rdv.send(key, source, timeout=MESSAGE_TIMEOUT_S)
            else:
                message = rdv.recv(key, timeout=MESSAGE_TIMEOUT_S)
                check(message, number, nbytes)
                del message
        control.send((start, time.monotonic()))


def process_scaling(pairs: int, nbytes: int, count: int, lifetime_s: int = CHILD_LIFETIME_S) -> Dict[str, float]:
    """Aggregate send/recv throughput of `pairs` producer/consumer process pairs, each on its own key
    of one rendezvous, spread round-robin over the allowed CPUs."""
    import shmrdv

    cpus = allowed_cpus()
    children = Children(lifetime_s)
    controls: List[Connection] = []
    try:
        with shmrdv.Rendezvous(size=arena_bytes(nbytes)) as rdv:
            try:
                processes = []
                for pair in range(pairs):
                    for offset, role in enumerate(("producer", "consumer")):
                        ours, theirs = children.pipe()
                        cpu = cpus[(pair + offset) % len(cpus)]
                        processes.append(children.start(_growth_worker, role, rdv.name, f"k{pair}", nbytes, count, theirs, cpu=cpu))
                        theirs.close()
                        controls.append(ours)
                for control, process in zip(controls, processes):
                    if _reply(control, process) != "ready":
                        raise AssertionError("growth worker did not start")
                for control in controls:
                    control.send("go")
                spans = [_reply(control, process, MESSAGE_TIMEOUT_S * 2) for control, process in zip(controls, processes)]
                for process in processes:
                    children.join(process)
            finally:
                rdv.unlink()
    finally:
        children.cleanup()
        for control in controls:
            control.close()
    elapsed = max(end for _, end in spans) - min(start for start, _ in spans)
    total = pairs * count
    return {"pairs": pairs, "processes": 2 * pairs, "bytes": nbytes, "messages": total, "seconds": elapsed,
            "gbps": total * nbytes / elapsed / 1e9, "msgs_per_s": total / elapsed}


def pending_keys_arena(pending_keys: int, nbytes: int, messages: int) -> int:
    """Arena for `pending_keys` unreceived 64 B messages plus `messages` more of `nbytes`.

    A message that stays queued pins the arena's ring: space behind it is not
    reused until it is received, so the arena must hold everything sent."""
    return pending_keys * 256 + messages * (nbytes + 256) + 4 * MiB


def keys_scaling(peer: Peer, pending_keys: int, nbytes: int, count: int, rounds: int) -> Dict[str, float]:
    """send/recv streaming throughput with `pending_keys` other keys holding an unreceived message
    (median of `rounds` streams of `count` messages, after one warm-up stream)."""
    arena = pending_keys_arena(pending_keys, nbytes, (rounds + 1) * count)
    peer.resize(nbytes, pending_keys=pending_keys, size=arena)
    peer.stream(count)  # warm-up
    best = [peer.stream(count) for _ in range(rounds)]
    elapsed = statistics.median(best)
    return {"pending_keys": pending_keys, "bytes": nbytes, "messages": count, "seconds": elapsed,
            "gbps": count * nbytes / elapsed / 1e9, "msgs_per_s": count / elapsed}


def held_views_memory(peer: Peer, nbytes: int, views: int) -> Dict[str, Any]:
    """Receiver memory growth while holding `views` received messages of `nbytes` (every byte read)."""
    peer.resize(nbytes, size=max(arena_bytes(nbytes), 2 * views * (nbytes + 4 * KiB)))
    peer.stream(2)  # warm-up: mapping, first messages
    before = rss_kib()
    kept = peer.hold(views)
    checksum = float(sum(float(np.sum(view, dtype=np.float64)) for view in kept))
    after = rss_kib()
    del kept
    growth = {name: after[name] - before[name] for name in before}
    return {"bytes": nbytes, "views": views, "held_bytes": views * nbytes, "checksum": checksum,
            "rss_anon_growth_kib": growth["RssAnon"], "rss_shmem_growth_kib": growth["RssShmem"],
            "rss_growth_kib": growth["VmRSS"]}
