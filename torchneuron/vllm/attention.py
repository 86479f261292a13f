"""Paged attention on neuron in PyTorch: vLLM's FlexAttention backend with a per-request kernel.

vLLM's FlexAttention backend keeps the KV cache as one tensor and attends over
*all* of it with a block mask. Its fused kernels skip the masked blocks; the
unfused implementation (eager, or Inductor's dense lowering for neuron) does
not: every step costs O(query tokens x whole cache) in time and in scores
memory, invisibly to vLLM's memory profiling (its profiling run skips
attention), so a cache sized by ``gpu_memory_utilization`` runs out of memory
at the first real batch.

So this backend keeps FlexAttention's cache layout, KV-cache write
(``do_kv_cache_update`` -> ``_C_cache_ops.reshape_and_cache_flash``) and
checks, and replaces the attention itself: gather a request's blocks from the
block table (``index_select`` on the device), then
``scaled_dot_product_attention`` with the causal offset of the tokens already
in the cache. Requests with several query tokens (prefills, prefill chunks) go
one by one; the step's decode requests (one query token each) go together: their
block tables padded to the longest, one gather and one SDPA per layer with a
key-padding mask. One by one, a step of 16 decodes cost ~13 ops per request and
layer (460 ops a step for the 2-layer test model, 132 batched); see
docs/serving.md. The metadata needs only host copies of the query start offsets
and sequence lengths, which vLLM's runner already has (no synchronisation).
Cost: O(query tokens x that request's context) for prefills, O(decodes x longest
decode context) for the batch; memory bounded by ``max_num_batched_tokens x
max_model_len`` per layer, whatever the cache size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from vllm.v1.attention.backend import AttentionCGSupport, AttentionMetadataBuilder, AttentionType
from vllm.v1.attention.backends.flex_attention import FlexAttentionBackend, FlexAttentionImpl

# Attend the step's decode requests together (one padded SDPA per layer) rather than one by
# one. Module-level so a test can compare both paths.
BATCH_DECODES = True


@dataclass
class _Request:
    start: int  # its query tokens are [start, end) of the batch
    end: int
    blocks: torch.Tensor  # its KV blocks, in order (device)
    seq_len: int  # tokens in its context, this step's included
    mask: torch.Tensor | None  # [q_len, seq_len] causal mask, None when every key is visible


@dataclass
class _Decodes:
    """The step's one-token (decode) requests, attended together in one padded SDPA."""
    rows: torch.Tensor  # [n] their query rows in the batch (device)
    blocks: torch.Tensor  # [n * max_blocks] their block tables, padded, flattened (device)
    max_seq_len: int
    mask: torch.Tensor  # [n, 1, 1, max_seq_len]: key j is visible to request r iff j < seq_len[r]


@dataclass
class NeuronAttentionMetadata:
    num_actual_tokens: int
    requests: list[_Request]  # the requests with more than one query token (prefill, chunks), one by one
    slot_mapping: torch.Tensor
    decodes: _Decodes | None = None


