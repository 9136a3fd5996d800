"""CPU torch tensors as numpy arrays and back, sharing memory, for the APIs
that take either. torch is optional: nothing here imports it unless it is
handed a tensor or a torch dtype (then torch is loaded already) or asked for
a tensor (``as_torch=True``), and bfloat16 comes from ``ml_dtypes`` when that
is installed, imported only once needed."""
import sys
from typing import Any, Dict, Optional, Tuple

import numpy as np

from .errors import InvalidArgument, InvalidType

_bfloat16: Optional[np.dtype] = None
BF16_MISSING = "bfloat16 needs ml_dtypes, numpy's bfloat16 (pip install ml_dtypes)"
"""What an error says when bfloat16 is met and ml_dtypes is not installed."""


def bfloat16(load: bool = True) -> Optional[np.dtype]:
    """numpy's bfloat16 (ml_dtypes'), or None when ml_dtypes is missing; with
    load False, None unless ml_dtypes is imported already. ml_dtypes takes
    about a second to import, so nothing imports it before it is needed: an
    array of bfloat16 means its caller imported it."""
    global _bfloat16
    if _bfloat16 is None and (load or "ml_dtypes" in sys.modules):
        try:
            from ml_dtypes import bfloat16 as bf16
        except ImportError:
            return None
        _bfloat16 = np.dtype(bf16)
    return _bfloat16


def is_bfloat16(dtype: np.dtype) -> bool:
    """Whether dtype is ml_dtypes' bfloat16 (without importing ml_dtypes:
    an array of it means it is imported)."""
    if dtype.name != "bfloat16":
        return False
    bf16 = bfloat16(load=False)
    return bf16 is not None and dtype == bf16


def is_tensor(obj: object) -> bool:
    """Whether obj is a torch tensor (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def is_torch_dtype(obj: object) -> bool:
    """Whether obj is a torch dtype such as torch.float32 (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.dtype)


def _torch() -> Any:
    import torch

    return torch


def torch_module(what: str) -> Any:
    """torch, imported for as_torch=True; InvalidArgument if it is not installed."""
    try:
        return _torch()
    except ImportError as exc:
        raise InvalidArgument(f"{what}: as_torch=True needs torch (pip install torch): {exc}") from None


def check_as_torch(as_torch: object, what: str) -> bool:
    """An ``as_torch=`` argument: a bool; True imports torch (before anything is taken)."""
    if as_torch is True:
        torch_module(what)
        return True
    if as_torch is False:
        return False
    raise InvalidType(f"{what}: as_torch must be True or False, not {as_torch!r}")


def _not_numpy(t: Any, what: str, exc: Optional[BaseException] = None) -> InvalidType:
    """The error for a tensor numpy cannot hold: what it is and what to do."""
    dtype = t.dtype
    if t.is_quantized:
        return InvalidType(f"{what}: a quantized tensor ({dtype}) has no numpy counterpart: send t.dequantize(), "
                           f"or t.int_repr() with its scale and zero point")
    because = f" ({exc})" if exc is not None else ""
    wider = "torch.complex64" if dtype.is_complex else "torch.float32"  # keeps the imaginary part
    if getattr(t, "is_nested", False):
        return InvalidType(f"{what}: a nested tensor has no numpy counterpart: send its components one by one "
                           f"(t.unbind()), or pad it first (t.to_padded_tensor(0))")
    return InvalidType(f"{what}: a {dtype} tensor has no numpy counterpart{because}: convert it first, e.g. "
                       f"t.to({wider}), or send its bytes, t.view(torch.uint8)")


