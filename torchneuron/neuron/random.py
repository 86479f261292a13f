"""Random number generation: one counter-based generator per device.

The state is (seed, offset); each random op takes the next offset when it is
launched, so the same seed gives the same numbers run to run regardless of
how far the host runs ahead of the device.
"""

from __future__ import annotations

from typing import Any

import torch

from torchneuron import _C
from torchneuron.neuron._device import _get_device_index, device_count


def _generator(device: Any = None) -> torch.Generator:
    return _C._default_generator(_get_device_index(device))


def _all_generators() -> tuple[torch.Generator, ...]:
    return tuple(_C._default_generator(i) for i in range(device_count()))


def __getattr__(name: str):
    if name == "default_generators":
        return _all_generators()
    raise AttributeError(name)


default_generators: tuple[torch.Generator, ...]


def get_rng_state(device: Any = "neuron") -> torch.Tensor:
    """The generator state of a device as a CPU ``torch.uint8`` tensor."""
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "neuron") -> None:
    _generator(device).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [g.get_state() for g in _all_generators()]


def set_rng_state_all(new_states) -> None:
    for g, state in zip(_all_generators(), new_states):
        g.set_state(state)


def manual_seed(seed: int) -> None:
    """Seeds the current device's generator."""
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for g in _all_generators():
        g.manual_seed(int(seed))


def seed() -> None:
    """Seeds the current device with a non-deterministic random number."""
    _generator().seed()


def seed_all() -> None:
    s = _generator().seed()
    for g in _all_generators():
        g.manual_seed(s)


def initial_seed() -> int:
    return _generator().initial_seed()