class NeuronAttentionMetadataBuilder(AttentionMetadataBuilder[NeuronAttentionMetadata]):
    _cudagraph_support = AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.block_size = kv_cache_spec.block_size
        self.batch_decodes = BATCH_DECODES

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False) -> NeuronAttentionMetadata:
        m = common_attn_metadata
        if m.seq_lens_cpu_upper_bound is None:
            raise RuntimeError("neuron attention needs the host sequence lengths (seq_lens_cpu_upper_bound)")
        starts = m.query_start_loc_cpu[: m.num_reqs + 1].tolist()
        seq_lens = m.seq_lens_cpu_upper_bound[: m.num_reqs].tolist()
        requests = []
        decode_reqs, decode_rows, decode_lens = [], [], []
        for r, seq_len in enumerate(seq_lens):
            start, end = starts[r], starts[r + 1]
            if end == start or seq_len == 0:
                continue
            q_len = end - start
            if q_len == 1 and self.batch_decodes:
                decode_reqs.append(r)
                decode_rows.append(start)
                decode_lens.append(seq_len)
                continue
            num_blocks = -(-seq_len // self.block_size)
            mask = None
            if m.causal and q_len > 1:
                # Query i sits at position seq_len - q_len + i and sees keys up to it.
                keys = torch.arange(seq_len, device=self.device)
                last = torch.arange(seq_len - q_len, seq_len, device=self.device)
                mask = keys[None, :] <= last[:, None]
            requests.append(_Request(start, end, m.block_table_tensor[r, :num_blocks], seq_len, mask))
        decodes = None
        if len(decode_reqs) == 1:  # nothing to batch: the per-request path, without a mask
            r = decode_reqs[0]
            num_blocks = -(-decode_lens[0] // self.block_size)
            requests.append(_Request(decode_rows[0], decode_rows[0] + 1, m.block_table_tensor[r, :num_blocks],
                                     decode_lens[0], None))
        elif decode_reqs:
            decodes = self._decodes(m.block_table_tensor, decode_reqs, decode_rows, decode_lens)
        return NeuronAttentionMetadata(m.num_actual_tokens, requests, m.slot_mapping, decodes)

    def _decodes(self, block_table: torch.Tensor, reqs: list[int], rows: list[int], lens: list[int]) -> _Decodes:
        # Host lists -> one small host-to-device copy each; every layer of the step shares them.
        max_seq_len = max(lens)
        max_blocks = -(-max_seq_len // self.block_size)
        if reqs == list(range(reqs[0], reqs[0] + len(reqs))):
            table = block_table[reqs[0]:reqs[0] + len(reqs), :max_blocks]
        else:
            table = block_table[:, :max_blocks].index_select(0, torch.tensor(reqs).to(self.device))
        # Entries past a request's own blocks are stale or zero: valid block ids whose keys
        # the mask hides. Clamp anyway, so a negative filler could not index out of range.
        blocks = table.clamp_min(0).reshape(-1)
        seq_lens = torch.tensor(lens, dtype=torch.int32).to(self.device)
        keys = torch.arange(max_seq_len, device=self.device, dtype=torch.int32)
        mask = (keys[None, :] < seq_lens[:, None]).reshape(len(reqs), 1, 1, max_seq_len)
        return _Decodes(torch.tensor(rows).to(self.device), blocks, max_seq_len, mask)


class NeuronAttentionImpl(FlexAttentionImpl):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"neuron attention: {self.attn_type} attention is not supported yet")
        if self.sliding_window is not None:
            raise NotImplementedError("neuron attention: sliding-window attention is not supported yet")

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("neuron attention: fused output quantization is not supported")
        if attn_metadata is None:  # memory profiling run
            return output.fill_(0)
        hs = self.head_size
        # [num_blocks, num_kv_heads, block_size, 2 * head_size] -> [num_blocks, block_size, heads, head_size]
        key_cache, value_cache = kv_cache.transpose(1, 2).split(hs, dim=-1)
        gqa = self.num_kv_heads != self.num_heads
        for req in attn_metadata.requests:
            n = req.blocks.shape[0]
            k = key_cache.index_select(0, req.blocks).reshape(-1, self.num_kv_heads, hs)[: req.seq_len]
            v = value_cache.index_select(0, req.blocks).reshape(-1, self.num_kv_heads, hs)[: req.seq_len]
            assert k.shape[0] == req.seq_len <= n * key_cache.shape[1]
            q = query[req.start:req.end]
            # 4-d (a batch of one): 3-d inputs take SDPA's unfused math path, a dozen ops.
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                attn_mask=req.mask, scale=self.scale, enable_gqa=gqa,
            )
            output[req.start:req.end].copy_(out[0].transpose(0, 1))
        d = attn_metadata.decodes
        if d is not None:
            n = d.rows.shape[0]
            # [n * max_blocks, block_size, kv_heads, hs] -> [n, kv_heads, max_seq_len, hs]
            k = key_cache.index_select(0, d.blocks).reshape(n, -1, self.num_kv_heads, hs)[:, : d.max_seq_len]
            v = value_cache.index_select(0, d.blocks).reshape(n, -1, self.num_kv_heads, hs)[:, : d.max_seq_len]
            q = query.index_select(0, d.rows).unsqueeze(2)  # [n, heads, 1, hs]
            out = F.scaled_dot_product_attention(
                q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=d.mask, scale=self.scale, enable_gqa=gqa,
            )
            output.index_copy_(0, d.rows, out.squeeze(2).to(output.dtype))
        return output


class NeuronAttentionBackend(FlexAttentionBackend):
    """FlexAttention's cache layout and KV-cache write; paged SDPA per request (module docstring)."""

    @staticmethod
    def get_name() -> str:
        return "FLEX_ATTENTION"

    @staticmethod
    def get_impl_cls():
        return NeuronAttentionImpl

    @staticmethod
    def get_builder_cls():
        return NeuronAttentionMetadataBuilder

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return False

    @classmethod
    def supports_rswa(cls) -> bool:
        return False

    @classmethod
    def supports_mm_prefix(cls) -> bool:
        return False

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER
