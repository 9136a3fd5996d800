"""The arena allocator: fragmentation and cost in C, and a stream beside 100,000 pending messages.

``test_arena_sim`` builds ``benchmarks/arena_sim.c`` (the real allocator,
csrc/rdv_arena.c, linked with the few core files it needs, against a plain
next fit kept inside the harness) with gcc -O2 and runs one scenario per
test: (a) random sizes 64 B - 4 MiB with random lifetimes in 256 MiB kept
50-80% full, (b) a TensorFlow-like step of 500 tensors allocated then freed
in random order, (c) 10,000 long-lived small values beside a 1 MiB stream,
(d) the C side of the pending benchmark below. It reports external
fragmentation (1 - largest_free / free_bytes; worst and median of samples),
allocation failures, failures while a large enough free block existed (a bug
for the real allocator: asserted 0), ns per alloc/free pair, allocation
latency and, for the next fit, blocks scanned per allocation. Only
correctness is asserted, never a time.

``test_pending_random_order``: one process sends 100,000 messages of 64 B
under distinct keys into a rendezvous whose arena is twice the bytes they
take (measured with ``stats().bytes_used``), then receives them in random
order, while a pinned producer/consumer child pair streams 4 KiB messages on
another key of the same rendezvous. The stream's rate with nothing pending
against its rate during the random-order receive (target: within 2x); as a
control, the same random-order receive from another rendezvous of the same
size (the same CPU load, no shared arena).

Under ``--benchmark-disable`` (the default) both run with small counts
(10,000 pending messages, short traces); with ``--benchmark-enable`` or
``SHMRDV_BENCH_FULL=1`` with the full ones. The tables are in the terminal
summary ("shmrdv benchmark ratios").
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shmrdv import bench

from .harness import MESSAGE_TIMEOUT_S

ROOT = Path(__file__).resolve().parent.parent
SIM_SOURCE = Path(__file__).resolve().parent / "arena_sim.c"
# The allocator and what it calls: OS calls, waits (space wake-ups), the
# segment, liveness (linked, unused with the trivial ops), lock words.
SIM_CORE = ["rdv_os.c", "rdv_wait.c", "rdv_segment.c", "rdv_live.c", "rdv_lock.c", "rdv_arena.c"]
SCENARIOS = {  # short titles; see arena_sim.c
    "a": "random 64B-4MiB, 50-80% full",
    "b": "TF step: 500 tensors",
    "c": "10k small + 1MiB stream",
    "d": "256B pending + 4KiB stream",
}
# Smoke counts; the full counts are the harness's defaults (see arena_sim --help).
SIM_SMOKE_ARGS = {
    "a": ["--a-steps", "20000"],
    "b": ["--b-steps", "20"],
    "c": ["--c-stream", "20000"],
    "d": ["--d-pending", "10000"],
}
SIM_TIMEOUT_S = {"smoke": 60, "full": 600}

PENDING_FULL = 100_000
PENDING_SMOKE = 10_000
PENDING_PAYLOAD = np.zeros(16, dtype=np.float32)  # 64 B
PROBE_MESSAGES = 1000
STREAM_BYTES = 4096
STREAM_KEY = "stream/data"
CREDIT_KEY = "stream/credit"
# The stream's producer keeps at most STREAM_DEPTH messages in flight: the
# consumer sends a credit every CREDIT_EVERY messages. So the stream takes a
# bounded part of the arena (about 1 MiB) and measures send/recv, not waits
# for space.
STREAM_DEPTH = 256
CREDIT_EVERY = 64
STAMP_EVERY = 16  # the consumer notes the time every so many messages
POLL_EVERY = 64  # the producer looks at its control pipe every so many messages


def _full(benchmark: Any) -> bool:
    return bool(benchmark.enabled) or os.environ.get("SHMRDV_BENCH_FULL") == "1"


# ---------------------------------------------------------------------------
# arena_sim: the C harness
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def arena_sim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc to build benchmarks/arena_sim.c")
    exe = tmp_path_factory.mktemp("arena_sim") / "arena_sim"
    subprocess.run(
        [gcc, "-std=gnu11", "-O2", "-Wall", "-Wextra", f"-I{ROOT / 'csrc'}", str(SIM_SOURCE),
         *(str(ROOT / "csrc" / name) for name in SIM_CORE), "-lm", "-o", str(exe)],
        check=True, timeout=120,
    )
    return exe


def _parse_results(stdout: str) -> tuple[dict[str, dict[str, Any]], float | None]:
    """{allocator: {field: value}} from the harness's RESULT lines, and its SYNC figure."""
    rows: dict[str, dict[str, Any]] = {}
    sync = None
    for line in stdout.splitlines():
        words = line.split()
        if not words or words[0] not in ("RESULT", "SYNC"):
            continue
        fields: dict[str, Any] = {}
        for word in words[1:]:
            name, _, value = word.partition("=")
            try:
                fields[name] = int(value)
            except ValueError:
                try:
                    fields[name] = float(value)
                except ValueError:
                    fields[name] = value
        if words[0] == "SYNC":
            sync = fields["ns_per_pair"]
        else:
            rows[fields["allocator"]] = fields
    return rows, sync


