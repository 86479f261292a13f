"""``nki.language`` (``nl``): tiles, memory movement, math, reductions, loops and SPMD ids."""

import builtins
import math

import numpy as np
import torch

from torchneuron.nki import _alu, _context, _dtypes
from torchneuron.nki._alu import reduction_axes, tensor_args
from torchneuron.nki._batch import Affine, RuntimeInt, Unbatchable
from torchneuron.nki._errors import NKIError, kernel_position
from torchneuron.nki._ops import (as_dtype, check_one_psum_input, check_partitions, compute, lead, make_result,
                                  operand, record, result_dtype, tile_shape, wrap_torch_errors)
from torchneuron.nki.isa._tensor import check_matmul
from torchneuron.nki._tile import (IndexExpr, NkiTensor, ParDim, borrowable, ds, hbm, new_tile, private_hbm, psum, sbuf,
                                   shared_hbm)

__all__ = ["sbuf", "psum", "hbm", "shared_hbm", "private_hbm", "ds", "tile_size"]

# -- dtypes (torch dtypes, so ``dtype=a.dtype`` of a torch tensor works too) ---------------------
bool_ = torch.bool
bool = torch.bool  # noqa: A001 - nl.bool, as NKI names it
int8, int16, int32 = torch.int8, torch.int16, torch.int32
uint8, uint16, uint32 = torch.uint8, torch.uint16, torch.uint32
float16, float32, bfloat16 = torch.float16, torch.float32, torch.bfloat16
tfloat32 = torch.float32  # stored as fp32; the tensor engine's tf32 rounding is not modelled
float8_e4m3 = float8_e4m3fn = torch.float8_e4m3fn
float8_e5m2 = torch.float8_e5m2
float8_e8m0fnu = torch.float8_e8m0fnu  # MX scales (a power of two: 2 ** (bits - 127))
# NeuronCore-v4 packed MX dtypes (four fp8 / fp4 values per element; no torch dtype, see _dtypes)
float8_e5m2_x4, float8_e4m3fn_x4, float4_e2m1fn_x4 = _dtypes.float8_e5m2_x4, _dtypes.float8_e4m3fn_x4, \
    _dtypes.float4_e2m1fn_x4


class _TileSize:
    """``nl.tile_size``: the tile limits of the platform target in use."""

    def _p(self):
        try:
            return _context.current().platform
        except NKIError:
            return _context.Platform.named()

    pmax = property(lambda self: self._p().pmax)
    gemm_stationary_fmax = property(lambda self: self._p().stationary_fmax)
    gemm_moving_fmax = property(lambda self: self._p().moving_fmax)
    psum_fmax = psum_bank_fmax = property(lambda self: self._p().psum_bank_fp32)
    psum_bank_fmax_bytes = property(lambda self: self._p().psum_bank_bytes)
    psum_num_banks = property(lambda self: self._p().psum_banks)
    sbuf_fmax_bytes = total_available_sbuf_size = property(lambda self: self._p().sbuf_partition_bytes)
    bn_stats_fmax = 512


tile_size = _TileSize()


# -- creation ------------------------------------------------------------------------------------
def _hbm_tensor(shape, dtype, buffer, name):
    """shared_hbm tensors are shared by the programs of a grid: the i-th declaration of every program
    is the same tensor. In the run pass they are the buffers the check pass declared."""
    ctx = _context.current()
    if buffer is not shared_hbm:
        return new_tile(shape, dtype, buffer, name=name or "hbm tensor")
    index, ctx.cursor = ctx.cursor, ctx.cursor + 1
    if index < len(ctx.outputs):
        t = ctx.outputs[index]
        packed = _dtypes.packed_of(dtype)
        if not t.alloc.written and packed is not None and t.packed is None and t.data.dtype == packed.storage:
            t.packed = packed  # the run pass's buffer of a packed output: its bits (the plan keeps storage dtypes)
        if t.shape != shape or t.dtype != dtype:
            raise NKIError("output-declaration", f"shared_hbm tensor {index} is declared as {shape} {dtype} here but "
                           f"as {t.shape} {t.dtype} by another program or when the kernel was checked")
        return t
    if ctx.preset_outputs is not None:
        raise NKIError("output-declaration", "the kernel declared more shared_hbm tensors than when it was "
                       "checked; declarations must not depend on data")
    t = new_tile(shape, dtype, buffer, name=name or f"output {index}")
    ctx.outputs.append(t)
    return t


