"""A flushed segment as an FX graph, and the key that names it on disk.

The runtime describes a segment (``describe()`` in ``csrc/adaptive/Engine.cpp``)
as plain data:

- ``inputs``: one entry per device storage the segment reads from outside,
  ``(dtype, sizes, strides, storage_offset, storage_numel)`` of the tensor
  that first reached it. The program receives the whole storage, flat
  (``storage_numel`` elements of that dtype), and views it as that tensor:
  the first tensor may be a part of the storage (a row an in-place op
  writes) that a later op reads around (the whole matrix), and a view of a
  view reaching outside it is not something functionalization follows;
- ``values``: ``(dtype, sizes, strides, storage_offset)`` of each tensor an op
  of the segment created;
- ``live``: the values the program still references at the flush: the graph
  writes exactly those back;
- ``lifted``: ``(dtype, length)`` per lifted scalar list: the per-tensor
  scalars of a ``_foreach_`` op (an optimizer's bias corrections change every
  step; so does SGD's ``alpha=-lr`` under a schedule), which reach the program
  as a tensor so that the segment recurs;
- ``ops``: ``(name, overload, args, returns)`` per op, in launch order. An
  argument is ``("constant", value)``, ``("tensor", ref)``,
  ``("list", [ref or None, ...])`` or ``("lifted", index)``; a ref is ``("input" | "value", index,
  view)``, where ``view`` is ``None`` or the ``(dtype, sizes, strides,
  storage_offset)`` of a view of that input or value. ``returns`` lists, per
  schema return, the value each of its tensors created (-1 for none).

The graph mirrors the ops as they ran: in-place ops stay in place on their
inputs (AOTAutograd functionalizes them and Inductor writes the inputs back
inside the kernels); each live value gets an extra placeholder, the tensor
eager already returned to the program, and a trailing ``copy_`` into it.
"""

from __future__ import annotations

import hashlib
import math
import operator

import torch
from torch._prims_common import make_contiguous_strides_for

aten = torch.ops.aten


class Unsupported(Exception):
    """The segment cannot become a graph (the reason is the message)."""


def key_of(desc: dict, settings) -> str:
    """A stable name for the segment's structure and the compiler `settings`,
    the same in every process."""
    parts = (desc["inputs"], desc["lifted"], desc["values"], desc["live"], desc["ops"], settings)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _op(name: str, overload: str):
    namespace, op_name = name.split("::")
    return getattr(getattr(getattr(torch.ops, namespace), op_name), overload or "default")


# _foreach_<name>[_].ScalarList with lifted scalars, per tensor: the op of
# one tensor and its scalar (a 0-dim tensor).
_BINARY = {"add": aten.add.Tensor, "sub": aten.sub.Tensor, "mul": aten.mul.Tensor, "div": aten.div.Tensor,
           "clamp_min": aten.clamp_min.Tensor, "clamp_max": aten.clamp_max.Tensor, "maximum": aten.maximum.default,
           "minimum": aten.minimum.default, "pow": aten.pow.Tensor_Tensor}
_POINTWISE = {"addcdiv": aten.div.Tensor, "addcmul": aten.mul.Tensor}


def _foreach_with_lifted_scalars(graph, name: str, args: list, scalars, alpha: bool) -> list:
    """The per-tensor results (in-place ops: the updated tensors). `args` are the
    positional arguments other than the scalars; `alpha`: the scalars are the
    alpha of _foreach_add/_sub(self, other, alpha=), self ± alpha * other."""
    base = name.split("::")[1][len("_foreach_"):]
    in_place = base.endswith("_")
    base = base.rstrip("_")
    tensors = args[0]
    results = []
    for i, x in enumerate(tensors):
        s = graph.call_function(aten.select.int, (scalars, 0, i))
        if alpha:
            other = args[1][i] if isinstance(args[1], list) else args[1]
            scaled = graph.call_function(aten.mul.Tensor, (other, s))
            value = graph.call_function(aten.add.Tensor if base == "add" else aten.sub.Tensor, (x, scaled))
        elif base in _BINARY:
            value = graph.call_function(_BINARY[base], (x, s))
        elif base in _POINTWISE:  # self + scalar * (t1 op t2), as the kernel computes it
            t = graph.call_function(_POINTWISE[base], (args[1][i], args[2][i]))
            value = graph.call_function(aten.add.Tensor, (x, graph.call_function(aten.mul.Tensor, (t, s))))
        elif base == "lerp":
            value = graph.call_function(aten.lerp.Tensor, (x, args[1][i], s))
        else:
            raise Unsupported(f"{name} with per-tensor scalars")
        if in_place:
            value = graph.call_function(aten.copy_.default, (x, value))
        results.append(value)
    return results


