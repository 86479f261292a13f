"""``nki.isa`` Vector Engine scans along the flattened free dims of each partition:
``tensor_tensor_scan`` and ``tensor_scalar_cumulative``. Scans are whole-tile torch operations
(cumulative ops, or log2(n) steps of composed affine maps); only a tensor_tensor_scan whose ops
do not compose into affine maps steps through the columns one by one."""

import math

import numpy as np
import torch

import torchneuron.nki.isa.constants as C
from torchneuron.nki._errors import NKIError
from torchneuron.nki.isa._common import (BITVEC, alu, alu_stage, apply, column, member, per_partition, same_layout,
                                         shaped, tile)
from torchneuron.nki.isa._state import column_values, registers, set_registers
from torchneuron.nki._ops import check_one_psum_input, compute, dst_write, record, wrap_torch_errors

_AFFINE = ("add", "subtract", "multiply")


def _affine(name, x, reverse, inner):
    """(a, b) such that applying op (add, subtract or multiply) to the running value v and the
    operand x gives ``a * v + b``. v is op0's right operand (``inner``) and op1's left one;
    ``reverse`` swaps them."""
    if name == "add":
        return 1.0, x
    if name == "multiply":
        return x, 0.0
    acc_first = reverse if inner else not reverse  # subtract: is the running value on the left?
    return (1.0, -x) if acc_first else (-1.0, x)


def _times(p, q):
    """p * q for numbers or tensors, a factor 1.0 costing nothing."""
    return q if isinstance(p, float) and p == 1.0 else p if isinstance(q, float) and q == 1.0 else p * q


def _plus(p, q):
    """p + q for numbers or tensors, a term 0.0 costing nothing."""
    return q if isinstance(p, float) and p == 0.0 else p if isinstance(q, float) and q == 0.0 else p + q


def _linear_scan(a, b, start):
    """``acc_i = a_i * acc_(i-1) + b_i`` along the last dim from ``acc_(-1) = start``: prefix
    compositions of the affine maps in log2(n) whole-tile steps (Hillis-Steele)."""
    if a == 1.0 if isinstance(a, float) else bool((a == 1).all()):  # a running sum (cumsum kernels): one pass
        b = torch.as_tensor(b)
        shape = np.broadcast_shapes(tuple(torch.as_tensor(a).shape), tuple(b.shape))
        out = torch.cumsum(b.expand(shape), -1)
        if np.broadcast_shapes(shape, tuple(start.shape)) == shape:
            return out.add_(start)
        return out + start
    a, b = torch.broadcast_tensors(torch.as_tensor(a), torch.as_tensor(b))
    a, b = a.clone(), b.clone()
    step = 1
    while step < a.shape[-1]:
        na, nb = a.clone(), b.clone()
        na[..., step:] = a[..., step:] * a[..., :-step]
        nb[..., step:] = a[..., step:] * b[..., :-step] + b[..., step:]
        a, b, step = na, nb, step * 2
    return a * start + b


def tensor_tensor_scan(dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None):
    """Per partition, along the flattened free dims: ``acc = op1(op0(data0[i], acc), data1[i]);
    dst[i] = acc`` from ``acc = initial`` (a number or a (P, 1) tile), in fp32; ``reverse0`` /
    ``reverse1`` swap an op's operands. ``op0=multiply, op1=add`` is the recurrence
    ``h[i] = data0[i] * h[i-1] + data1[i]``."""
    what = "nisa.tensor_tensor_scan"
    names, fns = [], []
    for i, op in enumerate((op0, op1)):
        op_name, fn, arity = alu(op, f"{what} op{i}")
        if op_name in BITVEC or arity != 2:
            raise NKIError("alu-op", f"{what}: op{i} must be a binary arithmetic op, got nl.{op_name}")
        names.append(op_name)
        fns.append(fn)
    same_layout(what, "data0", data0, data1=data1, dst=dst)
    check_one_psum_input(what, data0, data1)
    x = per_partition(compute(tile(data0, f"{what} data0")).float())
    y = per_partition(shaped(compute(tile(data1, f"{what} data1")).float(), data0.shape))
    start = torch.as_tensor(column_values(column(initial, f"{what} initial", data0)), dtype=torch.float32)
    if names[0] in _AFFINE and names[1] in _AFFINE:
        a0, b0 = _affine(names[0], x, reverse0, inner=True)
        a1, b1 = _affine(names[1], y, reverse1, inner=False)
        # the composed map a1 * (a0 * v + b0) + b1, without whole-tile passes for the factors 1 and terms 0
        out = _linear_scan(_times(a1, a0), _plus(_times(a1, b0), b1), start)
    else:
        x, y = torch.broadcast_tensors(x, y)
        acc, columns = start, []
        for i in range(x.shape[-1]):
            acc = wrap_torch_errors(what, apply, fns[0], x[..., i:i + 1], acc, reverse0)
            acc = wrap_torch_errors(what, apply, fns[1], acc, y[..., i:i + 1], reverse1)
            columns.append(acc)
        out = torch.cat(torch.broadcast_tensors(*columns), dim=-1)
    record("vector", "tensor_tensor_scan", dst.shape, dst.dtype)
    dst_write(dst, out, what, fresh=True)


