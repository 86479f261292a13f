"""Streams and events: in-order device queues and points in them.

``Stream`` and ``Event`` are the generic ``torch.Stream`` / ``torch.Event``
bound to the neuron device, so they work everywhere PyTorch accepts those
(``torch.accelerator``, ``Tensor.record_stream``, FSDP, Dynamo).
"""

from __future__ import annotations

from typing import Any

import torch

from torchneuron import _C
from torchneuron.neuron._device import _get_device_index



class Stream(torch.Stream):
    """A neuron stream. ``priority`` < 0 takes a high-priority stream from the pool."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs):
        if "stream_id" in kwargs:
            return super().__new__(cls, **kwargs)
        index = _get_device_index(device)
        return super().__new__(cls, torch.device("neuron", index), priority=priority)

    def wait_event(self, event: "Event") -> None:
        event.wait(self)

    def wait_stream(self, stream: torch.Stream) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: "Event | None" = None) -> "Event":
        if event is None:
            event = Event()
        event.record(self)
        return event

    @property
    def priority(self) -> int:
        return _C._stream_priority(self.stream_id, self.device_index)

    def __repr__(self) -> str:
        return f"<torch.neuron.Stream device=neuron:{self.device_index} id={self.stream_id}>"


class Event(torch.Event):
    """A neuron event; ``enable_timing=True`` allows ``elapsed_time``."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        if interprocess:
            raise NotImplementedError("interprocess neuron events are not supported by the emulated runtime")
        return super().__new__(cls, device="neuron", enable_timing=enable_timing, blocking=blocking)

    def record(self, stream: torch.Stream | None = None) -> None:
        super().record(stream if stream is not None else current_stream())

    def wait(self, stream: torch.Stream | None = None) -> None:
        super().wait(stream if stream is not None else current_stream())


def _wrap(packed: tuple[int, int, int]) -> Stream:
    stream_id, device_index, device_type = packed
    return Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)


def current_stream(device: Any = None) -> Stream:
    return _wrap(_C._current_stream(_get_device_index(device)))


def default_stream(device: Any = None) -> Stream:
    return _wrap(_C._default_stream(_get_device_index(device)))


def set_stream(stream: torch.Stream | None) -> None:
    if stream is None:
        return
    _C._set_stream(stream.stream_id, stream.device_index)


class StreamContext:
    """Makes ``stream`` current on its device (and that device current) for a block."""

    def __init__(self, stream: torch.Stream | None):
        self.stream = stream
        self.prev_stream: torch.Stream | None = None
        self.prev_device = -1

    def __enter__(self):
        if self.stream is None:
            return self
        self.prev_device = _C._current_device()
        if self.stream.device_index != self.prev_device:
            _C._set_device(self.stream.device_index)
        self.prev_stream = current_stream(self.stream.device_index)
        set_stream(self.stream)
        return self

    def __exit__(self, *exc):
        if self.stream is None:
            return False
        set_stream(self.prev_stream)
        if self.stream.device_index != self.prev_device:
            _C._set_device(self.prev_device)
        return False


def stream(stream: torch.Stream | None) -> StreamContext:
    return StreamContext(stream)
