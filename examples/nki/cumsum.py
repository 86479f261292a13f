"""Cumulative sum along the free (last) axis of x [N, D], current NKI API.

Rows go on the partitions, 128 per tile (an ``affine_range`` over full tiles, then a smaller
one for the rest). Rows are loaded, scanned and stored in chunks of at most 8192 columns, the
running total carried from one chunk to the next, so the SBUF footprint does not grow with D
(e.g. a cumsum over a 32k vocabulary for top-p sampling). Three versions:

``cumsum_kernel``             nisa.tensor_tensor_scan, the vector engine's linear recurrence
                              h[i] = a[i] * h[i-1] + b[i] with a = 1 and b = x; the carry is the
                              scan's ``initial`` (the previous chunk's last column).
``cumsum_cumulative_kernel``  nisa.tensor_scalar_cumulative with op1=add: the engine's running
                              register is the sum; chunks chain through that register
                              (reduce_cmd=reduce).
``cumsum_matmul_kernel``      the tensor engine: 128 columns at a time transposed onto the
                              partitions and multiplied by an upper-triangular ones matrix
                              (built with nisa.affine_select); the sum of everything left of a
                              block is added by a second matmul accumulating into the same PSUM
                              tile (a staircase of ones, also from affine_select).
"""

import numpy as np
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
import torchneuron.nki.isa as nisa

P = 128
CHUNK = 8192  # columns per scan instruction (32 KiB per partition in fp32)