@pytest.fixture(scope="module")
def sim_table(report: list[str]) -> Iterator[dict[str, Any]]:
    """Rows of every scenario run; tabulated in the terminal summary at module end."""
    table: dict[str, Any] = {"rows": [], "sync": None, "mode": None}
    yield table
    if not table["rows"]:
        return
    report.append(f"arena-sim ({table['mode']} counts): fragmentation = 1 - largest_free/free_bytes, "
                  "worst and median of samples; ns per alloc/free pair (one pass without sampling)")
    report.append(f"| {'scenario':<30} | {'allocator':<9} | worst | typical | failures | fit-fail | ns/pair "
                  f"| alloc p99.9 us | next-fit scan avg/max |")
    report.append(f"|{'-' * 32}|{'-' * 11}|-------|---------|----------|----------|---------"
                  "|----------------|-----------------------|")
    for scenario, row in table["rows"]:
        scan = (f"{row['scan_blocks_per_alloc']:.1f}/{row['scan_blocks_max']}"
                if row["allocator"] == "next-fit" else "-")
        report.append(
            f"| {scenario + ' ' + SCENARIOS[scenario]:<30} | {row['allocator']:<9} | {100 * row['worst_frag']:4.1f}% "
            f"| {100 * row['typical_frag']:6.1f}% | {row['failures']:8d} | {row['fit_failures']:8d} "
            f"| {row['ns_per_pair']:7.1f} | {row['alloc_p999_us']:14.2f} | {scan:>21} |")
    if table["sync"] is not None:
        report.append(f"arena-sim: shmrdv's ns/pair includes {table['sync']:.1f} ns of lock words and space "
                      "wake-up (uncontended) that the next fit does not pay")


