"""The loader's messages read back (batch.py, worker.py's task messages):
every length and offset a message states is checked against the message,
also for a batch whose meta was read before and is kept parsed, and the
int64 form of a task says its own length rightly."""
import sys

import numpy as np
import pytest

from shmrdv.errors import ProtocolError
from shmrdv.loader import batch as wire
from shmrdv.loader.collate import collate, convert
from shmrdv.loader.worker import decode_task, encode_json, int_task


def _message(data, task=3):
    leaves = []
    tree = convert(data, leaves, arrays_as_tensors=False)
    plan = wire.batch_plan(task, tree, leaves)
    buf = np.zeros(plan.nbytes, np.uint8)
    plan.write(buf)
    return buf


def test_a_batch_reads_back_and_a_second_with_the_same_meta_too():
    first, second = np.arange(12.0).reshape(3, 4), np.arange(12.0, 24.0).reshape(3, 4)
    for expected in (first, second):
        buf = _message({"x": expected, "y": expected[0]})
        kind, task, meta = wire.read(buf)
        assert (kind, task) == (wire.BATCH, 3)
        got = wire.build(buf, meta, as_torch=False)
        assert np.array_equal(got["x"], expected) and np.array_equal(got["y"], expected[0])
        assert np.shares_memory(got["x"], buf)  # views of the message, not copies


def test_a_meta_seen_before_is_kept_and_its_batches_share_nothing():
    samples = [{"s": f"s{i}", "x": np.full(2, i)} for i in range(2)]
    leaves = []
    plan = wire.batch_plan(0, collate(samples, leaves), leaves)
    first, second = (np.zeros(plan.nbytes, np.uint8) for _ in range(2))
    plan.write(first)
    plan.write(second)
    meta = wire.read(first)[2]
    assert wire.read(second)[2] is meta  # kept: not parsed again
    one = wire.build(first, meta, as_torch=False)
    one["s"].append("changed by the trainer")
    two = wire.build(second, meta, as_torch=False)
    assert two["s"] == ["s0", "s1"] and two["s"] is not one["s"]


def test_a_kept_meta_is_still_checked_against_each_message_length():
    buf = _message(np.arange(1024, dtype=np.float32))
    wire.build(buf, wire.read(buf)[2], as_torch=False)  # its meta is kept, its table checked
    short = buf[: len(buf) - 8].copy()  # the same header and meta, the leaf cut short
    kind, _, meta = wire.read(short)
    assert kind == wire.BATCH
    with pytest.raises(ProtocolError, match="lies outside"):
        wire.build(short, meta, as_torch=False)


def test_a_batch_of_collated_samples_keeps_its_structure():
    leaves = []
    tree = collate([(np.full(2, i, np.int64), float(i)) for i in range(4)], leaves)
    plan = wire.batch_plan(0, tree, leaves)
    buf = np.zeros(plan.nbytes, np.uint8)
    plan.write(buf)
    rows, numbers = wire.build(buf, wire.read(buf)[2], as_torch=False)
    assert rows.tolist() == [[0, 0], [1, 1], [2, 2], [3, 3]] and numbers.tolist() == [0.0, 1.0, 2.0, 3.0]


def _with_meta(meta: bytes, total: int = 256) -> np.ndarray:
    head = wire._HEAD.pack(wire.MAGIC, wire.VERSION, wire.BATCH, 0, 1, len(meta), 0) + meta
    buf = np.zeros(max(total, len(head)), np.uint8)
    buf[: len(head)] = np.frombuffer(head, np.uint8)
    return buf


@pytest.mark.parametrize("buf, match", [
    (np.zeros(10, np.uint8), "shorter than its header"),
    (np.frombuffer(b"XXXX" + bytes(60), np.uint8), "does not start with"),
    (_with_meta(b"{}")[:25], "says its meta is 2 bytes"),
    (_with_meta(b"{not json"), "unreadable meta"),
    (_with_meta(b"[1, 2]"), "not a JSON object"),
])
def test_a_malformed_header_or_meta_is_refused(buf, match):
    with pytest.raises(ProtocolError, match=match):
        wire.read(buf)


