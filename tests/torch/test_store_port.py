"""PyTorch's own Store tests (``test/distributed/test_store.py``:
``StoreTestBase`` and the tests of the methods ``shmrdv.torch.Store``
has), run against the shmrdv Store.

Ported from pytorch/pytorch's test/distributed/test_store.py as of commit
00d48902182b42a7cd48bef911c1addcc9fe73c5 (the version at hand; its
``StoreTestBase`` is the one torch 2.13 still has). Each case keeps its
upstream name and assertions; torch's unittest harness is plain pytest.
Upstream cases for the methods torch has added since (``queue_*``,
``append``, ``multi_*``, ``list_keys``, ``compare_set`` from many clients)
follow the same pattern, checked against the reference below.

``SHMRDV_PORT_STORE=tcp`` runs the same cases against ``TCPStore``, the
reference: each passes there, or is skipped for the reason given.
"""
import os
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from shmrdv.torch.store import Store  # noqa: E402

from ..conftest import _new_name, segment_path  # noqa: E402

REFERENCE = os.environ.get("SHMRDV_PORT_STORE") == "tcp"


@pytest.fixture
def make_store():
    made = []

    def make():
        if REFERENCE:
            store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=300))
        else:
            store = Store(_new_name(), timeout=timedelta(seconds=300))
        made.append(store)
        return store

    yield make
    for store in made:
        if isinstance(store, Store):
            store.close()
            store.unlink()
            assert not os.path.exists(segment_path(store.name))


# The keys test_set_get leaves: TCPStore keeps one of its own to coordinate
# workers (upstream's num_keys_total of 6); shmrdv's Store has none.
NUM_KEYS_TOTAL = 6 if REFERENCE else 5


class TestStoreTestBase:
    """Upstream's StoreTestBase."""

    def test_set_get(self, make_store):
        fs = make_store()
        fs.add("key", 1)
        fs.add("key", 2)
        fs.add("key", 3)
        fs.set("key0", "value0")
        fs.add("key3", 1)
        fs.set("key1", "value1")
        fs.add("key3", 2)
        fs.set("key2", "value2")
        fs.add("key3", 3)
        fs.add("key3", 4)
        fs.add("key3", 5)
        fs.add("key3", 6)
        assert fs.num_keys() == NUM_KEYS_TOTAL
        assert b"6" == fs.get("key")
        assert b"value0" == fs.get("key0")
        assert b"value1" == fs.get("key1")
        assert b"value2" == fs.get("key2")
        assert b"21" == fs.get("key3")
        fs.set("-key3", "7")
        assert b"7" == fs.get("-key3")
        fs.delete_key("-key3")
        assert fs.num_keys() == NUM_KEYS_TOTAL

    def test_compare_set(self, make_store):
        store = make_store()
        assert b"wrong_old_value" == store.compare_set("cs_key0", "wrong_old_value", "new_value0")
        store.set("cs_key0", "value0")
        assert b"value0" == store.get("cs_key0")
        assert b"value0" == store.compare_set("cs_key0", "wrong_old_value", "new_value0")
        assert b"value0" == store.get("cs_key0")
        assert b"new_value0" == store.compare_set("cs_key0", "value0", "new_value0")
        assert b"new_value0" == store.get("cs_key0")
        assert b"new_value1" == store.compare_set("cs_key1", "", "new_value1")
        assert b"new_value1" == store.get("cs_key1")

    def test_simple_wait(self, make_store):
        fs = make_store()
        with pytest.raises(RuntimeError, match="[t -i]imeout"):
            fs.wait(["bad_key"], timedelta(seconds=0.25))
        fs.add("good_key", 1)
        fs.wait(["good_key"])

    def test_append(self, make_store):
        store = make_store()
        store.set("foo", "po")
        store.append("foo", "tato")
        store.append("bar", "po")
        store.append("bar", "tato")
        assert b"potato" == store.get("foo")
        assert b"potato" == store.get("bar")

    def test_multi_set(self, make_store):
        store = make_store()
        store.multi_set(["foo", "bar"], ["po", "tato"])
        assert b"po" == store.get("foo")
        assert b"tato" == store.get("bar")

    def test_multi_get(self, make_store):
        store = make_store()
        store.set("foo", "po")
        store.set("bar", "tato")
        assert [b"po", b"tato"] == store.multi_get(["foo", "bar"])

    def test_queues(self, make_store):
        store = make_store()
        store.queue_push("foo", "1")
        store.queue_push("foo", "2")
        assert store.queue_len("foo") == 2
        assert store.queue_pop("foo") == b"1"
        store.wait(["foo"])  # a non-empty queue is a key to wait and check
        assert store.check(["foo"])
        assert store.queue_pop("foo") == b"2"
        assert store.queue_len("foo") == 0
        with pytest.raises(dist.QueueEmptyError):
            store.queue_pop("foo", block=False)

    def test_queue_pop_timeout(self, make_store):
        store = make_store()
        store.set_timeout(timedelta(seconds=0.1))
        with pytest.raises(dist.DistStoreError):
            store.queue_pop("empty")

    def test_list_keys(self, make_store):
        store = make_store()
        store.set("foo", "1")
        store.set("bar", "2")
        keys = set(store.list_keys())
        assert {"foo", "bar"} <= keys
        if not REFERENCE:
            assert keys == {"foo", "bar"}

    def test_clone(self, make_store):
        a = make_store()
        b = a.clone()
        a.set("foo", "bar")
        assert b.get("foo") == b"bar"
        if isinstance(b, Store):
            b.close()

    def test_barrier(self, make_store):
        store = make_store()
        store.barrier("foo", 1)
        store.barrier("foo2", 1, timedelta(seconds=10))


