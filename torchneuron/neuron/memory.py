"""Device memory: the caching allocator's statistics and controls.

The numbers come from the allocator through ``torch.accelerator`` (the same
``memory_stats()`` keys as CUDA), so both APIs always agree.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from torchneuron import _C
from torchneuron.neuron._device import _get_device_index


def memory_stats(device: Any = None) -> "OrderedDict[str, Any]":
    return torch.accelerator.memory_stats(_get_device_index(device))


def memory_allocated(device: Any = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: Any = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: Any = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: Any = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device: Any = None) -> None:
    torch.accelerator.reset_peak_memory_stats(_get_device_index(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(_get_device_index(device))


def empty_cache() -> None:
    """Returns cached, unused device memory to the device (tensors in use are untouched)."""
    _C._empty_cache()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the device, as ``torch.cuda.mem_get_info``."""
    return tuple(_C._mem_get_info(_get_device_index(device)))


def _format_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A table of the allocator statistics, laid out like ``torch.cuda.memory_summary``."""
    index = _get_device_index(device)
    stats = memory_stats(index)
    rows = [
        ("Allocated memory", "allocated_bytes", True),
        ("Active memory", "active_bytes", True),
        ("Requested memory", "requested_bytes", True),
        ("Reserved memory", "reserved_bytes", True),
        ("Non-releasable memory", "inactive_split_bytes", True),
        ("Allocations", "allocation", False),
        ("Active allocs", "active", False),
        ("Device reserved segments", "segment", False),
        ("Non-releasable allocs", "inactive_split", False),
    ]
    pools = ["all"] if abbreviated else ["all", "large_pool", "small_pool"]
    width = 75
    lines = ["=" * width, f" neuron:{index} memory summary (caching allocator)".ljust(width), "-" * width,
             f"{'Metric':<28}{'Cur Usage':>12}{'Peak Usage':>12}{'Tot Alloc':>12}{'Tot Freed':>11}", "-" * width]
    for title, key, is_bytes in rows:
        for pool in pools:
            fmt = _format_size if is_bytes else str
            vals = [stats.get(f"{key}.{pool}.{field}", 0) for field in ("current", "peak", "allocated", "freed")]
            label = title if pool == "all" else f"  from {pool.replace('_', ' ')}"
            lines.append(f"{label:<28}" + "".join(f"{fmt(v):>12}" for v in vals[:3]) + f"{fmt(vals[3]):>11}")
        lines.append("-" * width)
    free, total = mem_get_info(index)
    lines.append(f"Device capacity: {_format_size(total)}; free on device: {_format_size(free)}")
    lines.append(f"Alloc retries: {stats.get('num_alloc_retries', 0)}  OOMs: {stats.get('num_ooms', 0)}  "
                 f"Device allocs: {stats.get('num_device_alloc', 0)}  Device frees: {stats.get('num_device_free', 0)}")
    lines.append("=" * width)
    return "\n".join(lines) + "\n"
