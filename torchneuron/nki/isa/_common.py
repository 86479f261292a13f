"""What the ``nki.isa`` instruction modules share: operands, ALU ops, engines, targets, layout rules."""

import functools
import inspect
import math

import numpy as np
import torch

from torchneuron.nki import _context
from torchneuron.nki import _alu
from torchneuron.nki._errors import NKIError
from torchneuron.nki._ops import compute, lead, operand
from torchneuron.nki._tile import NkiTensor, psum, sbuf
from torchneuron.nki.isa.constants import engine, nc_version

# ALU ops whose operands are bit patterns (integer tiles only); all others compute in fp32.
BITVEC = {"invert", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"}
# Names an op may arrive under (NumPy ufuncs, nl reductions) -> the nl op it is.
_ALIASES = {"true_divide": "divide", "absolute": "abs", "max": "maximum", "min": "minimum", "sum": "add",
            "amax": "maximum", "amin": "minimum"}
# ALU functions nl does not define.
_EXTRA = {"copy": lambda x: x, "abs_min": lambda a, b: torch.minimum(torch.abs(a), torch.abs(b))}


def strict_call(fn):
    """The instruction ``fn`` refusing, as an NKIError naming the kernel line, a keyword it does not
    have (dropped silently, a parameter of a later reference or a misspelling would leave its effect
    out of the result) and a call without ``dst`` (the older Beta 1 form that returned the result)."""
    params = inspect.signature(fn).parameters
    dst_at = list(params).index("dst") if "dst" in params else None

    @functools.wraps(fn)
    def instruction(*args, **kwargs):
        unknown = [k for k in kwargs if k not in params]
        if unknown:
            raise NKIError("operands", f"nisa.{fn.__name__} has no parameter {', '.join(map(repr, unknown))} (its "
                           f"parameters: {', '.join(params)})")
        if dst_at is not None and len(args) <= dst_at and "dst" not in kwargs:
            raise NKIError("operands", f"nisa.{fn.__name__}: dst is missing; the current NKI writes the result into "
                           f"dst= (nisa.{fn.__name__}(dst=t, ...)). The Beta 1 form that returned it "
                           f"(t = nisa.{fn.__name__}(...)) is not in the current reference (see its Beta 2 migration "
                           "guide); the older nl functions (nl.exp(x), ...) still return tiles")
        return fn(*args, **kwargs)
    return instruction


def op_name(op):
    """The nl name of an op given as an nl function or a NumPy ufunc (``np.max`` is ``maximum``)."""
    name = getattr(op, "__name__", None)
    if not isinstance(name, str):
        return repr(op)
    return _ALIASES.get(name, name)


def alu(op, what):
    """(name, torch function, number of operands) of an ALU or activation op."""
    name = op_name(op)
    nl_op = getattr(_alu, name, None)
    fn = _EXTRA.get(name) or getattr(nl_op, "torch_fn", None)
    if fn is None:
        raise NKIError("alu-op", f"{what}: {op!r} is not an NKI ALU or activation op (use nl.add, nl.exp, ...)")
    arity = getattr(nl_op, "arity", None) or getattr(op, "nin", None) or (1 if name == "copy" else 2)
    return name, fn, arity


def engine_name(eng, what, allowed, default):
    """The engine an instruction runs on: ``default`` for ``engine.unknown``, else one of ``allowed``."""
    if eng is None:
        return default
    try:
        e = engine(eng)
    except ValueError:
        raise NKIError("engine", f"{what}: {eng!r} is not an nki.isa.engine member") from None
    if e is engine.unknown:
        return default
    if e.name not in allowed:
        raise NKIError("engine", f"{what} runs on the {' or '.join(allowed)} engine, not the {e.name} engine")
    return e.name


def member(enum_cls, value, what):
    """``value`` as a member of ``enum_cls`` (members, or the values they stand for)."""
    try:
        return enum_cls(value)
    except ValueError:
        raise NKIError("enum", f"{what}: {value!r} is not a member of nki.isa.{enum_cls.__name__} "
                       f"({', '.join(m.name for m in enum_cls)})") from None


def get_nc_version():
    """The NeuronCore generation of the target the kernel is checked and run for."""
    return nc_version(_context.current().platform.generation)


def has(capability):
    """Whether the kernel's platform target has ``capability`` (see _context.FIRST_GENERATION)."""
    return _context.current().platform.has(capability)


def require(capability, what=None):
    """Refuses ``what`` (by default the capability's own name) on a platform target that lacks it."""
    platform = _context.current().platform
    if not platform.has(capability):
        first = _context.FIRST_GENERATION[capability]
        raise NKIError("target", f"{what or capability} needs NeuronCore-v{first} (trn{first - 1}) or newer, but the "
                       f"kernel targets {platform.target} ({platform.core_name}); check and run it for "
                       f"trn{first - 1} with nki.jit(platform_target=\"trn{first - 1}\") or "
                       f"NEURON_PLATFORM_TARGET_OVERRIDE=trn{first - 1}")


def tile(x, what, raw=False):
    """The values of an on-chip tile operand (``raw``: the bits of a packed MX tile)."""
    if not isinstance(x, NkiTensor):
        raise NKIError("operand", f"{what}: expected a tile, got {type(x).__name__}")
    return operand(x, what, raw=raw)


def packed_move(what, dst, src):
    """Whether an instruction that moves values unchanged moves packed MX bits: both ``dst`` and
    ``src`` have the same packed dtype. One packed dtype and another dtype is an error: packed
    values are never converted."""
    a, b = getattr(dst, "packed", None), getattr(src, "packed", None)
    if a is None and b is None:
        return False
    if a is not b:
        raise NKIError("dtype", f"{what}: src {src.describe() if isinstance(src, NkiTensor) else repr(src)} and dst "
                       f"{dst.describe()} must have the same dtype: packed MX values ({a or b!r}) are moved "
                       "unchanged, never converted (see bytes as packed elements with .view(dtype) or "
                       ".ap(..., dtype=))")
    return True


def in_sbuf(what, **tiles):
    """GpSimd (and a few others) reach SBUF only."""
    for role, t in tiles.items():
        if isinstance(t, NkiTensor) and t.buffer is not sbuf:
            raise NKIError("gpsimd-sbuf", f"{what}: {role} {t.describe()} must be in SBUF")


def not_in_psum(what, **tiles):
    for role, t in tiles.items():
        if isinstance(t, NkiTensor) and t.buffer is psum:
            raise NKIError("gpsimd-sbuf", f"{what}: {role} {t.describe()} is in PSUM, which the GpSimd engine "
                           "cannot reach")


def per_partition(v):
    """[..., P, F]: the values of each partition flattened (leading batch dims kept)."""
    n = lead()
    return v.reshape(list(v.shape[:n]) + [v.shape[n], -1])


def free_size(t):
    return math.prod(t.shape[1:])


def same_layout(what, ref_role, ref, **others):
    """Operands have the same partitions and the same number of elements per partition."""
    for role, t in others.items():
        if isinstance(t, NkiTensor) and (t.shape[:1] != ref.shape[:1] or free_size(t) != free_size(ref)):
            raise NKIError("shape-mismatch", f"{what}: {role} {t.describe()} must have the partitions and the "
                           f"number of elements per partition of {ref_role} {ref.describe()}")


def check_dtype(what, role, t, allowed, names):
    if t.dtype not in allowed:
        raise NKIError("dtype", f"{what}: {role} {t.describe()} must be {names}")


def integer_dtype(what, role, t):
    if t.dtype.is_floating_point:
        raise NKIError("dtype", f"{what}: {role} {t.describe()} must have an integer dtype")


def column(x, what, data):
    """A scalar operand, or a (P, 1) tile (or a (P,) view) broadcast along the free dims of ``data``."""
    if isinstance(x, NkiTensor):
        v = compute(operand(x, what))
        partitions = data.shape[0]
        if x.shape[:1] != (partitions,) or free_size(x) != 1:
            raise NKIError("scalar-operand", f"{what}: a tile operand must have shape ({partitions}, 1), got "
                           f"{x.shape}")
        n = lead()
        return v.reshape(list(v.shape[:n]) + [partitions] + [1] * (len(data.shape) - 1))
    if isinstance(x, (bool, int, float, np.number)):
        return x
    raise NKIError("scalar-operand", f"{what}: expected a number or a ({data.shape[0]}, 1) tile, got "
                   f"{type(x).__name__}")


def as_tensor(y, like):
    """A scalar operand as a tensor: fp32 next to float values, an integer next to integer ones."""
    if isinstance(y, torch.Tensor):
        return y
    t = torch.as_tensor(y)
    return t.float() if t.is_floating_point() or like.is_floating_point() else t


def apply(fn, x, y, reverse):
    """``fn(x, y)``, or ``fn(y, x)`` when ``reverse``."""
    y = as_tensor(y, x)
    return fn(y, x) if reverse else fn(x, y)


def shaped(values, shape):
    """A tile's values laid out as ``shape`` (same partitions, same elements per partition)."""
    n = lead()
    return values.reshape(list(values.shape[:n]) + list(shape))


def buffer_of(t):
    return t.buffer if isinstance(t, NkiTensor) else None


def alu_stage(what, op, opnd, index, data):
    """One ``x op operand`` stage of a tensor-scalar instruction: (op name, ``fn(x, reverse)``).
    A binary op takes a number or a (P, 1) tile; a unary op (nl.abs, nl.rsqrt) takes None or 0."""
    name, fn, arity = alu(op, f"{what} op{index}")
    if arity == 1:
        if opnd is not None and not (isinstance(opnd, (int, float, np.number)) and opnd == 0):
            raise NKIError("operands", f"{what}: op{index} nl.{name} is unary; operand{index} must be None or 0")
        return name, lambda x, reverse=False: fn(x)
    if opnd is None:
        raise NKIError("operands", f"{what}: op{index} nl.{name} needs operand{index}")
    value = column(opnd, f"{what} operand{index}", data)
    return name, lambda x, reverse=False: apply(fn, x, value, reverse)


def broadcast_lead(*values):
    """Tensors expanded to common leading (batch) dims, their tile dims kept (for gathers and
    scatters, which do not broadcast)."""
    n = lead()
    batch = np.broadcast_shapes(*(tuple(v.shape[:n]) for v in values))  # (torch.broadcast_shapes costs ~0.1-0.3 ms)
    return [v.expand(list(batch) + list(v.shape[n:])) for v in values]


def _fold(fn, v):
    """``fn`` folded over the last dim of ``v`` (pairwise, so log2(n) whole-tile steps)."""
    while v.shape[-1] > 1:
        half = v.shape[-1] // 2
        v = torch.cat([fn(v[..., :half], v[..., half:2 * half]), v[..., 2 * half:]], dim=-1)
    return v


# reduction op (tensor_reduce, tensor_partition_reduce) -> its value over the last dim, kept as size 1
REDUCTIONS = {
    "add": lambda v: v.sum(-1, keepdim=True),
    "subtract": lambda v: v[..., :1] - v[..., 1:].sum(-1, keepdim=True),  # x0 - x1 - x2 - ...
    "multiply": lambda v: v.prod(-1, keepdim=True),
    "maximum": lambda v: v.amax(-1, keepdim=True),
    "minimum": lambda v: v.amin(-1, keepdim=True),
    "logical_and": lambda v: (v != 0).all(-1, keepdim=True),
    "logical_or": lambda v: (v != 0).any(-1, keepdim=True),
    "logical_xor": lambda v: (v != 0).sum(-1, keepdim=True) % 2 == 1,
    "bitwise_and": lambda v: _fold(torch.bitwise_and, v),
    "bitwise_or": lambda v: _fold(torch.bitwise_or, v),
    "bitwise_xor": lambda v: _fold(torch.bitwise_xor, v),
}
