"""``nki.isa`` (``nisa``): engine instructions, destination first (``dst`` is written in place)."""

import enum

import numpy as np
import torch

from torchneuron.nki import _context
from torchneuron.nki._errors import NKIError
from torchneuron.nki._batch import Unbatchable
from torchneuron.nki._ops import (check_one_psum_input, compute, dst_write, frame_constant, lead, operand, record,
                                  tile_shape, wrap_torch_errors)
from torchneuron.nki._tile import NkiTensor, borrowable, psum, sbuf

NkiValidationError = NKIError


class engine(enum.IntEnum):
    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    vector = 5
    sync = 6
    dma = 7


tensor_engine, scalar_engine, gpsimd_engine, vector_engine, unknown_engine = (
    engine.tensor, engine.scalar, engine.gpsimd, engine.vector, engine.unknown)


class reduce_cmd(enum.IntEnum):
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3


class nc_version(enum.IntEnum):
    gen2 = 2
    gen3 = 3
    gen4 = 4


def get_nc_version():
    return nc_version.gen4 if _context.current().platform.target == "trn3" else nc_version.gen3


def _torch_op(op, what):
    """The torch function of an ALU/activation op given as an nl function or a NumPy ufunc."""
    from torchneuron.nki import language
    fn = getattr(op, "torch_fn", None)
    if fn is None and isinstance(op, np.ufunc):
        name = {"true_divide": "divide", "negative": "negative"}.get(op.__name__, op.__name__)
        nl_op = getattr(language, name, None)
        fn = getattr(nl_op, "torch_fn", None)
    if fn is None:
        if op is language.copy:
            return lambda x: x
        raise NKIError("alu-op", f"{what}: {op!r} is not an NKI ALU or activation op (use nl.add, nl.exp, ...)")
    return fn


def _engine_name(eng, default):
    return default if eng in (None, engine.unknown) else engine(eng).name


def _tile(x, what):
    if not isinstance(x, NkiTensor):
        raise NKIError("operand", f"{what}: expected a tile, got {type(x).__name__}")
    return operand(x, what)


# -- data movement --------------------------------------------------------------------------------
def dma_copy(dst, src, priority=None, oob_mode=None, dge_mode=None, engine=None, name=None, mask=None, **kwargs):
    """Copies between any two memories; element counts must match, values are cast through fp32."""
    for role, t in (("dst", dst), ("src", src)):
        if not isinstance(t, NkiTensor):
            raise NKIError("operand", f"nisa.dma_copy: {role} must be a tensor or tile, got {type(t).__name__}")
    if src.buffer is psum or dst.buffer is psum:
        raise NKIError("dma-psum", f"nisa.dma_copy from {src.describe()} to {dst.describe()}: DMA does not reach "
                       "PSUM; copy PSUM tiles to SBUF with nisa.tensor_copy first")
    values = src.read(mask, what="nisa.dma_copy")
    n = lead()
    count = int(np.prod(values.shape[n:]))
    if count != int(np.prod(dst.shape)):
        raise NKIError("shape-mismatch", f"nisa.dma_copy: src {src.describe()} has {count} elements, "
                       f"dst {dst.describe()} has {int(np.prod(dst.shape))}")
    record("dma", "dma_copy", dst.shape, dst.dtype, src=src.buffer.name, dst=dst.buffer.name)
    if _can_borrow(dst, src, values, mask):
        dst.borrow(values)
        return
    dst.write(values.reshape(list(values.shape[:n]) + list(dst.shape)), mask=mask,
              what=f"nisa.dma_copy to {dst.describe()}")


def _can_borrow(dst, src, values, mask):
    """A whole fresh SBUF tile loaded from an input the kernel never writes may use its memory."""
    return (mask is None and borrowable(src) and
            dst.buffer is sbuf and dst.key is None and not dst.alloc.written and not dst.alloc.viewed and
            dst.batch == _context.current().frame and dst.dtype == values.dtype and tile_shape(values) == dst.shape)


def tensor_copy(dst, src, engine=None, name=None, mask=None, **kwargs):
    values = _tile(src, "nisa.tensor_copy src")
    record(_engine_name(engine, "vector"), "tensor_copy", dst.shape, dst.dtype)
    dst_write(dst, values, "nisa.tensor_copy", mask)


def memset(dst, value, engine=None, name=None, **kwargs):
    record(_engine_name(engine, "vector"), "memset", dst.shape, dst.dtype)
    dst_write(dst, value, "nisa.memset")


