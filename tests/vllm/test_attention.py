"""The neuron paged-attention kernel against a dense float64 CPU reference.

One step's batch mixes a prefill chunk (several query tokens over cached ones)
with decode requests (one query token each) that are not contiguous in the
batch, over a block table padded with stale entries, with GQA: the decode
requests go through the batched path (one padded SDPA), the rest per request.
The end-to-end tests (``test_offline.py``) compare batched generation with
solo generation too, whose single decode request takes the per-request path.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from torchneuron.vllm import attention

NEURON = torch.device("neuron:0")
HEADS, KV_HEADS, HS, BLOCK, NUM_BLOCKS = 4, 2, 64, 16, 32


def _builder():
    b = attention.NeuronAttentionMetadataBuilder.__new__(attention.NeuronAttentionMetadataBuilder)
    b.block_size, b.device, b.batch_decodes = BLOCK, NEURON, attention.BATCH_DECODES
    return b


def _impl():
    impl = attention.NeuronAttentionImpl.__new__(attention.NeuronAttentionImpl)
    impl.head_size, impl.num_heads, impl.num_kv_heads, impl.scale = HS, HEADS, KV_HEADS, HS ** -0.5
    return impl


def _reference(q, kv_cache, table, q_lens, seq_lens):
    """Dense causal attention per request, float64 on CPU, straight from the cache layout."""
    out, start = [], 0
    cache = kv_cache.double()  # [blocks, kv_heads, block, 2 * hs]
    for r, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens)):
        nb = -(-seq_len // BLOCK)
        rows = cache[table[r, :nb]].permute(0, 2, 1, 3).reshape(-1, KV_HEADS, 2 * HS)[:seq_len]
        k, v = rows[..., :HS].repeat_interleave(HEADS // KV_HEADS, 1), rows[..., HS:].repeat_interleave(HEADS // KV_HEADS, 1)
        qr = q[start:start + q_len].double()
        scores = torch.einsum("qhd,khd->hqk", qr, k) * HS ** -0.5
        pos = torch.arange(seq_len - q_len, seq_len)
        scores = scores.masked_fill(torch.arange(seq_len)[None, :] > pos[:, None], float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v))
        start += q_len
    return torch.cat(out)


@pytest.mark.parametrize("batch_decodes", [True, False])
@pytest.mark.parametrize("q_lens,seq_lens", [
    ([1, 5, 1, 1], [40, 20, 1, 33]),   # decodes around a prefill chunk: not contiguous
    ([1, 1, 1], [17, 64, 3]),          # decodes only, contiguous
    ([1, 7], [9, 7]),                  # a single decode: the per-request path
])
def test_paged_attention_matches_dense_reference(monkeypatch, batch_decodes, q_lens, seq_lens):
    monkeypatch.setattr(attention, "BATCH_DECODES", batch_decodes)
    gen = torch.Generator().manual_seed(0)
    kv_cache = torch.randn(NUM_BLOCKS, KV_HEADS, BLOCK, 2 * HS, generator=gen)
    max_blocks = 6
    # Shuffled block ids; every row padded with stale (valid) ids past its own blocks.
    table = torch.randperm(NUM_BLOCKS, generator=gen)[: len(q_lens) * max_blocks].reshape(len(q_lens), max_blocks)
    num_tokens = sum(q_lens)
    query = torch.randn(num_tokens, HEADS, HS, generator=gen)
    starts = torch.tensor([0] + q_lens).cumsum(0).int()
    meta = SimpleNamespace(
        num_reqs=len(q_lens), query_start_loc_cpu=starts, seq_lens_cpu_upper_bound=torch.tensor(seq_lens),
        causal=True, block_table_tensor=table.to(NEURON), num_actual_tokens=num_tokens,
        slot_mapping=torch.zeros(num_tokens, dtype=torch.long, device=NEURON),
    )
    m = _builder().build(0, meta)
    assert (m.decodes is not None) == (batch_decodes and q_lens.count(1) > 1)
    output = torch.full((num_tokens, HEADS, HS), float("nan"), device=NEURON)
    _impl().forward(None, query.to(NEURON), None, None, kv_cache.to(NEURON), m, output)
    expected = _reference(query, kv_cache, table, q_lens, seq_lens)
    torch.testing.assert_close(output.cpu().double(), expected, atol=1e-5, rtol=1e-5)
