"""RMSNorm over [N, D] in the current NKI API: out = x / sqrt(mean(x**2) + eps) * w.

(``rmsnorm.py`` is the same computation in the older nl.load / nl.store style.)

Rows go on the partitions, 128 per tile; full tiles run as one ``affine_range`` loop, a last
partial tile after it. Per tile: one scalar-engine pass squares x and sums each row
(``reduce_res``), one more turns the [128, 1] sums into 1/rms (rsqrt(sum / D + eps)), and x is
scaled by it and by w. The weight row is broadcast to the 128 partitions once, by a matmul with
a ones column (contraction over a single partition): a [1, 128] ones stationary times the [1, D]
weight row is the [128, D] broadcast.
"""

import numpy as np
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
import torchneuron.nki.isa as nisa

P = 128
TN = 512  # weight columns broadcast per matmul (one fp32 PSUM bank)


def _normalise(out, x, r0, rows, w_bc, eps):
    """Normalises rows r0 .. r0+rows-1 (rows <= 128) of x into out."""
    D = x.shape[1]
    xt = nl.ndarray((rows, D), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x[r0:r0 + rows, :])
    sq = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)  # only its row sums are used
    sq_sum = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=sq, op=nl.square, data=xt, reduce_op=nl.add, reduce_res=sq_sum,
                    reduce_cmd=nisa.reduce_cmd.reset_reduce)
    rstd = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=rstd, op=nl.rsqrt, data=sq_sum, scale=1.0 / D, bias=eps)
    # y = (x * rstd) * w in one vector-engine pass.
    y = nl.ndarray((rows, D), dtype=out.dtype, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=y, data=xt, op0=nl.multiply, operand0=rstd, op1=nl.multiply,
                              operand1=w_bc if rows == P else w_bc[0:rows, :])
    nisa.dma_copy(dst=out[r0:r0 + rows, :], src=y)


@nki.jit
def rmsnorm_kernel(x, w, eps=1e-6):
    N, D = x.shape
    assert w.shape == (D,), f"w must be [{D}], got {w.shape}"
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)

    # w broadcast to [128, D] (fp32), 512 columns per matmul.
    w_row = nl.ndarray((1, D), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=w_row, src=w)  # [D] lands as one partition row
    ones = nl.ndarray((1, P), dtype=w.dtype, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    w_bc = nl.ndarray((P, D), dtype=nl.float32, buffer=nl.sbuf)
    for n0 in range(0, D, TN):
        cols = min(TN, D - n0)
        w_ps = nl.ndarray((P, TN), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=w_ps[:, 0:cols], stationary=ones, moving=w_row[:, n0:n0 + cols])
        nisa.tensor_copy(dst=w_bc[:, n0:n0 + cols], src=w_ps[:, 0:cols])

    for t in nl.affine_range(N // P):
        _normalise(out, x, t * P, P, w_bc, eps)
    if N % P:
        _normalise(out, x, N - N % P, N % P, w_bc, eps)
    return out


def reference(x, w, eps=1e-6):
    return torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), w.float(), eps=eps).to(x.dtype)


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
