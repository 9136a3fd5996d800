"""One message from a loader worker to the trainer, in one block of shared
memory: a batch, an error, or the end of an iterable worker's data.

Layout (little-endian), a 1-D uint8 message:

======  =====  ===============================================================
offset  bytes  field
======  =====  ===============================================================
0       4      magic ``SRDB``
4       1      version (1)
5       1      kind: BATCH 1, ERROR 2, END 3, READY 4 (reset done)
6       2      zero
8       8      task index (signed; the batch's place in the sampler's order)
16      4      M, the bytes of the meta
20      4      zero
24      M      meta, UTF-8 JSON: for a batch ``{"tree": node, "leaves":
               [[dtype code, shape, offset], ...]}`` (nodes: ``collate.py``);
               for an error ``{"type", "module", "message", "traceback"}``
D       ...    the data: D is 24 + M rounded up to 64; each leaf's bytes, C
               order, at D + its offset (a multiple of 64)
======  =====  ===============================================================

The worker writes it with ``alloc`` (each sample's rows copied once, into
place); the trainer receives it writable and returns views of it: each
array of a batch keeps the whole block alive, and the block returns to the
arena when the last of them is dropped. Everything read back is
bounds-checked: a malformed message raises ``ProtocolError``, it never
reads outside its block.
"""
import collections
import json
import struct
from typing import Any, Dict, List, Tuple

import numpy as np

from ..codec import dtype_code, dtype_of
from ..errors import ProtocolError
from ..tensors import as_tensor
from .collate import Leaf, namedtuple_type

MAGIC = b"SRDB"
VERSION = 1
BATCH, ERROR, END, READY = 1, 2, 3, 4
HEADER = 24
ALIGN = 64
_MAX_LEAVES = 1 << 16


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


_HEAD = struct.Struct("<4sBBHqII")  # the header above
_SEEN_METAS = 256  # batch metas kept parsed: a loader's batches mostly repeat one (or a few)
_SEEN_META_BYTES = 4096  # the longest meta kept (a batch of many leaves is rare, and costly to keep)
JSON = json.JSONEncoder(separators=(",", ":"))  # compact; NaN and inf as JSON's extensions read them


class Plan:
    """A message ready to be written: its header and meta, each leaf's
    offset, its size."""

    __slots__ = ("kind", "task", "head", "leaves", "offsets", "nbytes")

    def __init__(self, kind: int, task: int, meta: Dict[str, Any], leaves: List[Leaf]) -> None:
        offsets = []
        if leaves:
            table = []
            pos = 0
            for leaf in leaves:
                offsets.append(pos)
                table.append([dtype_code(leaf.dtype).decode("ascii"), list(leaf.shape), pos])
                pos = _round_up(pos + leaf.nbytes, ALIGN)
            meta = dict(meta, leaves=table)
        encoded = JSON.encode(meta).encode("utf-8")
        self.head = _HEAD.pack(MAGIC, VERSION, kind, 0, task, len(encoded), 0) + encoded
        start = _round_up(len(self.head), ALIGN)
        self.kind, self.task, self.leaves = kind, task, leaves
        self.offsets = [start + off for off in offsets]
        self.nbytes = start + pos if leaves else len(self.head)

    def write(self, buf: np.ndarray) -> None:
        """Write the message into ``buf`` (uint8, at least ``nbytes`` long):
        every leaf's sources are copied once, into place."""
        buf[: len(self.head)] = np.frombuffer(self.head, np.uint8)
        for leaf, off in zip(self.leaves, self.offsets):
            dst = buf[off : off + leaf.nbytes].view(leaf.dtype).reshape(leaf.shape)
            if leaf.rows is not None:
                for i, row in enumerate(leaf.rows):
                    np.copyto(dst[i, ...], row, casting="unsafe")
            else:
                np.copyto(dst, leaf.whole, casting="unsafe")


