"""The stream sanitizer: data races between streams, and between the host and
non-blocking copies, reported with the stack traces of both accesses.

Turn it on with ``TORCHNEURON_SANITIZER=1`` (read when torchneuron is
imported) or ``torchneuron.sanitizer.enable()``, as PyTorch's CUDA sanitizer
is turned on with ``TORCH_CUDA_SANITIZER=1``. A race raises `StreamRaceError`
at the second access. It reports:

- a kernel on one stream touching memory that a kernel on another stream
  writes (or reads, when the second one writes), with no event, ``wait_stream``
  or synchronisation ordering the two;
- the host reading or writing the destination of a non-blocking device→host
  copy before the copy is known complete, and the host writing pinned memory
  that a non-blocking host→device copy may still be reading.

How: a dispatch mode sees every op with the tensors its schema says it reads
and writes, and the stream it is launched on. Each stream, and the host, keeps
a vector clock: how far it has seen each stream's work. A launch advances its
stream's own entry; the trace points of ``csrc/backend/SyncTrace.h`` (event
record and wait, event/stream/device synchronisation) and the host's blocking
reads (``.item()``, a blocking copy to the host) move what one side has seen
into another; every launch starts from what the host has seen. An access is
ordered after an earlier one when its side's clock has reached the earlier
access's position. This is the happens-before relation a real device gives;
the emulator may happen to run the racing work in a safe order, hardware need
not.

Off, it costs nothing: no mode is installed and each trace point is one
atomic load. On, each op pays for Python bookkeeping and a stack capture
(``benchmarks/sanitizer.py`` measures it).

Adaptive eager stays off while it is on: with both, a fuzzed program
crashed inside adaptive eager's flush on autograd's thread (under
investigation), and the sanitizer checks eager's ops one by one anyway.

Not seen: the kernels inside compiled programs (``torch.compile``), work of
threads other than the one that enabled it and autograd's, and reuse of a
freed block by another stream (a fresh output starts its memory's history;
``record_stream`` mistakes go unreported). Memory is tracked per storage, so
two streams writing disjoint halves of one storage are reported.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import _C

__all__ = ["StreamRaceError", "enable", "disable", "is_enabled"]

aten = torch.ops.aten
_HOST = "host"
_FIRST_COMMUNICATION_STREAM = 65  # runtime::kFirstCommunicationStream: not waited for by blocking reads
_EVENT_RECORD, _EVENT_WAIT, _EVENT_SYNCHRONIZE, _STREAM_SYNCHRONIZE, _DEVICE_SYNCHRONIZE = range(5)
_COPIES = (aten._to_copy.default, aten.copy_.default)
_HOST_WAITS_FOR_DEVICE = (aten._local_scalar_dense.default,)
# Ops that look at a tensor's metadata, never its data.
_METADATA_ONLY = {"aten::is_pinned", "aten::is_same_size", "aten::_has_compatible_shallow_copy_type", "aten::dim",
                  "aten::sym_size", "aten::sym_stride", "aten::sym_numel", "aten::sym_storage_offset",
                  "aten::is_complex", "aten::is_floating_point", "aten::is_coalesced", "aten::_nnz"}


class StreamRaceError(RuntimeError):
    """Two accesses to the same memory that nothing orders, one of them a write."""


@dataclass
class _Access:
    actor: object  # ("neuron", device, stream id) or _HOST
    position: int
    op: str
    stack: traceback.StackSummary


@dataclass
class _Memory:
    """The unordered history of one storage: its last write and the reads since."""

    writer: _Access | None = None
    readers: dict = field(default_factory=dict)  # actor -> _Access


_INTERNAL = (__file__, torch.utils._python_dispatch.__file__, torch._ops.__file__, torch._compile.__file__,
             os.path.join(os.path.dirname(torch.__file__), "_dynamo", "eval_frame.py"))
_STACK_LIMIT = 16  # innermost frames kept per access


def _stack() -> traceback.StackSummary:
    """The launching line and its callers (innermost last), without ours."""
    frames = []
    for frame, line in traceback.walk_stack(None):
        if frame.f_code.co_filename not in _INTERNAL:
            frames.append((frame, line))
            if len(frames) == _STACK_LIMIT:
                break
    return traceback.StackSummary.extract(reversed(frames), lookup_lines=False)


def _describe(actor) -> str:
    return "the host" if actor == _HOST else f"neuron:{actor[1]} stream {actor[2]}"


class _Sanitizer(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.clocks: dict = {}  # actor -> {actor: position}
        self.events: dict = {}  # event id -> clock at its record
        self.memory: dict = {}  # (device type, storage address) -> _Memory

    # ---- clocks -------------------------------------------------------------
    def _clock(self, actor) -> dict:
        return self.clocks.setdefault(actor, {})

    def _join(self, into, seen: dict) -> None:
        clock = self._clock(into)
        for actor, position in seen.items():
            if clock.get(actor, 0) < position:
                clock[actor] = position

    def _host_waits_for_device(self, device: int, communication: bool = True) -> None:
        for actor in list(self.clocks):
            if actor != _HOST and actor[1] == device and (communication or actor[2] < _FIRST_COMMUNICATION_STREAM):
                self._join(_HOST, self.clocks[actor])

    def _launch(self, device: int) -> tuple:
        actor = ("neuron", device, torch.neuron.current_stream(device).stream_id)
        self._join(actor, self._clock(_HOST))  # launched after everything the host has seen
        clock = self._clock(actor)
        clock[actor] = clock.get(actor, 0) + 1
        return actor

    def observe(self, kind: int, event: int, device: int, stream: int) -> None:
        """Called by the trace points of csrc/backend/SyncTrace.h."""
        actor = ("neuron", device, stream)
        if kind == _EVENT_RECORD:
            self.events[event] = dict(self._clock(actor))
        elif kind == _EVENT_WAIT:
            self._join(actor, self.events.get(event, {}))
        elif kind == _EVENT_SYNCHRONIZE:
            self._join(_HOST, self.events.get(event, {}))
        elif kind == _STREAM_SYNCHRONIZE:
            self._join(_HOST, self._clock(actor))
        elif kind == _DEVICE_SYNCHRONIZE:
            self._host_waits_for_device(device)

    # ---- accesses -----------------------------------------------------------
    def _ordered(self, actor, earlier: _Access) -> bool:
        return earlier.actor == actor or self._clock(actor).get(earlier.actor, 0) >= earlier.position

    def _access(self, key, access: _Access, write: bool, what: str) -> None:
        memory = self.memory.setdefault(key, _Memory())
        earlier = [memory.writer] if memory.writer else []
        if write:
            earlier += list(memory.readers.values())
        for e in earlier:
            if not self._ordered(access.actor, e):
                self._report(key, access, write, e, e is memory.writer, what)
        if access.actor == _HOST:
            if write:  # everything before is ordered: the device's later work comes after the host's write
                self.memory.pop(key, None)
            return
        if write:
            memory.writer, memory.readers = access, {}
        else:
            memory.readers[access.actor] = access

    def _report(self, key, access: _Access, write: bool, earlier: _Access, earlier_wrote: bool, what: str):
        verb = "writes" if write else "reads"
        before = "wrote" if earlier_wrote else "read"
        where = "host memory" if key[0] == "cpu" else f"{key[0]} memory"
        raise StreamRaceError(
            f"stream race on {what} ({where} at {key[1]:#x}): {access.op} on {_describe(access.actor)} {verb} it "
            f"while {earlier.op} on {_describe(earlier.actor)} {before} it, and nothing orders the two "
            f"(no event, wait_stream or synchronisation between them"
            + (", and a non-blocking copy's host memory may be used only once the copy is known complete)"
               if _HOST in (access.actor, earlier.actor) else ")")
            + f".\n\nThis access ({access.op}):\n{''.join(access.stack.format())}"
            f"\nThe earlier access ({earlier.op}):\n{''.join(earlier.stack.format())}"
        )

    @staticmethod
    def _key(t: torch.Tensor):
        address = t.untyped_storage().data_ptr()
        return (t.device.type, address) if address else None

    # ---- ops ----------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._schema.name
        if func is aten.record_stream.default or name in _METADATA_ONLY:
            return out
        reads, writes = [], []
        for i, argument in enumerate(func._schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(argument.name)
            tensors = [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
            alias = argument.alias_info
            if alias is not None and alias.is_write:
                writes += [(t, argument.name) for t in tensors]
            elif alias is None and not name.startswith(("aten::empty", "aten::new_empty")):
                reads += [(t, argument.name) for t in tensors]
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        fresh = [] if any(r.alias_info is not None for r in func._schema.returns) else outputs
        self._check(func, name, args, kwargs, reads, writes, fresh)
        return out

    def _check(self, func, name, args, kwargs, reads, writes, fresh):
        devices = {t.device.index for t, _ in reads + writes if t.device.type == "neuron"}
        devices |= {t.device.index for t in fresh if t.device.type == "neuron"}
        blocking = func in _HOST_WAITS_FOR_DEVICE
        if func in _COPIES and devices:
            src, dst = (args[0], fresh[0]) if func is aten._to_copy.default else (args[1], args[0])
            non_blocking = kwargs.get("non_blocking", len(args) > 2 and func is aten.copy_.default and args[2])
            to_host = src.device.type == "neuron" and dst.device.type == "cpu"
            if to_host and non_blocking and dst.is_pinned():  # the stream writes the host memory later
                if any(t is dst for t in fresh):  # a new pinned block: its history is its previous owner's
                    self.memory.pop(self._key(dst), None)
                writes = [(t, n) for t, n in writes if t is not dst] + [(dst, "the copy's destination")]
                fresh = [t for t in fresh if t is not dst]
            else:
                blocking = blocking or to_host or (dst.device.type == "neuron" and src.is_pinned() and not non_blocking)
        if blocking:  # a blocking read of the device waits for all of it first
            for device in devices:
                self._host_waits_for_device(device, communication=False)
        stack = _stack()
        # The host touches memory the device may still be using (pinned memory
        # of a non-blocking copy); a copy's pinned memory is touched on the stream.
        for group, write in ((reads, False), (writes, True)):
            for t, what in group:
                if t.device.type == "cpu" and not (func in _COPIES and devices) and (key := self._key(t)) in self.memory:
                    self._access(key, _Access(_HOST, 0, name, stack), write, f"argument {what}")
        for device in devices:
            actor = self._launch(device)
            access = _Access(actor, self._clock(actor)[actor], name, stack)
            for t in fresh:
                if t.device.type == "neuron" and (key := self._key(t)) is not None:
                    self.memory.pop(key, None)  # a new allocation: its earlier history is its previous owner's
                    self._access(key, access, True, "a new output")
            for group, write in ((reads, False), (writes, True)):
                for t, what in group:
                    on_stream = t.device == torch.device("neuron", device) or (func in _COPIES and t.is_pinned())
                    if on_stream and (key := self._key(t)) is not None:
                        self._access(key, access, write, f"argument {what}")
            if blocking:
                self._join(_HOST, self._clock(actor))


_active: _Sanitizer | None = None


def enable() -> None:
    """Checks every op from now on; a race raises StreamRaceError."""
    global _active
    if _active is not None:
        return
    _active = _Sanitizer()
    _C._adaptive_set_enabled(False)
    _active.__enter__()
    _C._set_sync_observer(_active.observe)


def disable() -> None:
    global _active
    if _active is None:
        return
    _C._set_sync_observer(None)
    _active.__exit__(None, None, None)
    _active = None


def is_enabled() -> bool:
    return _active is not None


def _enable_from_environment() -> None:
    value = os.environ.get("TORCHNEURON_SANITIZER", "0")
    if value not in ("0", "1"):
        raise ValueError(f"invalid environment: TORCHNEURON_SANITIZER={value!r}: expected 0 or 1")
    if value == "1":
        enable()
