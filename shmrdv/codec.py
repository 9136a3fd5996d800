"""How the core turns Python arguments into what the C core takes: keys as
UTF-8 bytes, timeouts as nanoseconds, dtypes as their descriptor codes, and
back. One place for each check; the bridge encodes its frames with the same
functions (a narrow internal interface, listed in docs/architecture.md)."""
import numbers
from typing import Dict

import numpy as np

from ._binding import lib
from .errors import InvalidArgument, InvalidType, MessageTooLarge, SegmentMismatch
from .limits import FOREVER_NS
from .tensors import BF16_MISSING, as_array, bfloat16, is_bfloat16, is_tensor

_DTYPE_KINDS = "biufcmMSU"  # plain, fixed-size, non-object dtypes
_NS = 1_000_000_000
_FINITE_S = FOREVER_NS / _NS  # float timeouts below this are finite waits
_MAX_CACHED = 4096
_key_cache: Dict[str, bytes] = {}


def key_bytes(key: object) -> bytes:
    if not isinstance(key, str):
        raise InvalidType(f"key must be a str, not {type(key).__name__}")
    kb = _key_cache.get(key)
    if kb is not None:
        return kb
    try:
        kb = key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"key is not valid text: {exc.reason} at character {exc.start} "
                              f"({key[exc.start:exc.end]!r}); keys are str of valid Unicode") from None
    if not kb or len(kb) > lib.RDV_KEY_MAX:
        raise InvalidArgument(f"key must be 1..{lib.RDV_KEY_MAX} bytes in UTF-8, got {len(kb)}")
    if len(_key_cache) >= _MAX_CACHED:
        _key_cache.clear()
    _key_cache[key] = kb
    return kb


def timeout_ns(timeout: object) -> int:
    """-1 for forever, else nanoseconds."""
    # the common cases first: one of them is on every timed call
    if type(timeout) is float:
        if 0.0 <= timeout < _FINITE_S:
            return int(timeout * _NS)
    elif type(timeout) is int and 0 <= timeout < _FINITE_S:
        return timeout * _NS
    if timeout is None:
        return -1
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise InvalidType(f"timeout must be None or a number of seconds, not {type(timeout).__name__}")
    if not isinstance(timeout, (int, float)):
        timeout = float(timeout)  # numpy's numbers: no int64 overflow below
    if not timeout >= 0:  # also rejects NaN
        raise InvalidArgument(f"timeout must be >= 0 seconds, got {timeout!r}")
    if timeout * _NS >= FOREVER_NS:  # includes inf
        return -1
    return int(timeout * _NS)


_dtype_codes: Dict[np.dtype, bytes] = {}
_code_dtypes: Dict[bytes, np.dtype] = {}
BF16_CODE = b"bfloat16"
"""The descriptor of ml_dtypes' bfloat16, whose dtype.str ('<V2') names no
dtype numpy can rebuild: the one code that is not a dtype.str."""


def dtype_code(dtype: np.dtype) -> bytes:
    """The descriptor a message of dtype carries: its dtype.str, or
    ``BF16_CODE`` for bfloat16."""
    code = _dtype_codes.get(dtype)
    if code is None:
        if dtype.kind in "SU" and dtype.itemsize == 0:
            raise InvalidType(f"dtype {dtype} cannot be sent: a string dtype needs a width (e.g. 'S8', 'U8')")
        if not dtype_sendable(dtype):
            raise InvalidType(f"dtype {dtype} cannot be sent: only numeric, bool, bfloat16, datetime, timedelta and "
                              f"fixed-width string dtypes that numpy itself can name (convert it, e.g. "
                              f"a.astype(np.float32))")
        code = BF16_CODE if dtype.kind == "V" else dtype.str.encode("ascii")
        if len(code) > lib.RDV_DTYPE_MAX:
            raise InvalidType(f"dtype {dtype} has too long a descriptor")
        _dtype_codes[dtype] = code
    return code


_INTP_MAX = int(np.iinfo(np.intp).max)


def shape_of(shape: object, itemsize: int, what: str) -> tuple:
    """Check a shape argument: an int or a tuple/list of ints (no floats, no
    strings), each non-negative, whose bytes could fit a rendezvous."""
    dims = shape if isinstance(shape, (tuple, list)) else (shape,)
    out = []
    for n in dims:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise InvalidType(f"{what}: shape must be an int or a tuple of ints, got {shape!r}")
        if n < 0:
            raise InvalidArgument(f"{what}: shape must be non-negative, got {tuple(dims)}")
        out.append(int(n))
    if len(out) > lib.RDV_NDIM_MAX:
        raise InvalidArgument(f"{what}: {len(out)} dimensions, at most {lib.RDV_NDIM_MAX} are supported")
    nbytes, spread = itemsize, itemsize  # spread: the product without the zero dimensions
    for n in out:
        nbytes *= n
        spread *= n or 1
    if nbytes == 0 and spread > _INTP_MAX:  # numpy could not make it either
        raise InvalidArgument(f"{what}: shape {tuple(out)} has dimensions too large for an array: without its "
                              f"zeros they make {spread} bytes, more than numpy can index ({_INTP_MAX})")
    if nbytes > lib.RDV_MAX_ARENA_BYTES:
        raise MessageTooLarge(f"{what}: shape {tuple(out)} is {nbytes} bytes, more than any rendezvous holds "
                              f"(at most {lib.RDV_MAX_ARENA_BYTES}): send it in parts")
    return tuple(out)


