"""``mode="reduce-overhead"`` on neuron: compiled graphs replayed as device graphs.

Each compiled forward or backward is wrapped in a ``GraphReplay``. Per input
signature (shapes, strides, dtypes, scalar arguments) it runs once eagerly
(warm-up: first-call checks, lazy initialisation), then records the compiled
code into a ``torch.accelerator.Graph`` and from then on replays it: one device
task per call instead of one launch per kernel and per op.

Inputs are handled as CUDA-graph trees do:
- static inputs (parameters and buffers, as Inductor marks them, and any
  nn.Parameter passed to a backward) are used in place; if one moves to
  another address the graph is recorded again;
- other inputs are copied into buffers owned by the recording (one launch);
  inputs the graph mutates are copied back afterwards;
- a new signature gets its own recording (a shape change never reuses one).

Outputs are copied out of the graph's memory into fresh tensors (one launch),
so results stay valid when the graph replays again: unlike CUDA graphs, users
need neither ``clone()`` nor ``cudagraph_mark_step_begin()``.

Recording happens on a private stream, so work other threads launch meanwhile
on the default stream is not captured; replays run on the caller's current
stream. A GraphReplay must not be called from several threads at once (the
recording's input buffers are shared), as with CUDA graphs.

Graphs with CPU kernels or CPU inputs are not replayed (their host work would
run only at capture time). Random ops in a replay draw new numbers each time,
but from a generator captured at recording (``torch.manual_seed`` does not
rewind them). A graph that cannot be recorded (it synchronises with the host,
or has more than MAX_RECORDINGS input signatures) runs without replay from then on, with one warning and
the reason in ``get_dynamo_metrics()["graph_replay_fallbacks"]``.
"""

from __future__ import annotations

import warnings

import torch
from torch._inductor.cudagraph_utils import CUDAGraphPolicy
from torch._inductor.output_code import CompiledFxGraph

from . import metrics

# A parameter that keeps moving (a user re-creating it every step) would make
# every call record again; past this many re-recordings the graph runs plainly.
RERECORD_LIMIT = 16
# Each recording keeps its own memory: dynamic shapes must not grow them without bound.
MAX_RECORDINGS = 8


def _signature(args: list, static: frozenset) -> tuple:
    key = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            key.append((a.dtype, a.device, tuple(a.shape), a.stride(), i in static))
        else:
            key.append(a)
    return tuple(key)


def _copyable(t: torch.Tensor) -> torch.Tensor:
    """The part of `t` that holds distinct elements (expanded dims taken once)."""
    for dim, stride in enumerate(t.stride()):
        if stride == 0 and t.shape[dim] > 1:
            t = t.narrow(dim, 0, 1)
    return t


class _Recording:
    def __init__(self, compiled, args: list, static: frozenset, mutated: frozenset):
        static = static | {i for i, a in enumerate(args) if isinstance(a, torch.nn.Parameter)}
        self.static_index = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i in static]
        self.static_ptrs = [args[i].data_ptr() for i in self.static_index]
        self.copied_index = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in static]
        self.mutated_index = [i for i in self.copied_index if i in mutated]
        self.inputs = list(args)
        for i in self.copied_index:
            a = args[i]
            buffer = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
            _copyable(buffer).copy_(_copyable(a))
            self.inputs[i] = buffer
        self.graph = torch.accelerator.Graph()
        caller = torch.neuron.current_stream()
        private = torch.neuron.Stream()
        private.wait_stream(caller)
        with torch.neuron.stream(private):
            self.graph.capture_begin()
            try:
                outputs = compiled(list(self.inputs))
            finally:
                self.graph.capture_end()
        self.outputs = list(outputs)
        # Outputs over input memory: views of a static input are returned as
        # they are; views of a copied input are rebuilt over the caller's tensor.
        static_storages = {args[i].untyped_storage().data_ptr() for i in self.static_index
                           if args[i].untyped_storage().nbytes()}
        copied_storages = {self.inputs[i].untyped_storage().data_ptr(): i for i in self.copied_index
                           if self.inputs[i].untyped_storage().nbytes()}
        self.static_outputs, self.input_views = set(), {}
        for k, o in enumerate(self.outputs):
            if not isinstance(o, torch.Tensor) or o.untyped_storage().nbytes() == 0:
                continue  # (every empty storage has address 0)
            storage = o.untyped_storage().data_ptr()
            if storage in static_storages:
                self.static_outputs.add(k)
            elif storage in copied_storages:
                i = copied_storages[storage]
                offset = o.storage_offset() - self.inputs[i].storage_offset()
                self.input_views[k] = (i, tuple(o.shape), o.stride(), offset)

    def statics_moved(self, args: list) -> bool:
        return any(args[i].data_ptr() != p for i, p in zip(self.static_index, self.static_ptrs))

    def replay(self, args: list) -> list:
        if self.copied_index:
            torch._foreach_copy_(
                [_copyable(self.inputs[i]) for i in self.copied_index], [_copyable(args[i]) for i in self.copied_index]
            )
        self.graph.replay()
        if self.mutated_index:
            torch._foreach_copy_(
                [_copyable(args[i]) for i in self.mutated_index], [_copyable(self.inputs[i]) for i in self.mutated_index]
            )
        # Fresh results: the next replay overwrites the graph's own outputs.
        results = list(self.outputs)
        for k, (i, shape, stride, offset) in self.input_views.items():
            results[k] = args[i].as_strided(shape, stride, args[i].storage_offset() + offset)
        fresh = [
            k for k, o in enumerate(self.outputs)
            if isinstance(o, torch.Tensor) and k not in self.static_outputs and k not in self.input_views
        ]
        if fresh:
            copies = [torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device=o.device)
                      for o in (self.outputs[k] for k in fresh)]
            torch._foreach_copy_([_copyable(c) for c in copies], [_copyable(self.outputs[k]) for k in fresh])
            for k, c in zip(fresh, copies):
                results[k] = c
        return results