def ndarray(shape, dtype, buffer=None, name="", address=None, **kwargs):
    """An uninitialised tensor (HBM) or tile (SBUF, the default, or PSUM). ``address`` (an
    explicit placement on chip) is accepted; the emulator places tiles itself."""
    buffer = sbuf if buffer is None else buffer
    if isinstance(buffer, str):
        raise NKIError("buffer", f"nl.ndarray: buffer={buffer!r}: pass the buffer itself (nl.{buffer}), not its name")
    shape = shape if isinstance(shape, (tuple, list)) else (shape,)
    shape = tuple(n if isinstance(n, ParDim) else int(n) for n in shape)
    dtype = as_dtype(dtype, packed=True, what="nl.ndarray")
    if not buffer.on_chip:
        return _hbm_tensor(shape, dtype, buffer, name)
    return new_tile(shape, dtype, buffer, name=name or "tile")


def full(shape, fill_value, dtype, buffer=None, name="", **kwargs):
    t = ndarray(shape, dtype, buffer=buffer, name=name)
    record("vector" if t.buffer.on_chip else "dma", "memset", t.shape, t.dtype)
    if t.packed is not None and fill_value == 0:  # all bits zero: +0.0 in every packed format
        t.write(0, what="nl.full", raw=True)
    else:
        t.write(fill_value, what="nl.full")
    return t


def zeros(shape, dtype, buffer=None, name="", **kwargs):
    return full(shape, 0, dtype, buffer=buffer, name=name)


def ones(shape, dtype, buffer=None, name="", **kwargs):
    return full(shape, 1, dtype, buffer=buffer, name=name)


def empty_like(a, dtype=None, buffer=None, name="", **kwargs):
    return ndarray(a.shape, dtype or a.dtype, buffer=buffer if buffer is not None else a.buffer, name=name)


def zeros_like(a, dtype=None, buffer=None, name="", **kwargs):
    return zeros(a.shape, dtype or a.dtype, buffer=buffer if buffer is not None else a.buffer, name=name)


def ones_like(a, dtype=None, buffer=None, name="", **kwargs):
    return ones(a.shape, dtype or a.dtype, buffer=buffer if buffer is not None else a.buffer, name=name)


def shared_constant(constant, dtype=None, **kwargs):
    """A constant (a NumPy array, or anything ``np.asarray`` takes) as a tensor in shared HBM."""
    values = torch.from_numpy(np.array(constant))
    if dtype is not None:
        values = values.to(as_dtype(dtype))
    return new_tile(values.shape, values.dtype, shared_hbm, name="shared constant", data=values.clone(), written=True)


def shared_identity_matrix(n, dtype=None, dst=None, **kwargs):
    """An n x n identity matrix in SBUF (the moving operand of a transposing matmul)."""
    eye = torch.eye(int(n), dtype=as_dtype(dtype) or torch.uint8)
    if dst is None:
        return make_result(eye, eye.dtype, "nl.shared_identity_matrix")
    dst.write(eye, what="nl.shared_identity_matrix")
    return dst


class NKIObject:
    """Base of configuration objects used inside kernels: the class attributes (and annotated
    fields) are the constructor's keywords, in the manner of a dataclass (a ``@dataclass``
    subclass keeps its own ``__init__``). Instances stay ordinary, mutable Python objects."""

    def __init__(self, *args, **kwargs):
        fields = self._fields()
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__name__}() takes at most {len(fields)} positional arguments "
                            f"({len(args)} given)")
        for name, value in zip(fields, args):
            kwargs.setdefault(name, value)
        unknown = set(kwargs) - set(fields) - set(dir(type(self)))
        if unknown:
            raise TypeError(f"{type(self).__name__}() got unexpected keyword arguments {sorted(unknown)}")
        for name, value in kwargs.items():
            setattr(self, name, value)
        post_init = getattr(self, "__post_init__", None)
        if post_init is not None:
            post_init()

    @classmethod
    def _fields(cls):
        """Annotated fields, base classes first, in declaration order."""
        names = []
        for klass in reversed(cls.__mro__):
            for name in getattr(klass, "__annotations__", {}):
                if name not in names:
                    names.append(name)
        return names

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


