"""``shmrdv bench`` end to end, in its --smoke mode (a few messages of each kind)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_bench_smoke_writes_tables_and_json(tmp_path):
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, "-m", "shmrdv", "bench", "--smoke", "--transports", "shmrdv,shmrdv-alloc,copyto,pipe",
         "--json", str(out)],
        capture_output=True, text=True, timeout=50,
    )
    assert run.returncode == 0, run.stderr
    assert "[  1/" in run.stderr  # progress while it runs
    assert "| size | shmrdv send/recv | shmrdv alloc/recv | np.copyto (1 process) | mp.Pipe |" in run.stdout
    assert "best peer ÷ shmrdv" in run.stdout and "### Targets" in run.stdout
    assert "its figures, and so whether a target is met, mean nothing" in run.stdout.split("### Targets")[1]

    results = json.loads(out.read_text())
    assert results["mode"] == "smoke" and results["machine"]["cpus"] >= 1
    transports = {row["transport"] for row in results["throughput"]}
    assert transports == {"shmrdv", "shmrdv-alloc", "copyto", "pipe"}
    sizes = {row["bytes"] for row in results["throughput"]}
    assert sizes == {64, 4096, 1 << 20}
    for row in results["throughput"]:
        assert row["gbps"] > 0 and row["msgs_per_s"] > 0 and row["messages"] >= 1
    round_trips = {(r["transport"], r["placement"], r["bytes"]) for r in results["round_trip"]}
    placements = ["apart", "same"] if len(results["machine"]["allowed_cpus"]) > 1 else ["same"]
    assert round_trips == {(t, p, b) for t in ("shmrdv", "pipe") for p in placements for b in (64, 4096)}
    for row in results["round_trip"]:
        assert 0 < row["median_us"] <= row["p99_us"]
    assert [r["pairs"] for r in results["processes"]] == [1, 2]
    assert [r["pending_keys"] for r in results["keys"]] == [0, 1000]
    assert all(r["rss_anon_growth_kib"] < 16 * 1024 for r in results["held_views"])
    assert {t["target"] for t in results["targets"]}  # evaluated from what was measured
    assert "leftover segment" not in run.stderr  # everything it created was unlinked before its final sweep

    again = subprocess.run([sys.executable, "-m", "shmrdv", "bench", "--from-json", str(out)],
                           capture_output=True, text=True, timeout=30)
    assert again.returncode == 0 and "| size | shmrdv send/recv" in again.stdout


def test_bench_rejects_unknown_transport():
    run = subprocess.run([sys.executable, "-m", "shmrdv", "bench", "--transports", "carrier-pigeon"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and "unknown transport" in run.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_progress_counts_the_steps_it_takes():
    """The counter ends at its total: [N/N], N the steps the plan really has (sizes, and
    round trips per placement: two on two CPUs, one on one)."""
    run = subprocess.run(
        [sys.executable, "-m", "shmrdv", "bench", "--smoke", "--transports", "shmrdv,copyto", "--sizes", "64B,4KiB"],
        capture_output=True, text=True, timeout=100,
    )
    assert run.returncode == 0, run.stderr
    counters = re.findall(r"\[\s*(\d+)/(\d+)\]", run.stderr)
    placements = 2 if len(os.sched_getaffinity(0)) > 1 else 1
    total = 2 + 2 * placements + 2 + (2 + 2 + 1)  # shmrdv sizes and round trips, copyto sizes, growth (smoke plan)
    assert [int(done) for done, _ in counters] == list(range(1, total + 1)), run.stderr
    assert {int(of) for _, of in counters} == {total}, run.stderr


def test_the_plots_scale_is_the_copying_transports():
    """alloc/recv copies nothing: its hundreds of GB/s must not squeeze the other lines (docs/bench.json)."""
    from shmrdv.bench import command

    results = command._load_results(str(Path(__file__).resolve().parent.parent.parent / "docs" / "bench.json"))
    low, top = command.throughput_scale(results)
    alloc = max(r["gbps"] for r in results.throughput if r["transport"] == "shmrdv-alloc")
    copying = [r["gbps"] for r in results.throughput if r["transport"] != "shmrdv-alloc"]
    assert top == 2 * max(copying) and low == min(copying) / 2 and alloc > 10 * top