def dtype_of(code: bytes) -> np.dtype:
    """The dtype a message's descriptor names: SegmentMismatch for one shmrdv
    never sends, InvalidType for bfloat16 when ml_dtypes is not installed
    (nothing numpy has can hold it)."""
    dtype = _code_dtypes.get(code)
    if dtype is None:
        if code == BF16_CODE:
            bf16 = bfloat16()
            if bf16 is None:
                raise InvalidType(f"the message is bfloat16, and {BF16_MISSING}")
            _code_dtypes[code] = bf16
            return bf16
        try:
            dtype = np.dtype(code.decode("ascii"))
        except (TypeError, ValueError, UnicodeDecodeError) as exc:
            raise SegmentMismatch(f"message carries an unreadable dtype {code!r}") from exc
        if dtype.kind not in _DTYPE_KINDS:
            raise SegmentMismatch(f"message carries a dtype shmrdv never sends: {code!r}")
        _code_dtypes[code] = dtype
    return dtype




SEND_ACCEPTS = ("send takes a numpy array, or an array-like of numbers that numpy turns into one (a number, "
                "or lists/tuples of numbers nested to a regular shape), or a CPU torch tensor; its dtype must be "
                "numeric, bool, bfloat16, datetime64, timedelta64 or a fixed-width string")


def _all_text(obj: object) -> bool:
    if isinstance(obj, (str, bytes)):
        return True
    return isinstance(obj, (list, tuple)) and all(_all_text(item) for item in obj)


def _describe(obj: object) -> str:
    """What a value is, for a message: its type, and for a list or tuple the types inside."""
    if obj is None:
        return "None"
    kind = type(obj).__name__
    if isinstance(obj, (list, tuple)):
        inner: Dict[str, None] = {}
        stack = [obj]
        while stack and len(inner) < 6:
            for item in stack.pop():
                if isinstance(item, (list, tuple)):
                    stack.append(item)
                else:
                    inner.setdefault(type(item).__name__, None)
        return f"a {kind} of {', '.join(inner) or 'nothing'}" if inner else f"an empty {kind}"
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def as_sendable(obj: object) -> np.ndarray:
    """The array that ``send`` copies for ``obj``: an ndarray as it is, a
    CPU torch tensor as the array sharing its memory (``tensors.as_array``:
    its data if it requires grad, bfloat16 as ml_dtypes'), an array-like
    through ``np.asarray``; ``InvalidType`` (saying what send takes) for what
    numpy can only hold as objects (a dict, None, a list of mixed objects), a
    ragged list, or a list of numbers and strings that numpy would silently
    turn into strings, and for a tensor numpy cannot hold (saying what to do)."""
    if isinstance(obj, np.ndarray):
        dtype_code(obj.dtype)
        return obj
    if is_tensor(obj):
        arr, _ = as_array(obj, "send")
        dtype_code(arr.dtype)
        return arr
    try:
        arr = np.asarray(obj)
    except (TypeError, ValueError) as exc:
        raise InvalidType(f"cannot send {_describe(obj)} ({exc}): {SEND_ACCEPTS}") from exc
    if arr.dtype.kind == "O" or arr.dtype.fields is not None:
        raise InvalidType(f"cannot send {_describe(obj)}: {SEND_ACCEPTS}")
    if arr.dtype.kind in "SU" and not _all_text(obj) and not isinstance(obj, np.generic):
        raise InvalidType(f"cannot send {_describe(obj)}: numpy would turn its elements into strings "
                          f"({arr.dtype}); {SEND_ACCEPTS}. Send the numbers and the strings apart, "
                          f"or convert them first with np.asarray")
    dtype_code(arr.dtype)
    return arr


def dtype_sendable(dtype: np.dtype) -> bool:
    """Whether arrays of dtype can be sent: the one test of admissibility."""
    if dtype.kind == "V":
        return is_bfloat16(dtype)
    if not (dtype.kind in _DTYPE_KINDS and dtype.fields is None and dtype.subdtype is None and dtype.itemsize > 0):
        return False
    # A message carries dtype.str: it must name this dtype again (ml_dtypes'
    # float8_e5m2 says '<f1', which names nothing a receiver could rebuild).
    try:
        return np.dtype(dtype.str) == dtype
    except (TypeError, ValueError):
        return False


def fit_text(text: str, limit: int) -> str:
    """text cut to at most limit bytes of UTF-8, on a character boundary: for
    reasons built from other text (a peer's, an exception's) that must fit."""
    data = text.encode("utf-8")
    return text if len(data) <= limit else data[:limit].decode("utf-8", "ignore")


def positive_int(value: object, what: str) -> int:
    """An int argument that must be at least 1 (``what`` names it in errors)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidType(f"{what} must be an int, not {type(value).__name__}")
    if value <= 0:
        raise InvalidArgument(f"{what} must be positive, got {value}")
    return value


_U64_MAX = (1 << 64) - 1


def u64(value: object, what: str) -> int:
    """An int argument that must fit 64 unsigned bits (``what`` names it in errors)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidType(f"{what} must be an int, not {type(value).__name__}")
    if not 0 <= value <= _U64_MAX:
        raise InvalidArgument(f"{what} must fit 64 unsigned bits, got {value}")
    return value