def is_hbm(buffer):
    return not buffer.on_chip


def is_on_chip(buffer):
    return buffer.on_chip


def is_sbuf(buffer):
    return buffer is sbuf


def is_psum(buffer):
    return buffer is psum


def par_dim(n):
    """Marks the partition dimension in a shape: dimensions before it are block dimensions (each
    block a tile of its own); without a mark the first dimension is the partition dimension."""
    return ParDim(int(n))


# -- index expressions ---------------------------------------------------------------------------
def arange(start, stop=None, step=1):
    if stop is None:
        start, stop = 0, start
    return IndexExpr(np.arange(int(start), int(stop), int(step)))


class _MGrid:
    def __getitem__(self, key):
        return tuple(IndexExpr(a) for a in np.mgrid[key])


mgrid = _MGrid()


# -- loops and SPMD ids --------------------------------------------------------------------------
def _range(kind, start, stop, step):
    for v in (start, stop, step):
        if isinstance(v, Affine):
            raise Unbatchable(v.coeffs, f"nl.{kind} bounds depend on a batched loop variable")
        if v is not None and not isinstance(v, (int, np.integer)):
            raise NKIError("loop-bounds", f"nl.{kind} bounds must be integers known when the kernel is traced, "
                           f"got {type(v).__name__}")
    return builtins.range(start, stop, step) if stop is not None else builtins.range(start)


def affine_range(start, stop=None, step=1):
    """Iterations without loop-carried dependencies (accumulation into a tile is allowed); the run
    pass may execute them all at once (see _batch)."""
    iterations = _range("affine_range", start, stop, step)
    ctx = _context.current()
    if len(iterations) > 1:
        ctx.batchable = True
    if ctx.batching and len(iterations) > 1:
        site = kernel_position()
        if site not in ctx.unbatchable:
            return _batched(ctx, site, iterations)
    return iterations


def _batched(ctx, site, iterations):
    loop = ctx.push_loop(site, len(iterations))
    try:
        yield Affine(iterations.start, {loop: iterations.step})
    finally:
        ctx.pop_loop(loop)


def dynamic_range(start, stop=None, step=1):
    """A loop run by the hardware, whose bounds may be registers (``nisa.register_alloc``) holding
    values read from tiles: the emulator reads them when the loop starts. With a register bound
    the induction variable is a ``RuntimeInt``: an access-pattern offset made from it is checked
    against the tensor with the real values (the run pass), not the check pass's scratch data."""
    if isinstance(step, RuntimeInt) or (not isinstance(step, (int, np.integer)) and hasattr(step, "__index__")):
        raise NKIError("loop-bounds", "nl.dynamic_range: the step must be an int known when the kernel is traced "
                       f"(the hardware loop encodes it as an immediate), got {type(step).__name__}")
    dynamic = builtins.any(_from_data(v) for v in (start, stop))
    start = _register_value(start)
    stop = _register_value(stop) if stop is not None else None
    iterations = _range("dynamic_range", start, stop, step)
    return [RuntimeInt(i) for i in iterations] if dynamic else iterations


def _from_data(x):
    """Whether a loop bound is a value read from data (a register, or arithmetic on one)."""
    return isinstance(x, RuntimeInt) or (not isinstance(x, (int, np.integer, Affine, type(None)))
                                         and hasattr(x, "__index__"))


def _register_value(x):
    if isinstance(x, (int, np.integer, Affine)):
        return x
    if hasattr(x, "__index__"):
        return int(x.__index__())
    return x


