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
frame_iters = st.tuples(st.integers(0, 2**64 - 1), st.integers(-(2**63), 2**63 - 1))


@given(src=devices, incarnation=incarnations, dst=devices, edge=edge_names, frame_iter=frame_iters)
def test_parse_inverts_create(src, incarnation, dst, edge, frame_iter):
    parsed = shmrdv.parse_key(shmrdv.create_key(src, incarnation, dst, edge, frame_iter))
    assert parsed.src_device == src
    assert parsed.src_incarnation == incarnation
    assert parsed.dst_device == dst
    assert parsed.edge_name == edge
    assert parsed.frame_iter == f"{frame_iter[0]}:{frame_iter[1]}"
    assert parsed.src.type in ("CPU", "GPU", "TPU") and parsed.src.job and parsed.src.id is not None


def test_tensorflows_key_case():
    # rendezvous_test.cc, TEST(RendezvousTest, Key)
    key = shmrdv.create_key("/job:mnist/replica:1/task:2/CPU:0", 7890, "/job:mnist/replica:1/task:2/device:GPU:0",
                            "var0", (0, 0))
    assert key == "/job:mnist/replica:1/task:2/CPU:0;0000000000001ed2;/job:mnist/replica:1/task:2/device:GPU:0;var0;0:0"
    parsed = shmrdv.parse_key(key)
    assert parsed.src_device == "/job:mnist/replica:1/task:2/CPU:0"
    assert parsed.src_incarnation == 7890
    assert parsed.src == shmrdv.DeviceName("mnist", 1, 2, "CPU", 0)
    assert parsed.dst_device == "/job:mnist/replica:1/task:2/device:GPU:0"
    assert parsed.dst.type == "GPU"
    for bad in ("foo;bar;baz", "/job:mnist/replica:1/task:2/CPU:0;/job:mnist/replica:1/task:2/device:GPU:0;",
                f"{key};{key}"):
        with pytest.raises(shmrdv.InvalidArgument, match="invalid rendezvous key"):
            shmrdv.parse_key(bad)


def test_create_key_writes_a_default_frame_and_iter_as_tensorflow_does():
    assert shmrdv.create_key("/cpu:0", 0xDEADBEEF0BADF00D, "/gpu:1", "e") == \
        "/cpu:0;deadbeef0badf00d;/gpu:1;e;18446744073709551615:-1"
    assert shmrdv.create_key("", 2**64 - 1, "", "e", (3, 17)) == ";ffffffffffffffff;;e;3:17"
    with pytest.raises(shmrdv.InvalidArgument, match="not a device name"):
        shmrdv.create_key("foo", 1, "/cpu:0", "e")
    with pytest.raises(shmrdv.InvalidArgument, match="iter_id"):
        shmrdv.create_key("/cpu:0", 1, "/cpu:0", "e", (0, 2**63))


@pytest.mark.parametrize("key", [
    "/cpu:0;1ed2;/gpu:0;e;0:0",  # any number of hex digits ...
    "/cpu:0;10000000000000001;/gpu:0;e;0:0",  # ... 17 of them too (read modulo 2**64)
    ";0000000000000001;;e;0:0",  # empty device names
    "/;1;/;e;anything at all",  # "/" names no device in particular; the fifth part is not read further
    "/job:w/replica:*/task:3/device:*;1;/job:a_1/device:TPU:*;e;0-0",
    "/job:w/job:v;1;/device:CPU/task:2;e;0:0",  # repeated parts, a device type with no id
    "/CPU:1;1;/GPU:*;e;x:y",
])
def test_keys_tensorflow_accepts(key):
    shmrdv.parse_key(key)


@pytest.mark.parametrize("key", [
    "", "no separators",
    "/a;0000000000000001;/b;e",  # four parts
    "/cpu:0;1;/cpu:0;e;0:0;extra",  # six parts
    "/cpu:0;not-hex;/cpu:0;e;0:0", "/cpu:0;0x1;/cpu:0;e;0:0", "/cpu:0;;/cpu:0;e;0:0", "/cpu:0;+1;/cpu:0;e;0:0",
    "foo;1;/cpu:0;e;0:0",  # not a device name
    "/job:1w/replica:0;1;/cpu:0;e;0:0",  # a job name starts with a letter
    "/task:x;1;/cpu:0;e;0:0", "/replica:-1;1;/cpu:0;e;0:0", "/device:CPU:x;1;/cpu:0;e;0:0",
    "/cpu:0;1;/tpu:0;e;0:0", "/cpu:0;1;/cpu:0/;e;0:0",
    "/cpu:0;1;/replica:99999999999999999999;e;0:0",  # more than 64 bits
    "/cpu:0;1;/cpu:0;;0:0",  # empty edge name
    "/job:w;0000000000000001;/job:w;edge;",  # empty frame:iter part (TensorFlow: "!parts[4].empty()")
    "/cpu:0;1;/cpu:0;e;",
])
def test_keys_tensorflow_refuses(key):
    with pytest.raises(shmrdv.InvalidArgument, match="invalid rendezvous key"):
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
