"""``nki.isa`` element-wise, copy, reduction and partition-shuffle instructions of the Vector
Engine (several of which may also run on the Scalar or GpSimd Engine)."""

import numpy as np
import torch

import torchneuron.nki.isa.constants as C
from torchneuron.nki import _alu
from torchneuron.nki._batch import Affine
from torchneuron.nki._errors import NKIError
from torchneuron.nki.isa._common import (BITVEC, REDUCTIONS, alu, alu_stage, buffer_of, check_dtype, engine_name,
                                         free_size, has, integer_dtype, not_in_psum, packed_move, per_partition,
                                         same_layout, shaped, tile)
from torchneuron.nki._ops import check_one_psum_input, compute, dst_write, lead, record, wrap_torch_errors
from torchneuron.nki._tile import NkiTensor, psum


def tensor_copy(dst, src, engine=C.engine.unknown, name=None, mask=None):
    """``dst = src`` on chip (same partitions and elements per partition); casts go through fp32.
    Packed MX tiles are copied bit for bit, to a tile of the same packed dtype."""
    what = "nisa.tensor_copy"
    eng = engine_name(engine, what, ("vector", "scalar", "gpsimd"), "vector")
    if eng == "gpsimd":
        not_in_psum(what, dst=dst, src=src)
    raw = packed_move(what, dst, src)
    values = tile(src, f"{what} src", raw=raw)
    record(eng, "tensor_copy", dst.shape, dst.dtype)
    dst_write(dst, values, what, mask, raw=raw)


def tensor_copy_predicated(dst, src, predicate, reverse_pred=False, name=None):
    """``dst = src`` where ``predicate`` is nonzero (zero with ``reverse_pred``); elsewhere ``dst``
    keeps its values. ``src`` is a tile or a number."""
    what = "nisa.tensor_copy_predicated"
    pred = tile(predicate, f"{what} predicate")
    check_dtype(what, "predicate", predicate, (torch.uint8, torch.uint16, torch.uint32), "uint8, uint16 or uint32")
    same_layout(what, "dst", dst, predicate=predicate, src=src)
    take = shaped(pred != 0, dst.shape) != bool(reverse_pred)
    # Outside batched loops only the selected elements are read and written: the others of src
    # and dst need not hold data.
    selective = not lead() and dst.key is None and not dst.batch
    if isinstance(src, NkiTensor):
        if src.dtype != dst.dtype:
            raise NKIError("dtype", f"{what}: src {src.describe()} and dst {dst.describe()} must have the same dtype")
        check_one_psum_input(what, src, predicate)
        if selective and src.shape == dst.shape:
            src._check_on_chip(f"{what} src")
            values = src.read(mask=take.numpy(), what=f"{what} src")
        else:
            values = shaped(tile(src, f"{what} src"), dst.shape)
    elif isinstance(src, (bool, int, float, np.number)):
        values = src
    else:
        raise NKIError("operand", f"{what}: src must be a tile or a number, got {type(src).__name__}")
    record("vector", "tensor_copy_predicated", dst.shape, dst.dtype)
    if selective:
        full = values if isinstance(values, torch.Tensor) else torch.as_tensor(values).expand(dst.shape)
        dst.write(full, mask=take.numpy(), what=what)
        return
    kept = dst.read(what=f"{what} dst (kept where the predicate is false)")
    dst_write(dst, torch.where(take, values, kept), what)


