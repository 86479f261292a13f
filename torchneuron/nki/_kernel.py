"""``nki.jit`` kernels: checking, launching on neuron tensors, and running on the host.

Every call first runs the kernel's *check pass* (see _context; cached per argument signature):
all rules are enforced and the output declarations collected before any data moves. Then:
  - neuron tensors: outputs are allocated on the device and one task is enqueued on the current
    stream; the task runs the kernel on host views of the device buffers (asynchronous, like an
    eager op);
  - NumPy arrays or CPU tensors (``nki.simulate``): the kernel runs at once on the host.
"""

import functools
import inspect
import itertools
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from torchneuron import _C
from torchneuron.nki import _context, _lnc
from torchneuron.nki.typing import is_mutable
from torchneuron.nki._batch import Affine, Unbatchable
from torchneuron.nki._cost import CostRecorder
from torchneuron.nki._errors import NKIError
from torchneuron.nki._numpy import to_numpy, to_torch
from torchneuron.nki._tile import Allocation, NkiTensor, hbm, shared_hbm

_KNOWN_OPTIONS = {"platform_target"}


class _PlanCache(dict):
    """Plans by call signature, the least recently made dropped past a bound (scalar arguments are
    part of a signature: a kernel called with ever-new values must not grow without limit)."""

    LIMIT = 256

    def put(self, key, plan):
        if len(self) >= self.LIMIT:
            del self[next(iter(self))]
        self[key] = plan


@dataclass
class Plan:
    """What the check pass learned about a call signature."""

    outputs: list          # (shape, dtype) of each shared_hbm tensor, in declaration order
    returns: object        # the return structure: ("out", i), ("in", name), None, or a tuple/list of these
    unbatchable: frozenset | None = None  # loop sites run one iteration at a time; None: batch nothing
    batching_note: str = ""                # why loops run sequentially (for users and tests)
    writes: tuple = ()                     # the inputs the kernel writes, declared or not


def _is_array(x):
    return isinstance(x, (torch.Tensor, np.ndarray))


