"""``torch.neuron``: the device module, mirroring ``torch.cuda``.

Device indices follow the same rules as CUDA: ``None`` means the current
device; an int, ``"neuron:1"`` or ``torch.device("neuron", 1)`` name one.
"""

from __future__ import annotations

import torch

from torchneuron import _C
from torchneuron.neuron._device import (
    _get_device_index,
    _is_in_bad_fork,
    _lazy_init,
    current_device,
    device,
    device_count,
    device_of,
    get_device_capability,
    get_device_name,
    get_device_properties,
    init,
    is_available,
    is_initialized,
    set_device,
    synchronize,
)
from torchneuron.neuron.amp import get_amp_supported_dtype, is_bf16_supported
from torchneuron.neuron.memory import (
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
)
from torchneuron.neuron.random import (
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from torchneuron.neuron.streams import (
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    set_stream,
    stream,
)

__all__ = [
    "is_available", "is_initialized", "init", "device_count", "current_device", "set_device", "device",
    "device_of", "get_device_name", "get_device_properties", "get_device_capability", "synchronize",
    "Stream", "Event", "StreamContext", "stream", "current_stream", "default_stream", "set_stream",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state",
    "get_rng_state_all", "set_rng_state_all", "default_generators", "get_amp_supported_dtype",
    "is_bf16_supported", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "max_memory_reserved", "memory_stats", "memory_summary", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "empty_cache", "mem_get_info",
]


def __getattr__(name: str):
    # torch.utils.checkpoint saves device RNG state only when
    # `device_module._initialized` is true (as torch.cuda provides).
    if name == "_initialized":
        return is_initialized()
    # Inductor looks these up on the device module when it first lowers a
    # graph, so torch.compile(backend="inductor") on neuron tensors finds the
    # neuron code generator without torchneuron.compile being imported first.
    if name in ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen"):
        from torchneuron import compile as _compile

        return _compile.inductor_classes()[name]
    raise AttributeError(f"module 'torch.neuron' has no attribute '{name}'")