def memset(dst, value, engine=C.engine.unknown, name=None):
    """Fills ``dst`` with the constant ``value`` (an int for an integer tile)."""
    what = "nisa.memset"
    eng = engine_name(engine, what, ("vector", "gpsimd"), "vector")
    if eng == "gpsimd":
        not_in_psum(what, dst=dst)
    if not isinstance(value, (bool, int, float, np.number, Affine)):
        raise NKIError("memset-value", f"{what}: value must be a number, got {type(value).__name__}")
    if isinstance(dst, NkiTensor) and not dst.dtype.is_floating_point and isinstance(value, (float, np.floating)):
        raise NKIError("memset-value", f"{what}: {dst.describe()} holds integers; value {value!r} must be an int")
    raw = isinstance(dst, NkiTensor) and dst.packed is not None
    if raw and not (isinstance(value, (bool, int, float, np.number)) and value == 0):
        raise NKIError("memset-value", f"{what}: {dst.describe()} holds packed MX values; memset can only clear it "
                       f"(value 0, all bits zero), got {value!r}")
    record(eng, "memset", dst.shape, dst.dtype)
    dst_write(dst, value, what, raw=raw)


def tensor_tensor(dst, data1, data2, op, engine=C.engine.unknown, name=None):
    """``dst = data1 op data2`` element-wise (same partitions and elements per partition, no
    broadcasting: tensor_scalar broadcasts a (P, 1) operand)."""
    what = "nisa.tensor_tensor"
    op_name, fn, arity = alu(op, f"{what} op")
    if arity != 2:
        raise NKIError("alu-op", f"{what}: op must be a binary ALU op, got nl.{op_name}")
    a, b = tile(data1, f"{what} data1"), tile(data2, f"{what} data2")
    same_layout(what, "data1", data1, data2=data2)
    check_one_psum_input(what, data1, data2)
    tiles = {"data1": data1, "data2": data2, "dst": dst}
    if op_name in BITVEC:
        for role, t in tiles.items():
            integer_dtype(what, role, t)
    # 32-bit integer math runs exactly on GpSimd, unless an operand is in PSUM; power needs GpSimd
    integers = all(getattr(t, "dtype", None) in (torch.int32, torch.uint32) for t in tiles.values())
    in_psum = any(buffer_of(t) is psum for t in tiles.values())
    default = "gpsimd" if op_name == "power" or (integers and not in_psum) else "vector"
    eng = engine_name(engine, what, ("vector", "gpsimd"), default)
    if eng == "gpsimd":
        not_in_psum(what, **tiles)
    a, b = compute(a), shaped(compute(b), data1.shape)
    if op_name not in BITVEC and eng == "vector":
        a, b = a.float(), b.float()
    out = wrap_torch_errors(what, fn, a, b)
    record(eng, "tensor_tensor", dst.shape, dst.dtype)
    dst_write(dst, out, what, fresh=True)


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False,
                  engine=C.engine.unknown, name=None):
    """``dst = (data op0 operand0) op1 operand1``: operands are numbers or (P, 1) tiles broadcast
    along the free dims; ``reverse`` swaps an op's operands; a unary op0/op1 (nl.abs, nl.rsqrt)
    takes operand None or 0."""
    what = "nisa.tensor_scalar"
    v = compute(tile(data, f"{what} data"))
    if op1 is None and operand1 is not None:
        raise NKIError("operands", f"{what}: operand1 is given without op1")
    stages = [alu_stage(what, op0, operand0, 0, data) + (reverse0,)]
    if op1 is not None:
        stages.append(alu_stage(what, op1, operand1, 1, data) + (reverse1,))
    names = [s[0] for s in stages]
    bitvec = {n in BITVEC for n in names}
    if len(bitvec) > 1:
        raise NKIError("alu-op", f"{what}: op0 and op1 must both be bitvec or both arithmetic ops, got "
                       f"{' and '.join('nl.' + n for n in names)}")
    eng = engine_name(engine, what, ("vector", "scalar", "gpsimd"), "vector")
    if True in bitvec:
        integer_dtype(what, "data", data)
        integer_dtype(what, "dst", dst)
        if eng != "vector":
            raise NKIError("engine", f"{what}: bitvec ops run on the vector engine only")
    else:
        v = v.float()
    if eng == "gpsimd":
        if names != ["rsqrt"]:
            raise NKIError("engine", f"{what} runs on the gpsimd engine for nl.rsqrt only")
        not_in_psum(what, data=data, dst=dst, operand0=operand0)
    if eng == "scalar" and not has("any tensor_scalar op on the scalar engine") and \
            names not in (["multiply", "add"], ["multiply"], ["add"]):
        raise NKIError("engine", f"{what} on the trn2 scalar engine supports (multiply, add), multiply and add, "
                       f"got {', '.join(names)}")
    out = v
    for _, fn, reverse in stages:
        out = wrap_torch_errors(what, fn, out, reverse)
    record(eng, "tensor_scalar", dst.shape, dst.dtype)
    dst_write(dst, out, what, fresh=True)


