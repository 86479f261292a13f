"""``nki.isa`` GpSimd Engine instructions: ``iota``, ``affine_select``, ``tensor_partition_reduce``,
``local_gather``, ``nc_n_gather``, ``sequence_bounds``, ``nonzero_with_count``.

GpSimd reaches SBUF only. Its eight cores each own 16 consecutive partitions, which is why
``local_gather`` gathers within groups of 16 partitions and ``nonzero_with_count`` works on
partitions 0, 16, ..., 112 only. Gather indices are data: one outside its range (undefined on
hardware) reads 0 here rather than failing, as the check pass runs on scratch data.
"""

import math

import numpy as np
import torch

from torchneuron.nki import _alu
from torchneuron.nki._errors import NKIError
from torchneuron.nki.isa._common import (BITVEC, REDUCTIONS, alu, broadcast_lead, check_dtype, free_size, in_sbuf,
                                         integer_dtype, per_partition, tile)
from torchneuron.nki._ops import compute, dst_write, frame_constant, lead, record


def _affine_values(shape, pattern, offset, channel_multiplier, what):
    """offset + partition * channel_multiplier + sum(index_i * step_i) over the free pattern."""
    if not 1 <= len(pattern) <= 4:
        raise NKIError("pattern", f"{what}: the pattern has 1 to 4 [step, num] pairs, got {pattern}")
    p = shape[0]
    steps = [int(step) for step, _ in pattern]
    nums = [int(num) for _, num in pattern]
    if math.prod(nums) != math.prod(shape[1:]):
        raise NKIError("pattern", f"{what}: the pattern {pattern} covers {math.prod(nums)} elements per "
                       f"partition, dst has {math.prod(shape[1:])}")
    value = np.full([p] + nums, offset, dtype=np.int64)
    value += (np.arange(p) * channel_multiplier).reshape([p] + [1] * len(nums))
    for i, (step, num) in enumerate(zip(steps, nums)):
        value += (np.arange(num) * step).reshape([1] + [num if j == i else 1 for j in range(len(nums))])
    return value.reshape(shape)


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """``dst[p, w, z, y, x] = offset + p * channel_multiplier + w * step_w + ... + x * step_x`` for
    ``pattern = [[step_w, num_w], ..., [step_x, num_x]]`` (up to 4 pairs), in int32."""
    in_sbuf("nisa.iota", dst=dst)
    values = _affine_values(dst.shape, pattern, offset, channel_multiplier, "nisa.iota")
    record("gpsimd", "iota", dst.shape, dst.dtype)
    dst_write(dst, frame_constant(torch.from_numpy(values.astype(np.int32))), "nisa.iota")


def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=_alu.equal, offset=0,
                  name=None):
    """``dst = on_true_tile`` where ``cmp_op(affine value, 0)`` holds, else the number
    ``on_false_value``; the affine value is iota's (e.g. causal masks)."""
    what = "nisa.affine_select"
    in_sbuf(what, dst=dst, on_true_tile=on_true_tile)
    if not isinstance(on_false_value, (int, float, np.number)):
        raise NKIError("operands", f"{what}: on_false_value must be a number, got {type(on_false_value).__name__}")
    v = compute(tile(on_true_tile, f"{what} on_true_tile"))
    values = torch.from_numpy(_affine_values(on_true_tile.shape, pattern, offset, channel_multiplier, what))
    keep = alu(cmp_op, f"{what} cmp_op")[1](values, 0)
    record("gpsimd", "affine_select", dst.shape, dst.dtype)
    dst_write(dst, torch.where(keep, v, torch.tensor(float(on_false_value), device=v.device)), what)


