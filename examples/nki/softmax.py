"""Row softmax of an [N, D] tensor: rows on the partitions (128 per tile), D along the free dim.

Two versions: ``softmax_kernel`` with nki.language math, and ``softmax_fused_kernel`` with the
engine instructions a tuned kernel uses (exp and row sum fused in one scalar-engine pass).
"""

import numpy as np
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
import torchneuron.nki.isa as nisa

P = 128  # rows per tile: one row per partition


@nki.jit
def softmax_kernel(x):
    N, D = x.shape
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(P)[:, None]
    i_f = nl.arange(D)[None, :]
    for t in nl.affine_range((N + P - 1) // P):
        rows = t * P + i_p
        tile = nl.load(x[rows, i_f], mask=(rows < N))  # the last tile may be partial: mask its rows
        # Reductions run along the free dim; keepdims leaves a [128, 1] column, which broadcasts
        # along the free dim in the element-wise ops below.
        row_max = nl.max(tile, axis=1, keepdims=True)
        e = nl.exp(nl.subtract(tile, row_max))
        row_sum = nl.sum(e, axis=1, keepdims=True)
        nl.store(out[rows, i_f], value=nl.divide(e, row_sum), mask=(rows < N))
    return out


@nki.jit
def softmax_fused_kernel(x):
    N, D = x.shape
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    # static_range unrolls at trace time, so r0 and p are Python ints and the last tile can
    # simply be smaller than 128 rows.
    for t in nl.static_range((N + P - 1) // P):
        r0 = t * P
        p = min(P, N - r0)
        tile = nl.ndarray((p, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x[r0:r0 + p, :])

        neg_max = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(neg_max, nl.maximum, tile, axis=1, negate=True, keepdims=True)  # -max per row
        # One scalar-engine pass: e = exp(x + (-max)), and reduce_res = sum(e) per row.
        e = nl.ndarray((p, D), dtype=nl.float32, buffer=nl.sbuf)
        row_sum = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(e, nl.exp, tile, reduce_op=nl.add, reduce_res=row_sum, bias=neg_max)
        inv_sum = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(inv_sum, row_sum)
        # tensor_scalar broadcasts a [p, 1] operand along the free dim.
        y = nl.ndarray((p, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(y, e, nl.multiply, inv_sum)
        nisa.dma_copy(dst=out[r0:r0 + p, :], src=y)
    return out


def reference(x):
    return torch.softmax(x.float(), dim=-1).to(x.dtype)


def main():
    x = torch.randn(300, 2000, device="neuron") * 4
    expected = reference(x.cpu())
    for kernel in (softmax_kernel, softmax_fused_kernel):
        y = kernel(x)
        torch.neuron.synchronize()
        print(f"{kernel.__name__:20s} device   max error:", (y.cpu() - expected).abs().max().item())
        y_np = nki.simulate(kernel)(x.cpu().numpy())
        print(f"{kernel.__name__:20s} simulate max error:", np.abs(y_np - expected.numpy()).max())


if __name__ == "__main__":
    main()
