"""Behavioural parity on bad input: each OpInfo's error inputs run on CPU and
on neuron must raise the same exception type. After the errors, no device
memory is left allocated, an unrelated tensor is unchanged and the device
still computes.
"""

from __future__ import annotations

import gc

import torch

from torch.testing._internal.opinfo.core import ErrorInput

from .op_checks import Result, _message
from .tensors import to_device


def _raised(op, error_input, sync: bool):
    s = error_input.sample_input
    try:
        op(s.input, *s.args, **s.kwargs)
        if sync:
            torch.neuron.synchronize()
    except Exception as e:  # noqa: BLE001 - the point is to catch it
        return e
    return None


def check_errors(op) -> tuple[Result, int]:
    """(result, number of error inputs compared)."""
    if op.error_inputs_func is None:
        return Result("skipped", "no error inputs"), 0
    try:
        cpu_inputs = list(op.error_inputs("cpu"))
    except Exception as e:  # noqa: BLE001 - the generator itself is broken
        return Result("error", "generating error inputs: " + _message(e)), 0
    if not cpu_inputs:
        return Result("skipped", "no error inputs"), 0
    # Generated on CPU (some cases, like out-of-range indices, only are) and
    # copied, aliasing kept, to neuron.
    neuron_inputs = [ErrorInput(to_device(e.sample_input, "neuron"), error_type=e.error_type,
                                error_regex=e.error_regex) for e in cpu_inputs]
    sentinel = torch.arange(64, dtype=torch.float32, device="neuron")
    gc.collect()
    torch.neuron.synchronize()
    allocated = torch.neuron.memory_allocated()
    mismatches = []
    for cpu_input, neuron_input in zip(cpu_inputs, neuron_inputs):
        expected = _raised(op, cpu_input, sync=False)
        actual = _raised(op, neuron_input, sync=True)
        if type(actual) is not type(expected):
            mismatches.append(f"{type(expected).__name__ if expected else 'no error'} on CPU, "
                              f"{_message(actual) if actual else 'no error'} on neuron")
        del actual, expected
    gc.collect()
    torch.neuron.synchronize()
    leaked = torch.neuron.memory_allocated() - allocated
    if mismatches:
        return Result("fail", f"{len(mismatches)}/{len(cpu_inputs)}: " + mismatches[0]), len(cpu_inputs)
    if leaked:
        return Result("fail", f"{leaked} bytes of device memory left allocated after errors"), len(cpu_inputs)
    if not torch.equal(sentinel.cpu(), torch.arange(64, dtype=torch.float32)):
        return Result("fail", "an unrelated tensor changed"), len(cpu_inputs)
    if (sentinel + 1).sum().item() != sum(range(1, 65)):
        return Result("fail", "the device no longer computes correctly"), len(cpu_inputs)
    return Result("pass"), len(cpu_inputs)
