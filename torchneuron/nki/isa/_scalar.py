"""``nki.isa`` Scalar Engine instructions: ``activation``, ``activation_reduce``, ``activate2``.

They share the Scalar Engine's accumulation registers (see _state): ``reduce_cmd`` resets,
loads or continues them, ``reduce_res`` reads them out. ``reduce_cmd=idle`` with a
``reduce_res`` tile reduces the instruction's own result (as older NKI did).
"""

import torch

import torchneuron.nki.isa.constants as C
from torchneuron.nki._errors import NKIError
from torchneuron.nki.isa._common import alu, apply, column, engine_name, not_in_psum, per_partition, \
    require, tile
from torchneuron.nki.isa._state import accumulate, command, read_out, reduce_op_name
from torchneuron.nki._ops import compute, dst_write, record, wrap_torch_errors


def _activation_fn(op, what):
    name, fn, arity = alu(op, f"{what} op")
    if arity != 1:
        raise NKIError("alu-op", f"{what}: op must be an activation function (nl.exp, nl.gelu, nl.copy, ...), got "
                       f"nl.{name}")
    return name, fn


def _reduce(what, out, reduce_op, reduce_res, reduce_cmd, allowed):
    """The Scalar Engine registers' part of an instruction (``out``: its fp32 result)."""
    cmd = command(reduce_cmd, reduce_res, what)
    op = reduce_op_name(reduce_op, what, allowed) if reduce_op is not None else "add"
    regs = accumulate("scalar", cmd, op, per_partition(out), what)
    if reduce_res is not None:
        read_out(reduce_res, regs, what)


def activation(dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, reduce_cmd=C.reduce_cmd.idle,
               name=None, engine=C.engine.unknown):
    """``dst = op(data * scale + bias)``: ``scale`` and ``bias`` are numbers or (P, 1) tiles. The
    per-partition sum of the result (``reduce_op=nl.add``) goes into the accumulation registers."""
    what = "nisa.activation"
    _, fn = _activation_fn(op, what)
    eng = engine_name(engine, what, ("scalar", "gpsimd"), "scalar")
    if eng == "gpsimd":  # NeuronCore-v4 GpSimd runs activations, without accumulation registers
        require("nisa.activation on the gpsimd engine", f"{what} on the gpsimd engine")
        not_in_psum(what, dst=dst, data=data)
        if reduce_res is not None or reduce_op is not None:
            raise NKIError("engine", f"{what}: the gpsimd engine has no accumulation registers")
    v = compute(tile(data, f"{what} data")).float()
    scale = column(scale, f"{what} scale", data)
    bias = None if bias is None else column(bias, f"{what} bias", data)
    # One pass per stage that does something (scale 1 and no bias are the common case).
    if isinstance(scale, (int, float)) and bias is not None and not isinstance(bias, (int, float)):
        x = wrap_torch_errors(what, lambda: torch.add(bias, v, alpha=scale))
    else:
        x = v if isinstance(scale, (int, float)) and scale == 1 else \
            wrap_torch_errors(what, apply, torch.mul, v, scale, False)
        if bias is not None:
            x = wrap_torch_errors(what, apply, torch.add, x, bias, False)
    out = wrap_torch_errors(what, fn, x)
    record(eng, "activation", dst.shape, dst.dtype)
    dst_write(dst, out, what, fresh=True)
    if eng == "scalar":
        _reduce(what, out, reduce_op, reduce_res, reduce_cmd, ("add",))


def activation_reduce(dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None):
    """``activation`` that also writes the per-partition sum of its result to ``reduce_res``
    (``reduce_cmd=reset_reduce``)."""
    activation(dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
               reduce_cmd=C.reduce_cmd.reset_reduce)


# (op0, op1) pairs activate2's tensor-scalar stage has ("bypass": no op)
_ACTIVATE2_OPS = {("multiply", "add"), ("multiply", "subtract"), ("multiply", "bypass"), ("add", "bypass"),
                  ("subtract", "bypass"), ("bypass", "bypass")}


def activate2(dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False, reverse1=False, reduce_op=None,
              reduce_res=None, reduce_cmd=C.reduce_cmd.idle, name=None):
    """``dst = op((data op0 imm0) op1 imm1)`` on the NeuronCore-v4 scalar engine (``nl.bypass``
    skips a stage), reducing the result per partition into the accumulation registers with
    ``reduce_op`` (add, maximum, minimum, abs_max, abs_min). ``relu_param`` is the slope
    ``nl.relu`` gives negative inputs (a parameterised ReLU); other functions take none."""
    what = "nisa.activate2"
    require("nisa.activate2", what)
    op_name, fn = _activation_fn(op, what)
    names = (alu(op0, f"{what} op0")[0], alu(op1, f"{what} op1")[0])
    if names not in _ACTIVATE2_OPS:
        raise NKIError("alu-op", f"{what}: (op0, op1) = (nl.{names[0]}, nl.{names[1]}) is not one of "
                       f"{', '.join(str(p) for p in sorted(_ACTIVATE2_OPS))}")
    x = compute(tile(data, f"{what} data")).float()
    for i, (n, stage_op, imm, reverse) in enumerate(zip(names, (op0, op1), (imm0, imm1), (reverse0, reverse1))):
        if n != "bypass":
            x = wrap_torch_errors(what, apply, alu(stage_op, what)[1], x, column(imm, f"{what} imm{i}", data), reverse)
    if op_name == "relu":
        out = torch.where(x > 0, x, apply(torch.mul, x, column(relu_param, f"{what} relu_param", data), False))
    else:
        out = wrap_torch_errors(what, fn, x)
    record("scalar", "activate2", dst.shape, dst.dtype)
    dst_write(dst, out, what, fresh=True)
    _reduce(what, out, reduce_op, reduce_res, reduce_cmd, ("add", "maximum", "minimum", "abs_max", "abs_min"))
