"""NumPy arrays in and out of kernels, including the ml_dtypes types (bfloat16, float8) that NKI
users pass for dtypes NumPy lacks. Conversions share memory, so a kernel's writes to an input
reach the caller's array."""

from __future__ import annotations

import numpy as np
import torch

try:
    import ml_dtypes
except ImportError:  # optional: without it, bf16/fp8 results come back as CPU tensors
    ml_dtypes = None

# ml_dtypes name -> (torch dtype, integer type of the same width)
_EXTENDED = {
    "bfloat16": (torch.bfloat16, np.uint16),
    "float8_e4m3fn": (torch.float8_e4m3fn, np.uint8),
    "float8_e5m2": (torch.float8_e5m2, np.uint8),
    "float8_e4m3fnuz": (torch.float8_e4m3fnuz, np.uint8),
    "float8_e5m2fnuz": (torch.float8_e5m2fnuz, np.uint8),
    "float8_e8m0fnu": (torch.float8_e8m0fnu, np.uint8),   # MX scales
}
_BITS = {torch.bfloat16: torch.uint16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8,
         torch.float8_e4m3fnuz: torch.uint8, torch.float8_e5m2fnuz: torch.uint8, torch.float8_e8m0fnu: torch.uint8}


def to_torch(a: np.ndarray) -> torch.Tensor:
    """A CPU tensor over the array's memory."""
    extended = _EXTENDED.get(a.dtype.name)
    if extended is not None and a.dtype.kind == "V":  # an ml_dtypes type: reinterpret its bits
        dtype, bits = extended
        return torch.from_numpy(a.view(bits)).view(dtype)
    return torch.from_numpy(a)


def to_numpy(t: torch.Tensor):
    """An array over the tensor's memory; a tensor of a dtype NumPy cannot hold stays a tensor."""
    bits = _BITS.get(t.dtype)
    if bits is None:
        try:
            return t.numpy()
        except TypeError:
            return t
    if ml_dtypes is None:
        return t
    return t.view(bits).numpy().view(getattr(ml_dtypes, str(t.dtype).replace("torch.", "")))
