"""Shared parts of the distributed examples: arguments, process-group set-up and
tear-down, and the parity check against a single-process CPU reference.

Every example is launched by torchrun, which sets RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT; nothing here is specific to one parallelism style.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

import torch  # autoloads torchneuron: the `neuron` device needs no other import
import torch.distributed as dist


def parse_args(description: str, **extra: dict) -> argparse.Namespace:
    """--device (default neuron) and --steps, plus script-specific options given as
    name=dict(kwargs for add_argument)."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="neuron", choices=["neuron", "cpu"])
    parser.add_argument("--steps", type=int, default=5, help="optimizer steps")
    for name, kwargs in extra.items():
        parser.add_argument("--" + name.replace("_", "-"), **kwargs)
    return parser.parse_args()


def setup(args: argparse.Namespace) -> torch.device:
    """Bind this rank to its local device and join the default process group.

    On neuron only standard PyTorch calls are used: the accelerator API binds the
    device, and init_process_group() without a backend picks the one registered for
    the device ("neuron"). `--device cpu` is the same path with gloo, for machines
    where the neuron c10d backend is not available.
    """
    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cpu":
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    else:
        torch.accelerator.set_device_index(local_rank)
        dist.init_process_group()
        device = torch.device(args.device, local_rank)
    return device


def teardown() -> None:
    dist.destroy_process_group()


def log(*msg) -> None:
    """print() on rank 0 only."""
    if dist.get_rank() == 0:
        print(*msg, flush=True)


def mlp(sizes=(16, 32, 32, 4), seed: int = 0) -> torch.nn.Sequential:
    """A small MLP (Linear/ReLU stack) on CPU, initialised from `seed`, so every rank
    and the reference start from the same weights."""
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def batches(steps: int, batch: int, in_dim: int = 16, out_dim: int = 4, seed: int = 1):
    """`steps` global (input, target) batches on CPU, identical on every rank."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, in_dim, generator=g), torch.randn(batch, out_dim, generator=g))
            for _ in range(steps)]


def shard(t: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """This rank's contiguous chunk of a global batch."""
    return t.chunk(dist.get_world_size(), dim)[dist.get_rank()]


def mean_over_ranks(value: torch.Tensor) -> torch.Tensor:
    """The mean of a per-rank value (SUM then divide: Gloo, behind --device cpu, has no AVG)."""
    total = value.detach().clone()
    dist.all_reduce(total)
    return total / dist.get_world_size()


def reference_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x, y) -> torch.Tensor:
    """One plain single-process step on the full batch (MSE loss); returns the loss."""
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss


@dataclass
class Parity:
    """Collects comparisons of distributed results with the CPU reference.

    check() records the max |diff| and any assert_close failure without raising, so
    that every rank reaches report(), which agrees on the outcome across ranks (one
    collective) before rank 0 prints and every rank raises on a mismatch.
    """

    atol: float = 1e-5
    rtol: float = 1e-5
    max_diff: float = 0.0
    errors: list[str] = field(default_factory=list)

    def check(self, what: str, actual, expected, *, atol=None, rtol=None) -> None:
        actual = _as_cpu_tensor(actual)
        expected = _as_cpu_tensor(expected)
        if actual.shape == expected.shape and actual.numel():
            diff = (actual.double() - expected.double()).abs().max().item()
            self.max_diff = max(self.max_diff, diff)
        try:
            torch.testing.assert_close(
                actual, expected,
                atol=self.atol if atol is None else atol,
                rtol=self.rtol if rtol is None else rtol,
                check_dtype=False,
            )
        except AssertionError as e:
            detail = "; ".join(line for line in str(e).splitlines() if line.strip())
            self.errors.append(f"rank {dist.get_rank()}: {what}: {detail}")

    def check_all(self, what: str, actual: dict, expected: dict, **tol) -> None:
        """Compare two {name: tensor} mappings entry by entry."""
        if actual.keys() != expected.keys():
            self.errors.append(f"rank {dist.get_rank()}: {what}: keys differ: "
                               f"{sorted(actual)} vs {sorted(expected)}")
        for k in actual.keys() & expected.keys():
            self.check(f"{what} {k}", actual[k], expected[k], **tol)

    def absorb(self, other: "Parity") -> None:
        """Fold another Parity (e.g. one phase's) into this one."""
        self.max_diff = max(self.max_diff, other.max_diff)
        self.errors += other.errors

    def report(self, name: str, device: torch.device) -> None:
        """Rank 0 prints `<name>: parity ok (max |diff| = ...)`; all ranks raise if any
        rank saw a mismatch."""
        stats = torch.tensor([self.max_diff, float(len(self.errors))], device=device)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        max_diff, failed = stats.tolist()
        for e in self.errors:
            print(e, flush=True)
        if failed:
            raise SystemExit(f"{name}: PARITY FAILED (max |diff| = {max_diff:.3e})")
        log(f"{name}: parity ok (max |diff| = {max_diff:.3e})")


def _as_cpu_tensor(x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        x = torch.tensor(x)
    return x.detach().cpu()
