"""Tensor parallelism with parallelize_module, then sequence parallelism.

Phase "mlp" (SGD): w1 ColwiseParallel (output features split), w2 RowwiseParallel
  (input features split, partial outputs all-reduced). Every rank sees the whole
  batch and gets the whole (replicated) output.
Phase "sp" (Adam): Megatron-style sequence parallelism around the same MLP in a
  pre-norm residual block. Activations outside the MLP are split along the sequence
  (Shard(1)): the LayerNorms run SequenceParallel on their sequence chunk, w1
  all-gathers the sequence (input_layouts=Shard(1)), w2 reduce-scatters its partial
  output back to sequence chunks (output_layouts=Shard(1)).
Both are compared with the plain model trained on one CPU process.

    torchrun --nproc-per-node 2 examples/distributed/tensor_parallel.py [--device cpu] [--steps N]
"""

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module,
)

from common import Parity, log, parse_args, setup, shard, teardown

D, H, SEQ, BATCH = 16, 32, 8, 4


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Linear(D, H), nn.Linear(H, D)

    def forward(self, x):
        return self.w2(F.relu(self.w1(x)))


class Block(MLP):
    """out_norm(x + MLP(norm(x)))"""

    def __init__(self):
        super().__init__()
        self.norm, self.out_norm = nn.LayerNorm(D), nn.LayerNorm(D)

    def forward(self, x):
        return self.out_norm(x + super().forward(self.norm(x)))


def data(steps):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, SEQ, D, generator=g), torch.randn(BATCH, SEQ, D, generator=g))
            for _ in range(steps)]


def train(name, make, plan, optim, shard_seq, device, mesh, steps) -> Parity:
    parity = Parity()
    torch.manual_seed(0)
    model = make()
    ref = copy.deepcopy(model)
    # Replaces the planned parameters with DTensors (sharded or replicated over the
    # mesh) and installs the input/output redistributions.
    parallelize_module(model.to(device), mesh, plan)
    opt, ref_opt = optim(model.parameters()), optim(ref.parameters())

    for step, (x, y) in enumerate(data(steps)):
        # With sequence parallelism a rank is fed only its chunk of the sequence
        # (SequenceParallel reads a plain tensor input as the local Shard(1) piece).
        out = model((shard(x, 1) if shard_seq else x).to(device))
        if isinstance(out, DTensor):
            # Sequence-sharded output: gather it (differentiably) so that every rank
            # evaluates the same global loss; the backward of the gather just takes
            # each rank's chunk of the gradient.
            out = out.full_tensor()
        loss = F.mse_loss(out, y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()

        ref_loss = F.mse_loss(ref(x), y)
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        parity.check(f"{name} loss step {step}", loss, ref_loss)

    full = {k: p.full_tensor() for k, p in model.named_parameters()}
    parity.check_all(f"{name} param", full, dict(ref.named_parameters()))
    log(f"tensor_parallel: phase {name}: {steps} steps, max |diff| = {parity.max_diff:.3e}")
    return parity


def main():
    args = parse_args(__doc__)
    device = setup(args)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("tp",))
    parity = Parity()

    parity.absorb(train(
        "mlp", MLP, {"w1": ColwiseParallel(), "w2": RowwiseParallel()},
        lambda p: torch.optim.SGD(p, lr=0.1), False, device, mesh, args.steps))
    parity.absorb(train(
        "sp", Block,
        {
            "norm": SequenceParallel(),                         # Shard(1) in and out
            "w1": ColwiseParallel(input_layouts=Shard(1)),      # all-gather the sequence
            "w2": RowwiseParallel(output_layouts=Shard(1)),     # reduce-scatter it back
            "out_norm": SequenceParallel(),
        },
        lambda p: torch.optim.Adam(p, lr=1e-2), True, device, mesh, args.steps))
    parity.report("tensor_parallel", device)
    teardown()


if __name__ == "__main__":
    main()
