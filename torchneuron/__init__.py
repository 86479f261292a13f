"""torchneuron: the ``neuron`` device for PyTorch.

Importing this package (which ``import torch`` does by itself through the
``torch.backends`` entry point) renames PrivateUse1 to ``neuron``, registers
``torch.neuron`` and the ``Tensor.neuron()`` family of methods, and loads the
native extension with the device runtime, the allocator and the eager
launcher. Nothing starts running until a device is first used.
"""

import torch

from torchneuron import _C  # noqa: F401  (registers the ATen kernels, guard, hooks, allocator)
from torchneuron import _flex_attention  # noqa: F401  (FlexAttention accepts neuron tensors)
from torchneuron import _rnn_cells  # noqa: F401  (the fused LSTM/GRU cells PyTorch expects of a device)
from torchneuron import _sparse  # noqa: F401  (sparse layouts: COO, CSR, CSC, BSR, BSC)
from torchneuron import adaptive  # noqa: F401  (adaptive eager's compile engine)
from torchneuron import distributed as _distributed  # noqa: F401  (the "neuron" c10d backend)
from torchneuron import neuron as _neuron_module
from torchneuron import sanitizer
from torchneuron import _torch_neuronx_name
from torchneuron._ops import clear_op_tracking, get_executed_ops, get_fallback_ops

__all__ = [
    "get_executed_ops", "get_fallback_ops", "clear_op_tracking", "get_dynamo_metrics", "reset_dynamo_metrics",
    "nki_op", "wrap_nki", "get_adaptive_metrics", "adaptive_eager", "set_adaptive_eager",
]
__version__ = "0.1.0"


def get_dynamo_metrics() -> dict:
    """Counters of torch.compile on neuron; see torchneuron.compile.metrics."""
    from torchneuron.compile import metrics

    return metrics.get_dynamo_metrics()


def reset_dynamo_metrics() -> None:
    from torchneuron.compile import metrics

    metrics.reset_dynamo_metrics()


def get_adaptive_metrics() -> dict:
    """Counters of adaptive eager; see torchneuron.adaptive.get_metrics."""
    return adaptive.get_metrics()


adaptive_eager = adaptive.enabled  # `with torchneuron.adaptive_eager():`
set_adaptive_eager = adaptive.set_enabled


def nki_op(name: str, mutates_args=(), *, schema=None):
    """Registers an NKI kernel as a PyTorch operator; see torchneuron.nki._custom_op."""
    from torchneuron.nki._custom_op import nki_op as make

    return make(name, mutates_args, schema=schema)


def wrap_nki(kernel, mutates_args=()):
    """An NKI kernel as an operator with a generated name; see torchneuron.nki._custom_op."""
    from torchneuron.nki._custom_op import wrap_nki as wrap

    return wrap(kernel, mutates_args)


def _register() -> None:
    if getattr(torch, "neuron", None) is _neuron_module:
        return
    torch.utils.rename_privateuse1_backend("neuron")
    torch._register_device_module("neuron", _neuron_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    _torch_neuronx_name.provide()


_register()
sanitizer._enable_from_environment()  # TORCHNEURON_SANITIZER=1
