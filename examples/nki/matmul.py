"""Tiled matmul C[M, N] = A[M, K] @ B[K, N] on the tensor engine.

The tensor engine contracts over the partition dimension of both operands, so the kernel takes
A already transposed (``lhsT``, [K, M]): ``nc_matmul(dst, stationary, moving)`` computes
``dst[M, N] = stationary[K, M].T @ moving[K, N]``. Tiles are 128 (K) x 128 (M) x 512 (N): the
limits of the stationary and moving free dimensions, and one fp32 PSUM bank for the result.
"""

import numpy as np
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
import torchneuron.nki.isa as nisa

TILE_K, TILE_M, TILE_N = 128, 128, 512


@nki.jit
def matmul_kernel(lhsT, rhs):
    """Destination-first ISA style: dma_copy loads, nc_matmul into PSUM, tensor_copy out of PSUM."""
    K, M = lhsT.shape
    K_, N = rhs.shape
    assert K == K_, "lhsT and rhs must share the contraction dimension K"
    assert K % TILE_K == 0 and M % TILE_M == 0 and N % TILE_N == 0, "shapes must be multiples of the tiles"
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)

    for m in nl.affine_range(M // TILE_M):
        for n in nl.affine_range(N // TILE_N):
            # Matmul results accumulate in fp32 PSUM, whatever the input dtype.
            res_psum = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                lhsT_tile = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=lhsT_tile, src=lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
                rhs_tile = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=rhs_tile, src=rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])
                # accumulate=None (the default): the first matmul into res_psum overwrites it, the
                # following ones add to it -- one accumulation group over the K tiles.
                nisa.nc_matmul(res_psum, lhsT_tile, rhs_tile)

            # DMA does not reach PSUM: evict to SBUF (casting to the output dtype), then store.
            res_sbuf = nl.ndarray((TILE_M, TILE_N), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(res_sbuf, res_psum)
            nisa.dma_copy(dst=result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N], src=res_sbuf)
    return result


@nki.jit
def matmul_legacy_kernel(lhsT, rhs):
    """The same matmul in the older language style: nl.load / nl.matmul / nl.store."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TILE_M):
        for n in nl.affine_range(N // TILE_N):
            res_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                lhsT_tile = nl.load(lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
                rhs_tile = nl.load(rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])
                # transpose_x=True: lhsT_tile is already [K, M], so this is lhsT_tile.T @ rhs_tile.
                res_psum += nl.matmul(lhsT_tile, rhs_tile, transpose_x=True)
            nl.store(result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N],
                     value=nl.copy(res_psum, dtype=result.dtype))
    return result


def reference(lhsT, rhs):
    return (lhsT.float().T @ rhs.float()).to(lhsT.dtype)


def main():
    K, M, N = 512, 256, 1024
    lhsT = torch.randn(K, M, device="neuron")
    rhs = torch.randn(K, N, device="neuron")
    expected = reference(lhsT.cpu(), rhs.cpu())
    for kernel in (matmul_kernel, matmul_legacy_kernel):
        out = kernel(lhsT, rhs)
        torch.neuron.synchronize()
        print(f"{kernel.__name__:22s} device   max error:", (out.cpu() - expected).abs().max().item())
        out_np = nki.simulate(kernel)(lhsT.cpu().numpy(), rhs.cpu().numpy())
        print(f"{kernel.__name__:22s} simulate max error:", np.abs(out_np - expected.numpy()).max())

    # bf16 inputs: the tensor engine still accumulates in fp32 PSUM; the result is rounded to bf16.
    a16, b16 = lhsT.bfloat16(), rhs.bfloat16()
    out = matmul_kernel(a16, b16)
    expected16 = reference(a16.cpu().float(), b16.cpu().float())  # fp32 product of the same bf16 values
    print("bf16 inputs            device   max rel error:",
          ((out.cpu().float() - expected16).abs() / expected16.abs().clamp_min(1)).max().item())


if __name__ == "__main__":
    main()
