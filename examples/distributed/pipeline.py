"""Pipeline parallelism with torch.distributed.pipelining: 2 stages, 4 micro-batches.

The model (a 4-Linear MLP) is split by hand: rank 0 holds the first two Linear
layers, rank 1 the last two and the loss. Activations go forward and their
gradients backward between the stages by point-to-point send/recv. Each phase
(ScheduleGPipe, then Schedule1F1B) trains a fresh model: the schedule splits the
global batch into micro-batches, and with scale_grads (the default) the accumulated
gradient is divided by their number, i.e. equals that of the mean loss on the full
batch, as in the single-process CPU reference. The last stage checks the losses,
each stage checks its own parameters.

    torchrun --nproc-per-node 2 examples/distributed/pipeline.py [--device cpu] [--steps N]
"""

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from common import Parity, batches, log, mlp, parse_args, reference_step, setup, teardown

BATCH, N_MICRO = 16, 4
SIZES = (16, 32, 32, 32, 4)  # Linear ReLU Linear ReLU | Linear ReLU Linear
SPLIT = 4                    # stage 0 = modules [0, 4), stage 1 = the rest


def run_phase(schedule_cls, device, steps) -> Parity:
    rank, world = dist.get_rank(), dist.get_world_size()
    parity = Parity()
    full = mlp(SIZES)
    ref = copy.deepcopy(full)
    # Slicing a Sequential keeps the module names ("4.weight", ...), so a stage's
    # parameters line up with the same slice of the reference.
    part = slice(0, SPLIT) if rank == 0 else slice(SPLIT, None)
    stage_mod = full[part].to(device)
    stage = PipelineStage(stage_mod, rank, world, device)
    schedule = schedule_cls(stage, n_microbatches=N_MICRO, loss_fn=F.mse_loss)
    opt = torch.optim.SGD(stage_mod.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)

    for step, (x, y) in enumerate(batches(steps, BATCH)):
        opt.zero_grad()
        if stage.is_first:
            schedule.step(x.to(device))                     # feeds micro-batches of x
        else:
            losses = []                                     # one loss per micro-batch
            schedule.step(target=y.to(device), losses=losses)
        opt.step()

        ref_loss = reference_step(ref, ref_opt, x, y)
        if stage.is_last:
            # Equal micro-batches: the mean of their mean losses is the batch's.
            parity.check(f"{schedule_cls.__name__} loss step {step}",
                         torch.stack(losses).mean(), ref_loss)

    parity.check_all(f"{schedule_cls.__name__} stage {rank} param",
                     dict(stage_mod.named_parameters()), dict(ref[part].named_parameters()))
    return parity


def main():
    args = parse_args(__doc__)
    device = setup(args)
    if dist.get_world_size() != 2:
        raise SystemExit("pipeline.py is a 2-stage example: run it with --nproc-per-node 2")
    parity = Parity()
    for schedule_cls in (ScheduleGPipe, Schedule1F1B):
        p = run_phase(schedule_cls, device, args.steps)
        parity.absorb(p)
        log(f"pipeline: {schedule_cls.__name__}: {args.steps} steps, "
            f"{N_MICRO} micro-batches, stage 0 max |diff| = {p.max_diff:.3e}")
    parity.report("pipeline", device)
    teardown()


if __name__ == "__main__":
    main()
