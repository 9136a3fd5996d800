"""shmrdv.torch.Store beside TCPStore and FileStore in one run, under
pytest-benchmark (groups print them side by side): ``set`` + ``get`` of a
16 B value and ``add``, from this process; and a ``queue_push`` /
``queue_pop`` round trip between this process and a forked echo child.
Under ``--benchmark-disable`` each body runs once (a smoke test)."""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import uuid
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from shmrdv.torch.store import Store  # noqa: E402

VALUE = b"v" * 16
STORES = ["shmrdv", "tcp", "file"]


@pytest.fixture(params=STORES)
def store(request):
    kind = request.param
    if kind == "shmrdv":
        s = Store(f"bench-store-{uuid.uuid4().hex[:8]}", timeout=timedelta(seconds=30))
        yield s
        s.close()
        s.unlink()
    elif kind == "tcp":
        yield dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30))
    else:
        path = tempfile.mktemp(prefix="bench-filestore-")
        yield dist.FileStore(path, 1)
        if os.path.exists(path):
            os.unlink(path)


@pytest.mark.benchmark(group="store set+get 16 B")
def test_set_get(benchmark, store):
    def set_get():
        store.set("k", VALUE)
        return store.get("k")

    assert benchmark(set_get) == VALUE


@pytest.mark.benchmark(group="store add")
def test_add(benchmark, store):
    store.set("n", "0")
    benchmark(store.add, "n", 1)


def _echo(kind, where, rounds):
    s = Store(where) if kind == "shmrdv" else dist.TCPStore("127.0.0.1", where, 1, False)
    for _ in range(rounds):
        s.queue_push("pong", s.queue_pop("ping"))


@pytest.mark.parametrize("kind", ["shmrdv", "tcp"])
@pytest.mark.benchmark(group="store queue round trip between two processes")
def test_queue_round_trip(benchmark, kind):
    rounds = 1 if benchmark.disabled else 20000
    if kind == "shmrdv":
        s = Store(f"bench-store-{uuid.uuid4().hex[:8]}", timeout=timedelta(seconds=30))
        where = s.name
    else:
        s = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30))
        where = s.port
    child = multiprocessing.get_context("fork").Process(target=_echo, args=(kind, where, rounds + 10), daemon=True)
    child.start()
    try:
        for _ in range(10):
            s.queue_push("ping", VALUE)
            s.queue_pop("pong")

        def round_trip():
            s.queue_push("ping", VALUE)
            return s.queue_pop("pong")

        benchmark.pedantic(round_trip, rounds=rounds, iterations=1)
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
        if isinstance(s, Store):
            s.close()
            s.unlink()