def fori_loop(lower, upper, body_fun, step=1):
    """``for i in dynamic_range(lower, upper, step): body_fun(i)`` (state lives in tiles)."""
    for i in dynamic_range(lower, upper, step):
        body_fun(i)


class no_reorder:
    """``with nl.no_reorder():`` keeps the block's instructions in program order; the emulator runs
    every instruction in program order anyway."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def nc(n):
    """The older ``nl.nc(n)``: n physical cores of a logical core in a grid (``nl.spmd_dim``)."""
    return int(n)


def spmd_dim(*sizes):
    """The older ``kernel[nl.spmd_dim(..., nl.nc(2))]`` grid axis: the product of its sizes."""
    return math.prod(int(n) for n in sizes)


def sequential_range(start, stop=None, step=1):
    return _range("sequential_range", start, stop, step)


def static_range(start, stop=None, step=1):
    return _range("static_range", start, stop, step)


def program_id(axis=0):
    ctx = _context.current()
    if not 0 <= axis < builtins.max(len(ctx.grid), 1):
        raise NKIError("program-id", f"nl.program_id({axis}): the launch grid {ctx.grid} has no axis {axis}")
    return ctx.program[axis] if ctx.program else 0


def num_programs(axes=None):
    grid = _context.current().grid or (1,)
    if axes is None:
        return math.prod(grid)
    if isinstance(axes, int):
        return grid[axes]
    return math.prod(grid[a] for a in axes)


def program_ndim():
    return len(_context.current().grid)


def device_print(prefix, x, **kwargs):
    """Prints a tile's values when the kernel runs (not while it is checked)."""
    ctx = _context.current()
    values = x.read(what="nl.device_print") if isinstance(x, NkiTensor) else x
    if not ctx.checking and not ctx.trial:
        print(prefix, values.numpy() if isinstance(values, torch.Tensor) else values, flush=True)


# -- memory movement ------------------------------------------------------------------------------
def load(src, mask=None, dtype=None, **kwargs):
    """HBM -> a new SBUF tile."""
    if not isinstance(src, NkiTensor) or src.buffer.on_chip:
        where = src.buffer.name if isinstance(src, NkiTensor) else type(src).__name__
        raise NKIError("load-from-hbm", f"nl.load reads from HBM tensors only, got {where}"
                       f"{' ' + src.describe() if isinstance(src, NkiTensor) else ''}")
    values = src.read(mask, what="nl.load")
    check_partitions(tile_shape(values), f"nl.load of {src.describe()}")
    record("dma", "load", tile_shape(values), src.dtype, src="hbm", dst="sbuf")
    out_dtype = as_dtype(dtype) or src.dtype
    if mask is None and out_dtype == src.dtype and borrowable(src):
        tile = make_result(values, out_dtype, "nl.load")  # no copy until written (NkiTensor.borrow)
        tile.borrow(tile.data)
        return tile
    return make_result(values.to(out_dtype, copy=True), out_dtype, "nl.load")  # read() applied the mask


def store(dst, value, mask=None, **kwargs):
    """An SBUF tile (or scalar) -> HBM."""
    if not isinstance(dst, NkiTensor) or dst.buffer.on_chip:
        raise NKIError("store-to-hbm", "nl.store writes to HBM tensors only, got "
                       f"{dst.describe() if isinstance(dst, NkiTensor) else type(dst).__name__}")
    if isinstance(value, NkiTensor):
        if value.buffer is psum:
            raise NKIError("store-from-psum", f"nl.store of {value.describe()}: PSUM cannot be stored to HBM; copy "
                           "it to SBUF first (nl.copy or nisa.tensor_copy)")
        if not value.buffer.on_chip:
            raise NKIError("store-from-sbuf", f"nl.store: the value {value.describe()} is not an SBUF tile")
        values = value.read(what="nl.store")
    else:
        values = value
    record("dma", "store", dst.shape, dst.dtype, src="sbuf", dst="hbm")
    dst.write(values, mask=mask, what=f"nl.store to {dst.describe()}")


