"""Compiled FlexAttention on neuron: the attention operators become dense ATen graphs.

Inductor lowers ``flex_attention`` to Triton templates (GPUs) or to a CPU
template that only serves inference. For neuron, a post-grad pass replaces
each ``flex_attention`` and ``flex_attention_backward`` node with the trace of
PyTorch's own dense implementation of the operator, with the score and mask
functions inlined; Inductor then fuses and generates that like any other
graph. AOTAutograd has already split forward and backward around the
operators, so the backward recomputes the scores as the fused kernels do
instead of keeping them alive.
"""

from __future__ import annotations

import copy
import operator
import sys

import torch
import torch.utils._pytree as pytree
from torch._inductor.custom_graph_pass import CustomGraphModulePass
from torch._inductor.pattern_matcher import fwd_only
from torch._inductor.virtualized import V

from .._flex_attention import dense_backward
from .build_id import build_id

_hop = sys.modules["torch._higher_order_ops.flex_attention"]
_DENSE = {
    torch.ops.higher_order.flex_attention: _hop.sdpa_dense,
    torch.ops.higher_order.flex_attention_backward: dense_backward,
}


def _batchable(subgraph: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of a score/mask subgraph whose dtype casts vmap can batch.

    The dense implementation vmaps the subgraphs over every score; AOTAutograd
    decomposed their casts to prims.convert_element_type, which has no
    batching rule, so vmap would unroll it per element.
    """
    subgraph = copy.deepcopy(subgraph)
    for n in subgraph.graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.prims.convert_element_type.default:
            n.target = torch.ops.aten._to_copy.default
            n.args, n.kwargs = (n.args[0],), {"dtype": n.args[1]}
    subgraph.recompile()
    return subgraph


def _grads_of_captured(gm: torch.fx.GraphModule, node: torch.fx.Node) -> list[bool]:
    """Which score_mod captured buffers of a backward node the joint graph differentiates.

    The joint graph returns the gradients of (score, b, h, q_idx, kv_idx,
    *captured): None for a buffer that did not require grad when it was traced
    or that the score function does not differentiate.
    """
    joint = getattr(gm, node.args[8].target)
    grads = joint.graph.output_node().args[0]
    return [g is not None for g in grads[5:]]


def _trace_dense(gm: torch.fx.GraphModule, node: torch.fx.Node):
    """The dense implementation of `node`, traced over its tensor arguments."""
    backward = node.target is torch.ops.higher_order.flex_attention_backward
    # Post-grad values no longer require grad, and the dense backward allocates
    # a gradient for each captured buffer that does, then copies the joint
    # graph's gradient into it: mark exactly the buffers the joint graph
    # differentiates (marking every floating input made a captured constant,
    # such as ALiBi slopes, fail with copy_(None)). Sizes may be SymInts.
    captured = node.args[12] if backward else ()
    differentiated = _grads_of_captured(gm, node) if backward else []
    needs_grad = {id(b) for b, d in zip(captured, differentiated) if d}
    # Score/mask subgraphs are attributes of gm: pass them as Python values.
    args = pytree.tree_map_only(
        torch.fx.Node, lambda n: _batchable(getattr(gm, n.target)) if n.op == "get_attr" else n, node.args
    )
    flat, spec = pytree.tree_flatten(args)
    tensor_positions = [i for i, a in enumerate(flat) if isinstance(a, torch.fx.Node)]

    def dense(*tensors):
        values = list(flat)
        for i, t in zip(tensor_positions, tensors):
            values[i] = t
        result = _DENSE[node.target](*pytree.tree_unflatten(values, spec))
        if not backward:
            return result
        # The operator's schema (and its fake implementation, which typed the
        # graph) has a gradient for every captured tensor: zeros where the
        # joint graph has none (AOTAutograd drops the unused ones).
        dq, dk, dv, grads = result
        buffers = pytree.tree_unflatten(values, spec)[12]
        grads = tuple(
            torch.zeros_like(b, memory_format=torch.contiguous_format)
            if g is None and isinstance(b, torch.Tensor) else g
            for g, b in zip(grads, buffers)
        )
        return dq, dk, dv, grads

    with V.fake_mode:
        examples = [flat[i].meta["val"] for i in tensor_positions]
        examples = [
            v.detach().requires_grad_(id(n) in needs_grad) if isinstance(v, torch.Tensor) else v
            for v, n in zip(examples, (flat[i] for i in tensor_positions))
        ]
        traced = fwd_only(dense, examples, run_functional_passes=False)
    return traced, [flat[i] for i in tensor_positions]


def _replace_with_dense(gm: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    traced, inputs = _trace_dense(gm, node)
    for n in traced.graph.nodes:  # constants the trace lifted (e.g. -inf) move into gm
        if n.op == "get_attr":
            name = f"_neuron_flex_constant_{len(gm._buffers)}"
            gm.register_buffer(name, getattr(traced, n.target))
            n.target = name
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    with gm.graph.inserting_before(node):
        results = gm.graph.graph_copy(traced.graph, dict(zip(placeholders, inputs)))
    # The operators' results are read through getitem, nested one level for
    # the gradients of captured buffers (flex_attention_backward's 4th result).
    for user in list(node.users):
        assert user.op == "call_function" and user.target is operator.getitem, user
        result = results[user.args[1]]
        if isinstance(result, (list, tuple)):
            for inner in list(user.users):
                inner.replace_all_uses_with(result[inner.args[1]])
                gm.graph.erase_node(inner)
        else:
            user.replace_all_uses_with(result)
        gm.graph.erase_node(user)
    gm.graph.erase_node(node)


class DenseFlexAttention(CustomGraphModulePass):
    """Inductor's post-grad pass for neuron graphs (see the module docstring)."""

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _DENSE]
        if not nodes:
            return
        for node in nodes:
            _replace_with_dense(gm, node)
        gm.graph.eliminate_dead_code()
        gm.recompile()

    def uuid(self) -> str:
        # Part of Inductor's cache key, and the only part a device backend supplies:
        # the build's identity, so that no program of another build is ever loaded.
        return f"torchneuron.{build_id()}"