class TestTCPStoreTest:
    """Upstream's TCPStoreTest cases that are not about TCP itself (the
    address in use, multi-tenancy and the socket are not ported)."""

    def test_numkeys_delkeys(self, make_store):
        fs = make_store()
        base = 1 if REFERENCE else 0  # TCPStore's own coordinating key
        assert fs.num_keys() == base
        fs.add("key", 1)
        fs.add("key", 2)
        fs.add("key", 3)
        fs.set("key0", "value0")
        fs.add("key3", 1)
        fs.set("key1", "value1")
        assert fs.num_keys() == base + 4
        fs.delete_key("key")
        assert fs.num_keys() == base + 3
        fs.set_timeout(timedelta(seconds=2))
        with pytest.raises(RuntimeError):
            fs.get("key")
        fs.delete_key("key0")
        fs.delete_key("key3")
        assert fs.num_keys() == base + 1
        fs.set("key4", "value2")
        assert fs.num_keys() == base + 2
        assert b"value1" == fs.get("key1")
        assert b"value2" == fs.get("key4")


class TestPrefixStore:
    """Upstream's PrefixTCPStoreTest: StoreTestBase through torch's PrefixStore (C++ calling the Python
    Store through torch's trampoline)."""

    def test_set_get_through_prefix(self, make_store):
        fs = dist.PrefixStore("test_prefix", make_store())
        for key, n in (("key", 1), ("key", 2), ("key", 3)):
            fs.add(key, n)
        fs.set("key0", "value0")
        assert b"6" == fs.get("key")
        assert b"value0" == fs.get("key0")
        assert fs.check(["key0"])

    @pytest.mark.skipif(not REFERENCE, reason="torch 2.13's trampoline for Python Stores does not forward "
                        "num_keys or delete_key (a pure virtual call in C++): call them on the Store itself")
    def test_num_keys_and_delete_through_prefix(self, make_store):
        fs = dist.PrefixStore("test_prefix", make_store())
        fs.set("a", "1")
        assert fs.num_keys() >= 1
        assert fs.delete_key("a")

    def test_compare_set_through_prefix(self, make_store):
        store = dist.PrefixStore("test_prefix", make_store())
        assert b"wrong_old_value" == store.compare_set("cs_key0", "wrong_old_value", "new_value0")
        store.set("cs_key0", "value0")
        assert b"new_value0" == store.compare_set("cs_key0", "value0", "new_value0")


class TestPythonStore:
    """Upstream's PythonStoreTest: torch's C++ test of a Python Store, through the trampoline."""

    @pytest.mark.skip(reason="torch 2.13's dist._test_python_store fails for upstream's own MyPythonStore "
                      "too (\"pure virtual function Store::clone\"); with clone defined it stops at an "
                      "INTERNAL ASSERT 'Not implemented' in init.cpp: the C++ test outgrew its trampoline. "
                      "test_through_torch_prefix_store in test_store.py drives the same methods from C++")
    def test_set_get(self, make_store):
        dist._test_python_store(make_store())
