"""SwiGLU MLP for a small batch of tokens (token generation), current NKI API.

out = (silu(x @ w_gate) * (x @ w_up)) @ w_down for x [T, H] (T <= 128 tokens), w_gate and w_up
[H, I], w_down [I, H]; H and I multiples of 512.

With few tokens the weights are the data that moves: x^T [128 hidden, T] is the stationary
operand (loaded into the tensor engine once per 128 rows of weights) and each [128, 512] weight
block streams through as the moving operand, 512 output columns per matmul and PSUM bank. The
gate and up results [T, 512] are combined (silu(g) * u) as they leave PSUM; h is transposed to
[I, T] in 128-row pieces for the down projection, which works the same way. Every weight block
is read once, straight from its place in HBM (one DMA per block, 2 KiB per partition in fp32).
Loops over blocks are ``affine_range``: their matmuls accumulate in PSUM and carry no other
dependency.
"""

import numpy as np
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
import torchneuron.nki.isa as nisa

P = 128    # partitions: the contraction tile of every matmul
TN = 512   # output columns per matmul (the moving-operand limit, one fp32 PSUM bank)


def transpose_rows(x_sb, rows, cols):
    """An SBUF tile [rows, cols] (rows <= 128) -> [128, cols/128, rows]: cols on partitions."""
    xT = nl.ndarray((P, cols // P, rows), dtype=x_sb.dtype, buffer=nl.sbuf)
    for k in nl.affine_range(cols // P):
        xT_ps = nl.ndarray((P, rows), dtype=x_sb.dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=xT_ps, data=x_sb[:, k * P:(k + 1) * P])
        nisa.tensor_copy(dst=xT[:, k, :], src=xT_ps)
    return xT


@nki.jit
def fused_mlp(x, w_gate, w_up, w_down):
    T, H = x.shape
    I = w_gate.shape[1]
    assert w_gate.shape == w_up.shape == (H, I) and w_down.shape == (I, H), "weights must be [H, I], [H, I], [I, H]"
    assert T <= P and H % TN == 0 and I % TN == 0, "T <= 128; H and I multiples of 512"
    out = nl.ndarray((T, H), dtype=x.dtype, buffer=nl.shared_hbm)

    x_sb = nl.ndarray((T, H), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb, src=x)
    xT = transpose_rows(x_sb, T, H)

    # h = silu(x Wg) * (x Wu), [T, I]: tokens on partitions.
    h = nl.ndarray((T, I), dtype=x.dtype, buffer=nl.sbuf)
    for n in nl.affine_range(I // TN):
        cols = slice(n * TN, (n + 1) * TN)
        g_ps = nl.ndarray((T, TN), dtype=nl.float32, buffer=nl.psum)
        u_ps = nl.ndarray((T, TN), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(H // P):
            wg = nl.ndarray((P, TN), dtype=w_gate.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=wg, src=w_gate[k * P:(k + 1) * P, cols])
            wu = nl.ndarray((P, TN), dtype=w_up.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=wu, src=w_up[k * P:(k + 1) * P, cols])
            nisa.nc_matmul(dst=g_ps, stationary=xT[:, k, :], moving=wg)
            nisa.nc_matmul(dst=u_ps, stationary=xT[:, k, :], moving=wu)
        g = nl.ndarray((T, TN), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=g, op=nl.silu, data=g_ps)
        nisa.tensor_tensor(dst=h[:, cols], data1=g, data2=u_ps, op=nl.multiply)

    # out = h Wd: the same with h^T [128, I/128, T] stationary.
    hT = transpose_rows(h, T, I)
    for n in nl.affine_range(H // TN):
        cols = slice(n * TN, (n + 1) * TN)
        o_ps = nl.ndarray((T, TN), dtype=nl.float32, buffer=nl.psum)
        for m in nl.affine_range(I // P):
            wd = nl.ndarray((P, TN), dtype=w_down.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=wd, src=w_down[m * P:(m + 1) * P, cols])
            nisa.nc_matmul(dst=o_ps, stationary=hT[:, m, :], moving=wd)
        o = nl.ndarray((T, TN), dtype=out.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=o, src=o_ps)
        nisa.dma_copy(dst=out[:, cols], src=o)
    return out


def reference(x, w_gate, w_up, w_down):
    xf = x.float()
    h = torch.nn.functional.silu(xf @ w_gate.float()) * (xf @ w_up.float())
    return (h @ w_down.float()).to(x.dtype)


def main():
    T, H, I = 8, 512, 1024
    x = torch.randn(T, H, device="neuron")
    w_gate, w_up = (torch.randn(H, I, device="neuron") / H ** 0.5 for _ in range(2))
    w_down = torch.randn(I, H, device="neuron") / I ** 0.5
    expected = reference(x.cpu(), w_gate.cpu(), w_up.cpu(), w_down.cpu())
    y = fused_mlp(x, w_gate, w_up, w_down)
    torch.neuron.synchronize()
    print("device   max error:", (y.cpu() - expected).abs().max().item())
    y_np = nki.simulate(fused_mlp)(*(t.cpu().numpy() for t in (x, w_gate, w_up, w_down)))
    print("simulate max error:", np.abs(y_np - expected.numpy()).max())


if __name__ == "__main__":
    main()