# -- tensor engine --------------------------------------------------------------------------------
def check_matmul(what, stationary, moving, s_shape, m_shape):
    """The tensor engine's operand rules: SBUF inputs, contraction on partitions, free-size limits."""
    p = _context.current().platform
    for role, t in (("stationary", stationary), ("moving", moving)):
        if isinstance(t, NkiTensor) and t.buffer is not sbuf:
            raise NKIError("matmul-operands-in-sbuf", f"{what}: the {role} operand {t.describe()} must be in SBUF")
    if len(s_shape) != 2 or len(m_shape) != 2:
        raise NKIError("matmul-shape", f"{what}: operands must be 2-D tiles, got {s_shape} and {m_shape}")
    if s_shape[0] != m_shape[0]:
        raise NKIError("matmul-contraction", f"{what}: contraction dimension mismatch: stationary[0]={s_shape[0]} "
                       f"!= moving[0]={m_shape[0]}")
    if s_shape[0] > p.pmax:
        raise NKIError("partition-dim", f"{what}: contraction (partition) dimension {s_shape[0]} exceeds maximum "
                       f"{p.pmax}")
    if s_shape[1] > p.stationary_fmax:
        raise NKIError("matmul-stationary-fmax", f"{what}: stationary free dimension {s_shape[1]} exceeds maximum "
                       f"{p.stationary_fmax}")
    if m_shape[1] > p.moving_fmax:
        raise NKIError("matmul-moving-fmax", f"{what}: moving free dimension {m_shape[1]} exceeds maximum "
                       f"{p.moving_fmax}")
    dtypes = {t.dtype for t in (stationary, moving) if isinstance(t, NkiTensor)}
    if torch.float32 in dtypes and len(dtypes) > 1:
        raise NKIError("matmul-dtype", f"{what}: if one operand is fp32 the other must be too, got "
                       f"{sorted(str(d) for d in dtypes)}")
    record("tensor", "matmul", (s_shape[1], m_shape[1]), next(iter(dtypes)) if dtypes else torch.float32,
           matmul=(s_shape[0], s_shape[1], m_shape[1]))


def _region(t):
    """Where a view lies in its PSUM tile, independent of the tile's batch dims."""
    n = len(t.batch)
    return (t.data.storage_offset(), tuple(t.data.shape[n:]), tuple(t.data.stride()[n:]))


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              accumulate=None, tile_position=(), tile_size=(), perf_mode=None, name=None, **kwargs):
    """``dst[M, N] (+)= stationary[K, M].T @ moving[K, N]`` on the tensor engine.

    accumulate=None: the first matmul into a PSUM region overwrites it and later ones add to it,
    until the region is read by another instruction or overwritten.
    """
    s = _tile(stationary, "nisa.nc_matmul stationary")
    m = _tile(moving, "nisa.nc_matmul moving")
    check_matmul("nisa.nc_matmul", stationary, moving, tile_shape(s), tile_shape(m))
    if not isinstance(dst, NkiTensor) or dst.buffer is not psum:
        raise NKIError("matmul-dst-in-psum", "nisa.nc_matmul: dst must be a PSUM tile, got "
                       f"{dst.describe() if isinstance(dst, NkiTensor) else type(dst).__name__}")
    allowed = (torch.float32, torch.bfloat16) if get_nc_version() >= nc_version.gen4 else (torch.float32,)
    if dst.dtype not in allowed:
        raise NKIError("matmul-dtype", f"nisa.nc_matmul: dst {dst.describe()} must be "
                       f"{' or '.join(str(d).replace('torch.', '') for d in allowed)} (PSUM accumulates in fp32)")
    k, mm = tile_shape(s)
    expected = (mm, k) if is_transpose else (mm, tile_shape(m)[1])
    if expected != dst.shape:
        raise NKIError("shape-mismatch", f"nisa.nc_matmul: the product has shape {expected} but dst is "
                       f"{dst.describe()}")
    groups = _groups(dst)
    region = _region(dst)
    add = accumulate if accumulate is not None else region in groups
    frame = _context.current().frame
    if not frame and not dst.batch and not is_transpose and dst.key is None and dst.dtype == torch.float32:
        if add:  # accumulate in place, as PSUM does
            dst.read(what="nisa.nc_matmul accumulate", accumulating=True)
            dst.data.addmm_(s.t().float(), m.float())
        else:
            torch.mm(s.t().float(), m.float(), out=dst.data)
            dst.alloc.written = True
            dst._mark_defined()
    else:
        product = _batched_product(s, m, dst, is_transpose, accumulate)
        if add:
            product = dst.read(what="nisa.nc_matmul accumulate", accumulating=True) + product
        dst.write(product, what="nisa.nc_matmul", fresh=True, accumulating=True)
    groups.add(region)


