"""A batch as a plan before it is built: its structure (a JSON-ready tree)
and, for every array in it, the dtype, shape and sources it is made of. The
writer (``batch.py``) then copies each source once, straight into the
batch's shared memory: nothing is stacked in private memory first.

Three ways to plan, each giving what torch gives for the same input:
- ``collate``: torch's ``default_collate`` (samples of one batch stacked);
- ``convert``: torch's ``default_convert`` (``batch_size=None``: one sample,
  its numpy arrays made tensors);
- ``convert`` with ``arrays_as_tensors=False``: what a custom ``collate_fn``
  returned, each array or tensor kept as it is.

Tree nodes (``t`` is the node type):

====  =======================================  ==============================
t     fields                                   becomes
====  =======================================  ==============================
a     i: leaf index, k: "T" tensor / "A" array  the leaf, as a tensor or array
      / "S" numpy scalar                        or numpy scalar
v     v: a JSON value (tuple: true, of a list)  that value (numbers, strings,
                                                None, lists or tuples of strings)
b     v: list of hex strings, or one;           bytes (a list or tuple of them)
      tuple as for v
l     c: children; tuple: true                  a list (a tuple)
d     k: keys (JSON values), c: children        a dict
o     k, c                                      a collections.OrderedDict
n     m: module, q: qualified name, f: field   that named tuple: a class of
      names, id: the class's id() in the       the trainer's own, found by m,
      worker, c                                q and f (``namedtuple_type``)
====  =======================================  ==============================
"""
import collections
import re
import sys
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..tensors import as_array, is_tensor

# default_collate's error, word for word: users search for it.
_COLLATE_ERROR = "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
_STR_OR_OBJECT = re.compile(r"[SaUO]")  # dtypes default_collate does not stack
_KEY_TYPES = (str, int, float, bool, type(None))


class Leaf:
    """One array of a batch: its dtype and shape, and either ``rows`` (one
    array per sample, stacked along a new first axis) or ``whole`` (the
    array itself)."""

    __slots__ = ("dtype", "shape", "rows", "whole")

    def __init__(self, dtype: np.dtype, shape: tuple, rows: Optional[List[np.ndarray]] = None,
                 whole: Optional[np.ndarray] = None) -> None:
        self.dtype, self.shape, self.rows, self.whole = dtype, shape, rows, whole

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


def _leaf(leaves: List[Leaf], leaf: Leaf, kind: str) -> Dict[str, Any]:
    leaves.append(leaf)  # its dtype is checked where it is encoded (batch.write)
    return {"t": "a", "i": len(leaves) - 1, "k": kind}


def _is_numpy_value(obj: object) -> bool:
    # default_convert's test: a numpy type that is not a numpy string.
    kind = type(obj)
    return kind.__module__ == "numpy" and kind.__name__ not in ("str_", "string_", "bytes_")


def _is_namedtuple(obj: object) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _keys(mapping: Any) -> List[Any]:
    keys = list(mapping)
    for k in keys:
        if not isinstance(k, _KEY_TYPES):
            raise TypeError(f"shmrdv.loader ships dict keys that are str, int, float, bool or None; "
                            f"got a key of type {type(k).__name__} ({k!r})")
    return keys


def _mapping_node(mapping: Any, keys: List[Any], children: List[Any]) -> Dict[str, Any]:
    kind = "o" if isinstance(mapping, collections.OrderedDict) else "d"
    return {"t": kind, "k": keys, "c": children}


def _namedtuple_node(obj: tuple, children: List[Any]) -> Dict[str, Any]:
    kind = type(obj)
    return {"t": "n", "m": kind.__module__, "q": kind.__qualname__, "f": list(kind._fields), "id": id(kind),
            "c": children}