@pytest.mark.parametrize("leaves, match", [
    (b'[["<f4",[4],1]]', "bad offset"),
    (b'[["<f4",[4],-64]]', "bad offset"),
    (b'[["<f4",[-1],0]]', "bad shape"),
    (b'[["<f4",[4]]]', "malformed"),
    (b'[["<f4",[1000000],0]]', "lies outside"),
    (b'{"a": 1}', "not a list"),
])
def test_a_malformed_leaf_table_is_refused_also_when_seen_before(leaves, match):
    meta = b'{"tree":{"t":"a","i":0,"k":"A"},"leaves":' + leaves + b"}"
    for _ in range(2):  # the second read finds the meta kept: the table is checked all the same
        buf = _with_meta(meta)
        with pytest.raises(ProtocolError, match=match):
            wire.build(buf, wire.read(buf)[2], as_torch=False)


@pytest.mark.parametrize("tree, match", [
    (b'{"t":"v","v":[["a"]]}', "more than plain values"),
    (b'{"t":"v","v":{"a":1}}', "is an object"),
    (b'{"t":"a","i":1,"k":"A"}', "names leaf 1 of 1"),
    (b'{"t":"n","m":"os","q":"X","f":["a"],"id":"1","c":[{"t":"v","v":1}]}', "named tuple node is malformed"),
    (b'{"t":"n","m":"os","q":"X","f":["a","b"],"id":1,"c":[{"t":"v","v":1}]}', "named tuple node is malformed"),
])
def test_a_malformed_tree_is_refused_also_when_seen_before(tree, match):
    meta = b'{"tree":' + tree + b',"leaves":[["|u1",[4],0]]}'
    for _ in range(2):
        buf = _with_meta(meta)
        with pytest.raises(ProtocolError, match=match):
            wire.build(buf, wire.read(buf)[2], as_torch=False)


def test_a_named_tuple_is_one_of_the_trainer_s_classes_never_imported():
    tree = b'{"t":"n","m":"xml.dom.minidom","q":"Gone","f":["a"],"id":1,"c":[{"t":"v","v":1}]}'
    buf = _with_meta(b'{"tree":' + tree + b',"leaves":[]}')
    with pytest.raises(TypeError, match=r"named tuple xml.dom.minidom.Gone\(a\) that this process does not have"):
        wire.build(buf, wire.read(buf)[2], as_torch=False)
    assert "xml.dom.minidom" not in sys.modules


def test_a_kept_meta_keeps_the_start_its_read_saw():
    buf = _message(np.arange(16, dtype=np.uint8))
    kind, task, meta = wire.read(buf)
    damaged = buf.copy()
    damaged[16:20] = np.frombuffer((1000).to_bytes(4, "little"), np.uint8)  # the header's meta length, after the read
    assert wire.build(damaged, meta, as_torch=False).tolist() == list(range(16))


def test_kept_metas_are_bounded():
    for i in range(wire._SEEN_METAS + 10):
        buf = _message(np.zeros(i + 1, np.uint8))
        wire.read(buf)
        assert len(wire._seen) <= wire._SEEN_METAS
    long_meta = _message([np.zeros(1, np.uint8)] * 200)  # a meta past _SEEN_META_BYTES is not kept
    wire.read(long_meta)
    assert all(len(text) <= wire._SEEN_META_BYTES for text in wire._seen)


@pytest.mark.parametrize("index", [0, 7, -1, 2**63 - 1, -2**63, [], [5], [-1], [1, 2, 3] * 20, [-4, 2**40]])
def test_int_tasks_go_as_int64_and_read_back(index):
    message = int_task(11, index)
    assert message is not None and message.dtype == np.int64
    got = decode_task(message)
    assert got == {"i": 11, "x": index}
    assert type(got["i"]) is int and type(got["x"]) is type(index)  # Python ints, as JSON gave
    assert all(type(i) is int for i in (got["x"] if isinstance(index, list) else [got["x"]]))


@pytest.mark.parametrize("index", [2**63, -2**63 - 1, [1, 2**64], True, [1, False], "a", None, (1, 2), [1.5],
                                   [[1, 2]]])
def test_other_indices_go_as_json(index):
    assert int_task(11, index) is None


def test_json_tasks_read_back_with_tuples_made_again():
    assert decode_task(encode_json({"i": 2, "x": {"tuple": [1, "a"]}})) == {"i": 2, "x": (1, "a")}
    assert decode_task(encode_json({"stop": 1})) == {"stop": 1}
    assert decode_task(encode_json({"reset": 3})) == {"reset": 3}


@pytest.mark.parametrize("values", [[1], [1, -1], [1, -1, 2, 3], [1, 3, 5, 6], [1, -2, 4], np.zeros((2, 3))])
def test_an_int64_task_that_miscounts_its_indices_is_refused(values):
    with pytest.raises(ProtocolError, match="loader task"):
        decode_task(np.asarray(values, np.int64))
