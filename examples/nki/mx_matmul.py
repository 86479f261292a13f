"""MXFP8 matmul on NeuronCore-v4 (trn3): ``lhsT.T @ rhs`` with both operands quantized on chip.

Each tensor-engine pass contracts 512 rows: 128 partitions x the 4 values of a packed element. The
rows ``j * 128 + p`` (j = 0..3) are gathered into partition p by the load's access pattern, so the
bf16 tile is ``[128, F, 4]``; ``nisa.quantize_mx`` turns it into ``[128, F]`` packed fp8 elements
plus one scale per 8 partitions x 4 values, and ``nisa.nc_matmul_mx`` multiplies the quantized
operands, accumulating the K tiles in PSUM.
"""

import numpy as np
import torch

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

K_TILE = 512  # contraction rows per nc_matmul_mx: 128 partitions x 4 packed values


def _quantized(src, kt, free, fmt):
    """Rows [kt * 512, (kt + 1) * 512) of ``src`` [K, free] interleaved, quantized: (data, scales)."""
    tile = nl.ndarray((128, free, 4), dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=src.ap(pattern=[[free, 128], [1, free], [128 * free, 4]], offset=kt * K_TILE * free))
    data = nl.ndarray((128, free), dtype=fmt, buffer=nl.sbuf)
    scales = nl.ndarray((128, free), dtype=nl.uint8, buffer=nl.sbuf)  # 4 partitions used per 32-partition quadrant
    nisa.quantize_mx(dst=data, src=tile.reshape((128, free * 4)), dst_scale=scales)
    return data, scales


@nki.jit(platform_target="trn3")
def mx_matmul_kernel(lhsT, rhs):
    """lhsT [K, M], rhs [K, N] (bf16; K a multiple of 512, M <= 128, N <= 512) -> [M, N] fp32."""
    k, m = lhsT.shape
    n = rhs.shape[1]
    acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
    for kt in nl.affine_range(k // K_TILE):
        a, a_scales = _quantized(lhsT, kt, m, nl.float8_e4m3fn_x4)
        b, b_scales = _quantized(rhs, kt, n, nl.float8_e4m3fn_x4)
        nisa.nc_matmul_mx(dst=acc, stationary=a, moving=b, stationary_scale=a_scales, moving_scale=b_scales)
    result = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=result, src=acc)
    out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=result)
    return out


def reference(lhsT, rhs):
    return lhsT.float().T @ rhs.float()


def main():
    lhsT = torch.randn(1024, 128, dtype=torch.bfloat16, device="neuron")
    rhs = torch.randn(1024, 512, dtype=torch.bfloat16, device="neuron")
    want = reference(lhsT.cpu(), rhs.cpu())
    out = mx_matmul_kernel(lhsT, rhs)
    torch.neuron.synchronize()
    scale = want.abs().max().item()
    print("device   max error / max |C|:", ((out.cpu() - want).abs().max() / scale).item(), "(fp8 e4m3 operands)")
    sim = nki.simulate(mx_matmul_kernel)(lhsT.cpu(), rhs.cpu())
    print("simulate max error / max |C|:", (np.abs(sim.numpy() - want.numpy()).max() / scale))


if __name__ == "__main__":
    main()