def as_array(obj: Any, what: str, out: bool = False) -> Tuple[np.ndarray, bool]:
    """(a numpy array sharing obj's memory, whether obj was a tensor). A
    tensor that requires grad gives its data (detached); bfloat16 tensors
    become ml_dtypes.bfloat16 arrays; a non-contiguous tensor gives a strided
    array (the callers copy it once). A tensor with its conjugate or negative
    bit set is resolved (a copy) unless it is an ``out`` (then InvalidType:
    a copy would not be written back). Anything else must be an ndarray (or
    convertible by np.asarray)."""
    if isinstance(obj, np.ndarray):
        return obj, False
    if is_tensor(obj):
        torch = _torch()
        t = obj.detach()
        if t.device.type == "meta":
            raise InvalidType(f"{what}: a meta tensor holds no data to send (it has only a shape and a dtype)")
        if t.device.type != "cpu":
            raise InvalidType(f"{what}: a {t.device.type} tensor; shmrdv moves CPU tensors: call .cpu() first")
        if t.layout != torch.strided:
            raise InvalidType(f"{what}: a {t.layout} tensor; shmrdv moves dense tensors: call .to_dense() first")
        if t.is_conj() or t.is_neg():
            if out:
                raise InvalidType(f"{what}: a tensor with its conjugate or negative bit set cannot be written "
                                  f"into: pass t.resolve_conj().resolve_neg() and use that")
            t = t.resolve_conj().resolve_neg()
        if t.dtype == torch.bfloat16:
            bf16 = bfloat16()
            if bf16 is None:
                raise InvalidType(f"{what}: a torch.bfloat16 tensor: {BF16_MISSING}")
            return t.view(torch.int16).numpy().view(bf16), True
        if t.is_quantized:
            raise _not_numpy(t, what)
        try:
            return t.numpy(), True
        except (TypeError, RuntimeError) as exc:
            raise _not_numpy(t, what, exc) from None
    if obj is None:
        raise InvalidType(f"{what}: an array is needed, got None")
    try:
        return np.asarray(obj), False
    except (TypeError, ValueError) as exc:
        raise InvalidType(f"{what}: expected a numpy array or a CPU torch tensor, got "
                          f"{type(obj).__name__} ({exc})") from None


_numpy_dtypes: Dict[Any, np.dtype] = {}


def numpy_dtype(dtype: Any, what: str) -> np.dtype:
    """The numpy dtype of a torch dtype (torch.float32: float32, torch.bfloat16:
    ml_dtypes' bfloat16); InvalidType for one numpy has no counterpart of."""
    npd = _numpy_dtypes.get(dtype)
    if npd is None:
        torch = _torch()
        if dtype == torch.bfloat16:
            npd = bfloat16()
            if npd is None:
                raise InvalidType(f"{what}: torch.bfloat16: {BF16_MISSING}")
        else:
            try:
                npd = as_array(torch.empty(0, dtype=dtype), what)[0].dtype
            except (InvalidType, RuntimeError, TypeError):
                raise InvalidType(f"{what}: {dtype} has no numpy counterpart: use a dtype that has one, e.g. "
                                  f"torch.float32 (or torch.uint8 for raw bytes), and convert") from None
        _numpy_dtypes[dtype] = npd
    return npd


_tensor_dtypes: Dict[np.dtype, bool] = {}


def tensor_dtype_ok(dtype: np.dtype) -> bool:
    """Whether an array of dtype can become a torch tensor (as_tensor):
    bfloat16, and what torch.from_numpy takes (numbers and bool in native
    byte order; not datetimes, strings or another byte order)."""
    ok = _tensor_dtypes.get(dtype)
    if ok is None:
        if is_bfloat16(dtype):
            ok = True
        else:
            try:
                _torch().from_numpy(np.empty(0, dtype))
                ok = True
            except (TypeError, ValueError, RuntimeError):
                ok = False
        _tensor_dtypes[dtype] = ok
    return ok


def as_tensor(array: np.ndarray) -> Any:
    """A torch tensor sharing array's memory (bfloat16 included). torch has no
    read-only tensors, so array should be writable (torch warns otherwise)."""
    torch = _torch()
    if array.dtype.kind == "V" and is_bfloat16(array.dtype):
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
