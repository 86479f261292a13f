"""The ALU and activation ops of the engines: the element-wise ``nl`` functions (``nl.exp(t)``)
that are also the ``op=`` arguments of ``nisa`` instructions (``torch_fn`` and ``arity`` say what
they compute). ``nki.language`` exports them; ``nki.isa`` reads them."""

import builtins
import math

import torch

from torchneuron.nki import _context
from torchneuron.nki._errors import NKIError
from torchneuron.nki._ops import (accumulate_over, as_dtype, check_one_psum_input, compute, frame_constant, lead,
                                  make_result, operand, record, result_dtype, tile_shape, wrap_torch_errors)

def _gelu_tanh(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


_UNARY = {
    "abs": torch.abs, "negative": torch.neg, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "square": torch.square, "reciprocal": torch.reciprocal, "sin": torch.sin,
    "cos": torch.cos, "tan": torch.tan, "tanh": torch.tanh, "arctan": torch.arctan, "sign": torch.sign,
    "ceil": torch.ceil, "floor": torch.floor, "trunc": torch.trunc, "erf": torch.erf,
    "erf_dx": lambda x: 2 / math.sqrt(math.pi) * torch.exp(-x * x),
    "sigmoid": torch.sigmoid, "relu": torch.relu, "gelu": torch.nn.functional.gelu,
    "gelu_apprx_tanh": _gelu_tanh, "gelu_apprx_sigmoid": lambda x: x * torch.sigmoid(1.702 * x),
    "silu": torch.nn.functional.silu, "softplus": torch.nn.functional.softplus,
    "mish": torch.nn.functional.mish, "logical_not": torch.logical_not, "invert": torch.bitwise_not,
    "bypass": torch.clone, "identity": torch.clone,
}
_BINARY = {
    "add": torch.add, "subtract": torch.sub, "multiply": torch.mul, "divide": torch.div,
    "maximum": torch.maximum, "minimum": torch.minimum, "power": torch.pow, "fmod": torch.fmod,
    "mod": torch.remainder, "equal": torch.eq, "not_equal": torch.ne, "greater": torch.gt,
    "greater_equal": torch.ge, "less": torch.lt, "less_equal": torch.le, "logical_and": torch.logical_and,
    "logical_or": torch.logical_or, "logical_xor": torch.logical_xor, "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor, "left_shift": torch.bitwise_left_shift,
    "right_shift": torch.bitwise_right_shift, "abs_max": lambda a, b: torch.maximum(torch.abs(a), torch.abs(b)),
}
_BOOL_RESULT = {"equal", "not_equal", "greater", "greater_equal", "less", "less_equal", "logical_and",
                "logical_or", "logical_xor", "logical_not"}
# Which engine runs an op by default, for the cost model.
_SCALAR_ENGINE = {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "gelu", "gelu_apprx_tanh", "gelu_apprx_sigmoid",
                  "silu", "softplus", "mish", "erf", "erf_dx", "sin", "cos", "tan", "arctan", "relu", "square"}


def tensor_args(args):
    """Scalars as tensors; tiles of fewer dims padded with trailing 1s: tiles line up on their first
    (partition) dimension, so a reduced [P] tile applies to each partition's row (NumPy's trailing
    alignment would silently apply it along the free dimension instead)."""
    args = [torch.as_tensor(a) if not isinstance(a, torch.Tensor) else a for a in args]
    n = lead()
    ranks = [a.dim() - n for a in args if a.dim()]
    rank = builtins.max(ranks) if ranks else 0
    for i, a in enumerate(args):
        if a.dim() and a.dim() - n < rank:
            args[i] = a.reshape(list(a.shape) + [1] * (rank - a.dim() + n))
    return args


def _elementwise(name, fn, arity):
    def op(*args, dtype=None, mask=None, **kwargs):
        if len(args) != arity:
            raise NKIError("arguments", f"nl.{name} takes {arity} operand(s), got {len(args)}")
        check_one_psum_input(f"nl.{name}", *args)
        values = [compute(operand(a, f"nl.{name}")) for a in args]
        if not builtins.any(isinstance(v, torch.Tensor) for v in values):
            raise NKIError("operand", f"nl.{name} needs at least one tile operand")
        out_dtype = as_dtype(dtype) or (torch.bool if name in _BOOL_RESULT else result_dtype(args, None))
        out = wrap_torch_errors(f"nl.{name}", fn, *tensor_args(values))
        record("scalar" if name in _SCALAR_ENGINE else "vector", name, tile_shape(out), out_dtype)
        return make_result(out, out_dtype, f"nl.{name}", mask)

    op.__name__ = op.__qualname__ = name
    op.torch_fn = fn
    op.arity = arity
    return op


OPS = {name: _elementwise(name, fn, 1) for name, fn in _UNARY.items()}
OPS.update({name: _elementwise(name, fn, 2) for name, fn in _BINARY.items()})
globals().update(OPS)



def reduction_axes(axis, ndim, what):
    """The reduced axes of a tile of ``ndim`` dims, checked, as dims of its frame-aligned values."""
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    axes = tuple(a % ndim for a in axes)
    if 0 in axes:
        raise NKIError("reduce-partition", f"{what}: axis 0 is the partition dimension; reductions run along free "
                       "dimensions (transpose the tile, or use a matmul with a ones vector)")
    if sorted(axes) != list(range(ndim - len(axes), ndim)):
        raise NKIError("reduce-axes", f"{what}: reduced axes {axes} must be the last contiguous free axes of a "
                       f"{ndim}-D tile")
    n = lead()
    return tuple(sorted(a + n for a in axes))


def inplace(tile, other, op):
    """``tile op= other``. Across a batched loop, ``+=``/``-=`` accumulate every iteration's value."""
    tile._check_on_chip(f"in-place {op}")
    values = operand(other, f"in-place {op}")
    if op in ("add", "subtract") and _context.current().frame:
        values = accumulate_over(frame_constant(torch.as_tensor(values)) if not isinstance(
            values, torch.Tensor) else values, tile)
    current = compute(tile.read(what=f"in-place {op}"))
    result = OPS[op].torch_fn(*tensor_args([current, compute(values)]))
    record("vector", op, tile.shape, tile.dtype)
    tile.write(result, what=f"in-place {op}")
    return tile