class Kernel:
    """A kernel function made callable on tensors; ``kernel[g0, g1]`` launches an SPMD grid."""

    def __init__(self, fn, mutates_args=(), grid=(), plans=None, platform_target=None, strict_inputs=False):
        if isinstance(mutates_args, str):
            mutates_args = (mutates_args,)
        self.fn = fn
        self.grid = grid
        self.platform_target = platform_target  # None: NEURON_PLATFORM_TARGET_OVERRIDE's
        self.signature = inspect.signature(fn)
        # Parameters annotated nt.mutable_tensor are declared as written, as mutates_args does.
        annotated = tuple(n for n, p in self.signature.parameters.items() if is_mutable(p.annotation))
        self.mutates_args = tuple(dict.fromkeys(tuple(mutates_args) + annotated))
        unknown = set(self.mutates_args) - set(self.signature.parameters)
        if unknown:
            raise ValueError(f"nki.jit({fn.__name__}): mutates_args names {sorted(unknown)}, which are not "
                             f"parameters of the kernel {list(self.signature.parameters)}")
        # An operator (nki_op) declares every input it writes, as torch.library requires; a
        # kernel may write any argument, as NKI kernels write outputs passed in.
        self.strict_inputs = strict_inputs
        self._plans = _PlanCache() if plans is None else plans
        functools.update_wrapper(self, fn)

    def __repr__(self):
        return f"<nki kernel {self.fn.__qualname__}{list(self.grid) if self.grid else ''}>"

    def __getitem__(self, grid):
        grid = grid if isinstance(grid, tuple) else (grid,)
        if not grid or any(not isinstance(g, (int, np.integer)) or g < 1 for g in grid):
            raise ValueError(f"{self.fn.__name__}[{grid}]: an SPMD grid is one or more positive integers")
        return Kernel(self.fn, self.mutates_args, tuple(int(g) for g in grid), self._plans, self.platform_target,
                      self.strict_inputs)

    # -- the two passes ---------------------------------------------------------------------------
    def _bind(self, args, kwargs):
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{self.fn.__name__}: {e}") from None
        bound.apply_defaults()
        return bound.arguments

    def _run(self, arguments, ctx, tensors, writes=None):
        """Runs every program of the grid with ``tensors`` (name -> torch tensor) as HBM inputs.

        ``writes``: the inputs the kernel writes, when known (loads may then share the memory of
        inputs if there are none); None in the check pass, which finds them (``ctx.written_inputs``).
        """
        wrapped = dict(arguments)
        for name, t in tensors.items():
            wrapped[name] = NkiTensor(t, hbm, Allocation(name, written=True, is_input=True, mutable=(
                name in self.mutates_args or not self.strict_inputs)))
        inputs = {id(w.alloc): (name, w.data) for name, w in wrapped.items() if name in tensors}
        ctx.borrowing = writes is not None and not writes  # writes include mutates_args
        result = None
        with _context.active(ctx):
            if ctx.batching and self.grid and "grid" not in ctx.unbatchable:
                loops = [ctx.push_loop("grid", g) for g in self.grid]  # every program at once
                ctx.program, ctx.cursor = tuple(Affine(0, {loop: 1}) for loop in loops), 0
                try:
                    result = self.fn(**wrapped)
                finally:
                    for loop in loops:
                        ctx.pop_loop(loop)
            else:
                programs = list(itertools.product(*(range(g) for g in self.grid))) if self.grid else [()]
                if len(programs) == 1:
                    ctx.program, ctx.cursor = programs[0], 0
                    result = self.fn(**wrapped)
                else:  # one core each, taking turns at barriers (see _lnc)
                    ctx.lnc = _lnc.Cores(ctx, programs)
                    try:
                        result = ctx.lnc.run(lambda: self.fn(**wrapped))[-1]
                    finally:
                        ctx.lnc = None
        ctx.written_inputs = tuple(name for name, w in wrapped.items() if name in tensors and w.alloc.modified)
        return self._structure(result, ctx, inputs)

    def _structure(self, value, ctx, inputs):
        if value is None:
            return None
        if isinstance(value, (tuple, list)):
            return type(value)(self._structure(v, ctx, inputs) for v in value)
        if isinstance(value, NkiTensor):
            if value.key is None and id(value.alloc) in inputs:
                name, data = inputs[id(value.alloc)]
                if value.data is not data:
                    raise NKIError("kernel-return", f"{self.fn.__name__} returns part of its input {name!r}; a "
                                   "kernel returns whole tensors")
                return ("in", name)
            for i, out in enumerate(ctx.outputs):
                if out.alloc is value.alloc and value.shape == out.shape:
                    return ("out", i)
            raise NKIError("kernel-return", f"{self.fn.__name__} returns {value.describe()}; a kernel returns whole "
                           "HBM tensors declared with nl.ndarray(..., buffer=nl.shared_hbm) (or its inputs)")
        raise NKIError("kernel-return", f"{self.fn.__name__} returns a {type(value).__name__}; a kernel returns "
                       "HBM tensors, tuples of them, or None")

    def check(self, arguments, target=None, cost=False):
        """The check pass: a Plan (and a CostRecorder when ``cost``), raising NKIError on any violation."""
        tensors = {n: to_torch(v) if isinstance(v, np.ndarray) else v for n, v in arguments.items() if _is_array(v)}
        key = None
        target = target or self.platform_target
        aliases = _aliases(tensors)
        if not cost:
            try:
                key = (self.grid, target, self.mutates_args, self.strict_inputs, aliases, tuple(
                    (n, tuple(v.shape), tuple(v.stride()), v.dtype)
                    if isinstance(v, torch.Tensor) else (n, v) for n, v in {**arguments, **tensors}.items()))
                plan = self._plans.get(key)
                if plan is not None:
                    return plan, None
            except TypeError:  # an unhashable argument: check every call
                key = None
        stand_ins = {n: _stand_in(v) for n, v in tensors.items()}
        pristine = {n: v.clone() for n, v in stand_ins.items()}
        ctx = _context.CallContext(_context.Platform.named(target), checking=True, grid=self.grid)
        if cost:
            ctx.cost = CostRecorder(ctx.platform)
        ctx.batchable = any(g > 1 for g in self.grid)
        returns = self._run(arguments, ctx, stand_ins)
        plan = Plan([(t.shape, t.data.dtype) for t in ctx.outputs], returns,  # (packed dtypes: their storage)
                    writes=tuple(dict.fromkeys(self.mutates_args + ctx.written_inputs)))
        if not cost:
            expected = [t.data for t in ctx.outputs] + [stand_ins[n] for n in plan.writes if n in stand_ins]
            if not ctx.batchable:
                plan.unbatchable, plan.batching_note = None, "nothing to batch"  # a grid of one must not run as a batch
            elif any(set(group) & set(plan.writes) for group in aliases):
                plan.unbatchable, plan.batching_note = None, "not batched: a mutable argument aliases another"
            else:
                plan.unbatchable, plan.batching_note = self._choose_batching(arguments, pristine, plan, expected,
                                                                             target)
        if key is not None:
            self._plans.put(key, plan)
        return plan, ctx.cost

    def _choose_batching(self, arguments, pristine, plan, expected, target):
        """Which affine_range loops (and grid) run batched: trial runs on the check pass's data,
        dropping the loops that cannot be batched, until one runs and matches the sequential result."""
        if not BATCHING:
            return None, "batching disabled (TORCHNEURON_NKI_BATCH=0)"
        unbatchable = set()
        for _ in range(32):
            inputs = {n: v.clone() for n, v in pristine.items()}
            outputs = [_filled(shape, dtype) for shape, dtype in plan.outputs]  # as the check pass's
            ctx = _context.CallContext(_context.Platform.named(target), checking=False, grid=self.grid,
                                       batching=True, trial=True, unbatchable=set(unbatchable))
            ctx.outputs = [NkiTensor(b, shared_hbm, Allocation(f"output {i}")) for i, b in enumerate(outputs)]
            ctx.preset_outputs = outputs
            try:
                self._run({**arguments, **inputs}, ctx, inputs, plan.writes)
            except Unbatchable as e:
                sites = {ctx.loop_sites.get(loop) for loop in e.loops}
                if not sites or None in sites or sites <= unbatchable:
                    return None, f"not batched: {e}"
                unbatchable |= sites
                continue
            except Exception as e:  # the sequential pass passed: batching must not change that
                return None, f"not batched: the batched trial failed ({type(e).__name__}: {e})"
            got = outputs + [inputs[n] for n in plan.writes if n in inputs]
            if all(_agree(a, b) for a, b in zip(expected, got)):
                return frozenset(unbatchable), "" if not unbatchable else \
                    f"{len(unbatchable)} loop(s) run sequentially"
            return None, "not batched: the batched trial did not reproduce the sequential results"
        return None, "not batched: too many loops could not be batched"

    def execute(self, arguments, plan, host_tensors, output_buffers):
        """The run pass on host tensors; ``output_buffers`` receive the declared shared_hbm tensors."""
        ctx = _context.CallContext(_context.Platform.named(self.platform_target), checking=False, grid=self.grid,
                                   batching=plan.unbatchable is not None, unbatchable=set(plan.unbatchable or ()))
        ctx.outputs = [NkiTensor(b, shared_hbm, Allocation(f"output {i}")) for i, b in enumerate(output_buffers)]
        ctx.preset_outputs = output_buffers
        self._run(arguments, ctx, host_tensors, plan.writes)

    # -- calls ----------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if torch.compiler.is_compiling():  # one clean graph break; wrap_nki/nki_op trace without one
            return _outside_graph()(self, *args, **kwargs)
        if _context.inside_kernel():  # called from another kernel: inline, as NKI does
            if self.grid:
                raise NKIError("nested-grid", f"{self.fn.__name__}{list(self.grid)} is called from inside a kernel; "
                               "a kernel called from a kernel runs inline and cannot launch a grid")
            return self.fn(*args, **kwargs)
        arguments = self._bind(args, kwargs)
        tensors = {n: v for n, v in arguments.items() if _is_array(v)}
        devices = {n: v.device for n, v in tensors.items() if isinstance(v, torch.Tensor)}
        kinds = {d.type for d in devices.values()}
        if len(set(devices.values())) > 1:
            listing = ", ".join(f"{n} on {d}" for n, d in devices.items())
            raise RuntimeError(f"{self.fn.__name__}: expected all tensors on one device, got {listing}")
        if kinds == {"neuron"}:
            if len(devices) != len(tensors):
                raise TypeError(f"{self.fn.__name__}: NumPy arrays cannot be mixed with neuron tensors")
            return self._launch(arguments, tensors)
        if kinds - {"cpu"}:
            raise RuntimeError(f"{self.fn.__name__}: NKI kernels run on neuron tensors, or on CPU tensors and NumPy "
                               f"arrays through the simulator; got tensors on {sorted(kinds)}")
        return self._simulate(arguments, tensors)

    def _launch(self, arguments, tensors):
        if _closing:
            raise RuntimeError(f"{self.fn.__name__}: the interpreter is shutting down; kernels can no longer run "
                               "on the device")
        plan, _ = self.check(arguments)
        device = next(iter(tensors.values())).device
        outputs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in plan.outputs]
        names = list(tensors)
        scalars = {n: v for n, v in arguments.items() if n not in tensors}
        n_in = len(names)

        def task(views):
            inputs = dict(zip(names, views[:n_in]))
            self.execute({**scalars, **inputs}, plan, inputs, list(views[n_in:]))

        _C._enqueue_host_task(f"nki kernel {self.fn.__name__}", list(tensors.values()) + outputs, task)
        _tasks_enqueued()
        return _restructure(plan.returns, outputs, tensors)

    def _simulate(self, arguments, tensors):
        plan, _ = self.check(arguments)
        host = {n: to_torch(v) if isinstance(v, np.ndarray) else v for n, v in tensors.items()}
        outputs = [_filled(shape, dtype) for shape, dtype in plan.outputs]
        self.execute({**arguments, **host}, plan, host, outputs)
        as_numpy = any(isinstance(v, np.ndarray) for v in tensors.values())
        if as_numpy:
            outputs = [to_numpy(o) for o in outputs]
        return _restructure(plan.returns, outputs, tensors)


