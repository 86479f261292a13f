"""Rotary position embedding on q and k, current NKI API: ``q_out, k_out = rope_kernel(q, k, cos, sin)``.

q [Hq, S, d], k [Hk, S, d] (the attention examples' layout), cos and sin [S, d/2] (one angle per
position and frequency); the head dim is split in halves (x1, x2), the rotate-half convention:
  out[..., :d/2] = x1 * cos - x2 * sin
  out[..., d/2:] = x2 * cos + x1 * sin

Positions go on the partitions, 128 per tile, and each half of the head dim is its own tile
(loaded and stored by its own DMA), so every instruction works on whole tiles: per half, two
multiplies and an add. The tables are loaded once for all position tiles (sin also negated).
Heads and position tiles are ``affine_range`` loops: every (head, tile) is independent.
"""

import numpy as np
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
import torchneuron.nki.isa as nisa

P = 128


def _rotate(x, out, cos_sb, sin_sb, neg_sin_sb):
    """out[h] = rope(x[h]) for every head and 128-position tile; the tables are [128, S/128, d/2]."""
    H, S, d = x.shape
    half = d // 2
    for h in nl.affine_range(H):
        for t in nl.affine_range(S // P):
            rows = slice(t * P, (t + 1) * P)
            x1 = nl.ndarray((P, half), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=x1, src=x[h, rows, 0:half])
            x2 = nl.ndarray((P, half), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=x2, src=x[h, rows, half:d])
            for xa, xb, sa, cols in ((x1, x2, neg_sin_sb, slice(0, half)),   # x1 cos - x2 sin
                                     (x2, x1, sin_sb, slice(half, d))):      # x2 cos + x1 sin
                a = nl.ndarray((P, half), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=a, data1=xa, data2=cos_sb[:, t, :], op=nl.multiply)
                b = nl.ndarray((P, half), dtype=nl.float32, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=b, data1=xb, data2=sa[:, t, :], op=nl.multiply)
                y = nl.ndarray((P, half), dtype=out.dtype, buffer=nl.sbuf)
                nisa.tensor_tensor(dst=y, data1=a, data2=b, op=nl.add)
                nisa.dma_copy(dst=out[h, rows, cols], src=y)


@nki.jit
def rope_kernel(q, k, cos, sin):
    Hq, S, d = q.shape
    Hk = k.shape[0]
    half = d // 2
    assert k.shape == (Hk, S, d) and cos.shape == sin.shape == (S, half), "q [Hq, S, d], k [Hk, S, d], cos/sin [S, d/2]"
    assert S % P == 0 and d % 2 == 0, "S must be a multiple of 128 and d even"
    n_tiles = S // P
    q_out = nl.ndarray((Hq, S, d), dtype=q.dtype, buffer=nl.shared_hbm)
    k_out = nl.ndarray((Hk, S, d), dtype=k.dtype, buffer=nl.shared_hbm)

    # The tables of all position tiles, [128, S/128, d/2] (fp32), and -sin.
    cos_sb = nl.ndarray((P, n_tiles, half), dtype=nl.float32, buffer=nl.sbuf)
    sin_sb = nl.ndarray((P, n_tiles, half), dtype=nl.float32, buffer=nl.sbuf)
    for t in nl.affine_range(n_tiles):
        nisa.dma_copy(dst=cos_sb[:, t, :], src=cos[t * P:(t + 1) * P, :])
        nisa.dma_copy(dst=sin_sb[:, t, :], src=sin[t * P:(t + 1) * P, :])
    neg_sin_sb = nl.ndarray((P, n_tiles, half), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=neg_sin_sb, data=sin_sb, op0=nl.multiply, operand0=-1.0)

    _rotate(q, q_out, cos_sb, sin_sb, neg_sin_sb)
    _rotate(k, k_out, cos_sb, sin_sb, neg_sin_sb)
    return q_out, k_out


def reference(q, k, cos, sin):
    def rotate(x):
        x1, x2 = x.float().chunk(2, dim=-1)
        c, s = cos.float(), sin.float()
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)
    return rotate(q), rotate(k)


def tables(S, d, base=10000.0):
    """cos and sin [S, d/2] of the usual RoPE angles position * base**(-2i/d)."""
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = torch.arange(S, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def main():
    Hq, Hk, S, d = 8, 2, 512, 128
    q, k = torch.randn(Hq, S, d, device="neuron"), torch.randn(Hk, S, d, device="neuron")
    cos, sin = (t.to("neuron") for t in tables(S, d))
    eq, ek = reference(q.cpu(), k.cpu(), cos.cpu(), sin.cpu())
    oq, ok = rope_kernel(q, k, cos, sin)
    torch.neuron.synchronize()
    print("device   max error:", max((oq.cpu() - eq).abs().max().item(), (ok.cpu() - ek).abs().max().item()))
    sq, sk = nki.simulate(rope_kernel)(*(t.cpu().numpy() for t in (q, k, cos, sin)))
    print("simulate max error:", max(np.abs(sq - eq.numpy()).max(), np.abs(sk - ek.numpy()).max()))


if __name__ == "__main__":
    main()