def _batched_product(s, m, dst, is_transpose, accumulate):
    """stationary.T @ moving for every iteration of the batched loops, summed over the loops that
    ``dst`` does not have (accumulation across those iterations) in one contraction."""
    ctx = _context.current()
    n = len(ctx.frame)
    summed = [i for i, f in enumerate(ctx.frame) if f not in dst.batch]
    if summed and dst.dtype != torch.float32:
        raise Unbatchable({ctx.frame[i] for i in summed}, "accumulating into a low-precision tile rounds at every "
                          "iteration")
    if summed and accumulate is False:
        raise Unbatchable({ctx.frame[i] for i in summed}, "matmuls of a batched loop overwrite one PSUM tile")
    if is_transpose:  # `moving` is an identity: the instruction transposes the stationary operand
        product = s.float().transpose(-1, -2).clone()
        for i in reversed(summed):
            product = product.sum(dim=i, keepdim=True)
        return product
    letters = "abcdefghijlmnopqrstuvw"[:n]  # loop dims; k, x, y name the tile dims
    kept = "".join(c for i, c in enumerate(letters) if i not in summed)
    product = torch.einsum(f"{letters}kx,{letters}ky->{kept}xy", s.float(), m.float())
    for i in summed:  # a product the same in every iteration is accumulated once per iteration
        if s.shape[i] == 1 and m.shape[i] == 1:
            product = product * ctx.loop_sizes[ctx.frame[i]]
    for i in summed:
        product = product.unsqueeze(i)
    return product


def _groups(t):
    if t.alloc.groups is None:
        t.alloc.groups = set()
    return t.alloc.groups


def nc_transpose(dst, data, engine=None, name=None, **kwargs):
    values = _tile(data, "nisa.nc_transpose")
    eng = _engine_name(engine, "tensor")
    limit = 32 if eng == "vector" else _context.current().platform.pmax
    n = lead()
    v2 = values.reshape(list(values.shape[:n]) + [values.shape[n], -1])
    shape2 = tile_shape(v2)
    if max(shape2) > limit:
        raise NKIError("transpose-size", f"nisa.nc_transpose on the {eng} engine handles up to [{limit}, {limit}], "
                       f"got {shape2}")
    if eng == "tensor" and (dst.buffer is not psum or data.buffer is not sbuf):
        raise NKIError("transpose-buffers", "nisa.nc_transpose on the tensor engine reads SBUF and writes PSUM")
    if dst.dtype != data.dtype:
        raise NKIError("dtype", f"nisa.nc_transpose: dst dtype {dst.dtype} must equal data dtype {data.dtype}")
    record(eng, "transpose", shape2, data.dtype, matmul=(shape2[0], shape2[0], shape2[1])
           if eng == "tensor" else None)
    dst_write(dst, v2.transpose(-1, -2), "nisa.nc_transpose")



# -- vector / scalar / gpsimd ---------------------------------------------------------------------
def tensor_tensor(dst, data1, data2, op, engine=None, name=None, **kwargs):
    a, b = _tile(data1, "nisa.tensor_tensor data1"), _tile(data2, "nisa.tensor_tensor data2")
    if data1.shape != data2.shape:
        raise NKIError("shape-mismatch", f"nisa.tensor_tensor: data1 {data1.describe()} and data2 "
                       f"{data2.describe()} must have the same shape (use tensor_scalar to broadcast)")
    check_one_psum_input("nisa.tensor_tensor", data1, data2)
    out = wrap_torch_errors("nisa.tensor_tensor", _torch_op(op, "nisa.tensor_tensor"), compute(a), compute(b))
    record(_engine_name(engine, "vector"), "tensor_tensor", dst.shape, dst.dtype)
    dst_write(dst, out, "nisa.tensor_tensor", fresh=True)


def _scalar_operand(x, what, data):
    """A scalar, or a (P, 1) tile broadcast along the free dims of ``data``."""
    if isinstance(x, NkiTensor):
        v = compute(operand(x, what))
        partitions = data.shape[0]
        if x.shape != (partitions, 1):
            raise NKIError("scalar-operand", f"{what}: a tile operand must have shape ({partitions}, 1), got "
                           f"{x.shape}")
        n = lead()
        return v.reshape(list(v.shape[:n]) + [partitions] + [1] * (len(data.shape) - 1))
    return x


