"""DistributedDataParallel with several gradient buckets and gradient accumulation.

Each optimizer step consumes a global batch in MICRO micro-batches; each rank trains
on its half of every micro-batch. The first micro-batches run under no_sync() (grads
accumulate locally, no all-reduce); the last one triggers the bucketed all-reduce of
the accumulated gradients. The CPU reference trains the plain model on the full
batch with the mean loss, which is the same gradient.

    torchrun --nproc-per-node 2 examples/distributed/ddp.py [--device cpu] [--steps N]
"""

import copy

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from common import (
    Parity, batches, log, mean_over_ranks, mlp, parse_args, reference_step, setup, shard, teardown,
)

MICRO = 2    # micro-batches per optimizer step
BATCH = 16   # global batch per optimizer step


def main():
    args = parse_args(__doc__)
    device = setup(args)

    model = mlp()
    ref = copy.deepcopy(model)  # the independent single-process CPU reference
    # ~7 KB of fp32 gradients and a 512-byte cap: a bucket closes as soon as it
    # reaches the cap, so each Linear's weight+bias ends up in its own bucket (3).
    # DDP starts with one bucket and rebuilds them in gradient-ready order after the
    # first iteration.
    ddp = DDP(model.to(device), bucket_cap_mb=512 / 2**20)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)

    parity = Parity()
    for step, (x, y) in enumerate(batches(args.steps, BATCH)):
        # Distributed: MICRO micro-batches, this rank's half of each. Dividing by
        # MICRO makes the accumulated gradient that of the mean over the step's batch
        # (DDP already averages over ranks).
        opt.zero_grad()
        step_loss = torch.zeros((), device=device)
        for i, (xm, ym) in enumerate(zip(x.chunk(MICRO), y.chunk(MICRO))):
            xm, ym = shard(xm).to(device), shard(ym).to(device)
            last = i == MICRO - 1
            with ddp.no_sync() if not last else torch.enable_grad():
                loss = F.mse_loss(ddp(xm), ym) / MICRO
                loss.backward()
            step_loss += loss.detach()
        opt.step()
        step_loss = mean_over_ranks(step_loss)

        # Reference: the full batch at once, mean loss.
        ref_loss = reference_step(ref, ref_opt, x, y)
        parity.check(f"loss step {step}", step_loss, ref_loss)

    parity.check_all("param", dict(ddp.module.named_parameters()), dict(ref.named_parameters()))
    buckets = [b.buffer().numel() for b in ddp.reducer._get_zeros_like_grad_buckets()]
    log(f"ddp: {len(buckets)} gradient buckets (elements: {buckets})")
    parity.report("ddp", device)
    teardown()


if __name__ == "__main__":
    main()
