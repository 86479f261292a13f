"""ZeroRedundancyOptimizer (ZeRO stage 1) with DDP and Adam.

DDP all-reduces the gradients as usual; the optimizer state is partitioned: each rank
keeps Adam's moments for, and updates, only its share of the parameters, then the
updated parameters are broadcast from their owners. The result must match the plain
model with torch.optim.Adam on the full batch: losses, parameters, and (after
consolidate_state_dict on rank 0) the Adam moments.

    torchrun --nproc-per-node 2 examples/distributed/zero.py [--device cpu] [--steps N]
"""

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from common import Parity, batches, mean_over_ranks, mlp, parse_args, reference_step, setup, shard, teardown

BATCH, LR = 16, 1e-2


def main():
    args = parse_args(__doc__)
    device = setup(args)

    model = mlp()
    ref = copy.deepcopy(model)
    ddp = DDP(model.to(device))
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=LR)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=LR)
    owned = sum(p.numel() for g in opt.optim.param_groups for p in g["params"])
    total = sum(p.numel() for p in ddp.parameters())
    print(f"zero: rank {dist.get_rank()} holds Adam state for {owned}/{total} parameters",
          flush=True)

    parity = Parity()
    for step, (x, y) in enumerate(batches(args.steps, BATCH)):
        opt.zero_grad()
        loss = F.mse_loss(ddp(shard(x).to(device)), shard(y).to(device))
        loss.backward()
        opt.step()
        loss = mean_over_ranks(loss)

        ref_loss = reference_step(ref, ref_opt, x, y)
        parity.check(f"loss step {step}", loss, ref_loss)

    parity.check_all("param", dict(ddp.module.named_parameters()), dict(ref.named_parameters()))
    # Gather the partitioned optimizer state on rank 0 (a collective); its layout is
    # that of the plain optimizer's state_dict.
    opt.consolidate_state_dict(to=0)
    # ZeRO copies the states to the CPU with non_blocking=True, into pinned memory, and
    # does not wait: the copies are still in flight (on CUDA too) until a synchronize.
    torch.accelerator.synchronize()
    if dist.get_rank() == 0:
        state, ref_state = opt.state_dict()["state"], ref_opt.state_dict()["state"]
        for i, s in ref_state.items():
            for k in ("exp_avg", "exp_avg_sq"):
                parity.check(f"adam {k} [{i}]", state[i][k], s[k])
    parity.report("zero", device)
    teardown()


if __name__ == "__main__":
    main()
