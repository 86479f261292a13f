"""``nki.isa`` Vector Engine instructions that reduce their result per partition into the
engine's accumulation registers: ``exponential``, ``tensor_scalar_reduce``, ``select_reduce``,
``range_select``. ``reduce_cmd`` resets, loads or continues the registers (shared by these and
``tensor_scalar_cumulative``); ``reduce_res`` reads them out. ``reduce_cmd=idle`` with a
``reduce_res`` tile reduces the instruction's own result."""

import numpy as np
import torch

import torchneuron.nki.isa.constants as C
from torchneuron.nki import _alu
from torchneuron.nki._errors import NKIError
from torchneuron.nki.isa._common import (BITVEC, alu, alu_stage, check_dtype, column, per_partition, require,
                                         same_layout, shaped, tile)
from torchneuron.nki.isa._state import accumulate, column_values, command, read_out, reduce_op_name
from torchneuron.nki._ops import check_one_psum_input, compute, dst_write, record, wrap_torch_errors
from torchneuron.nki._tile import NkiTensor

FP32_MIN = float(np.finfo(np.float32).min)


def _accumulate(what, out, op, reduce_res, cmd, init=None, negate=False):
    regs = accumulate("vector", cmd, op, per_partition(out), what, init)
    if reduce_res is not None:
        read_out(reduce_res, regs, what, negate)


def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=C.reduce_cmd.idle, reduce_init=0.0, name=None):
    """``dst = exp(src - max_value)`` in fp32 on the NeuronCore-v4 vector engine (``max_value``: a
    number or a (P, 1) tile), summing the result per partition into the accumulation registers
    (``load_reduce`` starts the sum at ``reduce_init``)."""
    what = "nisa.exponential"
    require("nisa.exponential", what)
    cmd = command(reduce_cmd, reduce_res, what)
    if cmd is C.reduce_cmd.reset:
        raise NKIError("reduce-cmd", f"{what}: reduce_cmd is idle, reset_reduce, reduce or load_reduce")
    if cmd is not C.reduce_cmd.load_reduce and not (isinstance(reduce_init, (int, float, np.number)) and reduce_init == 0):
        raise NKIError("reduce-init", f"{what}: reduce_init is only used with reduce_cmd=load_reduce")
    if dst.dtype == torch.uint32 or len(src.shape) > 4:
        raise NKIError("dtype", f"{what}: dst cannot be uint32 and tiles have at most 4 dims, got {dst.describe()} "
                       f"and {src.describe()}")
    v = compute(tile(src, what)).float()
    out = v - column(max_value, f"{what} max_value", src)
    out = torch.exp(out)
    record("vector", "exponential", dst.shape, dst.dtype)
    dst_write(dst, out, what, fresh=True)
    init = column_values(column(reduce_init, f"{what} reduce_init", src))
    _accumulate(what, out, "add", reduce_res, cmd, init)


def tensor_scalar_reduce(dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False,
                         reduce_cmd=C.reduce_cmd.reset_reduce, reduce_init=None, reduce_res_negate=False, name=None):
    """``dst = data op0 operand0`` (one arithmetic op; a unary op takes operand 0 or None), reduced
    per partition with ``reduce_op`` (add, multiply, maximum, minimum) into the accumulation
    registers; ``reduce_res`` receives them (negated with ``reduce_res_negate``)."""
    what = "nisa.tensor_scalar_reduce"
    if reverse0:
        raise NKIError("operands", f"{what}: reverse0 is not supported by the vector engine yet")
    if len(data.shape) > 4:
        raise NKIError("shape-mismatch", f"{what}: data has at most 3 free dims, got {data.describe()}")
    name0, stage = alu_stage(what, op0, operand0, 0, data)
    if name0 in BITVEC:
        raise NKIError("alu-op", f"{what}: op0 must be an arithmetic op, got nl.{name0}")
    op = reduce_op_name(reduce_op, what, ("add", "multiply", "maximum", "minimum"))
    cmd = command(reduce_cmd, reduce_res, what)
    if (reduce_init is not None) != (cmd is C.reduce_cmd.load_reduce):
        raise NKIError("reduce-init", f"{what}: reduce_init is given exactly when reduce_cmd is load_reduce")
    out = wrap_torch_errors(what, stage, compute(tile(data, f"{what} data")).float())
    record("vector", "tensor_scalar_reduce", dst.shape, dst.dtype)
    dst_write(dst, out, what, fresh=True)
    init = column_values(column(reduce_init, f"{what} reduce_init", data)) if reduce_init is not None else None
    _accumulate(what, out, op, reduce_res, cmd, init, reduce_res_negate)


