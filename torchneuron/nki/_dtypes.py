"""Dtypes as kernels name them (nl dtypes, NumPy and torch dtypes, names) and the torch dtypes tiles hold.

Most NKI dtypes are torch dtypes. The packed MX dtypes of NeuronCore-v4 (``float8_e5m2_x4``,
``float8_e4m3fn_x4``, ``float4_e2m1fn_x4``: four fp8 or fp4 values in one 32- or 16-bit element)
have no torch counterpart, so they are ``PackedDtype`` objects: a tile of one holds the bits in
an integer *storage* dtype of the same width (int32, int16) and carries the packed dtype as its
logical dtype (``NkiTensor.packed``). Only instructions that know the format read or write such a
tile (see ``_tile.NkiTensor.read``), so the bits are never mistaken for integers and one format
is never read as another. ``decode`` and ``encode`` convert between the bits and fp32 values;
torch would need a dtype per packed format to make this class unnecessary.
"""

import numpy as np
import torch

from torchneuron.nki._errors import NKIError


class PackedDtype:
    """A packed MX dtype: ``count`` values of the element format ``element`` in one element of
    ``storage`` (value j in bits ``j * bits`` to ``(j + 1) * bits - 1``, as the bytes of four
    fp8 values read as one little-endian 32-bit word)."""

    is_floating_point = True  # (the values are floats; there is no arithmetic on the packed element)
    is_complex = False
    is_signed = True

    def __init__(self, name, element, bits, storage, emax, max_normal):
        self.name, self.element, self.bits, self.storage = name, element, bits, storage
        self.count = 4
        self.emax = emax                # exponent of the largest normal value (OCP MX emax_elem)
        self.max_normal = max_normal
        self.itemsize = storage.itemsize

    def __repr__(self):
        return f"nl.{self.name}"

    def __str__(self):  # getattr(nl, str(dtype)) works, as for the other dtypes
        return self.name

    def __reduce__(self):  # one object per format, also after pickling
        return (_packed_by_name, (self.name,))


# fp4 e2m1 (sign, 2 exponent bits, 1 mantissa bit): the 16 values of its codes
_FP4_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])

float8_e5m2_x4 = PackedDtype("float8_e5m2_x4", torch.float8_e5m2, 8, torch.int32, emax=15, max_normal=57344.0)
float8_e4m3fn_x4 = PackedDtype("float8_e4m3fn_x4", torch.float8_e4m3fn, 8, torch.int32, emax=8, max_normal=448.0)
float4_e2m1fn_x4 = PackedDtype("float4_e2m1fn_x4", "float4_e2m1fn", 4, torch.int16, emax=2, max_normal=6.0)
PACKED = {p.name: p for p in (float8_e5m2_x4, float8_e4m3fn_x4, float4_e2m1fn_x4)}


def _packed_by_name(name):
    return PACKED[name]


_DTYPES = {
    "bool": torch.bool, "bool_": torch.bool, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
    "int64": torch.int64, "uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32,
    "float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16, "tfloat32": torch.float32,
    "float8_e4m3": torch.float8_e4m3fn, "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
    "float8_e8m0fnu": torch.float8_e8m0fnu,
}


def packed_error(dtype, what):
    """The error for a packed dtype (or a tile of one) where only plain values make sense."""
    return NKIError("dtype", f"{what}: {dtype!r} is a packed MX dtype (four {_element_name(dtype)} values per "
                    "element); only nisa.quantize_mx writes its values and nisa.nc_matmul_mx reads them. Tiles of "
                    "it are declared with nl.ndarray, moved by nisa.dma_copy and nisa.tensor_copy (to the same "
                    "dtype), and their bits are seen through .view() or .ap(dtype=)")


def _element_name(p):
    return p.element if isinstance(p.element, str) else str(p.element).replace("torch.", "")


def as_dtype(dtype, packed=False, what="dtype"):
    """A torch dtype from an nl dtype, a torch or NumPy dtype, or a dtype name. A packed MX dtype is
    returned as itself where the caller takes one (``packed=True``: declarations and views) and is
    an error elsewhere."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype in PACKED:
        dtype = PACKED[dtype]
    if isinstance(dtype, PackedDtype):
        if not packed:
            raise packed_error(dtype, what)
        return dtype
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    try:
        return _DTYPES[name]
    except KeyError:
        raise NKIError("dtype", f"unsupported dtype {dtype!r}") from None


def storage_of(dtype):
    """The torch dtype a tile of ``dtype`` holds."""
    return dtype.storage if isinstance(dtype, PackedDtype) else dtype


def packed_of(dtype):
    """``dtype`` if it is a packed MX dtype, else None."""
    return dtype if isinstance(dtype, PackedDtype) else None


def _bytes(bits, packed):
    """[..., F] storage elements -> [..., F * itemsize] uint8 (little-endian order)."""
    b = bits.contiguous().view(torch.uint8)
    return b.reshape(list(bits.shape[:-1]) + [bits.shape[-1] * packed.itemsize])


def decode(bits, packed):
    """The values of packed elements: [..., F] storage -> [..., F, 4] float32, value j of each element last."""
    b = _bytes(bits, packed)
    if packed.bits == 8:
        values = b.view(packed.element).float()
    else:  # two fp4 codes per byte, the low nibble first
        codes = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(list(b.shape[:-1]) + [-1])
        values = _FP4_VALUES[codes.long()]
    return values.reshape(list(bits.shape) + [packed.count])


def encode(values, packed):
    """[..., F, 4] values exactly representable in the element format -> [..., F] storage bits
    (the caller has rounded them: fp8 by torch's round-to-nearest-even cast)."""
    if packed.bits != 8:
        raise NKIError("dtype", f"encoding {packed!r} values is not an instruction of NKI (quantize_mx writes fp8)")
    b = values.to(packed.element).contiguous().view(torch.uint8)
    return b.reshape(list(values.shape[:-2]) + [-1]).view(packed.storage)