@pytest.mark.benchmark(group="arena-sim")
@pytest.mark.timeout(SIM_TIMEOUT_S["full"] + 60)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_arena_sim(benchmark, arena_sim: Path, single_cpu: int, scenario: str, sim_table: dict[str, Any]) -> None:
    """One scenario through the real allocator and the reference next fit (pinned to one CPU)."""
    mode = "full" if _full(benchmark) else "smoke"
    command = [str(arena_sim), "--scenarios", scenario, *([] if mode == "full" else SIM_SMOKE_ARGS[scenario])]
    runs: list[subprocess.CompletedProcess] = []
    # The child inherits this thread's CPU (single_cpu).
    benchmark.pedantic(lambda: runs.append(subprocess.run(
        command, capture_output=True, text=True, timeout=SIM_TIMEOUT_S[mode])), rounds=1, iterations=1)
    run = runs[-1]
    assert run.returncode == 0, f"{' '.join(command)} failed ({run.returncode}):\n{run.stdout}\n{run.stderr}"
    rows, sync = _parse_results(run.stdout)
    assert set(rows) == {"shmrdv", "next-fit"}, run.stdout
    sim_table["mode"] = mode
    if sync is not None:
        sim_table["sync"] = sync
    for allocator in ("shmrdv", "next-fit"):
        row = rows[allocator]
        sim_table["rows"].append((scenario, row))
        for field in ("worst_frag", "typical_frag", "failures", "fit_failures", "ns_per_pair", "alloc_p999_us"):
            benchmark.extra_info[f"{allocator}:{field}"] = row[field]
        # Correctness, not speed: the same trace twice gave the same outcome,
        # and what Rendezvous.stats() reports agrees with the side table.
        assert row["deterministic"] == 1, row
        assert row["usage_mismatches"] == 0, f"rdv_arena_usage disagrees with the side table:\n{run.stderr}"
    real = rows["shmrdv"]
    assert real["fit_failures"] == 0, (
        f"the real allocator refused {real['fit_failures']} allocations while a large enough free block existed "
        f"(reproduce: {' '.join(command)}):\n{run.stderr}")
    if scenario in ("b", "c", "d"):  # these never need more than the arena holds
        assert real["failures"] == 0, f"{real}\n{run.stderr}"


# ---------------------------------------------------------------------------
# 100,000 pending messages received in random order beside a 4 KiB stream
# ---------------------------------------------------------------------------


