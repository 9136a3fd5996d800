"""A received tensor is a view into shared memory: receiving 256 MiB must not copy it."""

import pytest

import shmrdv
from tests import workers
from tests.conftest import MiB

TENSOR_BYTES = 256 * MiB


@pytest.mark.timeout(90)
def test_receiving_256_mib_adds_no_private_memory(rdv_name, children):
    n_elements = TENSOR_BYTES // 4  # uint32
    done, reports = children.context.Event(), children.context.Queue()
    with shmrdv.Rendezvous(rdv_name, size=300 * MiB, create=True):
        children.start(workers.send_arange, rdv_name, "big", n_elements, done)
        children.start(workers.recv_and_measure, rdv_name, "big", reports)
        report = reports.get(timeout=60)
        done.set()
        children.join()

    assert report["size"] == n_elements
    assert report["sum"] == n_elements * (n_elements - 1) // 2  # every page was read and is right
    assert report["uss_growth_kib"] * 1024 < 32 * MiB, report
    assert report["anon_growth_kib"] * 1024 < 32 * MiB, report
