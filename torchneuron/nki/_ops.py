"""The compute core shared by ``nki.language`` and ``nki.isa``: operands, results, engines, cost."""

import numpy as np
import torch

from torchneuron.nki import _context
from torchneuron.nki._batch import Affine, Unbatchable, affine_values  # noqa: F401 - re-exported
from torchneuron.nki._dtypes import as_dtype  # noqa: F401 - re-exported
from torchneuron.nki._errors import NKIError
from torchneuron.nki._tile import NkiTensor, keep_only, mask_array, new_tile, psum, sbuf

def operand(x, what, raw=False):
    """A tile's values (as a torch tensor) or a Python scalar, checked for use in compute (``raw``:
    the bits of a packed MX tile, for instructions that know its format)."""
    if isinstance(x, NkiTensor):
        x._check_on_chip(what)
        return x.read(what=what, raw=raw)
    if isinstance(x, (bool, int, float, np.number)):
        return x
    if isinstance(x, Affine):
        return affine_values(x)
    raise NKIError("operand", f"{what}: expected a tile in SBUF/PSUM or a scalar, got {type(x).__name__}")


def compute(values):
    """Vector, scalar and GpSimd engines compute floats in fp32 (bf16/fp8 inputs are widened)."""
    if isinstance(values, torch.Tensor) and values.is_floating_point() and values.dtype != torch.float32:
        return values.float()
    return values


def result_dtype(args, dtype):
    if dtype is not None:
        return as_dtype(dtype)
    tensors = [a for a in args if isinstance(a, NkiTensor)]
    if not tensors:
        return torch.float32
    out = tensors[0].dtype
    for t in tensors[1:]:
        out = torch.promote_types(out, t.dtype)
    return out


def check_partitions(shape, what):
    pmax = _context.current().platform.pmax
    if shape and shape[0] > pmax:
        raise NKIError("partition-dim", f"{what}: partition dimension {shape[0]} exceeds maximum {pmax} "
                       f"(result shape {tuple(shape)})")


def lead():
    """How many leading (batch) dims values have in the current loop frame."""
    return len(_context.current().frame)


def tile_shape(values):
    return tuple(values.shape[lead():])


def frame_constant(values):
    """A tile-shaped tensor that is the same in every iteration, aligned to the loop frame."""
    return values.reshape([1] * lead() + list(values.shape))


def accumulate_over(values, tile):
    """``values`` summed over the batched loops ``tile`` does not have (what accumulating every
    iteration into ``tile`` adds up to; a value the same in every iteration counts n times)."""
    ctx = _context.current()
    missing = {loop for loop in ctx.frame if loop not in tile.batch}
    if missing and tile.dtype not in (torch.float32, torch.float64):
        raise Unbatchable(missing, "accumulating into a low-precision tile rounds at every iteration")
    for i, loop in enumerate(ctx.frame):
        if loop not in tile.batch:
            if values.shape[i] != 1:
                values = values.sum(dim=i, keepdim=True)
            else:
                values = values * ctx.loop_sizes[loop]
    return values


def make_result(values, dtype, what, mask=None, buffer=sbuf, transient=False):
    """A new tile holding ``values`` (aligned to the loop frame) cast to ``dtype``; elements outside
    ``mask`` are zero."""
    shape = tile_shape(values)
    check_partitions(shape, what)
    values = keep_only(values, mask_array(mask, shape)).to(dtype)
    tile = new_tile(shape, dtype, buffer, name=f"result of {what}", data=values, written=True, transient=transient)
    tile.alloc.computed = True  # a value: testing its truth would be data-dependent control flow
    return tile


def check_one_psum_input(what, *args):
    """Two-input instructions read at most one operand from PSUM."""
    if sum(1 for a in args if isinstance(a, NkiTensor) and a.buffer is psum) > 1:
        raise NKIError("two-psum-inputs", f"{what}: at most one input may be in PSUM")


def wrap_torch_errors(what, fn, *args):
    try:
        return fn(*args)
    except NKIError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        raise NKIError("operands", f"{what}: {e}") from None


def record(engine, what, shape, dtype=torch.float32, **extra):
    """Counts an instruction for the cost model (check pass with estimation only)."""
    ctx = _context.current()
    if ctx.cost is not None:
        ctx.cost.instruction(engine, what, shape, dtype, **extra)


def dst_write(dst, values, what, mask=None, fresh=False, raw=False):
    """Writes an instruction's result into its destination tile (ISA style; ``raw``: the bits of a
    packed MX tile)."""
    if not isinstance(dst, NkiTensor):
        raise NKIError("operand", f"{what}: dst must be a tile, got {type(dst).__name__}")
    dst._check_on_chip(what)
    if isinstance(values, torch.Tensor) and tile_shape(values) != dst.shape:
        n = lead()
        got = tile_shape(values)
        if got[:1] != dst.shape[:1] or int(np.prod(got)) != int(np.prod(dst.shape)):
            raise NKIError("shape-mismatch", f"{what}: the result has shape {tile_shape(values)} but dst is "
                           f"{dst.describe()}")
        values = values.reshape(list(values.shape[:n]) + list(dst.shape))
    dst.write(values, mask=mask, what=what, fresh=fresh, raw=raw)

