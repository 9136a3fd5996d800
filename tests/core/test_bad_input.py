"""Invalid arguments raise the documented exceptions and leave the rendezvous usable."""

import os

import numpy as np
import pytest

import shmrdv
from tests.conftest import MiB, segment_path

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def rdv(rdv):
    """The shared fixture, checked after the test: a round trip still works and nothing is queued."""
    yield rdv
    rdv.send("still-works", np.arange(5))
    np.testing.assert_array_equal(rdv.recv("still-works", timeout=5), np.arange(5))
    assert rdv.stats().pending_messages == 0


OPERATIONS = {
    "send": lambda rdv, key, **kw: rdv.send(key, np.zeros(2), **kw),
    "recv": lambda rdv, key, **kw: rdv.recv(key, **{"timeout": 0, **kw}),
    "try_recv": lambda rdv, key: rdv.try_recv(key),
}


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("key", [b"k", 1, None, ["unhashable"]])
def test_non_str_key_raises_type_error(rdv, operation, key):
    with pytest.raises(TypeError):
        OPERATIONS[operation](rdv, key)


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize(
    "key", ["", "a" * 4097, "é" * 2048 + "a", "\ud800"], ids=["empty", "4097-ascii", "4097-utf8-bytes", "not-utf8"]
)
def test_empty_oversized_or_unencodable_key_raises_value_error(rdv, operation, key):
    with pytest.raises(ValueError):
        OPERATIONS[operation](rdv, key)


@pytest.mark.parametrize("key", ["a" * 4096, "é" * 2048], ids=["4096-ascii", "4096-utf8-bytes"])
def test_key_of_4096_bytes_is_accepted(rdv, key):
    rdv.send(key, np.array([1, 2]))
    np.testing.assert_array_equal(rdv.recv(key, timeout=5), [1, 2])


@pytest.mark.parametrize("operation", ["send", "recv"])
@pytest.mark.parametrize("timeout, error", [(-1, ValueError), (-0.001, ValueError), ("1", TypeError)])
def test_bad_timeout(rdv, operation, timeout, error):
    with pytest.raises(error):
        OPERATIONS[operation](rdv, "k", timeout=timeout)


@pytest.mark.parametrize("size", [0, -1, -MiB])
def test_non_positive_size_raises_value_error(rdv_name, size):
    with pytest.raises(ValueError):
        shmrdv.Rendezvous(rdv_name, size=size, create=True)
    assert not os.path.exists(segment_path(rdv_name))


@pytest.mark.parametrize("name", ["", "a/b", "x" * 300], ids=["empty", "slash", "300-chars"])
def test_bad_name_raises_value_error(name):
    with pytest.raises(ValueError):
        shmrdv.Rendezvous(name, size=MiB, create=True)


@pytest.mark.parametrize("payload", [[object(), object()], [1, None], {"a": 1}, None],
                         ids=["objects", "int-and-none", "dict", "none"])
def test_payload_without_numeric_dtype_raises_type_error(rdv, payload):
    with pytest.raises(TypeError):
        rdv.send("k", payload)
    assert rdv.try_recv("k") is None
