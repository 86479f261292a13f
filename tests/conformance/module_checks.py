"""Checks of one `torch.nn` module (a ModuleInfo of PyTorch's module_db) at
one dtype: the same module, with the same parameters, on neuron and on CPU;
forward outputs, buffers after forward (running statistics) and the
gradients of inputs and parameters are compared, in training mode and, where
they differ, eval mode.
"""

from __future__ import annotations

import copy

import torch

from . import known
from .op_checks import Result, _message
from .tensors import assert_same, tensors, to_device



def check_module(module_info, dtype, *, max_inputs: int | None = None) -> Result:
    modes = (True, False) if module_info.train_and_eval_differ else (True,)
    shapes_only = module_info.name in known.RANDOM_MODULES
    ran = 0
    for training in modes:
        torch.manual_seed(0)
        inputs = module_info.module_inputs_func(module_info, device="cpu", dtype=dtype, requires_grad=True,
                                                training=training)
        for i, module_input in enumerate(inputs):
            if max_inputs is not None and i >= max_inputs:
                break
            if module_input.forward_input is None:
                continue
            ctor, fwd = module_input.constructor_input, module_input.forward_input
            label = f"{'train' if training else 'eval'} {module_input.desc or i}"
            try:
                torch.manual_seed(0)
                cpu_module = module_info.module_cls(*ctor.args, **ctor.kwargs).to(dtype).train(training)
                if module_info.is_lazy:  # materialise the parameters first, on CPU
                    with torch.no_grad():
                        cpu_module(*to_device(fwd.args, "cpu"), **to_device(fwd.kwargs, "cpu"))
                pristine = copy.deepcopy(cpu_module)  # before forward updates running statistics
                cpu_args, cpu_kwargs = to_device((fwd.args, fwd.kwargs), "cpu")
                expected = cpu_module(*cpu_args, **cpu_kwargs)
                expected_grads = _grads(cpu_module, expected, (cpu_args, cpu_kwargs), None)
            except Exception:  # noqa: BLE001 - not a valid input on CPU either
                continue
            ran += 1
            try:
                neuron_module = pristine.to("neuron")
                args, kwargs = to_device((fwd.args, fwd.kwargs), "neuron")
                actual = neuron_module(*args, **kwargs)
                torch.neuron.synchronize()
            except Exception as e:  # noqa: BLE001
                return Result("error", f"{label} forward: {_message(e)}")
            try:
                assert_same(actual, expected, shapes_only=shapes_only)
                assert_same(list(neuron_module.buffers()), list(cpu_module.buffers()))
            except AssertionError as e:
                return Result("fail", f"{label} forward: {_message(e)}")
            if shapes_only:
                continue
            try:
                actual_grads = _grads(neuron_module, actual, (args, kwargs), expected_grads[1])
                torch.neuron.synchronize()
            except Exception as e:  # noqa: BLE001
                return Result("error", f"{label} backward: {_message(e)}")
            try:
                assert_same(actual_grads[0], expected_grads[0])
            except AssertionError as e:
                return Result("fail", f"{label} backward: {_message(e)}")
    return Result("pass") if ran else Result("skipped", "no input runs on CPU")


def _grads(module, out, inputs, grad_outputs):
    """(gradients of differentiable inputs and parameters, the output
    gradients used); grad_outputs drawn on CPU when None."""
    outs = [o for o in tensors(out) if o.requires_grad]
    wrt = [t for t in tensors(inputs) if t.requires_grad] + [p for p in module.parameters() if p.requires_grad]
    if not outs or not wrt:
        return [], []
    if grad_outputs is None:
        torch.manual_seed(1)
        grad_outputs = [torch.randn_like(o) for o in outs]
    device_grads = [g.to(outs[0].device) for g in grad_outputs]
    return list(torch.autograd.grad(outs, wrt, device_grads, allow_unused=True)), grad_outputs
