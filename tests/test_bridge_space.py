"""Arena space and the bridges: an envelope's block goes back to the sending
arena as soon as its message is acknowledged."""
import numpy as np
import pytest

from .conftest import MiB, wait_for
from .test_bridge import DEV_A, DEV_B, Hosts, key

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("reconnect", [False, True])
def test_acknowledged_envelope_frees_its_block_at_once(tmp_path, reconnect):
    """The bridge held the last envelope it forwarded until the next one came
    (and a link that reconnected, the last one it queued again, for the whole
    connection): a 40 MiB message through a 64 MiB arena could then be sent
    only once."""
    h = Hosts(tmp_path, size=64 * MiB)
    try:
        k = key(DEV_A, DEV_B, "big")
        x = np.arange((40 * MiB) // 8, dtype=np.int64)
        for round_ in range(2):
            if reconnect:  # the message waits in the link's queue for the new connection
                h.bridges[1].kill()
            h.a.send(k, x, timeout=20)
            if reconnect:
                h.bridges[1].start()
            got = h.b.recv(k, timeout=30)
            assert got.nbytes == x.nbytes and got[-1] == x[-1], round_
            del got
            wait_for(lambda: h.a.stats().bytes_used == 0, "the acknowledged envelope's block to be freed")
    finally:
        h.close()
