"""``shmrdv bench --loader`` end to end, in its --smoke mode (a few batches of each case)."""

import glob
import importlib.util
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

LIBRARIES = ("in-process", "torch", "shmrdv")
CASES = ("tensor 1 MiB", "tensor 19 MiB", "partly random tensor 1 MiB", "partly random tensor 19 MiB",
         "random tensor 1 MiB", "random tensor 19 MiB", "images 32x3x224x224 uint8")


@pytest.mark.timeout(180)
def test_bench_loader_smoke_prints_tables_and_writes_json(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "loader.json"
    command = [sys.executable, "-m", "shmrdv", "bench", "--loader", "--smoke", "--json", str(out)]
    plot = tmp_path / "loader.png"
    if importlib.util.find_spec("matplotlib") is not None:
        command += ["--plot", str(plot)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=170)
        finally:
            process.kill()
    run = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    assert run.returncode == 0, run.stderr
    # every loader's arena (a private rendezvous, named after the trainer's pid) was unlinked
    assert not glob.glob(f"/dev/shm/*private-{process.pid}-*")
    assert "batches/s" in run.stdout and "shmrdv ÷ torch" in run.stdout
    assert "trainer CPU µs/batch" in run.stdout and "VmRSS" in run.stdout
    assert "time to first batch" in run.stdout and "Goals:" in run.stdout
    assert "Per batch the trainer reads the first element" in run.stdout
    assert "[  1/" in run.stderr  # progress while it runs
    if importlib.util.find_spec("matplotlib") is not None:
        assert plot.stat().st_size > 0

    results = json.loads(out.read_text())
    assert results["bench"] == "loader" and results["smoke"] is True
    assert results["machine"]["cpus"] >= 1 and results["machine"]["cpu"]
    assert results["date"] and results["torch"] and results["trainer_work"]
    throughput = [c for c in results["cases"] if c["kind"] == "throughput"]
    assert [c["case"] for c in throughput] == list(CASES)
    for case in throughput:
        assert case["batches"] >= 1 and case["batch_bytes"] > 0 and case["workers"] == 2
        for lib in LIBRARIES:
            figures = case[lib]
            for name in ("batches_per_s", "gbps", "cpu_us_per_batch"):
                stats = figures[name]
                assert 0 < stats["min"] <= stats["median"] <= stats["max"], (case["case"], lib, name)
                assert len(stats["runs"]) == results["rounds"]
            rss = figures["rss_kib"]
            for when in ("start", "mid", "end"):
                assert rss[when]["VmRSS"] > 0 and {"RssAnon", "RssFile", "RssShmem"} <= set(rss[when])
            assert isinstance(rss["growth_max"], int)
        assert set(case["ratios"]) == {"torch", "in-process"} and all(r > 0 for r in case["ratios"].values())
    first = next(c for c in results["cases"] if c["kind"] == "first_batch")
    assert first["context"] == "spawn"
    for lib in ("shmrdv", "torch"):
        assert first[lib]["seconds"]["median"] > 0
    assert first["ratios"]["torch"] > 0
    goals = results["goals"]
    assert goals and all({"goal", "value", "target", "met"} <= set(g) for g in goals)
    assert any("first batch" in g["goal"] for g in goals) and any("VmRSS" in g["goal"] for g in goals)

    again = subprocess.run([sys.executable, "-m", "shmrdv", "bench", "--loader", "--from-json", str(out)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert "shmrdv ÷ torch" in again.stdout and "time to first batch" in again.stdout


@pytest.mark.timeout(60)
def test_bench_loader_and_collectives_exclude_each_other():
    run = subprocess.run([sys.executable, "-m", "shmrdv", "bench", "--loader", "--collectives"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and "exclude each other" in run.stderr


@pytest.mark.timeout(60)
def test_bench_loader_from_json_refuses_another_benchmarks_json(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"mode": "smoke", "throughput": []}))
    run = subprocess.run([sys.executable, "-m", "shmrdv", "bench", "--loader", "--from-json", str(other)],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and "not the JSON of shmrdv bench --loader" in run.stderr