def copy(x, dtype=None, mask=None, **kwargs):
    values = operand(x, "nl.copy")
    record("vector", "copy", x.shape, x.dtype)
    return make_result(values.clone(), as_dtype(dtype) or x.dtype, "nl.copy", mask)


def broadcast_to(src, shape, **kwargs):
    values = operand(src, "nl.broadcast_to")
    record("vector", "broadcast", tuple(shape), src.dtype)
    out = wrap_torch_errors("nl.broadcast_to",
                            lambda: values.expand(list(values.shape[:lead()]) + list(shape)).clone())
    return make_result(out, src.dtype, "nl.broadcast_to")


def transpose(x, dtype=None, mask=None, **kwargs):
    """Swaps the partition and free dimension of a 2-D tile (on the tensor engine)."""
    values = operand(x, "nl.transpose")
    shape = tile_shape(values)
    if len(shape) != 2:
        raise NKIError("transpose", f"nl.transpose takes a 2-D tile, got {x.describe()}")
    pmax = _context.current().platform.pmax
    if builtins.max(shape) > pmax:
        raise NKIError("transpose-size", f"nl.transpose of {x.describe()}: both dimensions must be at most {pmax}")
    record("tensor", "transpose", shape, x.dtype, matmul=(shape[0], shape[0], shape[1]))
    return make_result(values.transpose(-1, -2).clone(), as_dtype(dtype) or x.dtype, "nl.transpose", mask)


def matmul(x, y, transpose_x=False, mask=None, **kwargs):
    """``x @ y`` (``x.T @ y`` with transpose_x) into a new fp32 PSUM tile."""
    xs, ys = operand(x, "nl.matmul x"), operand(y, "nl.matmul y")
    if not isinstance(xs, torch.Tensor) or not isinstance(ys, torch.Tensor):
        raise NKIError("operand", "nl.matmul multiplies two tiles")
    stationary = xs if transpose_x else xs.transpose(-1, -2)
    check_matmul("nl.matmul", x, y, tile_shape(stationary), tile_shape(ys))
    out = stationary.transpose(-1, -2).float() @ ys.float()
    # transient: `acc += nl.matmul(...)` accumulates into acc's banks, the product takes none
    return make_result(out, torch.float32, "nl.matmul", mask, buffer=psum, transient=True)


# -- element-wise math ----------------------------------------------------------------------------
# The element-wise ops (ALU and activation functions), shared with nki.isa.
globals().update(_alu.OPS)


def where(condition, x, y, dtype=None, mask=None, **kwargs):
    c = operand(condition, "nl.where condition")
    xv, yv = compute(operand(x, "nl.where x")), compute(operand(y, "nl.where y"))
    out = wrap_torch_errors("nl.where", lambda: torch.where(*tensor_args([c.bool(), xv, yv])))
    out_dtype = as_dtype(dtype) or result_dtype([x, y], None)
    record("vector", "where", tile_shape(out), out_dtype)
    return make_result(out, out_dtype, "nl.where", mask)


# -- reductions ----------------------------------------------------------------------------------
def _reduction(name, fn, bool_result=False, float_result=False):
    def op(x, axis, dtype=None, mask=None, keepdims=False, **kwargs):
        values = compute(operand(x, f"nl.{name}"))
        axes = reduction_axes(axis, values.dim() - lead(), f"nl.{name}")
        out = fn(values, axes, keepdims)
        out_dtype = as_dtype(dtype) or (torch.bool if bool_result else torch.float32 if float_result and
                                        not x.dtype.is_floating_point else x.dtype)
        record("vector", name, tile_shape(values), out_dtype)
        return make_result(out, out_dtype, f"nl.{name}", mask)

    op.__name__ = op.__qualname__ = name
    return op


def _over_trailing(fn):
    """``fn(values, dim)`` applied to the reduced axes (the trailing ones) flattened into one."""
    def reduce(v, axes, keepdims):
        out = fn(v.flatten(axes[0]), axes[0])
        return out.reshape(list(v.shape[:axes[0]]) + [1] * len(axes)) if keepdims else out
    return reduce