def _stack(batch: Sequence[Any], leaves: List[Leaf]) -> Dict[str, Any]:
    arrays = [as_array(x, "a batch's element")[0] for x in batch]
    first = arrays[0]
    for i, a in enumerate(arrays):
        if a.shape != first.shape:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got {list(first.shape)} at "
                               f"entry 0 and {list(a.shape)} at entry {i}")
    dtype = first.dtype if all(a.dtype == first.dtype for a in arrays) else np.result_type(*arrays)
    return _leaf(leaves, Leaf(dtype, (len(arrays),) + first.shape, rows=arrays), "T")


def _int_batch_dtype(batch: Sequence[Any]) -> Any:
    """What ``torch.tensor(batch)`` makes of a batch whose first element is
    an int: bool if all are bools, float32 (torch's default) if any is a
    float, complex64 if any is complex, int64 otherwise."""
    kinds = {type(x) for x in batch}
    if kinds == {bool}:
        return np.bool_
    if any(issubclass(k, complex) for k in kinds):
        return np.complex64
    if any(issubclass(k, float) for k in kinds):
        return np.float32
    return np.int64


def _numbers(batch: Sequence[Any], dtype: Any, leaves: List[Leaf]) -> Dict[str, Any]:
    try:
        whole = np.asarray(batch, dtype=dtype)
    except OverflowError as exc:
        raise OverflowError(f"default_collate: {exc} (an int does not fit int64)") from None
    return _leaf(leaves, Leaf(whole.dtype, whole.shape, whole=whole), "T")


def collate(batch: Sequence[Any], leaves: List[Leaf]) -> Any:
    """The tree torch's ``default_collate(batch)`` would build, its arrays
    planned into ``leaves``."""
    elem = batch[0]
    if is_tensor(elem) or isinstance(elem, np.ndarray):
        if isinstance(elem, np.ndarray) and _STR_OR_OBJECT.search(elem.dtype.str):
            raise TypeError(_COLLATE_ERROR.format(elem.dtype))
        return _stack(batch, leaves)
    if isinstance(elem, (np.bool_, np.number)):
        return _numbers(batch, None, leaves)
    if isinstance(elem, float):
        return _numbers(batch, np.float64, leaves)
    if isinstance(elem, int):  # bool too; the dtype torch.tensor(batch) infers
        return _numbers(batch, _int_batch_dtype(batch), leaves)
    if isinstance(elem, str):  # as torch: the batch itself (a tuple when it came from tuple samples)
        return {"t": "v", "v": list(batch), "tuple": isinstance(batch, tuple)}
    if isinstance(elem, bytes):
        return {"t": "b", "v": [bytes(x).hex() for x in batch], "tuple": isinstance(batch, tuple)}
    if isinstance(elem, collections.abc.Mapping):
        keys = _keys(elem)
        return _mapping_node(elem, keys, [collate([d[k] for d in batch], leaves) for k in keys])
    if _is_namedtuple(elem):
        return _namedtuple_node(elem, [collate(s, leaves) for s in zip(*batch)])
    if isinstance(elem, collections.abc.Sequence):
        size = len(elem)
        if not all(len(e) == size for e in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        return {"t": "l", "c": [collate(s, leaves) for s in zip(*batch)]}
    raise TypeError(_COLLATE_ERROR.format(type(elem)))


def convert(data: Any, leaves: List[Leaf], arrays_as_tensors: bool = True) -> Any:
    """The tree of one value shipped as it is: torch's ``default_convert``
    (numpy arrays and scalars become tensors) or, with ``arrays_as_tensors``
    False, a custom ``collate_fn``'s result (arrays stay arrays)."""
    if is_tensor(data):
        whole = as_array(data, "a batch's tensor")[0]
        return _leaf(leaves, Leaf(whole.dtype, whole.shape, whole=whole), "T")
    if _is_numpy_value(data):
        whole = np.asarray(data)
        if whole.dtype.kind == "O":
            raise TypeError("shmrdv.loader cannot ship numpy object arrays: make them numeric "
                            "(or strings of fixed width) in __getitem__ or collate_fn")
        string = _STR_OR_OBJECT.search(whole.dtype.str) is not None
        kind = "T" if arrays_as_tensors and not string else ("S" if isinstance(data, np.generic) else "A")
        return _leaf(leaves, Leaf(whole.dtype, whole.shape, whole=whole), kind)
    if isinstance(data, collections.abc.Mapping):
        keys = _keys(data)
        return _mapping_node(data, keys, [convert(data[k], leaves, arrays_as_tensors) for k in keys])
    if _is_namedtuple(data):
        return _namedtuple_node(data, [convert(d, leaves, arrays_as_tensors) for d in data])
    if isinstance(data, (bytes, bytearray)):
        return {"t": "b", "v": bytes(data).hex()}
    if isinstance(data, _KEY_TYPES):
        return {"t": "v", "v": data}
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, str):
        # default_convert makes tuples lists; a collate_fn's tuple stays one
        keep_tuple = not arrays_as_tensors and isinstance(data, tuple)
        return {"t": "l", "c": [convert(d, leaves, arrays_as_tensors) for d in data], "tuple": keep_tuple}
    raise TypeError(f"shmrdv.loader cannot ship a {type(data).__module__}.{type(data).__qualname__} from a "
                    f"worker: a batch holds arrays, tensors, numbers, strings, bytes and tuples, lists, dicts "
                    f"and named tuples of them (nothing is pickled); convert it in __getitem__ or collate_fn")


