"""Causal attention forward, flash style, for all heads in one call: ``kernel[H](q, k, v)``.

q, k, v are [H, S, d] (d = 64, S a multiple of 128). Each program of the grid handles one head:
for each tile of 128 queries it walks the key/value tiles up to the diagonal with an online
softmax (running max m, running sum l, and an accumulator rescaled whenever m grows).

Layouts: the tensor engine contracts over the partition dim, so
  scores[q, k] = Q K^T  needs Q^T [d, 128q] (stationary) and K^T [d, 128k] (moving);
  out[q, :]  += P V    needs P^T [128k, 128q] (stationary) and V [128k, d] (moving).
Q, K and P are transposed on chip with nisa.nc_transpose (SBUF -> PSUM); V is used as loaded.
"""

import math

import numpy as np
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
import torchneuron.nki.isa as nisa

T = 128  # query rows / key columns per tile
NEG = -30000.0  # "minus infinity" for masked scores and the initial running max


def _load_transposed(dst, src):
    """dst[d, 128] (SBUF) = the transpose of the HBM slice src[128, d]."""
    rows, cols = src.shape
    tile = nl.ndarray((rows, cols), dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=src)
    t_psum = nl.ndarray((cols, rows), dtype=src.dtype, buffer=nl.psum)
    nisa.nc_transpose(t_psum, tile)  # on the tensor engine: SBUF -> PSUM
    nisa.tensor_copy(dst, t_psum)


@nki.jit
def causal_attention_kernel(q, k, v):
    H, S, d = q.shape
    assert S % T == 0 and d <= 128
    out = nl.ndarray((H, S, d), dtype=q.dtype, buffer=nl.shared_hbm)
    h = nl.program_id(0)
    scale = 1.0 / math.sqrt(d)

    # K^T for the whole sequence stays in SBUF ([d, S]): every query tile reuses it.
    kT = nl.ndarray((d, S), dtype=k.dtype, buffer=nl.sbuf)
    for j in nl.affine_range(S // T):
        _load_transposed(kT[:, j * T:(j + 1) * T], k[h, j * T:(j + 1) * T, :])

    # static_range: i is a Python int at trace time, so the causal bound (i + 1) is a constant.
    for i in nl.static_range(S // T):
        qT = nl.ndarray((d, T), dtype=q.dtype, buffer=nl.sbuf)
        _load_transposed(qT, q[h, i * T:(i + 1) * T, :])
        m = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.sbuf)    # running row max
        nisa.memset(m, NEG)
        l = nl.zeros((T, 1), dtype=nl.float32, buffer=nl.sbuf)      # running row sum
        acc = nl.zeros((T, d), dtype=nl.float32, buffer=nl.sbuf)    # running P @ V

        # Key tiles j > i lie entirely above the diagonal: they are never visited.
        for j in nl.static_range(i + 1):
            s_psum = nl.ndarray((T, T), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(s_psum, qT, kT[:, j * T:(j + 1) * T])  # [128q, 128k] = (Q^T)^T K^T
            s = nl.ndarray((T, T), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(s, nl.copy, s_psum, scale=scale)  # PSUM -> SBUF, times 1/sqrt(d)
            if j == i:
                # Diagonal tile: keep key <= query. The affine value is partition*1 + column*(-1)
                # = q - k; where it is >= 0 the score is kept, elsewhere it becomes NEG.
                nisa.affine_select(s, pattern=[[-1, T]], channel_multiplier=1, on_true_tile=s,
                                   on_false_value=NEG, cmp_op=nl.greater_equal)

            # Online softmax update.
            m_new = nl.maximum(m, nl.max(s, axis=1, keepdims=True))
            alpha = nl.exp(nl.subtract(m, m_new))          # rescales what was summed so far
            neg_m = nl.negative(m_new)
            p = nl.ndarray((T, T), dtype=nl.float32, buffer=nl.sbuf)
            p_sum = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation_reduce(p, nl.exp, s, reduce_op=nl.add, reduce_res=p_sum, bias=neg_m)  # exp, row sum
            l[...] = nl.add(nl.multiply(l, alpha), p_sum)
            m[...] = m_new

            # P @ V with the keys as the contraction: transpose P to [128k, 128q] first.
            pT_psum = nl.ndarray((T, T), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_transpose(pT_psum, p)
            pT = nl.ndarray((T, T), dtype=v.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(pT, pT_psum)
            v_tile = nl.ndarray((T, d), dtype=v.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=v_tile, src=v[h, j * T:(j + 1) * T, :])
            pv_psum = nl.ndarray((T, d), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(pv_psum, pT, v_tile)
            acc[...] = nl.add(nl.multiply(acc, alpha), pv_psum)  # the [128, 1] alpha broadcasts

        # Normalise by the row sums and write this query tile.
        inv_l = nl.ndarray((T, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(inv_l, l)
        o = nl.ndarray((T, d), dtype=out.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(o, acc, nl.multiply, inv_l)
        nisa.dma_copy(dst=out[h, i * T:(i + 1) * T, :], src=o)
    return out


def reference(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                            is_causal=True).to(q.dtype)


def main():
    H, S, d = 4, 512, 64
    q, k, v = (torch.randn(H, S, d, device="neuron") for _ in range(3))
    expected = reference(q.cpu(), k.cpu(), v.cpu())
    o = causal_attention_kernel[H](q, k, v)  # one program per head
    torch.neuron.synchronize()
    print("device   max error:", (o.cpu() - expected).abs().max().item())
    o_np = nki.simulate(causal_attention_kernel)[H](q.cpu().numpy(), k.cpu().numpy(), v.cpu().numpy())
    print("simulate max error:", np.abs(o_np - expected.numpy()).max())


if __name__ == "__main__":
    main()