# op1 of tensor_scalar_cumulative -> the value reset_reduce starts from
_START = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -math.inf, "minimum": math.inf}


def tensor_scalar_cumulative(dst, src, op0, op1, imm0, imm1=None, reduce_cmd=C.reduce_cmd.reset_reduce, name=None):
    """Per partition, along the flattened free dims: ``reg = op1(src[i] op0 imm0, reg);
    dst[i] = reg``, with ``reg`` the vector engine's accumulation register: reset to op1's
    identity (``reset_reduce``), carried over from the previous accumulating instruction
    (``reduce``) or loaded from ``imm1`` (``load_reduce``). op1 is add, subtract (``t - reg``),
    multiply, maximum or minimum."""
    what = "nisa.tensor_scalar_cumulative"
    name0, stage = alu_stage(what, op0, imm0, 0, src)
    name1 = alu(op1, f"{what} op1")[0]
    if name0 in BITVEC or name1 not in _START:
        raise NKIError("alu-op", f"{what}: op0 must be arithmetic and op1 one of {', '.join(_START)}, got nl.{name0} "
                       f"and nl.{name1}")
    for role, t in (("src", src), ("dst", dst)):
        if t.dtype in (torch.int32, torch.uint32):
            raise NKIError("dtype", f"{what}: {role} {t.describe()} cannot be int32 or uint32")
    same_layout(what, "src", src, dst=dst)
    cmd = member(C.reduce_cmd, reduce_cmd, f"{what} reduce_cmd")
    t = per_partition(wrap_torch_errors(what, stage, compute(tile(src, f"{what} src")).float()))
    if cmd is C.reduce_cmd.reset_reduce:
        start = torch.tensor(_START[name1])
    elif cmd is C.reduce_cmd.reduce:
        current = registers("vector", t.shape[-2], what)
        start = torch.tensor(_START[name1]) if current is None else current
    elif cmd is C.reduce_cmd.load_reduce:
        if imm1 is None:
            raise NKIError("reduce-init", f"{what}: reduce_cmd=load_reduce loads imm1, which is not given")
        start = torch.as_tensor(column_values(column(imm1, f"{what} imm1", src)), dtype=torch.float32)
    else:
        raise NKIError("reduce-cmd", f"{what}: reduce_cmd is reset_reduce, reduce or load_reduce, got {reduce_cmd!r}")
    if name1 == "add":
        out = t.cumsum(-1)
        out = out.add_(start) if np.broadcast_shapes(tuple(out.shape), tuple(start.shape)) == tuple(out.shape) \
            else out + start
    elif name1 == "multiply":
        out = start * t.cumprod(-1)
    elif name1 == "maximum":
        out = torch.maximum(start, t.cummax(-1).values)
    elif name1 == "minimum":
        out = torch.minimum(start, t.cummin(-1).values)
    else:  # reg_i = t_i - reg_(i-1) = (-1)^i * (sum_j<=i (-1)^j t_j - start)
        sign = 1.0 - 2.0 * (torch.arange(t.shape[-1]) % 2)
        out = sign * ((sign * t).cumsum(-1) - start)
    set_registers("vector", out[..., -1:])
    record("vector", "tensor_scalar_cumulative", dst.shape, dst.dtype)
    dst_write(dst, out, what, fresh=True)
