"""Devices: discovery, selection, properties, synchronisation."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from torchneuron import _C



def _get_device_index(device: Any = None, optional: bool = True) -> int:
    """Normalises a device argument to an index; ``None`` is the current device."""
    if device is None:
        if not optional:
            raise ValueError("Expected a neuron device, got None")
        return current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "neuron":
            raise ValueError(f"Expected a neuron device, but got: {device}")
        return current_device() if device.index is None else device.index
    if isinstance(device, int):
        return device
    raise ValueError(f"Expected a neuron device index, string or torch.device, got {type(device).__name__}")


def is_available() -> bool:
    """True when at least one neuron device is visible (NEURON_RT_NUM_CORES / NEURON_RT_VISIBLE_CORES)."""
    return _C._device_count() > 0


def device_count() -> int:
    return _C._device_count()


def is_initialized() -> bool:
    return _C._is_initialized() and not _C._is_in_bad_fork()


def _is_in_bad_fork() -> bool:
    return _C._is_in_bad_fork()


def init() -> None:
    """Initialises the runtime (normally lazy, on first use)."""
    _lazy_init()


def _lazy_init() -> None:
    _C._init()


def current_device() -> int:
    return _C._current_device()


def set_device(device: Any) -> None:
    index = _get_device_index(device)
    if index >= 0:
        _C._set_device(index)


class device:
    """Context manager that changes the current device (like ``torch.cuda.device``)."""

    def __init__(self, device: Any):
        self.idx = _get_device_index(device, optional=True) if device is not None else -1
        self.prev_idx = -1

    def __enter__(self):
        if self.idx >= 0:
            self.prev_idx = current_device()
            if self.prev_idx != self.idx:
                _C._set_device(self.idx)
        return self

    def __exit__(self, *exc):
        if self.idx >= 0 and self.prev_idx != self.idx:
            _C._set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of ``obj`` (a tensor) current; no-op for CPU tensors."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == "neuron" else None)


@dataclasses.dataclass(frozen=True)
class _DeviceProperties:
    name: str
    total_memory: int
    platform: str
    core_name: str
    physical_core: int
    cores_per_chip: int
    hbm_bandwidth_tbps: float
    core_bf16_tflops: float
    sbuf_bytes: int
    psum_bytes: int
    partitions: int
    major: int
    minor: int
    multi_processor_count: int = 1
    is_emulated: bool = True

    def __repr__(self) -> str:
        return (f"_NeuronDeviceProperties(name='{self.name}', total_memory={self.total_memory // (1 << 20)}MB, "
                f"platform='{self.platform}', physical_core={self.physical_core}, emulated={self.is_emulated})")


def get_device_properties(device: Any = None) -> _DeviceProperties:
    index = _get_device_index(device)
    _check_index(index)
    p = _C._platform()
    major = 3 if p["target"] == "trn2" else 4
    return _DeviceProperties(
        name=get_device_name(index),
        total_memory=_C._device_capacity(index),
        platform=p["target"],
        core_name=p["core_name"],
        physical_core=_C._physical_core(index),
        cores_per_chip=p["cores_per_chip"],
        hbm_bandwidth_tbps=p["hbm_bandwidth_tbps"],
        core_bf16_tflops=p["core_bf16_tflops"],
        sbuf_bytes=p["partitions"] * p["sbuf_partition_bytes"],
        psum_bytes=p["partitions"] * p["psum_partition_bytes"],
        partitions=p["partitions"],
        major=major,
        minor=0,
    )


def get_device_name(device: Any = None) -> str:
    index = _get_device_index(device)
    _check_index(index)
    p = _C._platform()
    return f"{p['core_name']} ({p['target']}, emulated) core {_C._physical_core(index)}"


def get_device_capability(device: Any = None) -> tuple[int, int]:
    props = get_device_properties(device)
    return props.major, props.minor


def synchronize(device: Any = None) -> None:
    """Waits for every stream of the device; raises the first error of an asynchronous task."""
    index = _get_device_index(device)
    _C._synchronize(index)


def _check_index(index: int) -> None:
    count = device_count()
    if not 0 <= index < count:
        raise RuntimeError(f"Invalid device argument {index}: neuron has {count} device(s)")
