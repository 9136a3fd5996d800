"""shmrdv.loader under repeated SIGKILLs: epochs of a loader whose workers
are killed at random moments (mid-batch, mid-write, waiting), checking
that every batch delivered is whole and right (a sum per batch), that a
killed worker is always named, and that nothing is left behind: no
process, no segment, no fd. Short by default; SHMRDV_SOAK_SECONDS sets the
duration (e.g. 300)."""
import os
import random
import signal
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shmrdv.loader import DataLoader, WorkerDied  # noqa: E402
from tests.loader.test_loader import no_leaks  # noqa: E402,F401  (the same leak checks)

pytestmark = pytest.mark.slow

SECONDS = float(os.environ.get("SHMRDV_SOAK_SECONDS", "6"))
ITEMS = 400
ROWS = 1 << 14  # float64 rows of 128 KiB per item


class Checked(torch.utils.data.Dataset):
    """Item i: ROWS float64 values i, i+1, ...: a batch's sum says whether it is whole and its own."""

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, i: int):
        return np.arange(i, i + ROWS, dtype=np.float64), i


def _kill_child(pid: int) -> None:
    """SIGKILL pid if it is still a child of ours (an epoch may have ended, and its workers gone, first)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if int(f.read().rsplit(")", 1)[1].split()[1]) != os.getpid():
                return
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass


def _expected(indices) -> float:
    return float(sum(ROWS * i + ROWS * (ROWS - 1) / 2 for i in indices))


@pytest.mark.timeout(SECONDS + 120)
def test_workers_killed_at_random_moments():
    rng = random.Random(1234)
    deadline = time.monotonic() + SECONDS
    epochs = kills = batches = 0
    while time.monotonic() < deadline or epochs < 3:
        loader = DataLoader(Checked(), batch_size=4, num_workers=2, shuffle=True, shm_size=16 << 20,
                            prefetch_factor=rng.choice([1, 2, 4]), in_order=rng.random() < 0.7)
        it = iter(loader)
        victim = rng.choice(it.workers.procs).pid
        kill_at = rng.uniform(0.0, 0.3)
        timer = threading.Timer(kill_at, _kill_child, (victim,))
        timer.start()
        try:
            for rows, labels in it:
                # whole and its own: the rows' sum matches the labels the batch says it holds
                assert float(rows.sum()) == _expected(labels.tolist())
                batches += 1
        except WorkerDied as err:
            assert err.worker_pid == victim and err.signal == signal.SIGKILL
            kills += 1
        finally:
            timer.cancel()
            timer.join()
        del it, loader
        epochs += 1
    print(f"loader soak: {epochs} epochs, {kills} killed mid-epoch, {batches} batches checked")
    assert kills > 0
