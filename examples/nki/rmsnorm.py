"""RMSNorm over the last dim: out = x / sqrt(mean(x**2) + eps) * w, rows on the partitions.

The weight is loaded once as a [1, D] row and broadcast to all 128 partitions; each row tile
then needs one reduction (sum of squares, fused into the square on the scalar engine), one
rsqrt on a [128, 1] column, and two multiplies.
"""

import numpy as np
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
import torchneuron.nki.isa as nisa

P = 128


@nki.jit
def rmsnorm_kernel(x, w, eps=1e-6):
    N, D = x.shape
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(P)[:, None]
    i_f = nl.arange(D)[None, :]

    # w is 1-D [D]; indexing it with a [1, D] index expression loads it as one partition row.
    w_row = nl.load(w[i_f])
    w_tile = nl.broadcast_to(w_row, shape=(P, D))  # partition-dim broadcast, done once

    for t in nl.affine_range((N + P - 1) // P):
        rows = t * P + i_p
        x_tile = nl.load(x[rows, i_f], mask=(rows < N))
        # square(x) on the scalar engine, summing each row into sq_sum in the same pass.
        sq = nl.ndarray((P, D), dtype=nl.float32, buffer=nl.sbuf)
        sq_sum = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(sq, nl.square, x_tile, reduce_op=nl.add, reduce_res=sq_sum)
        # rstd = (sum / D + eps) ** -0.5 on the [128, 1] column.
        rstd = nl.rsqrt(nl.add(nl.multiply(sq_sum, 1.0 / D), eps))
        y = nl.multiply(nl.multiply(x_tile, rstd), w_tile, dtype=x.dtype)
        nl.store(out[rows, i_f], value=y, mask=(rows < N))
    return out


def reference(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def main():
    x = torch.randn(300, 1024, device="neuron")
    w = torch.rand(1024, device="neuron") + 0.5
    expected = reference(x.cpu(), w.cpu())
    y = rmsnorm_kernel(x, w)
    torch.neuron.synchronize()
    print("device   max error:", (y.cpu() - expected).abs().max().item())
    y_np = nki.simulate(rmsnorm_kernel)(x.cpu().numpy(), w.cpu().numpy())
    print("simulate max error:", np.abs(y_np - expected.numpy()).max())


if __name__ == "__main__":
    main()
