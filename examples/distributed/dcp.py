"""Distributed checkpointing (torch.distributed.checkpoint) with resharding on load.

1. Train an FSDP2 model (fully_shard per Linear and at the root) with Adam for a
   few steps, then save its sharded model and optimizer state dicts
   (get_model_state_dict / get_optimizer_state_dict: DTensors, Shard(0)): each rank
   writes only its shards.
2. Load the checkpoint into differently sharded targets and check that every value
   equals the original full tensor, exactly:
   a. a plain, unsharded model + torch.optim.Adam on every rank (model and
      optimizer state);
   b. DTensors on the same 1-D mesh with other placements: weights Shard(1),
      biases Replicate.

The directory is --path, or a fresh temporary directory made by rank 0 and sent to
the others with broadcast_object_list (and removed at the end). Across hosts it must
be on a file system all ranks share.

    torchrun --nproc-per-node 2 examples/distributed/dcp.py [--device cpu] [--steps N] [--path DIR]
"""

import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_model_state_dict, get_optimizer_state_dict, set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from common import Parity, batches, log, mlp, parse_args, setup, shard, teardown

FULL = StateDictOptions(full_state_dict=True)  # all-gather to full tensors on every rank


def flat_optim(osd):
    """{fqn: {exp_avg: t, ...}} -> {"fqn.exp_avg": t, ...}"""
    return {f"{fqn}.{k}": v for fqn, s in osd["state"].items() for k, v in s.items()}


def main():
    args = parse_args(__doc__, path=dict(default=None, help="checkpoint directory"))
    device = setup(args)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))

    path = [args.path]
    if path[0] is None:
        path = [tempfile.mkdtemp(prefix="dcp_example_") if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(path, src=0, device=device)
    path = path[0]

    # 1. Train the FSDP2 model a little so that Adam has state, then save.
    model = mlp().to(device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for x, y in batches(args.steps, 16):
        opt.zero_grad()
        F.mse_loss(model(shard(x).to(device)), shard(y).to(device)).backward()
        opt.step()

    dcp.save({"model": get_model_state_dict(model),
              "optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=path)
    # The ground truth: the same state, all-gathered (collectives: every rank).
    full_model = {k: v.cpu() for k, v in get_model_state_dict(model, options=FULL).items()}
    full_optim = get_optimizer_state_dict(model, opt, options=FULL)
    full_optim = {k: v.cpu() for k, v in flat_optim(full_optim).items()}
    log(f"dcp: saved to {path}: {sorted(os.listdir(path))}")

    parity = Parity(atol=0, rtol=0)  # a checkpoint round trip must be exact

    # 2a. Plain model + Adam, from another seed so a failed load would show.
    plain = mlp(seed=123).to(device)
    plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-2)
    state = {"model": plain.state_dict(),
             "optim": get_optimizer_state_dict(plain, plain_opt)}  # FQN-keyed, initialised
    dcp.load(state, checkpoint_id=path)  # reads whole tensors in place: resharding
    plain.load_state_dict(state["model"])
    set_optimizer_state_dict(plain, plain_opt, optim_state_dict=state["optim"])
    parity.check_all("plain param", dict(plain.named_parameters()), full_model)
    parity.check_all("plain adam", flat_optim(get_optimizer_state_dict(plain, plain_opt)),
                     full_optim)
    log("dcp: loaded into an unsharded model + Adam on every rank")

    # 2b. Same mesh, other placements: weights split by columns, biases replicated.
    other = {k: distribute_tensor(torch.zeros_like(v, device=device), mesh,
                                  [Shard(1) if v.dim() == 2 else Replicate()])
             for k, v in full_model.items()}
    dcp.load({"model": other}, checkpoint_id=path)
    parity.check_all("Shard(1)/Replicate param", {k: v.full_tensor() for k, v in other.items()},
                     full_model)
    log("dcp: loaded into DTensors with weights Shard(1), biases Replicate")

    dist.barrier()
    if args.path is None and dist.get_rank() == 0:
        shutil.rmtree(path)
    parity.report("dcp", device)
    teardown()


if __name__ == "__main__":
    main()
