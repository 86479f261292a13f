"""Mixture-of-experts on neuron: vLLM's unquantized MoE method with a PyTorch expert kernel.

For an out-of-tree platform vLLM selects ``UnquantizedMoeBackend.OOT`` and
builds no expert kernel (``moe_kernel`` stays None, and ``forward_native``
asserts it), expecting the platform to bring one through
``CustomOp.register_oot``. This one computes every expert for every token and
weights each result by the router's top-k weights for that expert (zero when
the expert was not chosen). That costs E/k times the routed FLOPs but has no
data-dependent shapes, so nothing synchronises with the host; a grouped
kernel (sort tokens by expert, one matmul per expert's slice) is the
optimisation for models with many experts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def expert_mixture(x, w13, w2, topk_weights, topk_ids, apply_router_weight_on_input: bool = False):
    """sum_k w_k * W2_e(silu(W1_e x) * W3_e x) for the top-k experts e of each token.

    ``w13``: [E, 2I, H] (gate rows, then up rows); ``w2``: [E, H, I].
    """
    out = torch.zeros_like(x, dtype=torch.float32)
    inter = w13.shape[1] // 2
    for e in range(w13.shape[0]):
        weight = (topk_weights.float() * (topk_ids == e)).sum(-1, keepdim=True)  # [T, 1]
        h = x * weight.to(x.dtype) if apply_router_weight_on_input else x
        gate_up = h @ w13[e].t()
        y = (F.silu(gate_up[:, :inter]) * gate_up[:, inter:]) @ w2[e].t()
        out += y.float() if apply_router_weight_on_input else y.float() * weight
    return out.to(x.dtype)


_registered = False


def register() -> None:
    """Register the neuron MoE method with vLLM (idempotent; before the model is built)."""
    global _registered
    if _registered:
        return
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    @UnquantizedFusedMoEMethod.register_oot(name="UnquantizedFusedMoEMethod")
    class NeuronUnquantizedFusedMoEMethod(UnquantizedFusedMoEMethod):
        @property
        def is_monolithic(self) -> bool:  # routing happens before the experts (select_experts)
            return False

        def forward_oot(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
            if shared_experts is not None:
                raise NotImplementedError("neuron MoE: shared experts are not supported yet")
            if layer.activation != MoEActivation.SILU:
                raise NotImplementedError(f"neuron MoE: activation {layer.activation} is not supported (silu is)")
            if layer.expert_map is not None:
                raise NotImplementedError("neuron MoE: expert parallelism is not supported")
            if getattr(layer, "w13_bias", None) is not None:
                raise NotImplementedError("neuron MoE: expert biases are not supported yet")
            return expert_mixture(x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids,
                                  layer.apply_router_weight_on_input)

    _registered = True
