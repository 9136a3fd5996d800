"""``shmrdv bench`` end to end, in its --smoke mode (a few messages of each kind)."""

import json
import subprocess
import sys

import pytest


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