def tensor_partition_reduce(dst, op, data, name=None):
    """``dst[0, ...] = op`` reduced across the partitions of ``data`` (add, maximum, bitwise_or,
    bitwise_and): ``dst`` has one partition and ``data``'s free layout."""
    what = "nisa.tensor_partition_reduce"
    op_name = alu(op, f"{what} op")[0]
    if op_name not in ("add", "maximum", "bitwise_or", "bitwise_and"):
        raise NKIError("reduce-op", f"{what}: op must be nl.add, nl.maximum, nl.bitwise_or or nl.bitwise_and, got "
                       f"nl.{op_name}")
    in_sbuf(what, dst=dst, data=data)
    if dst.shape[0] != 1 or free_size(dst) != free_size(data):
        raise NKIError("shape-mismatch", f"{what}: dst {dst.describe()} must have 1 partition and the "
                       f"{free_size(data)} elements per partition of data")
    v = compute(tile(data, what))
    if op_name in BITVEC:
        integer_dtype(what, "data", data)
    else:
        v = v.float()
    n = lead()
    out = REDUCTIONS[op_name](v.movedim(n, -1)).movedim(-1, n)
    record("gpsimd", "partition_reduce", data.shape, dst.dtype)
    dst_write(dst, out, what)


def _gather(values, index):
    """``values[..., index]`` along the last dim; out-of-range indices read 0."""
    values, index = broadcast_lead(values, index.long())
    inside = (index >= 0) & (index < values.shape[-1])
    gathered = values.gather(-1, index.clamp(0, max(values.shape[-1] - 1, 0)))
    return torch.where(inside, gathered, torch.zeros((), dtype=gathered.dtype))


def local_gather(dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None):
    """Each GpSimd core (16 partitions) flattens its part of ``index`` partition by partition
    (``index[0, 0], index[1, 0], ..., index[15, 0], index[0, 1], ...``) and keeps the first
    ``num_valid_indices``; then every partition of the core gathers ``num_elem_per_idx``
    consecutive elements of its own ``src_buffer`` row from each index (an element offset in the
    flattened free dims): ``dst[p] = concat(src[p, i:i + num_elem_per_idx] for i in indices)``."""
    what = "nisa.local_gather"
    in_sbuf(what, dst=dst, src_buffer=src_buffer, index=index)
    check_dtype(what, "index", index, (torch.uint16,), "uint16")
    p = src_buffer.shape[0]
    if index.shape[0] != p or p % 16:
        raise NKIError("shape-mismatch", f"{what}: src_buffer and index have the same number of partitions, a "
                       f"multiple of 16; got {src_buffer.describe()} and {index.describe()}")
    if num_elem_per_idx not in (1, 2, 4, 8, 16, 32):
        raise NKIError("operands", f"{what}: num_elem_per_idx is 1, 2, 4, 8, 16 or 32, got {num_elem_per_idx!r}")
    per_core = 16 * free_size(index)
    valid = per_core if num_valid_indices is None else int(num_valid_indices)
    if per_core > 4096 or not 0 < valid <= per_core:
        raise NKIError("operands", f"{what}: a core gathers with up to 4096 indices and at most the {per_core} its "
                       f"16 partitions of index hold; got {per_core} and num_valid_indices={num_valid_indices!r}")
    if dst.dtype != src_buffer.dtype:
        raise NKIError("dtype", f"{what}: dst {dst.describe()} must have src_buffer's dtype (no casting)")
    n = lead()
    src = per_partition(tile(src_buffer, f"{what} src_buffer"))
    idx = per_partition(tile(index, f"{what} index"))
    cores = p // 16
    lanes = idx.reshape(list(idx.shape[:n]) + [cores, 16, -1]).transpose(-1, -2)
    offsets = lanes.reshape(list(idx.shape[:n]) + [cores, 1, -1])[..., :valid].long()
    offsets = (offsets.unsqueeze(-1) + torch.arange(num_elem_per_idx)).flatten(-2)
    out = _gather(src.reshape(list(src.shape[:n]) + [cores, 16, -1]), offsets.expand(
        list(offsets.shape[:-2]) + [16, offsets.shape[-1]]))
    record("gpsimd", "local_gather", dst.shape, dst.dtype)
    dst_write(dst, out.reshape(list(out.shape[:-3]) + [p, -1]), what)


