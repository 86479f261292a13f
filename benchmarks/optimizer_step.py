"""AdamW step (foreach) over 40 parameters of 128x128: neuron eager vs CPU eager, one run.

The optimizer passes new bias-correction scalars every step, so this also
guards the launcher's plan cache: a plan keyed on scalar values would be
recomputed (a Meta call) on every step.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, report  # noqa: E402

PARAMS, SIZE = 40, 128


def make_steps(device: str, steps: int, after_step=None):
    """`after_step` runs after every step (the adaptive benchmark ends each step's segment there)."""
    torch.manual_seed(0)
    params = [torch.randn(SIZE, SIZE, device=device, requires_grad=True) for _ in range(PARAMS)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=True)
    opt.step()  # creates the state

    def run() -> float:
        """Milliseconds per step, ending with the device idle."""
        t0 = time.perf_counter()
        for _ in range(steps):
            opt.step()
            if after_step:
                after_step()
        params[0].sum().item()
        return (time.perf_counter() - t0) / steps * 1e3

    return run


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10, help="steps per measurement")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    neuron_ms, cpu_ms = interleaved(make_steps("neuron", args.steps), make_steps("cpu", args.steps),
                                    rounds=args.rounds)
    return [report("optimizer_step", f"adamw_foreach_{PARAMS}x{SIZE}x{SIZE}", "ms_per_step", neuron_ms,
                   "cpu_eager", cpu_ms, higher_is_better=False)]


if __name__ == "__main__":
    main()
