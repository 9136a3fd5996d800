"""How the core turns Python arguments into what the C core takes: keys as
UTF-8 bytes, timeouts as nanoseconds, dtypes as their descriptor codes, and
back. One place for each check; the bridge encodes its frames with the same
functions (a narrow internal interface, listed in docs/architecture.md)."""
from typing import Dict

import numpy as np

from ._binding import lib
from .errors import InvalidArgument, InvalidType, SegmentMismatch

_DTYPE_KINDS = "biufcmMSU"  # plain, fixed-size, non-object dtypes
_NS = 1_000_000_000
_MAX_CACHED = 4096
_key_cache: Dict[str, bytes] = {}


def key_bytes(key: object) -> bytes:
    if not isinstance(key, str):
        raise InvalidType(f"key must be a str, not {type(key).__name__}")
    kb = _key_cache.get(key)
    if kb is not None:
        return kb
    kb = key.encode("utf-8")
    if not kb or len(kb) > lib.RDV_KEY_MAX:
        raise InvalidArgument(f"key must be 1..{lib.RDV_KEY_MAX} bytes in UTF-8, got {len(kb)}")
    if len(_key_cache) >= _MAX_CACHED:
        _key_cache.clear()
    _key_cache[key] = kb
    return kb


def timeout_ns(timeout: object) -> int:
    """-1 for forever, else nanoseconds."""
    if timeout is None:
        return -1
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise InvalidType(f"timeout must be None or a number of seconds, not {type(timeout).__name__}")
    if not timeout >= 0:  # also rejects NaN
        raise InvalidArgument(f"timeout must be >= 0 seconds, got {timeout!r}")
    if timeout * _NS >= 1 << 62:  # includes inf: as good as forever
        return -1
    return int(timeout * _NS)


_dtype_codes: Dict[np.dtype, bytes] = {}
_code_dtypes: Dict[bytes, np.dtype] = {}


def dtype_code(dtype: np.dtype) -> bytes:
    code = _dtype_codes.get(dtype)
    if code is None:
        if not dtype_sendable(dtype):
            raise InvalidType(f"dtype {dtype} cannot be sent: only numeric, bool, datetime, timedelta and fixed-width string dtypes")
        code = dtype.str.encode("ascii")
        if len(code) > lib.RDV_DTYPE_MAX:
            raise InvalidType(f"dtype {dtype} has too long a descriptor")
        _dtype_codes[dtype] = code
    return code


def dtype_of(code: bytes) -> np.dtype:
    dtype = _code_dtypes.get(code)
    if dtype is None:
        try:
            dtype = np.dtype(code.decode("ascii"))
        except (TypeError, ValueError, UnicodeDecodeError) as exc:
            raise SegmentMismatch(f"message carries an unreadable dtype {code!r}") from exc
        if dtype.kind not in _DTYPE_KINDS:
            raise SegmentMismatch(f"message carries a dtype shmrdv never sends: {code!r}")
        _code_dtypes[code] = dtype
    return dtype




def dtype_sendable(dtype: np.dtype) -> bool:
    """Whether arrays of dtype can be sent: the one test of admissibility."""
    return dtype.kind in _DTYPE_KINDS and dtype.fields is None and dtype.subdtype is None and dtype.itemsize > 0