def nc_n_gather(dst, data, indices, name=None):
    """``dst[p, ...] = data[p].flatten()[indices[p, ...]]``: a gather within each partition
    (``indices`` uint32, ``dst`` laid out as ``indices`` with ``data``'s dtype)."""
    what = "nisa.nc_n_gather"
    in_sbuf(what, dst=dst, data=data, indices=indices)
    check_dtype(what, "indices", indices, (torch.uint32,), "uint32")
    if dst.dtype != data.dtype:
        raise NKIError("dtype", f"{what}: dst {dst.describe()} must have data's dtype")
    if not data.shape[0] == indices.shape[0] == dst.shape[0] or free_size(dst) != free_size(indices):
        raise NKIError("shape-mismatch", f"{what}: data, indices and dst have the same partitions, and dst the "
                       "number of elements per partition of indices")
    values = per_partition(tile(data, f"{what} data"))
    out = _gather(values, per_partition(tile(indices, f"{what} indices")))
    record("gpsimd", "n_gather", dst.shape, dst.dtype)
    dst_write(dst, out, what)


def sequence_bounds(dst, segment_ids, name=None):
    """For a (1, n) row of segment ids, ``dst[0, 0, i]`` is the index where element i's segment
    starts and ``dst[0, 1, i]`` the index just past its end; id 0 marks padding (start n, end -1)."""
    what = "nisa.sequence_bounds"
    in_sbuf(what, dst=dst, segment_ids=segment_ids)
    for role, t in (("segment_ids", segment_ids), ("dst", dst)):
        check_dtype(what, role, t, (torch.float32, torch.int32), "float32 or int32")
    if segment_ids.shape[0] != 1 or dst.shape[0] != 1 or free_size(dst) != 2 * free_size(segment_ids):
        raise NKIError("shape-mismatch", f"{what}: segment_ids is (1, n) and dst (1, 2, n), got "
                       f"{segment_ids.describe()} and {dst.describe()}")
    ids = per_partition(tile(segment_ids, what))
    count = ids.shape[-1]
    position = torch.arange(count)
    differs = ids[..., 1:] != ids[..., :-1]
    edge = torch.ones_like(ids[..., :1], dtype=torch.bool)
    starts = torch.where(torch.cat([edge, differs], -1), position, 0).cummax(-1).values
    ends = torch.where(torch.cat([differs, edge], -1), position + 1, count).flip(-1).cummin(-1).values.flip(-1)
    padding = ids == 0
    out = torch.stack([torch.where(padding, count, starts), torch.where(padding, -1, ends)], dim=-2)
    record("gpsimd", "sequence_bounds", dst.shape, dst.dtype)
    dst_write(dst, out, what)


def nonzero_with_count(dst, src, index_offset=0, padding_val=-1, name=None):
    """On partitions 0, 16, ..., 112 (each GpSimd core's first; the others of ``dst`` are left as
    they are): the indices (plus ``index_offset``) of the T elements' nonzero ones, then
    ``padding_val`` up to T, then their count: T + 1 int32 values per partition."""
    what = "nisa.nonzero_with_count"
    in_sbuf(what, dst=dst, src=src)
    check_dtype(what, "src", src, (torch.float32, torch.int32), "float32 or int32")
    check_dtype(what, "dst", dst, (torch.int32,), "int32")
    if not all(isinstance(x, (int, np.integer)) for x in (index_offset, padding_val)):
        raise NKIError("operands", f"{what}: index_offset and padding_val are int32 constants")
    if dst.shape[0] != src.shape[0] or free_size(dst) != free_size(src) + 1:
        raise NKIError("shape-mismatch", f"{what}: dst {dst.describe()} must have src's partitions and one element "
                       f"per partition more than src {src.describe()}")
    first = np.arange(src.shape[0]) % 16 == 0  # each core's first partition
    v = per_partition(src.read(mask=_rows(first, src.shape), what=what))
    nonzero = v != 0
    order = torch.sort((~nonzero).to(torch.uint8), dim=-1, stable=True).indices  # nonzero positions first
    count = nonzero.sum(-1, keepdim=True)
    position = torch.arange(v.shape[-1])
    out = torch.cat([torch.where(position < count, order + int(index_offset), int(padding_val)), count], dim=-1)
    record("gpsimd", "nonzero_with_count", src.shape, dst.dtype)
    dst_write(dst, out, what, mask=_rows(first, dst.shape))


def _rows(partitions, shape):
    """A mask of ``shape`` keeping the partitions flagged in ``partitions``."""
    return np.broadcast_to(partitions.reshape([-1] + [1] * (len(shape) - 1)), shape)
