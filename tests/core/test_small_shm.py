"""A /dev/shm too small for the rendezvous asked for (Docker's default is 64 MiB): creation
fails at once with an error naming the size asked for and the space free, never a SIGBUS
later, also for a segment whose pages are left to their first touch (prefault=False); the
data loader, whose arena is a private rendezvous (a memfd, in no directory), works there.
Run in a private mount namespace with a 1 MiB tmpfs on /dev/shm (needs root)."""
import sys
import textwrap

import pytest

from ..conftest import run_with_private_shm

CHILD = textwrap.dedent(
    """
    import os, re, sys, shmrdv
    try:
        shmrdv.Rendezvous("small-shm", size=8 << 20, create=True, prefault=sys.argv[1] == "True")
    except shmrdv.SharedMemoryFull as exc:
        print("ERROR", exc.errno, exc)
        fits = int(re.search(r"size=(\\d+) fits now", str(exc)).group(1))
        with shmrdv.Rendezvous("fits", size=fits, create=True) as rdv:  # what it says fits does
            rdv.unlink()
        print("FITS", fits)
    from shmrdv.loader import DataLoader
    print("LOADER", [b.tolist() for b in DataLoader(list(range(4)), batch_size=2, num_workers=1)])
    print("LEFT", sorted(os.listdir("/dev/shm")))
    """
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("prefault", [True, False])
def test_full_dev_shm_fails_at_creation_with_sizes(prefault):
    run = run_with_private_shm([sys.executable, "-c", CHILD, str(prefault)], size="1m")
    assert run.returncode == 0, run.stderr
    assert "ERROR 28" in run.stdout, run.stdout  # errno ENOSPC
    error = run.stdout.split("ERROR", 1)[1].splitlines()[0]
    assert "8,388,608-byte arena" in error and "1,048,576 bytes free" in error and "--shm-size" in error, error
    assert "the segment needs" in error and "fits now" in error, error
    assert "FITS" in run.stdout, run.stdout
    assert "LOADER [[0, 1], [2, 3]]" in run.stdout, run.stdout  # its 256 MiB arena is in no directory
    assert "LEFT []" in run.stdout  # the failed segments were removed
