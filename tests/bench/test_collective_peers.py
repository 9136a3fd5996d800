"""The peer measurements of the collective benchmarks (Open MPI, gloo) run
end to end in smoke mode, and leave no process and no /dev/shm entry behind."""

import importlib.util
import os
import shutil

import pytest

from shmrdv.bench import collective_peers
from shmrdv.bench.cleanup import descendants

needs_mpi = pytest.mark.skipif(shutil.which("mpirun") is None or importlib.util.find_spec("mpi4py") is None,
                               reason="needs Open MPI's mpirun and mpi4py (apt-get install openmpi-bin "
                                      "libopenmpi-dev; pip install mpi4py)")
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (gloo)")


def _shm() -> set:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _resource_tracker(pid: int) -> bool:
    """multiprocessing's resource tracker, started by spawn, outlives the run by design."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"resource_tracker" in cmdline.read()
    except OSError:
        return True  # gone meanwhile


def _run_leaving_nothing(run) -> dict:
    """run(), then check that it left no process and no /dev/shm entry of its own."""
    shm, processes = _shm(), set(descendants())
    results = run()
    assert _shm() <= shm
    assert [pid for pid in descendants() if pid not in processes and not _resource_tracker(pid)] == []
    return results


def _check(results: dict) -> None:
    assert results is not None
    expected = {collective_peers.case_name(op, nbytes) for op, nbytes in collective_peers.OPS}
    assert set(results) == expected
    for name, figures in results.items():
        assert figures["median_us"] > 0 and figures["p99_us"] >= figures["median_us"], (name, figures)
        assert figures["iters"] == collective_peers.SMOKE_ITERS, (name, figures)


@needs_mpi
@pytest.mark.timeout(120)
def test_open_mpi_smoke():
    _check(_run_leaving_nothing(lambda: collective_peers.run_mpi(smoke=True, timeout_s=90)))


@pytest.mark.slow
@needs_torch
@pytest.mark.timeout(120)
def test_gloo_smoke():
    _check(_run_leaving_nothing(lambda: collective_peers.run_gloo(smoke=True, timeout_s=90)))
