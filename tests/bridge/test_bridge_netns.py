"""Two hosts for real: network namespaces A and B joined by a veth pair,
each with its own bridge listening on its own address. The rendezvous
segments stay in this process's /dev/shm (a network namespace does not
separate them), so the test reads both sides directly; every byte between
the bridges crosses the veth link."""
import threading
import zlib

import numpy as np
import pytest

from .bridges import run_threads, two_hosts_or_skip
from ..conftest import MiB
from .test_bridge import DEV_A, DEV_B, Hosts, key

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def namespaces():
    hosts = two_hosts_or_skip()
    yield hosts
    hosts.down()


@pytest.fixture
def hosts(tmp_path, namespaces):
    h = Hosts(tmp_path, size=600 * MiB, listen=tuple(f"{ip}:0" for ip in namespaces.ip), netns=namespaces.ns)
    yield h
    h.close()


def crc(arr):
    return zlib.crc32(np.ascontiguousarray(arr).view(np.uint8).reshape(-1))


def test_bridges_bind_their_own_namespace(hosts, namespaces):
    assert hosts.bridges[0].host == namespaces.ip[0] and hosts.bridges[1].host == namespaces.ip[1]


@pytest.mark.parametrize("nbytes", [1, 4096, 64 * MiB, 256 * MiB])
def test_tf_keys_both_ways_across_the_veth(hosts, nbytes):
    rng = np.random.default_rng(nbytes)
    x = rng.integers(0, 256, nbytes, dtype=np.uint8)
    want = crc(x)
    hosts.a.send(key(DEV_A, DEV_B, "fwd"), x)
    got = hosts.b.recv(key(DEV_A, DEV_B, "fwd"), timeout=120)
    assert got.nbytes == nbytes and crc(got) == want
    del got
    y = x.view(np.uint8)[::-1]  # non-contiguous: sent as C-contiguous
    hosts.b.send(key(DEV_B, DEV_A, "back"), y)
    got = hosts.a.recv(key(DEV_B, DEV_A, "back"), timeout=120)
    assert crc(got) == crc(np.ascontiguousarray(y))


def test_many_keys_concurrently_both_ways(hosts):
    n_keys, rounds = 64, 4
    errors = []

    def produce(src, dst, sdev, ddev):
        for r in range(rounds):
            for k in range(n_keys):
                src.send(key(sdev, ddev, f"k{k}"), np.full(1 + (k * 997 + r) % 50_000, k * 10 + r, np.int32))

    def consume(dst, sdev, ddev):
        try:
            for r in range(rounds):
                for k in range(n_keys):
                    got = dst.recv(key(sdev, ddev, f"k{k}"), timeout=60)
                    assert got.size == 1 + (k * 997 + r) % 50_000 and (got == k * 10 + r).all()
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=produce, args=(hosts.a, hosts.b, DEV_A, DEV_B)),
        threading.Thread(target=produce, args=(hosts.b, hosts.a, DEV_B, DEV_A)),
        threading.Thread(target=consume, args=(hosts.b, DEV_A, DEV_B)),
        threading.Thread(target=consume, args=(hosts.a, DEV_B, DEV_A)),
    ]
    run_threads(threads)
    assert not errors, errors[0]


def test_receiving_bridge_killed_mid_stream(hosts):
    count = 300
    received = []
    done = threading.Event()

    def consume():
        for _ in range(count):
            received.append(int(hosts.b.recv(key(DEV_A, DEV_B, "s"), timeout=90)[0]))
        done.set()

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    for i in range(count):
        hosts.a.send(key(DEV_A, DEV_B, "s"), np.full(1 + (i % 3) * 100_000, i, np.int64))
        if i in (100, 200):
            hosts.bridges[1].kill()
            hosts.bridges[1].start()
    assert done.wait(120), f"received {len(received)} of {count}"
    assert received == list(range(count))
