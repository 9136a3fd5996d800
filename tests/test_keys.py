"""Rendezvous keys: the TensorFlow wire format "src;incarnation;dst;name;frame:iter"."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import shmrdv

pytestmark = pytest.mark.timeout(30)

_ident = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)
_small = st.integers(0, 64)
devices = st.builds(
    "/job:{}/replica:{}/task:{}/device:{}:{}".format,
    _ident, _small, _small, st.sampled_from(["CPU", "GPU", "TPU"]), _small,
)
edge_names = st.from_regex(r"[A-Za-z0-9_./-]{1,40}", fullmatch=True)
incarnations = st.integers(0, 2**64 - 1)
frame_iters = st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1))


@given(src=devices, incarnation=incarnations, dst=devices, edge=edge_names, frame_iter=frame_iters)
def test_parse_inverts_create(src, incarnation, dst, edge, frame_iter):
    parsed = shmrdv.parse_key(shmrdv.create_key(src, incarnation, dst, edge, frame_iter))
    assert parsed.src_device == src
    assert parsed.src_incarnation == incarnation
    assert parsed.dst_device == dst
    assert parsed.edge_name == edge
    assert tuple(parsed.frame_iter) == frame_iter


def test_wire_format():
    key = shmrdv.create_key(
        "/job:w/replica:0/task:0/device:CPU:0", 1, "/job:w/replica:0/task:1/device:CPU:0", "edge_5_y", (0, 0)
    )
    assert key == "/job:w/replica:0/task:0/device:CPU:0;0000000000000001;/job:w/replica:0/task:1/device:CPU:0;edge_5_y;0:0"


def test_incarnation_is_16_lowercase_hex_digits_and_frame_iter_defaults_to_0_0():
    assert shmrdv.create_key("/a", 0xDEADBEEF0BADF00D, "/b", "e") == "/a;deadbeef0badf00d;/b;e;0:0"
    assert shmrdv.create_key("/a", 2**64 - 1, "/b", "e", (3, 17)) == "/a;ffffffffffffffff;/b;e;3:17"


@pytest.mark.parametrize(
    "key",
    [
        "",
        "no separators",
        "/a;0000000000000001;/b;e",  # four fields
        "/a;0000000000000001;/b;e;0:0;extra",  # six fields
        "/a;not-hex-at-all;/b;e;0:0",  # incarnation is not hex
        "/a;0000000000000001;/b;e;0-0",  # frame_iter without ':'
        "/a;0000000000000001;/b;e;x:0",  # frame is not a number
        "/a;0000000000000001;/b;e;0:",  # iter missing
    ],
)
def test_malformed_key_raises_value_error(key):
    with pytest.raises(ValueError):
        shmrdv.parse_key(key)


# Any non-empty text is a key, NUL and non-ASCII included (encodable as UTF-8, so no lone surrogates).
texts = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=64)


@settings(max_examples=60, deadline=None)
@given(keys=st.lists(texts, min_size=2, max_size=2, unique=True))
def test_distinct_texts_are_distinct_keys(module_rdv, keys):
    for i, key in enumerate(keys):
        module_rdv.send(key, np.array(i), timeout=5)
    for i, key in enumerate(keys):
        assert int(module_rdv.recv(key, timeout=5)) == i