sum = _reduction("sum", lambda v, a, k: torch.sum(v, dim=a, keepdim=k))
prod = _reduction("prod", _over_trailing(lambda v, d: torch.prod(v, dim=d)))
mean = _reduction("mean", lambda v, a, k: torch.mean(v.float(), dim=a, keepdim=k), float_result=True)
var = _reduction("var", lambda v, a, k: torch.var(v.float(), dim=a, keepdim=k, unbiased=False), float_result=True)
max = _reduction("max", lambda v, a, k: torch.amax(v, dim=a, keepdim=k))
min = _reduction("min", lambda v, a, k: torch.amin(v, dim=a, keepdim=k))
all = _reduction("all", _over_trailing(lambda v, d: torch.all(v.bool(), dim=d)), bool_result=True)
any = _reduction("any", _over_trailing(lambda v, d: torch.any(v.bool(), dim=d)), bool_result=True)
sum.torch_fn, max.torch_fn, min.torch_fn = torch.sum, torch.amax, torch.amin


def softmax(x, axis, dtype=None, compute_dtype=None, mask=None, **kwargs):
    values = compute(operand(x, "nl.softmax"))
    axes = reduction_axes(axis, values.dim() - lead(), "nl.softmax")
    shifted = values - torch.amax(values, dim=axes, keepdim=True)
    e = torch.exp(shifted)
    out = e / torch.sum(e, dim=axes, keepdim=True)
    record("scalar", "softmax", tile_shape(values), x.dtype, passes=4)
    return make_result(out, as_dtype(dtype) or x.dtype, "nl.softmax", mask)


def rms_norm(x, w, axis, n, epsilon=1e-6, dtype=None, compute_dtype=None, mask=None, **kwargs):
    """``x / sqrt(sum(x**2, axis) / n + epsilon) * w``."""
    values = compute(operand(x, "nl.rms_norm x"))
    weight = compute(operand(w, "nl.rms_norm w"))
    axes = reduction_axes(axis, values.dim() - lead(), "nl.rms_norm")
    rms = torch.sqrt(torch.sum(values * values, dim=axes, keepdim=True) / n + epsilon)
    out = wrap_torch_errors("nl.rms_norm", lambda: values / rms * weight)
    record("scalar", "rms_norm", tile_shape(values), x.dtype, passes=3)
    return make_result(out, as_dtype(dtype) or x.dtype, "nl.rms_norm", mask)


# -- Python operators on tiles ------------------------------------------------------------------
def _bind_operators():
    g = globals()
    for dunder, name in {"add": "add", "sub": "subtract", "mul": "multiply", "truediv": "divide", "pow": "power",
                         "mod": "mod", "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor",
                         "lshift": "left_shift", "rshift": "right_shift"}.items():
        fn = g[name]
        setattr(NkiTensor, f"__{dunder}__", lambda self, other, fn=fn: fn(self, other))
        setattr(NkiTensor, f"__r{dunder}__", lambda self, other, fn=fn: fn(other, self))
    for dunder, name in {"lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal"}.items():
        setattr(NkiTensor, f"__{dunder}__", lambda self, other, fn=g[name]: fn(self, other))
    # `t == None` / `t != None` test an optional argument on the host (plain bools); tiles compare per element
    NkiTensor.__eq__ = lambda self, other: False if other is None else g["equal"](self, other)
    NkiTensor.__ne__ = lambda self, other: True if other is None else g["not_equal"](self, other)
    for dunder, name in {"iadd": "add", "isub": "subtract", "imul": "multiply", "itruediv": "divide"}.items():
        setattr(NkiTensor, f"__{dunder}__", lambda self, other, name=name: _alu.inplace(self, other, name))
    NkiTensor.astype = lambda self, dtype: copy(self, dtype=dtype)
    NkiTensor.broadcast_to = lambda self, shape: broadcast_to(self, shape=shape)
    NkiTensor.T = property(lambda self: transpose(self))
    NkiTensor.__neg__ = lambda self: g["negative"](self)
    NkiTensor.__abs__ = lambda self: g["abs"](self)
    NkiTensor.__invert__ = lambda self: g["invert"](self)


_bind_operators()
