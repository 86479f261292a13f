"""``nki.isa`` Vector Engine search instructions, the steps of a top-k: ``max8``,
``nc_find_index8``, ``nc_match_replace8``. Values are compared in fp32, per partition, over the
flattened free dims."""

import numpy as np
import torch

from torchneuron.nki._errors import NKIError
from torchneuron.nki.isa._common import broadcast_lead, check_dtype, per_partition, tile
from torchneuron.nki._ops import compute, dst_write, record
from torchneuron.nki._tile import NkiTensor


def _searched(what, data, fewest=8, dims=3):
    """The searched tile's values per partition: up to ``dims``-D, ``fewest`` to 16384 elements."""
    v = per_partition(compute(tile(data, f"{what} data")).float())
    if len(data.shape) > dims or not fewest <= v.shape[-1] <= 16384:
        raise NKIError("max8-size", f"{what} searches up to {dims}-D tiles of {fewest} to 16384 elements per "
                       f"partition, got {data.describe()}")
    return v


def _eight(what, data, vals):
    if not isinstance(vals, NkiTensor) or vals.shape[0] != data.shape[0]:
        raise NKIError("shape-mismatch", f"{what}: vals must be a tile with data's {data.shape[0]} partitions")
    v = per_partition(compute(tile(vals, f"{what} vals")).float())
    if v.shape[-1] != 8:
        raise NKIError("shape-mismatch", f"{what}: vals holds 8 values per partition, got {vals.describe()}")
    return v


def max8(dst, src, name=None):
    """The 8 largest values of each partition, in descending order."""
    v = _searched("nisa.max8", src)
    record("vector", "max8", src.shape, dst.dtype)
    dst_write(dst, torch.topk(v, 8, dim=-1).values, "nisa.max8")


def nc_find_index8(dst, data, vals, name=None):
    """``dst[p, k]`` = the flattened index of the first element of ``data[p]`` equal to
    ``vals[p, k]`` (uint32 or uint16; a value that does not occur gives 0, where hardware is
    undefined)."""
    what = "nisa.nc_find_index8"
    d = _searched(what, data)
    v = _eight(what, data, vals)
    check_dtype(what, "dst", dst, (torch.uint32, torch.uint16), "uint32 or uint16")
    d, v = broadcast_lead(d, v)
    first = (d.unsqueeze(-2) == v.unsqueeze(-1)).int().argmax(-1)  # argmax: the first of equal maxima
    record("vector", "find_index8", data.shape, dst.dtype)
    dst_write(dst, first, what)


def nc_match_replace8(dst, data, vals, imm, dst_idx=None, name=None):
    """``dst`` = ``data`` with the first occurrence of each of the 8 ``vals[p]`` (in turn, so a
    repeated value replaces the next occurrence) replaced by the number ``imm``; ``dst_idx``
    receives the flattened indices, laid out as ``vals`` (0 for a value that does not occur)."""
    what = "nisa.nc_match_replace8"
    d = _searched(what, data, fewest=1, dims=5)
    v = _eight(what, data, vals)
    if not isinstance(imm, (int, float, np.number)):
        raise NKIError("operands", f"{what}: imm must be a number, got {type(imm).__name__}")
    d, v = broadcast_lead(d, v)
    current, found = d.clone(), []
    for k in range(8):
        hit = current == v[..., k:k + 1]
        index = hit.int().argmax(-1, keepdim=True)
        replaced = torch.where(hit.any(-1, keepdim=True), torch.tensor(float(imm)), current.gather(-1, index))
        current.scatter_(-1, index, replaced)
        found.append(index)
    record("vector", "match_replace8", data.shape, dst.dtype)
    dst_write(dst, current, what, fresh=True)
    if dst_idx is not None:
        dst_write(dst_idx, torch.cat(found, dim=-1), f"{what} dst_idx")