def select_reduce(dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=C.reduce_cmd.idle,
                  reduce_op=_alu.maximum, reverse_pred=False, name=None):
    """``dst = on_true`` where ``predicate`` is nonzero (zero with ``reverse_pred``), else
    ``on_false`` (a number or a (P, 1) tile); the per-partition maximum of the result goes into
    the accumulation registers (``reset_reduce`` starts from -inf)."""
    what = "nisa.select_reduce"
    reduce_op_name(reduce_op, what, ("maximum",))
    pred = tile(predicate, f"{what} predicate")
    check_dtype(what, "predicate", predicate, (torch.int8, torch.uint8, torch.int16, torch.uint16),
                "int8, uint8, int16 or uint16")
    if not isinstance(on_true, NkiTensor) or on_true.dtype in (torch.int32, torch.uint32):
        raise NKIError("dtype", f"{what}: on_true must be a tile of a dtype other than int32/uint32")
    if reduce_res is not None and not reduce_res.dtype.is_floating_point:
        raise NKIError("dtype", f"{what}: reduce_res {reduce_res.describe()} must have a float dtype")
    same_layout(what, "on_true", on_true, predicate=predicate, dst=dst)
    check_one_psum_input(what, on_true, predicate)
    cmd = command(reduce_cmd, reduce_res, what)
    v = compute(tile(on_true, f"{what} on_true")).float()
    take = shaped(pred != 0, on_true.shape) != bool(reverse_pred)
    other = torch.as_tensor(column(on_false, f"{what} on_false", on_true), dtype=torch.float32)
    out = torch.where(take, v, other)
    record("vector", "select_reduce", dst.shape, dst.dtype)
    dst_write(dst, out, what, fresh=True)
    _accumulate(what, out, "maximum", reduce_res, cmd)


_RANGE_COMPARISONS = ("equal", "less", "less_equal", "greater", "greater_equal")


def range_select(dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=C.reduce_cmd.reset_reduce,
                 reduce_res=None, reduce_op=_alu.maximum, range_start=0, on_false_value=FP32_MIN, name=None):
    """``dst[p, j] = on_true_tile[p, j]`` where ``comp_op0(range_start + j, bound0[p])`` and
    ``comp_op1(range_start + j, bound1[p])`` hold (j: the flattened free index, compared in fp32),
    else ``on_false_value`` (which the hardware fixes at the fp32 minimum); the per-partition
    maximum goes into the accumulation registers."""
    what = "nisa.range_select"
    reduce_op_name(reduce_op, what, ("maximum",))
    comparisons = []
    for i, op in enumerate((comp_op0, comp_op1)):
        comparison, fn, _ = alu(op, f"{what} comp_op{i}")
        if comparison not in _RANGE_COMPARISONS:
            raise NKIError("alu-op", f"{what}: comp_op{i} must be one of {', '.join(_RANGE_COMPARISONS)}, got "
                           f"nl.{comparison}")
        comparisons.append(fn)
    if not isinstance(on_true_tile, NkiTensor) or not on_true_tile.dtype.is_floating_point:
        raise NKIError("dtype", f"{what}: on_true_tile must be a tile of a float dtype")
    for role, b in (("bound0", bound0), ("bound1", bound1)):
        if not isinstance(b, NkiTensor) or b.dtype != torch.float32:
            raise NKIError("operand", f"{what}: {role} must be a ({on_true_tile.shape[0]}, 1) fp32 tile")
    if np.float32(on_false_value) != np.float32(FP32_MIN):
        raise NKIError("range-select-fill", f"{what}: on_false_value must be the fp32 minimum ({FP32_MIN}), a "
                       f"hardware constraint; got {on_false_value!r}")
    if not isinstance(range_start, (int, np.integer)):
        raise NKIError("operands", f"{what}: range_start must be an int known when the kernel is traced")
    cmd = command(reduce_cmd, reduce_res, what)
    v = per_partition(compute(tile(on_true_tile, f"{what} on_true_tile")).float())
    if range_start + v.shape[-1] > 2 ** 24:
        raise NKIError("operands", f"{what}: range_start + index must stay below 2**24 (exact in fp32)")
    index = torch.arange(v.shape[-1], dtype=torch.float32) + float(range_start)
    b0 = per_partition(column(bound0, f"{what} bound0", on_true_tile))
    b1 = per_partition(column(bound1, f"{what} bound1", on_true_tile))
    keep = comparisons[0](index, b0) & comparisons[1](index, b1)
    out = torch.where(keep, v, torch.tensor(FP32_MIN))
    record("vector", "range_select", dst.shape, dst.dtype)
    dst_write(dst, out, what, fresh=True)
    _accumulate(what, out, "maximum", reduce_res, cmd)
