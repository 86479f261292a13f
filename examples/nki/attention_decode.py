"""Token-generation (decode) attention against a KV cache, current NKI API, grouped-query heads.

q is [Hq, n, d]: n new tokens (1 for plain decode, a few for speculative decoding) of Hq query
heads. The cache holds Hkv <= Hq heads of ctx positions: K transposed, [Hkv, d, ctx] (the layout
token-generation kernels keep, so the scores matmul reads it as it lies), V as [Hkv, ctx, d].
Query head h reads cache head h // (Hq // Hkv); every cached position is visible.

All G = Hq // Hkv query heads of a KV head share one pass over its cache: their G * n rows are
the partitions of the score tile, so each cache byte is loaded and multiplied once. With the
whole context in one [rows, ctx] tile no online softmax is needed: one max, one exp with the row
sum fused, then P V with V streamed through in 128-position tiles, accumulated in PSUM.
"""

import math

import numpy as np
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
import torchneuron.nki.isa as nisa

P = 128    # cache positions per transpose / PV matmul (partitions)
TK = 512   # cache positions per score matmul: one fp32 PSUM bank


@nki.jit
def attention_decode(q, k_cache, v_cache):
    Hq, n, d = q.shape
    Hkv, d_, ctx = k_cache.shape
    assert d == d_ and v_cache.shape == (Hkv, ctx, d), "k_cache must be [Hkv, d, ctx], v_cache [Hkv, ctx, d]"
    assert Hq % Hkv == 0 and d <= 128 and ctx % TK == 0, "Hq a multiple of Hkv, d <= 128, ctx a multiple of 512"
    G = Hq // Hkv
    R = G * n  # score rows per KV head
    assert R <= 128, "the query rows of one KV head must fit the 128 partitions"
    out = nl.ndarray((Hq, n, d), dtype=q.dtype, buffer=nl.shared_hbm)

    for g in nl.affine_range(Hkv):
        # Q^T [d, R] of the group, scaled by 1/sqrt(d) as it leaves PSUM.
        q_sb = nl.ndarray((R, d), dtype=q.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=q_sb, src=q[g * G:(g + 1) * G, :, :])  # [G, n, d] lands as R rows
        qT_ps = nl.ndarray((d, R), dtype=q.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=qT_ps, data=q_sb)
        qT = nl.ndarray((d, R), dtype=q.dtype, buffer=nl.sbuf)
        nisa.activation(dst=qT, op=nl.copy, data=qT_ps, scale=1.0 / math.sqrt(d))

        # The cache head's K^T in one DMA.
        kT = nl.ndarray((d, ctx), dtype=k_cache.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=kT, src=k_cache[g, :, :])

        # Scores [R, ctx], 512 positions per matmul and PSUM bank.
        s = nl.ndarray((R, ctx), dtype=nl.float32, buffer=nl.sbuf)
        for c in nl.affine_range(ctx // TK):
            s_ps = nl.ndarray((R, TK), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=s_ps, stationary=qT, moving=kT[:, c * TK:(c + 1) * TK])
            nisa.tensor_copy(dst=s[:, c * TK:(c + 1) * TK], src=s_ps)

        # Softmax numerator and row sums in one scalar-engine pass.
        neg_max = nl.ndarray((R, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_max, op=nl.maximum, data=s, axis=1, negate=True, keepdims=True)
        p = nl.ndarray((R, ctx), dtype=v_cache.dtype, buffer=nl.sbuf)
        row_sum = nl.ndarray((R, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=p, op=nl.exp, data=s, bias=neg_max, reduce_op=nl.add, reduce_res=row_sum,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)

        # P V, streaming V through in 128-position tiles, accumulated in one PSUM tile. P^T comes
        # four 128-position transposes per PSUM bank, evicted with one copy.
        o_ps = nl.ndarray((R, d), dtype=nl.float32, buffer=nl.psum)
        for c in nl.affine_range(ctx // TK):
            pT_ps = nl.ndarray((P, TK // P, R), dtype=v_cache.dtype, buffer=nl.psum)
            for j in nl.affine_range(TK // P):
                nisa.nc_transpose(dst=pT_ps[:, j, :], data=p[:, c * TK + j * P:c * TK + (j + 1) * P])
            pT = nl.ndarray((P, TK // P, R), dtype=v_cache.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=pT, src=pT_ps)
            for j in nl.affine_range(TK // P):
                v_t = nl.ndarray((P, d), dtype=v_cache.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=v_t, src=v_cache[g, c * TK + j * P:c * TK + (j + 1) * P, :])
                nisa.nc_matmul(dst=o_ps, stationary=pT[:, j, :], moving=v_t)

        inv_sum = nl.ndarray((R, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv_sum, data=row_sum)
        o = nl.ndarray((R, d), dtype=out.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=o, data=o_ps, op0=nl.multiply, operand0=inv_sum)
        nisa.dma_copy(dst=out[g * G:(g + 1) * G, :, :], src=o)
    return out


def reference(q, k_cache, v_cache):
    """q [Hq, n, d], k_cache [Hkv, d, ctx], v_cache [Hkv, ctx, d] -> [Hq, n, d]."""
    k = k_cache.float().transpose(1, 2)  # a view: [Hkv, ctx, d]
    return torch.nn.functional.scaled_dot_product_attention(q.float()[None], k[None], v_cache.float()[None],
                                                            enable_gqa=True)[0].to(q.dtype)


def main():
    Hq, Hkv, n, d, ctx = 8, 2, 1, 128, 1024
    q = torch.randn(Hq, n, d, device="neuron")
    k_cache = torch.randn(Hkv, d, ctx, device="neuron")
    v_cache = torch.randn(Hkv, ctx, d, device="neuron")
    expected = reference(q.cpu(), k_cache.cpu(), v_cache.cpu())
    o = attention_decode(q, k_cache, v_cache)
    torch.neuron.synchronize()
    print("device   max error:", (o.cpu() - expected).abs().max().item())
    o_np = nki.simulate(attention_decode)(q.cpu().numpy(), k_cache.cpu().numpy(), v_cache.cpu().numpy())
    print("simulate max error:", np.abs(o_np - expected.numpy()).max())


if __name__ == "__main__":
    main()