def _apply(fn, x, y, reverse):
    if not isinstance(y, torch.Tensor):
        y = torch.tensor(y, dtype=torch.float32)
    return fn(y, x) if reverse else fn(x, y)


def tensor_scalar(dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, engine=None,
                  name=None, **kwargs):
    """``dst = (data op0 operand0) op1 operand1``; operands are scalars or (P, 1) tiles."""
    v = compute(_tile(data, "nisa.tensor_scalar data"))
    o0 = _scalar_operand(operand0, "nisa.tensor_scalar operand0", data)
    fn0 = _torch_op(op0, "nisa.tensor_scalar op0")
    out = wrap_torch_errors("nisa.tensor_scalar", _apply, fn0, v, o0, reverse0)
    if op1 is not None:
        o1 = _scalar_operand(operand1, "nisa.tensor_scalar operand1", data)
        out = wrap_torch_errors("nisa.tensor_scalar", _apply, _torch_op(op1, "nisa.tensor_scalar op1"), out, o1,
                                reverse1)
    record(_engine_name(engine, "vector"), "tensor_scalar", dst.shape, dst.dtype)
    dst_write(dst, out, "nisa.tensor_scalar", fresh=True)


_REDUCE = {"add": torch.sum, "sum": torch.sum, "maximum": torch.amax, "max": torch.amax, "minimum": torch.amin,
           "min": torch.amin, "multiply": None}


def _reducer(op, what):
    name = getattr(op, "__name__", "")
    if name not in _REDUCE:
        raise NKIError("reduce-op", f"{what}: unsupported reduce op {op!r} (nl.add, nl.maximum, nl.minimum, "
                       "nl.multiply)")
    fn = _REDUCE[name]
    if fn is None:
        return lambda v, axes, keepdim: torch.prod(v.flatten(axes[0]), dim=axes[0], keepdim=keepdim)
    return lambda v, axes, keepdim: fn(v, dim=axes, keepdim=keepdim)


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None, **kwargs):
    from torchneuron.nki.language import _axes
    v = compute(_tile(data, "nisa.tensor_reduce"))
    axes = _axes(axis, len(data.shape), "nisa.tensor_reduce")
    out = _reducer(op, "nisa.tensor_reduce")(v, axes, keepdims)
    if negate:
        out = -out
    record("vector", "tensor_reduce", data.shape, dst.dtype)
    dst_write(dst, out, "nisa.tensor_reduce", fresh=True)


def _reduce_into(out, cmd, reduce_res, what):
    """The scalar engine's per-partition accumulation registers, which persist across instructions."""
    ctx = _context.current()
    sums = _per_partition(out).sum(dim=-1, keepdim=True)
    regs = ctx.reduce_regs
    if cmd in (reduce_cmd.reset, reduce_cmd.reset_reduce) or regs is None or regs.shape[-2] != sums.shape[-2]:
        regs = torch.zeros_like(sums)
    elif ctx.frame:
        raise Unbatchable(ctx.frame, "reduce registers accumulated across iterations of a batched loop")
    if cmd in (reduce_cmd.reduce, reduce_cmd.reset_reduce):
        regs = regs + sums
    ctx.reduce_regs = regs
    if reduce_res is not None:
        dst_write(reduce_res, regs.clone(), f"{what} reduce_res")


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
               name=None, **kwargs):
    """``dst = op(data * scale + bias)`` on the scalar engine, optionally summing the result per partition."""
    v = compute(_tile(data, "nisa.activation data"))
    x = wrap_torch_errors("nisa.activation", torch.mul, v, _scalar_operand(scale, "nisa.activation scale", data))
    if bias is not None:
        x = wrap_torch_errors("nisa.activation", torch.add, x, _scalar_operand(bias, "nisa.activation bias", data))
    out = wrap_torch_errors("nisa.activation", _torch_op(op, "nisa.activation"), x)
    record("scalar", "activation", dst.shape, dst.dtype)
    dst_write(dst, out, "nisa.activation", fresh=True)
    if reduce_op is not None or reduce_res is not None:
        if reduce_op is not None and getattr(reduce_op, "__name__", "") not in ("add", "sum"):
            raise NKIError("reduce-op", "nisa.activation: reduce_op must be nl.add")
        cmd = reduce_cmd if reduce_cmd != type(reduce_cmd).idle else type(reduce_cmd).reset_reduce
        _reduce_into(out, cmd, reduce_res, "nisa.activation")


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None, **kwargs):
    activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
               reduce_cmd=globals()["reduce_cmd"].reset_reduce)