def scalar_tensor_tensor(dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, reduce_cmd=None,
                         reduce_op=None, reduce_res=None, name=None):
    """``dst = (data op0 operand0) op1 operand1`` with arithmetic ops: ``operand0`` a number or a
    (P, 1) tile, ``operand1`` a tile laid out as ``data``. The reduce parameters of the latest
    reference are refused (see docs/nki.md: what they reduce is not specified)."""
    what = "nisa.scalar_tensor_tensor"
    given = [n for n, v in (("reduce_cmd", reduce_cmd), ("reduce_op", reduce_op), ("reduce_res", reduce_res))
             if v is not None]
    if given:
        raise NKIError("not-emulated", f"{what}: {', '.join(given)} not emulated: the reference lists the reduce "
                       "parameters in the signature without specifying what is reduced (dst, the op0 stage?) or how "
                       "reduce_cmd drives the accumulation registers; reduce dst with nisa.tensor_reduce or use "
                       "nisa.tensor_scalar_reduce")
    v = compute(tile(data, f"{what} data")).float()
    for i, op in enumerate((op0, op1)):
        op_name, _, arity = alu(op, f"{what} op{i}")
        if op_name in BITVEC or arity != 2:
            raise NKIError("alu-op", f"{what}: op0 and op1 must be binary arithmetic ops, got nl.{op_name}")
    stage0 = alu_stage(what, op0, operand0, 0, data)[1]
    fn1 = alu(op1, f"{what} op1")[1]
    if not isinstance(operand1, NkiTensor):
        raise NKIError("operand", f"{what}: operand1 must be a tile, got {type(operand1).__name__}")
    same_layout(what, "data", data, operand1=operand1, dst=dst)
    check_one_psum_input(what, data, operand1)
    other = shaped(compute(tile(operand1, f"{what} operand1")).float(), data.shape)
    tmp = wrap_torch_errors(what, stage0, v, reverse0)
    out = wrap_torch_errors(what, fn1, other, tmp) if reverse1 else wrap_torch_errors(what, fn1, tmp, other)
    record("vector", "scalar_tensor_tensor", dst.shape, dst.dtype)
    dst_write(dst, out, what, fresh=True)


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """``dst = op`` reduced over ``axis`` (the last free axes), times -1 with ``negate``
    (arithmetic ops only); the reduced axes stay as size 1 with ``keepdims``."""
    what = "nisa.tensor_reduce"
    op_name = alu(op, f"{what} op")[0]
    if op_name not in REDUCTIONS:
        raise NKIError("reduce-op", f"{what}: nl.{op_name} is not a reduction op ({', '.join(REDUCTIONS)})")
    v = compute(tile(data, what))
    axes = _alu.reduction_axes(axis, len(data.shape), what)
    if op_name in BITVEC:
        integer_dtype(what, "data", data)
        integer_dtype(what, "dst", dst)
        if negate:
            raise NKIError("operands", f"{what}: negate applies to arithmetic reductions, not nl.{op_name}")
    else:
        v = v.float()
    reduced = REDUCTIONS[op_name](v.flatten(axes[0]))
    out = reduced.reshape(list(v.shape[:axes[0]]) + [1] * len(axes)) if keepdims else reduced.squeeze(-1)
    if negate:
        out = -out.float()
    record("vector", "tensor_reduce", data.shape, dst.dtype)
    dst_write(dst, out, what, fresh=True)