def _stream_producer(name: str, control: Any) -> None:
    """Send numbered 4 KiB messages on STREAM_KEY until told to stop, then a -1 sentinel."""
    import shmrdv

    with shmrdv.Rendezvous(name, create=False) as rdv:
        payload = np.zeros(STREAM_BYTES // 4, dtype=np.int32)
        control.send("ready")
        if control.recv() != "go":
            return
        sent = credits = 0
        while True:
            if sent % POLL_EVERY == 0 and control.poll():
                control.recv()
                break
            while sent - credits * CREDIT_EVERY >= STREAM_DEPTH:
                rdv.recv(CREDIT_KEY, timeout=MESSAGE_TIMEOUT_S)
                credits += 1
            payload[0] = payload[-1] = sent
            rdv.send(STREAM_KEY, payload, timeout=MESSAGE_TIMEOUT_S)
            sent += 1
        payload[0] = payload[-1] = -1
        rdv.send(STREAM_KEY, payload, timeout=MESSAGE_TIMEOUT_S)
        control.send(sent)


def _stream_consumer(name: str, control: Any) -> None:
    """Receive and check the stream; note the time every STAMP_EVERY messages; send the times back."""
    import shmrdv

    with shmrdv.Rendezvous(name, create=False) as rdv:
        credit = np.zeros(1, dtype=np.int32)
        stamps: list[int] = []
        control.send("ready")
        if control.recv() != "go":
            return
        received = 0
        while True:
            message = rdv.recv(STREAM_KEY, timeout=MESSAGE_TIMEOUT_S)
            first, last = int(message[0]), int(message[-1])
            del message
            if first == -1:
                break
            if first != received or last != received:
                raise AssertionError(f"stream message {received} arrived as ({first}, {last})")
            received += 1
            if received % CREDIT_EVERY == 0:
                rdv.send(CREDIT_KEY, credit, timeout=MESSAGE_TIMEOUT_S)
            if received % STAMP_EVERY == 0:
                stamps.append(time.monotonic_ns())
        control.send((received, np.array(stamps, dtype=np.int64)))


def _answer(control: Any, child: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not control.poll(0.1):
        if not child.is_alive():
            raise AssertionError(f"child {child.pid} exited with code {child.exitcode}")
        if time.monotonic() > deadline:
            raise AssertionError(f"child {child.pid} did not answer within {timeout} s")
    return control.recv()


@contextlib.contextmanager
def _rendezvous(shmrdv: Any, kind: str, size: int, max_keys: int) -> Iterator[Any]:
    """A new rendezvous under the benchmarks' name prefix, always unlinked."""
    rdv = shmrdv.Rendezvous(bench.unique_name(kind), create=True, size=size, max_keys=max_keys)
    try:
        yield rdv
    finally:
        with contextlib.suppress(Exception):
            rdv.unlink()
        rdv.close()


def _keys(count: int) -> list[str]:
    return [f"pending/{index:06d}" for index in range(count)]  # one length: one block size


def _fill(rdv: Any, keys: list[str]) -> float:
    """Send one numbered 64 B message under each key; seconds taken."""
    payload = PENDING_PAYLOAD.copy()
    start = time.monotonic()
    for index, key in enumerate(keys):
        payload[0] = index
        rdv.send(key, payload, timeout=MESSAGE_TIMEOUT_S)
    return time.monotonic() - start


def _drain(rdv: Any, keys: list[str], order: list[int]) -> None:
    for index in order:
        message = rdv.recv(keys[index], timeout=MESSAGE_TIMEOUT_S)
        if message[0] != index:
            raise AssertionError(f"{keys[index]} held {message[0]}")
        del message


def _figures(stats: Any) -> dict[str, int]:
    return {"bytes_used": stats.bytes_used, "bytes_free": stats.bytes_free, "largest_free": stats.largest_free,
            "live_blocks": stats.live_blocks, "pending_messages": stats.pending_messages}


def _pending_run(shmrdv: Any, children: bench.Children, count: int, cpus: dict[str, int],
                 idle_s: float) -> dict[str, Any]:
    keys = _keys(count)
    order = list(range(count))
    random.Random(20240607).shuffle(order)
    max_keys = 2 * count + 1024
    # What the messages take: from stats().bytes_used, on a probe rendezvous.
    probe_count = min(PROBE_MESSAGES, count)
    with _rendezvous(shmrdv, "probe-", probe_count * 1024 + bench.MiB, max_keys) as probe:
        _fill(probe, keys[:probe_count])
        used = probe.stats().bytes_used
    assert used % probe_count == 0, (used, probe_count)
    block = used // probe_count
    arena = 2 * count * block
    out: dict[str, Any] = {"pending": count, "block_bytes": block, "arena_bytes": arena}
    windows: dict[str, tuple[int, int]] = {}

    def window(name: str, work: Any) -> Any:
        start = time.monotonic_ns()
        result = work()
        windows[name] = (start, time.monotonic_ns())
        return result

    with _rendezvous(shmrdv, "stream-", arena, max_keys) as shared, \
            _rendezvous(shmrdv, "control-", arena, max_keys) as control:
        _fill(control, keys)
        out["full_load_pending_only"] = _figures(control.stats())
        pipes, processes = {}, {}
        try:
            for role, target in (("consumer", _stream_consumer), ("producer", _stream_producer)):
                ours, theirs = children.pipe()
                processes[role] = children.start(target, shared.name, theirs, cpu=cpus[role])
                theirs.close()
                pipes[role] = ours
            for role in ("consumer", "producer"):
                assert _answer(pipes[role], processes[role], bench.STARTUP_TIMEOUT_S) == "ready"
            for role in ("consumer", "producer"):
                pipes[role].send("go")
            with bench.pinned(cpus["parent"]):
                time.sleep(idle_s / 2)  # warm-up: first pages, spin budgets
                window("idle", lambda: time.sleep(idle_s))
                window("control", lambda: _drain(control, keys, order))
                out["fill_s"] = window("filling", lambda: _fill(shared, keys))
                out["full_load_with_stream"] = _figures(shared.stats())
                window("during", lambda: _drain(shared, keys, order))
                window("after", lambda: time.sleep(idle_s))
            pipes["producer"].send("stop")
            sent = _answer(pipes["producer"], processes["producer"], MESSAGE_TIMEOUT_S)
            received, stamps = _answer(pipes["consumer"], processes["consumer"], MESSAGE_TIMEOUT_S)
            for role in ("producer", "consumer"):
                children.join(processes[role])
        finally:
            for pipe in pipes.values():
                pipe.close()
        assert received == sent, (received, sent)
        after_control, after_shared = control.stats(), shared.stats()
    # Correctness of what stats() says: the pending messages alone take
    # exactly count blocks of the probe's size, and all come back.
    pending_only = out["full_load_pending_only"]
    assert pending_only["bytes_used"] == count * block and pending_only["live_blocks"] == count, pending_only
    assert pending_only["bytes_used"] + pending_only["bytes_free"] == control.capacity, pending_only
    assert after_control.bytes_used == 0 and after_control.live_blocks == 0, after_control
    assert after_shared.pending_messages <= 2 * STREAM_DEPTH // CREDIT_EVERY, after_shared  # unclaimed credits
    out["stream_messages"] = sent
    for name, (start, end) in windows.items():
        inside = int(np.count_nonzero((stamps >= start) & (stamps < end))) * STAMP_EVERY
        seconds = (end - start) / 1e9
        out[f"{name}_s"] = seconds
        out[f"{name}_msgs_per_s"] = inside / seconds
    out["receive_msgs_per_s_control"] = count / out["control_s"]
    out["receive_msgs_per_s_during"] = count / out["during_s"]
    out["slowdown_during_vs_idle"] = out["idle_msgs_per_s"] / max(out["during_msgs_per_s"], 1e-9)
    out["slowdown_during_vs_control"] = out["control_msgs_per_s"] / max(out["during_msgs_per_s"], 1e-9)
    return out


PLACEMENTS = {
    # The stream pair shares the second CPU; the pending process has the first to itself.
    "stream-same-cpu": lambda cpus: {"parent": cpus[0], "producer": cpus[1], "consumer": cpus[1]},
    # The stream pair apart; the pending process shares the first CPU with the consumer.
    "stream-apart": lambda cpus: {"parent": cpus[0], "producer": cpus[1], "consumer": cpus[0]},
}


@pytest.mark.benchmark(group="arena-pending")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("placement_name", list(PLACEMENTS))
def test_pending_random_order(benchmark, shmrdv, children: bench.Children, placement_name: str,
                              report: list[str]) -> None:
    cpus = bench.allowed_cpus()
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs: the pending process beside the stream")
    full = _full(benchmark)
    count = PENDING_FULL if full else PENDING_SMOKE
    results: list[dict[str, Any]] = []
    benchmark.pedantic(lambda: results.append(_pending_run(
        shmrdv, children, count, PLACEMENTS[placement_name](cpus), 1.0 if full else 0.3)), rounds=1, iterations=1)
    out = results[-1]
    benchmark.extra_info.update({k: v for k, v in out.items() if not isinstance(v, dict)})
    for load in ("full_load_pending_only", "full_load_with_stream"):
        benchmark.extra_info.update({f"{load}:{k}": v for k, v in out[load].items()})
    rates = ", ".join(f"{name} {out[f'{name}_msgs_per_s']:,.0f}" for name in ("idle", "control", "filling", "during", "after"))
    pending, loaded = out["full_load_pending_only"], out["full_load_with_stream"]
    report.append(
        f"arena-pending [{placement_name}]: {count:,} pending 64 B messages (block {out['block_bytes']} B), "
        f"arena {out['arena_bytes']:,} B (2x); 4 KiB stream msgs/s: {rates}; "
        f"slowdown during vs idle {out['slowdown_during_vs_idle']:.2f}x (target <= 2x), "
        f"during vs control {out['slowdown_during_vs_control']:.2f}x; random-order recv msgs/s: "
        f"control {out['receive_msgs_per_s_control']:,.0f}, beside the stream {out['receive_msgs_per_s_during']:,.0f}")
    report.append(
        f"arena-pending [{placement_name}]: at full load, pending only: bytes_used {pending['bytes_used']:,}, "
        f"largest_free {pending['largest_free']:,}, live_blocks {pending['live_blocks']:,}; with the stream: "
        f"bytes_used {loaded['bytes_used']:,}, largest_free {loaded['largest_free']:,}, "
        f"live_blocks {loaded['live_blocks']:,}")