def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=reduce_cmd.idle, reduce_init=0.0, name=None,
                **kwargs):
    """``dst = exp(src - max_value)``; with reduce_res, also the per-partition sum of the result."""
    v = compute(_tile(src, "nisa.exponential"))
    out = torch.exp(v - _scalar_operand(max_value, "nisa.exponential max_value", src))
    record("vector", "exponential", dst.shape, dst.dtype)
    dst_write(dst, out, "nisa.exponential", fresh=True)
    if reduce_res is not None:
        total = _per_partition(out).sum(dim=-1, keepdim=True) + reduce_init
        dst_write(reduce_res, total, "nisa.exponential reduce_res")


def reciprocal(dst, data, name=None, **kwargs):
    v = compute(_tile(data, "nisa.reciprocal"))
    record("vector", "reciprocal", dst.shape, dst.dtype)
    dst_write(dst, torch.reciprocal(v), "nisa.reciprocal", fresh=True)


def _affine_values(shape, pattern, offset, channel_multiplier, what):
    """offset + partition * channel_multiplier + sum(index_i * step_i) over the free pattern."""
    p = shape[0]
    steps = [int(step) for step, _ in pattern]
    nums = [int(num) for _, num in pattern]
    if int(np.prod(nums)) != int(np.prod(shape[1:])):
        raise NKIError("pattern", f"{what}: the pattern {pattern} covers {int(np.prod(nums))} elements per "
                       f"partition, dst has {int(np.prod(shape[1:]))}")
    value = np.full([p] + nums, offset, dtype=np.int64)
    value += (np.arange(p) * channel_multiplier).reshape([p] + [1] * len(nums))
    for i, (step, num) in enumerate(zip(steps, nums)):
        value += (np.arange(num) * step).reshape([1] + [num if j == i else 1 for j in range(len(nums))])
    return value.reshape(shape)


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None, **kwargs):
    if dst.buffer is not sbuf:
        raise NKIError("gpsimd-sbuf", f"nisa.iota writes SBUF tiles only, got {dst.describe()}")
    values = _affine_values(dst.shape, pattern, offset, channel_multiplier, "nisa.iota")
    record("gpsimd", "iota", dst.shape, dst.dtype)
    dst_write(dst, frame_constant(torch.from_numpy(values)), "nisa.iota")


def affine_select(dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=None, offset=0, name=None,
                  **kwargs):
    """``dst = where(cmp_op(affine value, 0), on_true_tile, on_false_value)`` (e.g. causal masks)."""
    from torchneuron.nki import language
    for role, t in (("dst", dst), ("on_true_tile", on_true_tile)):
        if isinstance(t, NkiTensor) and t.buffer is not sbuf:
            raise NKIError("gpsimd-sbuf", f"nisa.affine_select: {role} {t.describe()} must be in SBUF")
    v = compute(_tile(on_true_tile, "nisa.affine_select on_true_tile"))
    values = torch.from_numpy(_affine_values(on_true_tile.shape, pattern, offset, channel_multiplier,
                                             "nisa.affine_select"))
    keep = _torch_op(cmp_op or language.equal, "nisa.affine_select cmp_op")(values, 0)
    record("gpsimd", "affine_select", dst.shape, dst.dtype)
    dst_write(dst, torch.where(keep, v, torch.tensor(float(on_false_value), device=v.device)), "nisa.affine_select")


def bn_stats(dst, data, name=None, **kwargs):
    """Per partition: (count, mean, count * variance) of the even and of the odd elements."""
    v = _per_partition(compute(_tile(data, "nisa.bn_stats")))
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


def _per_partition(v):
    """[..., P, F]: the values of each partition flattened (leading batch dims kept)."""
    n = lead()
    return v.reshape(list(v.shape[:n]) + [v.shape[n], -1])


def bn_aggr(dst, data, name=None, **kwargs):
    """Combines (count, mean, count * variance) triples into per-partition (mean, variance)."""
    v = _per_partition(compute(_tile(data, "nisa.bn_aggr")))
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


def max8(dst, src, name=None, **kwargs):
    """The 8 largest values of each partition, in descending order."""
    v = _per_partition(compute(_tile(src, "nisa.max8")))
    if not 8 <= v.shape[-1] <= 16384:
        raise NKIError("max8-size", f"nisa.max8 needs 8 to 16384 elements per partition, got {v.shape[-1]}")
    record("vector", "max8", src.shape, dst.dtype)
    dst_write(dst, torch.topk(v, 8, dim=-1).values, "nisa.max8")
