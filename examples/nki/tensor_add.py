"""Element-wise add over an SPMD grid: one program per 128 x 512 tile.

Shows ``kernel[g0, g1](...)``, ``nl.program_id``, ``nl.arange`` index expressions, and masks for
shapes that are not a multiple of the tile.
"""

import numpy as np
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
import torchneuron.nki.isa as nisa  # noqa: F401  (the usual NKI imports)

TILE_P, TILE_F = 128, 512  # partitions x free elements of one tile


@nki.jit
def tensor_add_kernel(a_input, b_input):
    """c = a + b for 2-D inputs; launch with grid (ceil(M / 128), ceil(N / 512))."""
    M, N = a_input.shape
    # A shared_hbm tensor is one tensor for the whole grid: every program writes its own tile.
    c_output = nl.ndarray((M, N), dtype=a_input.dtype, buffer=nl.shared_hbm)

    # The rows and columns of this program's tile, as index expressions: i_p is [128, 1] and
    # i_f is [1, 512], so a[i_p, i_f] addresses a [128, 512] tile (numpy broadcasting).
    i_p = nl.program_id(0) * TILE_P + nl.arange(TILE_P)[:, None]
    i_f = nl.program_id(1) * TILE_F + nl.arange(TILE_F)[None, :]
    # Edge tiles reach past the tensor: the mask keeps only the positions inside it.
    inside = (i_p < M) & (i_f < N)

    a_tile = nl.load(a_input[i_p, i_f], mask=inside)   # HBM -> SBUF
    b_tile = nl.load(b_input[i_p, i_f], mask=inside)
    c_tile = nl.add(a_tile, b_tile)                     # on the vector engine (a_tile + b_tile works too)
    nl.store(c_output[i_p, i_f], value=c_tile, mask=inside)  # SBUF -> HBM
    return c_output


def tensor_add(a, b):
    """Launches one program per tile."""
    M, N = a.shape
    grid = ((M + TILE_P - 1) // TILE_P, (N + TILE_F - 1) // TILE_F)
    return tensor_add_kernel[grid](a, b)


def reference(a, b):
    return a + b


def main():
    a = torch.randn(300, 1100, device="neuron")
    b = torch.randn(300, 1100, device="neuron")
    c = tensor_add(a, b)  # neuron tensors in, a neuron tensor out (asynchronous, like an op)
    torch.neuron.synchronize()
    print("device   max error:", (c.cpu() - reference(a.cpu(), b.cpu())).abs().max().item())

    a_np, b_np = a.cpu().numpy(), b.cpu().numpy()
    grid = ((300 + TILE_P - 1) // TILE_P, (1100 + TILE_F - 1) // TILE_F)
    c_np = nki.simulate(tensor_add_kernel)[grid](a_np, b_np)  # NumPy in, NumPy out
    print("simulate max error:", np.abs(c_np - (a_np + b_np)).max())


if __name__ == "__main__":
    main()