def batch_plan(task: int, tree: Any, leaves: List[Leaf]) -> Plan:
    if len(leaves) > _MAX_LEAVES:
        raise ValueError(f"a batch of {len(leaves)} arrays: shmrdv.loader ships at most {_MAX_LEAVES} per batch")
    return Plan(BATCH, task, {"tree": tree}, leaves)


class _Meta(dict):
    """A batch's meta as read, where its leaves start (``start``, fixed by
    the meta's length), and its leaf table once checked (``table``): each
    leaf's dtype, shape, offset in the message and bytes. A loader's
    batches mostly repeat their meta byte for byte, so all three are kept
    (at most ``_SEEN_METAS``), never changed after: each batch's length and
    tree are still checked, and what a batch returns is built anew (no list
    of the meta's is handed out)."""

    __slots__ = ("start", "table")


_seen: Dict[bytes, _Meta] = {}


def read(buf: np.ndarray) -> Tuple[int, int, Dict[str, Any]]:
    """(kind, task index, meta) of a received message, checked."""
    n = len(buf)
    if n < HEADER:
        raise ProtocolError(f"a loader worker's message of {n} bytes is shorter than its header")
    magic, version, kind, _, task, meta_len, _ = _HEAD.unpack(bytes(buf[:HEADER]))
    if magic != MAGIC:
        raise ProtocolError(f"a loader worker's message of {n} bytes does not start with {MAGIC!r}")
    if version != VERSION or kind not in (BATCH, ERROR, END, READY):
        raise ProtocolError(f"a loader worker's message has version {version} and kind {kind}: "
                            f"this trainer reads version {VERSION}, kinds 1-4")
    if meta_len > n - HEADER:
        raise ProtocolError(f"a loader worker's message says its meta is {meta_len} bytes, "
                            f"but the message is {n} bytes")
    text = bytes(buf[HEADER : HEADER + meta_len])
    seen = _seen.get(text) if kind == BATCH else None
    if seen is not None:
        return kind, task, seen
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"a loader worker's message has unreadable meta: {exc}") from None
    if not isinstance(meta, dict):
        raise ProtocolError("a loader worker's message has meta that is not a JSON object")
    if kind == BATCH:
        meta = _Meta(meta)
        meta.start, meta.table = _round_up(HEADER + meta_len, ALIGN), None
        if meta_len <= _SEEN_META_BYTES:
            if len(_seen) >= _SEEN_METAS:
                _seen.clear()
            _seen[text] = meta
    return kind, task, meta


def _checked_table(table: Any, start: int) -> List[Tuple[np.dtype, List[int], int, int]]:
    """A leaf table's entries as (dtype, shape, offset in the message, bytes),
    each checked but for the message's length."""
    if not isinstance(table, list) or len(table) > _MAX_LEAVES:
        raise ProtocolError("a loader batch's leaf table is not a list of at most 65536 entries")
    checked = []
    for entry in table:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                and isinstance(entry[1], list) and type(entry[2]) is int):
            raise ProtocolError(f"a loader batch's leaf entry is malformed: {entry!r:.200}")
        code, shape, off = entry
        if not all(type(d) is int and d >= 0 for d in shape):
            raise ProtocolError(f"a loader batch's leaf has a bad shape {shape!r:.200}")
        dtype = dtype_of(code.encode("ascii", "replace"))
        nbytes = dtype.itemsize
        for d in shape:
            nbytes *= d
        off += start
        if off < start or off % ALIGN:
            raise ProtocolError(f"a loader batch's leaf of {nbytes} bytes has a bad offset {off}")
        checked.append((dtype, shape, off, nbytes))
    return checked


def _leaf_views(buf: np.ndarray, table: List[Tuple[np.dtype, List[int], int, int]]) -> List[np.ndarray]:
    views = []
    for dtype, shape, off, nbytes in table:
        if off + nbytes > len(buf):
            raise ProtocolError(f"a loader batch's leaf of {nbytes} bytes at offset {off} lies outside "
                                f"the {len(buf)} bytes of its message")
        views.append(buf[off : off + nbytes].view(dtype).reshape(shape))
    return views


