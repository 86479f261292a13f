"""What the engines keep between the instructions of one kernel call: accumulation registers
(Scalar and Vector Engine) and random number generator states (Vector and GpSimd Engine).

The state lives in the call context's ``engine_state`` field, which the LNC scheduler keeps per
program (each core has its own engines). Every call starts with no accumulated values and with
generators in a fixed initial state, so the check pass and the run pass of a call (and two calls
of a kernel) see the same random numbers unless the kernel seeds the generators from data.

Accumulation registers hold one fp32 value per partition. In a batched loop they carry the
loop's batch dims; an instruction that reads values an earlier iteration left (``reduce`` with
no reset in the same iteration) makes the loop run iteration by iteration.
"""

import math

import torch

from torchneuron.nki import _context
from torchneuron.nki._batch import Unbatchable
from torchneuron.nki._errors import NKIError
from torchneuron.nki.isa._common import member, op_name, per_partition
from torchneuron.nki._ops import dst_write
from torchneuron.nki._tile import NkiTensor, align
from torchneuron.nki.isa.constants import reduce_cmd


class EngineState:
    """The accumulation registers and generator states of one core's engines."""

    def __init__(self):
        self.registers = {}  # engine name -> (values [..., P, 1] fp32 aligned to `frame`, frame)
        self.rng = {}        # engine name -> int64 tensor [pmax, words] of 32-bit state words


def engine_state():
    ctx = _context.current()
    if not isinstance(ctx.engine_state, EngineState):
        ctx.engine_state = EngineState()
    return ctx.engine_state


# reduce op -> (reduction over the free elements, combination of two partial results, identity)
_REDUCERS = {
    "add": (lambda v: v.sum(-1, keepdim=True), torch.add, 0.0),
    "multiply": (lambda v: v.prod(-1, keepdim=True), torch.mul, 1.0),
    "maximum": (lambda v: v.amax(-1, keepdim=True), torch.maximum, -math.inf),
    "minimum": (lambda v: v.amin(-1, keepdim=True), torch.minimum, math.inf),
    "abs_max": (lambda v: v.abs().amax(-1, keepdim=True), lambda a, b: torch.maximum(a.abs(), b.abs()), 0.0),
    "abs_min": (lambda v: v.abs().amin(-1, keepdim=True), lambda a, b: torch.minimum(a.abs(), b.abs()), math.inf),
}


def reduce_op_name(op, what, allowed):
    name = op_name(op)
    if name not in allowed:
        raise NKIError("reduce-op", f"{what}: reduce_op must be {' or '.join('nl.' + a for a in allowed)}, got "
                       f"{op!r}")
    return name


def combine(op, a, b):
    return _REDUCERS[op][1](a, b)


def command(cmd, reduce_res, what):
    """The reduce_cmd an instruction runs: ``idle`` with a ``reduce_res`` tile reduces this
    instruction's result afresh (as ``reset_reduce``), so that ``reduce_res`` holds it."""
    cmd = member(reduce_cmd, cmd, f"{what} reduce_cmd")
    return reduce_cmd.reset_reduce if cmd is reduce_cmd.idle and reduce_res is not None else cmd


def registers(engine, partitions, what):
    """The engine's register values aligned to the current loop frame; None before any instruction set them."""
    entry = engine_state().registers.get(engine)
    if entry is None:
        return None
    values, frame = entry
    ctx = _context.current()
    carried = [loop for loop in ctx.frame if loop not in frame]
    if carried:
        raise Unbatchable(carried, f"the {engine} engine's accumulation registers carried from one iteration of a "
                          "batched loop to the next")
    values = align(values, frame, ctx.frame)
    if values.shape[-2] != partitions:
        raise NKIError("accumulator-partitions", f"{what} continues the {engine} engine's accumulation over "
                       f"{partitions} partitions, but the registers hold {values.shape[-2]}; start a new one "
                       "with reduce_cmd=reset_reduce")
    return values


def set_registers(engine, values):
    engine_state().registers[engine] = (values.float(), _context.current().frame)


def accumulate(engine, cmd, op, values, what, init=None):
    """Applies ``cmd`` to the engine's registers with this instruction's results ``values``
    (per partition, [..., P, F]) reduced by ``op``; returns the registers' new values, or None
    for ``idle``. ``init`` (a number or [..., P, 1] values) is what ``load_reduce`` loads."""
    if cmd is reduce_cmd.idle:
        return None
    reduce, _, start = _REDUCERS[op]
    values = values.float()
    if cmd is reduce_cmd.reset:
        new = torch.full(values[..., :1].shape, start)
    elif cmd is reduce_cmd.reset_reduce:
        new = reduce(values)
    elif cmd is reduce_cmd.load_reduce:
        if init is None:
            raise NKIError("reduce-init", f"{what}: reduce_cmd=load_reduce needs the value to load")
        new = combine(op, init if isinstance(init, torch.Tensor) else torch.tensor(float(init)), reduce(values))
    else:
        current = registers(engine, values.shape[-2], what)
        new = reduce(values) if current is None else combine(op, current, reduce(values))
    set_registers(engine, new)
    return new


def read_out(reduce_res, values, what, negate=False):
    """Writes register values ([..., P, 1]) to ``reduce_res``, a (P, 1) tile."""
    if not isinstance(reduce_res, NkiTensor) or reduce_res.shape != tuple(values.shape[-2:]):
        got = reduce_res.describe() if isinstance(reduce_res, NkiTensor) else type(reduce_res).__name__
        raise NKIError("shape-mismatch", f"{what}: reduce_res must be a ({values.shape[-2]}, 1) tile, got {got}")
    dst_write(reduce_res, -values if negate else values, f"{what} reduce_res")


def column_values(x):
    """A (P, 1) operand from ``_common.column`` as [..., P, 1] values (a number stays a number)."""
    return per_partition(x) if isinstance(x, torch.Tensor) else x