def _row_tiles(N):
    """(first row, rows) of each tile: full tiles as one affine_range loop, then the rest."""
    for t in nl.affine_range(N // P):
        yield t * P, P
    if N % P:
        yield N - N % P, N % P


@nki.jit
def cumsum_kernel(x):
    N, D = x.shape
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    F = min(D, CHUNK)
    ones = nl.ndarray((P, F), dtype=nl.float32, buffer=nl.sbuf)  # the recurrence's a[i] = 1
    nisa.memset(dst=ones, value=1.0)
    for r0, rows in _row_tiles(N):
        y = None
        for c0 in nl.sequential_range(0, D, F):  # chunk c starts from chunk c-1's total
            w = min(F, D - c0)
            xt = _load(x, r0, rows, c0, w)
            carry = 0.0 if y is None else y[:, y.shape[1] - 1:y.shape[1]]
            y = nl.ndarray((rows, w), dtype=nl.float32, buffer=nl.sbuf)  # fp32 running sums
            nisa.tensor_tensor_scan(dst=y, data0=ones[0:rows, 0:w], data1=xt, initial=carry, op0=nl.multiply,
                                    op1=nl.add)
            _store(out, y, r0, c0)
    return out


@nki.jit
def cumsum_cumulative_kernel(x):
    N, D = x.shape
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    F = min(D, CHUNK)
    for r0, rows in _row_tiles(N):
        for c0 in nl.sequential_range(0, D, F):
            w = min(F, D - c0)
            xt = _load(x, r0, rows, c0, w)
            y = nl.ndarray((rows, w), dtype=nl.float32, buffer=nl.sbuf)
            # reg = (x + 0) + reg: reset for the first chunk, carried on for the next ones.
            cmd = nisa.reduce_cmd.reset_reduce if c0 == 0 else nisa.reduce_cmd.reduce
            nisa.tensor_scalar_cumulative(dst=y, src=xt, op0=nl.add, op1=nl.add, imm0=0.0, reduce_cmd=cmd)
            _store(out, y, r0, c0)
    return out


def _load(x, r0, rows, c0, w):
    xt = nl.ndarray((rows, w), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=xt, src=x[r0:r0 + rows, c0:c0 + w])
    return xt


def _store(out, y, r0, c0):
    rows, w = y.shape
    if out.dtype != nl.float32:  # round once, from the fp32 sums
        o = nl.ndarray(y.shape, dtype=out.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=o, src=y)
        y = o
    nisa.dma_copy(dst=out[r0:r0 + rows, c0:c0 + w], src=y)


BLOCK = 512  # output columns per PSUM bank


@nki.jit
def cumsum_matmul_kernel(x):
    N, D = x.shape
    assert D % P == 0 and D // P <= P, "the matmul version takes D a multiple of 128, at most 128 * 128"
    assert x.dtype == nl.float32, "the matmul version takes fp32 (both matmul operands share the dtype)"
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    nc = D // P  # 128-column chunks

    # tri[i, j] = 1 if i <= j: column j of a chunk sums its elements 0..j (chunk column i is partition i).
    tri = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=tri, value=1.0)
    nisa.affine_select(dst=tri, pattern=[[1, P]], channel_multiplier=-1, on_true_tile=tri, on_false_value=0.0,
                       cmp_op=nl.greater_equal)  # keep where j - i >= 0
    # stair[c, col] = 1 if chunk c lies left of column col's chunk: col - 128 * (c + 1) >= 0.
    stair = nl.ndarray((nc, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=stair, value=1.0)
    nisa.affine_select(dst=stair, pattern=[[1, D]], channel_multiplier=-P, offset=-P, on_true_tile=stair,
                       on_false_value=0.0, cmp_op=nl.greater_equal)

    for r0, rows in _row_tiles(N):
        xt = nl.ndarray((rows, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[r0:r0 + rows, :])
        # Chunk sums [rows, nc], transposed to [nc, rows]: the stationary of the carry matmul.
        sums = nl.ndarray((rows, nc), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=sums, op=nl.add, data=xt.reshape((rows, nc, P)), axis=2)
        sT_ps = nl.ndarray((nc, rows), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=sT_ps, data=sums)
        sT = nl.ndarray((nc, rows), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sT, src=sT_ps)
        # x^T chunks [128 (column in chunk), nc, rows].
        xT = nl.ndarray((P, nc, rows), dtype=nl.float32, buffer=nl.sbuf)
        for c in nl.affine_range(nc):
            xT_ps = nl.ndarray((P, rows), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_transpose(dst=xT_ps, data=xt[:, c * P:(c + 1) * P])
            nisa.tensor_copy(dst=xT[:, c, :], src=xT_ps)

        y = nl.ndarray((rows, D), dtype=out.dtype, buffer=nl.sbuf)
        for b0 in range(0, D, BLOCK):
            w = min(BLOCK, D - b0)
            y_ps = nl.ndarray((rows, BLOCK), dtype=nl.float32, buffer=nl.psum)
            # Totals of the chunks left of each column ...
            nisa.nc_matmul(dst=y_ps[:, 0:w], stationary=sT, moving=stair[:, b0:b0 + w], accumulate=False)
            # ... plus the running sum inside each column's own chunk (accumulate: these matmuls
            # write parts of the region the first one wrote).
            for c in nl.affine_range(w // P):
                nisa.nc_matmul(dst=y_ps[:, c * P:(c + 1) * P], stationary=xT[:, b0 // P + c, :], moving=tri,
                               accumulate=True)
            nisa.tensor_copy(dst=y[:, b0:b0 + w], src=y_ps[:, 0:w])
        nisa.dma_copy(dst=out[r0:r0 + rows, :], src=y)
    return out


def reference(x):
    return torch.cumsum(x.float(), dim=-1).to(x.dtype)


def main():
    x = torch.randn(300, 9000, device="neuron")
    expected = reference(x.cpu())
    for kernel in (cumsum_kernel, cumsum_cumulative_kernel):
        y = kernel(x)
        torch.neuron.synchronize()
        print(f"{kernel.__name__:26s} device   max error:", (y.cpu() - expected).abs().max().item())
        y_np = nki.simulate(kernel)(x.cpu().numpy())
        print(f"{kernel.__name__:26s} simulate max error:", np.abs(y_np - expected.numpy()).max())
    x = x[:, :1024]
    y = cumsum_matmul_kernel(x)
    print(f"{'cumsum_matmul_kernel':26s} device   max error:", (y.cpu() - reference(x.cpu())).abs().max().item())


if __name__ == "__main__":
    main()