def build(buf: np.ndarray, meta: _Meta, as_torch: bool) -> Any:
    """The batch a BATCH message holds (``meta`` as ``read`` gave it): its
    structure, with views of ``buf`` for its arrays (torch tensors where the
    worker had or made tensors, if ``as_torch``)."""
    if meta.table is None:
        # from the start the read saw, not the header's now (which damage may have changed since)
        meta.table = _checked_table(meta.get("leaves", []), meta.start)
    views = _leaf_views(buf, meta.table)
    try:
        return _node(meta.get("tree"), views, as_torch)
    except RecursionError:
        raise ProtocolError("a loader batch's tree is nested too deeply") from None


def _node(n: Any, views: List[np.ndarray], as_torch: bool) -> Any:
    # A plain recursive function, not a closure: a closure that calls itself
    # is a reference cycle, and would keep every view of the batch (its
    # shared memory) alive until the garbage collector's next pass.
    if not isinstance(n, dict):
        raise ProtocolError(f"a loader batch's tree has a node that is not an object: {n!r:.200}")
    t = n.get("t")
    if t == "a":
        i = n.get("i")
        if type(i) is not int or not 0 <= i < len(views):
            raise ProtocolError(f"a loader batch's tree names leaf {i!r} of {len(views)}")
        kind = n.get("k")
        if kind == "S":
            return views[i][()]  # a numpy scalar, as the collate_fn returned it
        return as_tensor(views[i]) if as_torch and kind == "T" else views[i]
    if t == "v":
        v = n.get("v")
        if isinstance(v, list):  # strings collated: a new list (the meta's own may serve the next batch)
            if any(isinstance(x, (list, dict)) for x in v):
                raise ProtocolError(f"a loader batch's value list holds more than plain values: {v!r:.200}")
            return tuple(v) if n.get("tuple") else list(v)
        if isinstance(v, dict):
            raise ProtocolError(f"a loader batch's value is an object: {v!r:.200}")
        return v
    if t == "b":
        v = n.get("v")
        if isinstance(v, list):
            return (tuple if n.get("tuple") else list)(_hex(x) for x in v)
        return _hex(v)
    children = n.get("c")
    if not isinstance(children, list):
        raise ProtocolError(f"a loader batch's tree node {t!r} has no children list")
    if t == "l":
        items = [_node(c, views, as_torch) for c in children]
        return tuple(items) if n.get("tuple") else items
    if t in ("d", "o"):
        keys = n.get("k")
        if (not isinstance(keys, list) or len(keys) != len(children)
                or any(isinstance(k, (list, dict)) for k in keys)):
            raise ProtocolError("a loader batch's dict has keys and values that do not pair up")
        pairs = ((k, _node(c, views, as_torch)) for k, c in zip(keys, children))
        return dict(pairs) if t == "d" else collections.OrderedDict(pairs)
    if t == "n":
        module, qualname, fields, class_id = n.get("m"), n.get("q"), n.get("f"), n.get("id")
        if not (isinstance(module, str) and isinstance(qualname, str) and isinstance(fields, list)
                and all(isinstance(f, str) for f in fields) and len(fields) == len(children)
                and type(class_id) is int):
            raise ProtocolError(f"a loader batch's named tuple node is malformed: {n!r:.200}")
        kind = namedtuple_type(module, qualname, tuple(fields), class_id)
        return kind(*(_node(c, views, as_torch) for c in children))
    raise ProtocolError(f"a loader batch's tree has a node of unknown type {t!r:.50}")


def _hex(text: Any) -> bytes:
    try:
        return bytes.fromhex(text)
    except (TypeError, ValueError):
        raise ProtocolError(f"a loader batch holds bytes that are not hex: {text!r:.100}") from None