def _stand_in(v):
    """Check-pass data for an argument: same shape, strides and dtype, never the caller's data."""
    if isinstance(v, np.ndarray):
        v = to_torch(v)
    return _context.scratch([int(n) for n in v.shape], v.dtype, [int(s) for s in v.stride()])


# TORCHNEURON_NKI_BATCH (parsed with the other settings in the runtime's Config).
BATCHING = bool(_C._config()["nki_batch"])


_disabled_call = None


def _outside_graph():
    """Kernel.__call__ with Dynamo off (made on first use: it imports Dynamo)."""
    global _disabled_call
    if _disabled_call is None:
        _disabled_call = torch.compiler.disable(Kernel.__call__, recursive=True)
    return _disabled_call


def _agree(expected, got):
    """Batched and sequential results agree up to the reordering of floating-point sums."""
    if not expected.is_floating_point():
        return torch.equal(expected, got)
    tol = {torch.float32: 1e-4, torch.float64: 1e-9}.get(expected.dtype, 5e-2)
    e, g = expected.double(), got.double()
    finite = e[torch.isfinite(e)]
    scale = finite.abs().max().item() if finite.numel() else 1.0
    return torch.allclose(g, e, rtol=tol, atol=tol * max(scale, 1.0), equal_nan=True)


def _aliases(tensors):
    """Pairs of argument names whose tensors' memory overlaps (aliasing changes what a kernel does)."""
    spans = []
    for name, t in tensors.items():
        try:
            storage = t.untyped_storage()
            spans.append((name, storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
        except RuntimeError:  # a fake tensor (tracing): no memory to share
            continue
    return tuple((a, b) for i, (a, start_a, end_a) in enumerate(spans) for b, start_b, end_b in spans[i + 1:]
                 if start_a < end_b and start_b < end_a)


def _filled(shape, dtype):
    """Simulated outputs start as NaN (floats) or 4 (integers), as NKI's simulator fills them."""
    return torch.full(shape, float("nan") if dtype.is_floating_point else 4, dtype=dtype)


def _restructure(returns, outputs, inputs):
    if returns is None:
        return None
    if isinstance(returns, (tuple, list)) and (not returns or not isinstance(returns[0], str)):
        return type(returns)(_restructure(r, outputs, inputs) for r in returns)
    kind, index = returns
    return outputs[index] if kind == "out" else inputs[index]


_exit_hook_installed = False
_closing = False


def _tasks_enqueued():
    """Kernel tasks need the interpreter: wait for them before it shuts down."""
    global _exit_hook_installed
    if not _exit_hook_installed:
        import atexit
        atexit.register(_drain_devices)
        _exit_hook_installed = True


def _drain_devices():
    global _closing
    _closing = True
    try:
        for d in range(torch.neuron.device_count()):
            torch.neuron.synchronize(d)
    except Exception:  # errors of abandoned work are not the exit's business
        pass


def jit(fn=None, *, mode="auto", mutates_args=(), **options):
    """Decorator: ``@nki.jit`` or ``@nki.jit(mutates_args=("x",))`` makes a function an NKI kernel.

    ``mode`` is accepted for compatibility: a kernel runs on the device its tensors are on and in
    the simulator for NumPy arrays and CPU tensors, whatever the mode.
    """
    unknown = set(options) - _KNOWN_OPTIONS
    if unknown:
        warnings.warn(f"nki.jit: options {sorted(unknown)} are compiler options of the Neuron compiler and have no "
                      "effect on the emulated device", stacklevel=2)
    if fn is None:
        return lambda f: jit(f, mode=mode, mutates_args=mutates_args, **options)
    if isinstance(fn, Kernel):
        return fn
    return Kernel(fn, mutates_args, platform_target=options.get("platform_target"))