def reciprocal(dst, data, name=None):
    """``dst = 1 / data`` in fp32 on the vector engine."""
    v = compute(tile(data, "nisa.reciprocal"))
    record("vector", "reciprocal", dst.shape, dst.dtype)
    dst_write(dst, torch.reciprocal(v.float()), "nisa.reciprocal", fresh=True)


def bn_stats(dst, data, name=None):
    """Per partition: (count, mean, count * variance) of the even and of the odd elements."""
    v = per_partition(compute(tile(data, "nisa.bn_stats")).float())
    if v.shape[-1] > 512:
        raise NKIError("bn-stats-fmax", f"nisa.bn_stats handles at most 512 elements per partition, got {v.shape[-1]}")
    parts = []
    for half in (v[..., 0::2], v[..., 1::2]):
        n = half.shape[-1]
        mean = half.mean(dim=-1, keepdim=True) if n else torch.zeros_like(v[..., :1])
        m2 = ((half - mean) ** 2).sum(dim=-1, keepdim=True)
        parts += [torch.full_like(mean, n), mean, m2]
    record("vector", "bn_stats", data.shape, dst.dtype)
    dst_write(dst, torch.cat(parts, dim=-1), "nisa.bn_stats")


def bn_aggr(dst, data, name=None):
    """Combines (count, mean, count * variance) triples into per-partition (mean, variance)."""
    v = per_partition(compute(tile(data, "nisa.bn_aggr")).float())
    if v.shape[-1] % 3:
        raise NKIError("bn-aggr-layout", f"nisa.bn_aggr reads (count, mean, count*var) triples; {v.shape[-1]} values "
                       "per partition is not a multiple of 3")
    t = v.reshape(list(v.shape[:-1]) + [-1, 3])
    count, mean, m2 = t[..., 0], t[..., 1], t[..., 2]
    total = count.sum(dim=-1, keepdim=True)
    mu = (count * mean).sum(dim=-1, keepdim=True) / total
    var = (m2 + count * (mean - mu) ** 2).sum(dim=-1, keepdim=True) / total
    record("vector", "bn_aggr", data.shape, dst.dtype)
    dst_write(dst, torch.cat([mu, var], dim=-1), "nisa.bn_aggr")


def nc_stream_shuffle(dst, src, shuffle_mask, name=None):
    """Moves partitions within each quadrant of 32: ``dst[32q + i] = src[32q + shuffle_mask[i]]``
    (partitions counted from each tile's start); a mask entry of 255 leaves ``dst[32q + i]`` as it is."""
    what = "nisa.nc_stream_shuffle"
    values = per_partition(tile(src, f"{what} src"))
    if not isinstance(dst, NkiTensor) or dst.dtype != src.dtype or free_size(dst) != free_size(src):
        raise NKIError("shape-mismatch", f"{what}: dst must have src's dtype and number of elements per partition")
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != 32 or any(not (0 <= m < 32 or m == 255) for m in mask):
        raise NKIError("stream-shuffle", f"{what}: shuffle_mask is 32 source partitions (0-31, or 255 to keep a "
                       f"partition), got {shuffle_mask!r}")
    rows = [(p // 32) * 32 + mask[p % 32] for p in range(dst.shape[0])]
    moved = [mask[p % 32] != 255 for p in range(dst.shape[0])]
    for p, (row, m) in enumerate(zip(rows, moved)):
        if m and row >= src.shape[0]:
            raise NKIError("stream-shuffle", f"{what}: dst partition {p} reads src partition {row}, but src "
                           f"{src.describe()} has {src.shape[0]}")
    index = torch.tensor([row if m else 0 for row, m in zip(rows, moved)])
    out = values.index_select(lead(), index)
    keep = None if all(moved) else np.broadcast_to(np.array(moved).reshape([-1] + [1] * (len(dst.shape) - 1)),
                                                      dst.shape)
    record("vector", "stream_shuffle", dst.shape, dst.dtype)
    dst_write(dst, out, what, mask=keep)
