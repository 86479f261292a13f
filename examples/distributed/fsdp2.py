"""FSDP2 (`fully_shard`): fp32, bf16 mixed precision, and CPU offload.

Each Linear and the root are sharded (Shard(0) DTensor parameters on a 1-D mesh).
Each rank trains on its half of the global batch; FSDP all-gathers parameters for
forward/backward and reduce-scatters (averages) gradients, so the result must match
the plain model trained on the full batch with the mean loss.

Phases, each from the same initial weights:
  fp32     - no policy; tolerance 1e-5.
  bf16     - MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) against the
             fp32 reference (no autocast, no bf16): a looser tolerance, see below.
  offload  - CPUOffloadPolicy: sharded params, grads and optimizer step live on the
             host; only unsharded params visit the device. With --device cpu this
             is degenerate (the device is the host) but the code path runs.

    torchrun --nproc-per-node 2 examples/distributed/fsdp2.py [--device cpu] [--steps N]
"""

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from common import (
    Parity, batches, log, mean_over_ranks, mlp, parse_args, reference_step, setup, shard, teardown,
)

BATCH = 16

# bf16 keeps 8 significant bits (relative rounding 2^-9 ~ 2e-3). Parameters and
# inputs are rounded to bf16 for the forward and the matmuls produce bf16, so
# activations and losses are off by a few 1e-3 relative after three layers; the
# gradients are reduced in fp32 and the sharded master weights stay fp32, so the
# updated parameters differ only by lr * (gradient error), far below 1e-2.
BF16_TOL = dict(atol=2e-2, rtol=2e-2)


def run_phase(name, device, mesh, steps, tol=None, **fsdp_kwargs) -> Parity:
    parity = Parity()
    model = mlp()
    ref = copy.deepcopy(model)
    # Move to the device first, also with CPU offload (which then moves the shards
    # back to the host); fully_shard would also move host parameters by itself.
    model.to(device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, **fsdp_kwargs)
    fully_shard(model, mesh=mesh, **fsdp_kwargs)

    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    tol = tol or {}
    for step, (x, y) in enumerate(batches(steps, BATCH)):
        opt.zero_grad()
        # .float(): with param_dtype=bf16 the output is bf16; take the loss in fp32.
        loss = F.mse_loss(model(shard(x).to(device)).float(), shard(y).to(device))
        loss.backward()
        opt.step()
        loss = mean_over_ranks(loss)

        ref_loss = reference_step(ref, ref_opt, x, y)
        parity.check(f"{name} loss step {step}", loss, ref_loss, **tol)

    # full_tensor() all-gathers each sharded parameter (a collective: same order on
    # every rank). Offloaded shards live on the host: gather them on the device, since
    # init_process_group() without a backend maps only the accelerator's device type
    # to a backend (as with nccl on cuda): the group may have none for CPU tensors.
    full = {k: p.to(device).full_tensor() for k, p in model.named_parameters()}
    parity.check_all(f"{name} param", full, dict(ref.named_parameters()), **tol)
    log(f"fsdp2: phase {name}: {steps} steps, max |diff| = {parity.max_diff:.3e}")
    return parity


def main():
    args = parse_args(__doc__)
    device = setup(args)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    parity = Parity()

    parity.absorb(run_phase("fp32", device, mesh, args.steps))
    parity.absorb(run_phase(
        "bf16", device, mesh, args.steps, tol=BF16_TOL,
        mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)))
    # With --device cpu the "device" is the host, so this phase only exercises FSDP2's
    # offload code path (host shards, pinned staging copies); it still runs.
    parity.absorb(run_phase("offload", device, mesh, args.steps,
                            offload_policy=CPUOffloadPolicy()))
    parity.report("fsdp2", device)
    teardown()


if __name__ == "__main__":
    main()
