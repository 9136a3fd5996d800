"""Ctrl-C during a blocking recv raises KeyboardInterrupt promptly and leaves
the rendezvous consistent."""
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ..conftest import wait_for

CHILD = textwrap.dedent(
    """
    import sys, shmrdv
    rdv = shmrdv.Rendezvous(sys.argv[1], create=False)
    print("waiting", flush=True)
    try:
        rdv.recv("never", timeout=60)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        rdv.close()
        sys.exit(0)
    sys.exit(1)
    """
)


@pytest.mark.timeout(60)
def test_ctrl_c_interrupts_a_blocked_recv(rdv):
    child = subprocess.Popen([sys.executable, "-c", CHILD, rdv.name], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "waiting"
        wait_for(lambda: rdv.stats().waiters > 0, "the child to block in recv", 10)
        assert rdv.stats().waiters == 1
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=10)
        assert child.returncode == 0 and "interrupted" in out
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # The interrupted waiter left: nothing registered, and the key still works.
    assert rdv.stats().waiters == 0
    rdv.send("never", np.arange(3))
    assert list(rdv.recv("never", timeout=5)) == [0, 1, 2]


def test_infinite_timeout_is_forever(rdv):
    rdv.send("k", np.ones(1))
    assert rdv.recv("k", timeout=float("inf"))[0] == 1