class GraphReplay:
    """A compiled graph (boxed calling convention) run through device-graph replay."""

    def __init__(self, compiled, static_input_idxs, mutated_input_idxs, name: str):
        self.compiled = compiled
        self.static = frozenset(static_input_idxs)
        self.mutated = frozenset(mutated_input_idxs)
        self.name = name
        self.recordings: dict[tuple, _Recording] = {}
        self.warmed_up: set[tuple] = set()
        self.rerecords = 0
        self.disabled_reason: str | None = None
        self._boxed_call = True

    def __call__(self, args: list):
        if self.disabled_reason is not None:
            return self.compiled(args)
        host = next((a for a in args if isinstance(a, torch.Tensor) and a.device.type != "neuron"), None)
        if host is not None:
            self._disable(f"an input is on {host.device}")
            return self.compiled(args)
        key = _signature(args, self.static)
        recording = self.recordings.get(key)
        if recording is not None and recording.statics_moved(args):
            self.rerecords += 1
            metrics.record(graph_rerecords=1)
            recording = None
            if self.rerecords > RERECORD_LIMIT:
                self._disable(f"static inputs moved {self.rerecords} times")
                return self.compiled(args)
        if recording is None:
            if key not in self.warmed_up:
                self.warmed_up.add(key)
                return self.compiled(args)
            if len(self.recordings) >= MAX_RECORDINGS:
                self._disable(f"more than {MAX_RECORDINGS} input signatures (dynamic shapes)")
                return self.compiled(args)
            try:
                recording = _Recording(self.compiled, args, self.static, self.mutated)
            except RuntimeError as error:
                self._disable(str(error))
                return self.compiled(args)
            self.recordings[key] = recording
            metrics.record(graph_recordings=1)
        outputs = recording.replay(args)
        args.clear()
        metrics.record(graph_replays=1)
        return outputs

    def _disable(self, reason: str) -> None:
        self.disabled_reason = reason
        self.recordings.clear()
        metrics.record(graph_fallbacks={"graph": self.name, "reason": reason})
        warnings.warn(
            f"torch.compile(mode='reduce-overhead') on neuron: {self.name} runs without graph replay: {reason}",
            stacklevel=2,
        )


class ReplayPolicy(CUDAGraphPolicy):
    """Wraps every compiled neuron graph in a GraphReplay, on fresh compiles and cache hits alike."""

    def __init__(self, graph_name: str):
        self.graph_name = graph_name

    def should_wrap(self, compiled_graph) -> bool:
        return False  # Inductor's own CUDA-graph wrapping: never on neuron

    def wrap_output(self, output_code):
        if not isinstance(output_code, CompiledFxGraph) or "neuron" not in output_code.device_types:
            return output_code
        kwargs = output_code.fx_kwargs
        kind = "backward" if kwargs.get("is_backward") else "forward"
        others = set(output_code.device_types) - {"neuron", "meta"}
        if others:
            reason = f"the {kind} of {self.graph_name} has kernels on {', '.join(sorted(others))}"
            metrics.record(graph_fallbacks={"graph": f"the {kind} of {self.graph_name}", "reason": reason})
            warnings.warn(f"torch.compile(mode='reduce-overhead') on neuron: {reason}; it runs without graph "
                          "replay", stacklevel=2)
            return output_code
        static = () if kwargs.get("is_backward") else kwargs.get("static_input_idxs") or ()
        name = f"the {kind} of {self.graph_name}"
        output_code.current_callable = GraphReplay(
            output_code.current_callable, static, output_code.mutated_input_idxs, name
        )
        return output_code
