"""DTensor on a DeviceMesh: placements, sharded matmuls, redistribute.

1-D mesh ("x", 2 ranks):
  - A Shard(0) @ B Replicate -> C Shard(0)            (no communication)
  - C -> Replicate (all-gather) and -> Shard(1)        (local re-slice)
  - A Shard(1) @ B Shard(0)  -> Partial(sum)           (local partial products)
    -> Replicate (all-reduce) and -> Shard(0) (reduce-scatter)
2-D meshes with named dims, (1, 2) and (2, 1):
  - distribute_tensor(T, [Shard(0), Shard(1)]), check the local block, full_tensor()
  - redistribute along one named dim only.
Every result is compared with the same computation on full CPU tensors.

    torchrun --nproc-per-node 2 examples/distributed/dtensor.py [--device cpu]
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

from common import Parity, log, parse_args, setup, teardown


def one_d(device, parity):
    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("x",))
    torch.manual_seed(0)  # same full tensors on every rank (and for the reference)
    a, b = torch.randn(8, 6), torch.randn(6, 4)

    da = distribute_tensor(a.to(device), mesh, [Shard(0)])
    db = distribute_tensor(b.to(device), mesh, [Replicate()])
    dc = da @ db  # row-sharded times replicated: each rank multiplies its rows
    assert dc.placements == (Shard(0),), dc.placements
    rank = dist.get_rank()
    parity.check("1-D Shard(0)@Replicate local", dc.to_local(), (a @ b).chunk(world)[rank])
    parity.check("1-D -> Replicate", dc.redistribute(mesh, [Replicate()]).to_local(), a @ b)
    parity.check("1-D -> Shard(1)", dc.redistribute(mesh, [Shard(1)]).to_local(),
                 (a @ b).chunk(world, 1)[rank])

    # Contraction dim sharded on both sides: each rank holds a partial sum of C.
    dp = (distribute_tensor(a.to(device), mesh, [Shard(1)])
          @ distribute_tensor(b.to(device), mesh, [Shard(0)]))
    assert isinstance(dp.placements[0], Partial), dp.placements
    parity.check("1-D Partial -> Replicate", dp.redistribute(mesh, [Replicate()]).to_local(), a @ b)
    parity.check("1-D Partial -> Shard(0)", dp.redistribute(mesh, [Shard(0)]).to_local(),
                 (a @ b).chunk(world)[rank])
    parity.check("1-D full_tensor", dp.full_tensor(), a @ b)
    log("dtensor: 1-D mesh: Shard/Replicate matmul, Partial reductions ok")


def two_d(device, parity, shape):
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=("dp", "tp"))
    torch.manual_seed(1)
    t = torch.randn(4, 6)

    dt = distribute_tensor(t.to(device), mesh, [Shard(0), Shard(1)])
    # Rows split over "dp", columns over "tp": this rank's block is at its mesh coordinate.
    i, j = mesh.get_coordinate()
    block = t.chunk(shape[0], 0)[i].chunk(shape[1], 1)[j]
    parity.check(f"2-D {shape} local block", dt.to_local(), block)
    parity.check(f"2-D {shape} full_tensor", dt.full_tensor(), t)
    # Gather along "tp" only: rows stay split over "dp".
    rows = dt.redistribute(mesh, [Shard(0), Replicate()])
    parity.check(f"2-D {shape} tp-gathered", rows.to_local(), t.chunk(shape[0], 0)[i])
    # The named sub-mesh is a 1-D mesh of its own.
    assert mesh["tp"].size() == shape[1] and mesh["dp"].size() == shape[0]
    log(f"dtensor: 2-D mesh {shape} (dp, tp): [Shard(0), Shard(1)] round trip ok")


def main():
    args = parse_args(__doc__)
    device = setup(args)
    parity = Parity()
    one_d(device, parity)
    world = dist.get_world_size()
    for shape in [(1, world), (world, 1)]:
        two_d(device, parity, shape)
    parity.report("dtensor", device)
    teardown()


if __name__ == "__main__":
    main()
