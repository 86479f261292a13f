"""Dtypes as kernels name them (nl dtypes, NumPy and torch dtypes, names) and the torch dtypes tiles hold."""

import numpy as np
import torch

from torchneuron.nki._errors import NKIError

_DTYPES = {
    "bool": torch.bool, "bool_": torch.bool, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
    "int64": torch.int64, "uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32,
    "float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16, "tfloat32": torch.float32,
    "float8_e4m3": torch.float8_e4m3fn, "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
}


def as_dtype(dtype):
    """A torch dtype from an nl dtype, a torch or NumPy dtype, or a dtype name."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    try:
        return _DTYPES[name]
    except KeyError:
        raise NKIError("dtype", f"unsupported dtype {dtype!r}") from None
