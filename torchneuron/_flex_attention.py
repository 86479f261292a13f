"""FlexAttention accepts neuron tensors (eager and compiled).

``torch.nn.attention.flex_attention`` checks the device against a fixed list
(cuda, cpu, xpu, hpu, mps) before doing anything; neuron joins the list here,
at import, by wrapping the module's checker (looked up at call time, also by
Dynamo when it traces the call). Eager calls then run the dense
implementation on the device; compiled calls are lowered by
``torchneuron.compile.flex_attention``. Autocast on neuron casts q, k, v to
the autocast dtype, as the CUDA and CPU autocast rules of the operator do.

The backward is PyTorch's dense one with the score function's joint graph
wrapped (`dense_backward`, also what compiled graphs inline): the stock one
supports gradients of captured tensors only when the score function indexes
them (``bias[h]``), and crashes when a captured tensor that requires grad gets
no gradient from the score function.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.attention.flex_attention  # noqa: F401  (the module we extend)
from torch._C import DispatchKey

_api = sys.modules["torch.nn.attention.flex_attention"]
# `torch._higher_order_ops.flex_attention` the attribute is the operator; the module is in sys.modules.
_hop = sys.modules["torch._higher_order_ops.flex_attention"]
_DEVICE = "neuron"


def _sum_over_scores(grad: torch.Tensor) -> torch.Tensor:
    """`grad` (one score's share of a captured tensor's gradient) summed over all scores.

    Inside the vmaps over (b, h, q_idx, kv_idx), flex_lib.zeros_and_scatter is
    the one operator whose batching rule reduces over the batch (the gradient
    of an indexed read, ``bias[h]``, is one); scattering into every element
    makes it a sum.
    """
    shape = list(grad.shape)
    flat = grad.reshape(-1)
    index = torch.arange(flat.shape[0], device=grad.device)
    return torch.ops.flex_lib.zeros_and_scatter([flat.shape[0]], [index], flat).view(shape)


def _reaches_a_scatter(joint_graph) -> list[bool]:
    """For each output of the joint graph: whether it is computed from a zeros_and_scatter."""
    scatter = torch.ops.flex_lib.zeros_and_scatter.default
    reaches: dict[torch.fx.Node, bool] = {}
    for node in joint_graph.graph.nodes:
        reaches[node] = node.target is scatter or any(reaches[i] for i in node.all_input_nodes)
    outputs = joint_graph.graph.output_node().args[0]
    return [isinstance(o, torch.fx.Node) and reaches[o] for o in outputs]


def _joint_with_summed_grads(joint_graph):
    """The joint score function, its captured tensors' gradients reduced over the scores.

    The dense backward vmaps it expecting those gradients unbatched, which they
    are only when the score function indexed the tensor: a tensor used as a
    whole (``score * temperature``) has a batched gradient, summed here. A
    tensor that requires grad but gets none (used only in a comparison) gets
    zeros, which the dense backward copies into its gradient.
    """
    is_batched = torch._C._functorch.is_batchedtensor
    scattered = _reaches_a_scatter(joint_graph)

    def joint(score, b, h, q_idx, kv_idx, grad, *captured):
        grads = list(joint_graph(score, b, h, q_idx, kv_idx, grad, *captured))
        for i, (g, t) in enumerate(zip(grads[5:], captured), start=5):
            if g is None:
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    grads[i] = torch.zeros_like(t, memory_format=torch.contiguous_format)
            elif is_batched(g):
                if scattered[i]:
                    # Part of it is already the sum (an indexed read), part is per score:
                    # summing the whole would count the first part once per score.
                    raise NotImplementedError(
                        "FlexAttention on neuron: a captured tensor that requires grad is both indexed "
                        "and used whole in score_mod; use a clone() of it for one of the two uses")
                grads[i] = _sum_over_scores(g)
        return grads

    return joint


def dense_backward(query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph,
                   block_mask, scale, kernel_options, score_mod_other_buffers=(), mask_mod_other_buffers=()):
    """flex_attention_backward on neuron: PyTorch's dense backward with the joint graph wrapped."""
    if joint_graph is None:  # as the stock implementation does
        example = [query.new_zeros((), requires_grad=True)] + [query.new_zeros((), dtype=torch.int)] * 4
        _, joint_graph = _hop.create_fw_bw_graph(fw_graph, tuple(example), score_mod_other_buffers)
    return _hop.sdpa_dense_backward(
        query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph,
        _joint_with_summed_grads(joint_graph), block_mask, scale, kernel_options,
        score_mod_other_buffers, mask_mod_other_buffers,
    )


def _validate_device(query, key, value):
    if query.device.type == _DEVICE and key.device == query.device and value.device == query.device:
        return
    _stock_validate_device(query, key, value)


def _autocast(query, key, value, score_mod, block_mask, scale, kernel_options,
              score_mod_other_buffers=(), mask_mod_other_buffers=()):
    dtype = torch.get_autocast_dtype(_DEVICE)
    query, key, value = (t.to(dtype) if t.is_floating_point() else t for t in (query, key, value))
    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(DispatchKey.AutocastPrivateUse1)):
        return _hop.flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options,
                                   score_mod_other_buffers, mask_mod_other_buffers)


_stock_validate_device = _api._validate_device
if _stock_validate_device.__module__ != __name__:
    _api._validate_device = _validate_device
    _hop.flex_attention.py_impl(DispatchKey.AutocastPrivateUse1)(_autocast)
    _hop.flex_attention_backward.fallthrough(DispatchKey.AutocastPrivateUse1)
    _hop.flex_attention_backward.py_impl(DispatchKey.PrivateUse1)(dense_backward)