def build(desc: dict) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    storages = [graph.placeholder(f"input{i}") for i in range(len(desc["inputs"]))]
    lifted = [graph.placeholder(f"scalars{i}") for i in range(len(desc["lifted"]))]
    outputs = [graph.placeholder(f"value{v}") for v in desc["live"]]
    values: dict[int, torch.fx.Node] = {}

    def view_of_storage(index: int, sizes, strides, offset: int) -> torch.fx.Node:
        sizes, strides = list(sizes), list(strides)
        whole = math.prod(sizes) == desc["inputs"][index][4]
        if offset == 0 and whole and strides == list(make_contiguous_strides_for(sizes)):
            return graph.call_function(aten.view.default, (storages[index], sizes))
        return graph.call_function(aten.as_strided.default, (storages[index], sizes, strides, offset))

    inputs: dict[int, torch.fx.Node] = {}  # each storage viewed as the tensor that first reached it

    def ref(r):
        if r is None:
            return None
        kind, index, view = r
        if kind == "input" and view is None:
            if index not in inputs:
                inputs[index] = view_of_storage(index, *desc["inputs"][index][1:4])
            return inputs[index]
        if view is None:
            return values[index]
        dtype, sizes, strides, offset = view
        base_dtype = (desc["inputs"] if kind == "input" else desc["values"])[index][0]
        if dtype != base_dtype:
            raise Unsupported(f"a {dtype} view of a {base_dtype} tensor")
        if kind == "input":
            return view_of_storage(index, sizes, strides, offset)
        return graph.call_function(aten.as_strided.default, (values[index], list(sizes), list(strides), offset))

    for name, overload, args, returns in desc["ops"]:
        op = _op(name, overload)
        positional, keywords = [], {}
        scalars = None
        for argument, (kind, payload) in zip(op._schema.arguments, args):
            if kind == "tensor":
                value = ref(payload)
            elif kind == "list":
                value = [ref(r) for r in payload]
            elif kind == "lifted":
                value = scalars = lifted[payload]
            else:
                value = payload
            if argument.kwarg_only:
                keywords[argument.name] = value
            else:
                positional.append(value)
        schema_returns = op._schema.returns
        if scalars is not None:
            alpha = keywords.get("alpha") is scalars
            results = _foreach_with_lifted_scalars(graph, name, positional if alpha else positional[:-1], scalars,
                                                   alpha)
            for position, created in enumerate(returns):
                for k, v in enumerate(created):
                    if v >= 0:
                        values[v] = results[k]
            continue
        node = graph.call_function(op, tuple(positional), keywords)
        for position, created in enumerate(returns):
            result = node if len(schema_returns) == 1 else graph.call_function(operator.getitem, (node, position))
            is_list = isinstance(schema_returns[position].type, torch.ListType)
            for k, v in enumerate(created):
                if v >= 0:
                    values[v] = graph.call_function(operator.getitem, (result, k)) if is_list else result
    for placeholder, v in zip(outputs, desc["live"]):
        graph.call_function(aten.copy_.default, (placeholder, values[v]))
    graph.output(())
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def example_inputs(desc: dict, fake_mode) -> list[torch.Tensor]:
    """Fake tensors laid out as the program's arguments: the inputs' whole
    storages (flat), the lifted scalars, the live values."""
    device = torch.device("neuron", desc["device"])
    fakes = []
    with fake_mode:
        for dtype, _sizes, _strides, _offset, numel in desc["inputs"]:
            fakes.append(torch.empty(numel, dtype=dtype, device=device))
        for dtype, length in desc["lifted"]:
            fakes.append(torch.empty(length, dtype=dtype, device=device))
        for v in desc["live"]:
            dtype, sizes, strides, offset = desc["values"][v]
            fakes.append(torch.empty_strided(sizes, strides, dtype=dtype, device=device))
    return fakes
