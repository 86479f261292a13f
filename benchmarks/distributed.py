"""Collectives and DDP on two ranks: the neuron backend against plain Gloo in the same run.

- ``all_reduce`` and ``all_gather_into_tensor`` bus bandwidth, 1 KiB to
  64 MiB: neuron tensors through the neuron backend vs CPU tensors through a
  Gloo group (the transport underneath). Target: >= 0.9x Gloo from 1 MiB.
- DDP training step of the small GPT (d=128) on two ranks vs one rank
  alone (same per-rank batch; weak scaling, ideal 1.0). On this emulated
  device the ranks' compute shares the host's cores, so the ratio mostly
  measures that sharing, not the communication.

Bus bandwidth follows the nccl-tests convention: all_reduce moves
2(n-1)/n x size per rank, all_gather (n-1)/n x output size.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, report  # noqa: E402

WORLD = 2


def bus_bandwidth(op: str, nbytes: int, seconds: float) -> float:
    factor = 2 * (WORLD - 1) / WORLD if op == "all_reduce" else (WORLD - 1) / WORLD
    return factor * nbytes / seconds / 1e9  # GB/s


def collective_loop(op: str, group, device: str, nbytes: int, iters: int):
    elems = nbytes // 4
    if op == "all_reduce":
        buf = torch.ones(elems, device=device)

        def issue():
            dist.all_reduce(buf, group=group)
    else:
        inp = torch.ones(elems // WORLD, device=device)
        buf = torch.empty(elems, device=device)

        def issue():
            dist.all_gather_into_tensor(buf, inp, group=group)

    def sync():
        if device != "cpu":
            torch.neuron.synchronize()

    def run() -> float:
        dist.barrier(group=group)
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            issue()
        sync()
        return (time.perf_counter() - t0) / iters

    return run


def ddp_loop(rank: int, distributed: bool, steps: int):
    from torchneuron.demo import GPT

    torch.manual_seed(0)
    device = torch.device("neuron", rank)
    model = GPT(96, d_model=128, n_layer=4, n_head=4, context=64).to(device)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    batches = [torch.randint(96, (8, 65), generator=gen) for _ in range(steps)]

    def run() -> float:
        t0 = time.perf_counter()
        for chunk in batches:
            chunk = chunk.to(device)
            loss = F.cross_entropy(model(chunk[:, :-1]).flatten(0, 1), chunk[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        loss.item()
        return (time.perf_counter() - t0) / steps

    return run


def rank_main(rank: int, store_path: str, args) -> None:
    torch.neuron.set_device(rank)
    dist.init_process_group("neuron", init_method=f"file://{store_path}", rank=rank, world_size=WORLD,
                            timeout=timedelta(minutes=5))
    gloo = dist.new_group(backend="gloo")
    quiet = rank != 0
    out = open(os.devnull, "w") if quiet else sys.stdout
    sys.stdout = out
    for op in ("all_reduce", "all_gather"):
        for kib in args.sizes_kib:
            nbytes = kib * 1024
            iters = max(args.min_iters, min(200, (256 << 20) // nbytes))  # about 256 MiB per measurement
            neuron = collective_loop(op, dist.group.WORLD, f"neuron:{rank}", nbytes, iters)
            base = collective_loop(op, gloo, "cpu", nbytes, iters)
            t_neuron, t_gloo = interleaved(neuron, base, rounds=args.rounds, warmup=1)
            report("distributed", f"{op} {kib} KiB", "bus GB/s", bus_bandwidth(op, nbytes, t_neuron),
                   "gloo on CPU tensors", bus_bandwidth(op, nbytes, t_gloo), True)
    two = ddp_loop(rank, True, args.steps)
    one = ddp_loop(rank, False, args.steps) if rank == 0 else None

    def two_ranks() -> float:
        return two()

    def one_rank() -> float:
        # Rank 1 waits in the barrier (blocked in Gloo, not computing) while rank 0 trains alone.
        t = one() if rank == 0 else 0.0
        dist.barrier(group=gloo)
        return t

    t_two, t_one = interleaved(two_ranks, one_rank, rounds=args.rounds, warmup=1)
    report("distributed", "DDP small GPT d=128, 2 ranks vs 1", "s/step", t_two, "1 rank, no DDP", t_one, False,
           note="weak scaling: same batch per rank; both ranks' device work shares 2 host cores")
    dist.destroy_process_group()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes-kib", type=int, nargs="+", default=[1, 16, 256, 1024, 4096, 16384, 65536])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-iters", type=int, default=8, help="fewest collectives per measurement")
    parser.add_argument("--steps", type=int, default=5, help="DDP steps per measurement")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(rank_main, args=(os.path.join(d, "store"), args), nprocs=WORLD, start_method="spawn")


if __name__ == "__main__":
    main()
