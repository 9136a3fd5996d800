"""CPU torch tensors as numpy arrays and back, sharing memory, for the APIs
that take either. torch is optional: nothing here imports it unless it is
handed a tensor (then torch is loaded already), and bfloat16 comes from
``ml_dtypes`` when that is installed, imported only once needed."""
import sys
from typing import Any, Optional, Tuple

import numpy as np

from .errors import InvalidType

_bfloat16: Optional[np.dtype] = None


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


def is_tensor(obj: object) -> bool:
    """Whether obj is a torch tensor (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _torch() -> Any:
    import torch

    return torch


def as_array(obj: Any, what: str) -> Tuple[np.ndarray, bool]:
    """(a numpy array sharing obj's memory, whether obj was a tensor). A
    tensor that requires grad gives its data (detached); bfloat16 tensors
    become ml_dtypes.bfloat16 arrays. Anything else must be an ndarray
    (or convertible by np.asarray)."""
    if isinstance(obj, np.ndarray):
        return obj, False
    if is_tensor(obj):
        torch = _torch()
        t = obj.detach()
        if t.device.type != "cpu":
            raise InvalidType(f"{what}: a {t.device.type} tensor; shmrdv moves CPU tensors: call .cpu() first")
        if t.dtype == torch.bfloat16:
            bf16 = bfloat16()
            if bf16 is None:
                raise InvalidType(f"{what}: bfloat16 tensors need ml_dtypes (pip install ml_dtypes)")
            return t.view(torch.int16).numpy().view(bf16), True
        try:
            return t.numpy(), True
        except (TypeError, RuntimeError) as exc:
            raise InvalidType(f"{what}: a {t.dtype} tensor has no numpy counterpart ({exc})") from None
    if obj is None:
        raise InvalidType(f"{what}: an array is needed, got None")
    try:
        return np.asarray(obj), False
    except (TypeError, ValueError) as exc:
        raise InvalidType(f"{what}: expected a numpy array or a CPU torch tensor, got "
                          f"{type(obj).__name__} ({exc})") from None


def as_tensor(array: np.ndarray) -> Any:
    """A torch tensor sharing array's memory (bfloat16 included)."""
    torch = _torch()
    bf16 = bfloat16(load=False)
    if bf16 is not None and array.dtype == bf16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