_NamedTupleKey = Tuple[str, str, Tuple[str, ...], int]
_found: Dict[_NamedTupleKey, "weakref.ref[type]"] = {}  # classes found before, by what a worker said of them
_MAX_FOUND = 256


def namedtuple_type(module: str, qualname: str, fields: Tuple[str, ...], worker_id_of_class: int) -> Any:
    """The named tuple class a worker named, among the classes this process
    has made (nothing is imported or unpickled on a peer's word): a class
    of ``module`` named ``qualname`` with these ``fields``. A class made in
    a class body or in a function has no name to import it by; it is found
    all the same, as a subclass of tuple. Of several such classes, the one
    whose id() is the worker's (a worker forked from this process, or no
    worker: the very class), else the one ``module`` has under that name
    (pickle's choice), else the only one; the id is only compared, never
    used as an address."""
    key = (module, qualname, fields, worker_id_of_class)
    ref = _found.get(key)
    kind = ref() if ref is not None else None
    if kind is None:
        kind = _choose_namedtuple(module, qualname, fields, worker_id_of_class)
        if len(_found) >= _MAX_FOUND:
            _found.clear()
        _found[key] = weakref.ref(kind)
    return kind


def _choose_namedtuple(module: str, qualname: str, fields: Tuple[str, ...], worker_id_of_class: int) -> Any:
    # The module compared as a module where this process has it: a spawned
    # worker runs the trainer's script as __mp_main__, which here is __main__.
    home = sys.modules.get(module)

    def named_so(kind: type) -> bool:
        return (kind.__qualname__ == qualname and getattr(kind, "_fields", None) == fields
                and (kind.__module__ == module or (home is not None and sys.modules.get(kind.__module__) is home)))

    candidates = []
    pending, seen = [tuple], set()
    while pending:
        for sub in type.__subclasses__(pending.pop()):
            if sub not in seen:
                seen.add(sub)
                pending.append(sub)
                if named_so(sub):
                    candidates.append(sub)
    for kind in candidates:
        if id(kind) == worker_id_of_class:
            return kind
    named: Any = home
    for part in qualname.split("."):
        named = getattr(named, part, None)
    for kind in candidates:
        if kind is named:
            return kind
    if len(candidates) == 1:
        return candidates[0]
    what = f"{module}.{qualname}({', '.join(fields)})"
    if not candidates:
        raise TypeError(f"a batch holds a named tuple {what} that this process does not have: import {module} "
                        f"in the training process (or, for a class made in a function, call that function there)")
    raise TypeError(f"a batch holds a named tuple {what}, and this process has {len(candidates)} such classes, "
                    f"none of them the worker's (a function that makes the class on each call?): make the class "
                    f"once, at the top level of {module}")
