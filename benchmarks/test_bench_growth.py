"""How shmrdv's costs grow: with the number of producer/consumer processes,
with the number of live (pending) keys, and the receiver's memory while it
holds received views (it must not grow with the payload: zero copy)."""

from __future__ import annotations

from statistics import median

import pytest

from shmrdv import bench

from .harness import DISABLED_MAX_BYTES, DISABLED_MAX_PENDING_KEYS, size_id, timings

KEYS_MESSAGE_BYTES = 4 * bench.KiB
KEYS_MESSAGES_PER_ROUND = 2000
KEYS_ROUNDS = 10
HELD_VIEWS = 8


@pytest.mark.benchmark(group="growth-processes")
@pytest.mark.parametrize("pairs", [1, 2, 4])
def test_processes(benchmark, shmrdv, pairs: int, results: bench.Results) -> None:
    """N producers + N consumers (64 KiB messages, a key per pair, one rendezvous); figures are aggregate."""
    count = 20_000 if benchmark.enabled else 10
    rows = []
    benchmark.pedantic(lambda: rows.append(bench.process_scaling(pairs, 64 * bench.KiB, count)), rounds=3)
    row = sorted(rows, key=lambda r: r["gbps"])[len(rows) // 2]
    benchmark.extra_info.update({"GB/s": row["gbps"], "messages/s": row["msgs_per_s"]})
    if benchmark.enabled:
        results.processes.append(row)


@pytest.mark.benchmark(group="growth-pending-keys")
@pytest.mark.parametrize("placement", ["apart"], indirect=True)
@pytest.mark.parametrize("pending_keys", [0, 100, 10_000, 100_000])
def test_pending_keys(benchmark, peers, placement, pending_keys: int, results: bench.Results) -> None:
    """4 KiB send/recv streaming while `pending_keys` other keys each hold a message nobody receives."""
    per_round = KEYS_MESSAGES_PER_ROUND if benchmark.enabled else 1
    if not benchmark.enabled:
        pending_keys = min(pending_keys, DISABLED_MAX_PENDING_KEYS)
    peer = peers.get("shmrdv", placement.child_cpu)
    arena = bench.pending_keys_arena(pending_keys, KEYS_MESSAGE_BYTES, per_round * (KEYS_ROUNDS + 1))
    peer.resize(KEYS_MESSAGE_BYTES, pending_keys=pending_keys, size=arena)
    benchmark.pedantic(peer.stream, args=(per_round,), rounds=KEYS_ROUNDS, warmup_rounds=1)
    data = timings(benchmark)
    if data is not None:
        seconds = median(data)
        row = {"pending_keys": pending_keys, "bytes": KEYS_MESSAGE_BYTES, "messages": per_round, "seconds": seconds,
               "gbps": per_round * KEYS_MESSAGE_BYTES / seconds / 1e9, "msgs_per_s": per_round / seconds}
        benchmark.extra_info.update({"GB/s": row["gbps"], "messages/s": row["msgs_per_s"]})
        results.keys.append(row)


@pytest.mark.benchmark(group="growth-held-views")
@pytest.mark.parametrize("placement", ["apart"], indirect=True)
@pytest.mark.parametrize("nbytes", [4 * bench.KiB, bench.MiB, 16 * bench.MiB, 64 * bench.MiB], ids=size_id)
def test_held_views(benchmark, peers, placement, nbytes: int, results: bench.Results) -> None:
    """The receiver holds HELD_VIEWS received messages and reads every byte: its private memory stays flat."""
    if not benchmark.enabled:
        nbytes = min(nbytes, DISABLED_MAX_BYTES)
    peer = peers.get("shmrdv", placement.child_cpu)
    rows = []
    benchmark.pedantic(lambda: rows.append(bench.held_views_memory(peer, nbytes, HELD_VIEWS)), rounds=1)
    row = rows[-1]
    assert row["checksum"] > 0  # every byte was read
    assert row["rss_anon_growth_kib"] * bench.KiB < 16 * bench.MiB, row
    benchmark.extra_info.update({k: v for k, v in row.items() if k.startswith("rss")})
    if benchmark.enabled:
        results.held_views.append(row)
