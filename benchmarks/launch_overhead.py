"""Launch overhead: µs per op for small eager ops, neuron vs CPU, in one run.

Each case issues the op N times on small tensors and times the whole loop
including a final synchronisation, so the figure is the host's per-op cost
once the device keeps up. Target (issue 2): neuron ≤ 2x CPU's per-op cost.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, report, timed  # noqa: E402


def cases(device: str):
    a = torch.randn(64, 64, device=device)
    b = torch.randn(64, 64, device=device)
    lin = torch.nn.Linear(64, 64).to(device)
    x = torch.randn(8, 64, device=device)
    params = [torch.randn(64, device=device) for _ in range(8)]
    return {
        "add": lambda: torch.add(a, b),
        "mul_": lambda: a.mul_(1.0),
        "relu": lambda: torch.relu(a),
        "sum": lambda: a.sum(),
        "linear_8x64": lambda: lin(x),
        "foreach_add_8": lambda: torch._foreach_add_(params, 1.0),
    }


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=2000, help="ops per measurement")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    neuron, cpu = cases("neuron"), cases("cpu")
    rows = []
    with torch.no_grad():
        for name in neuron:
            def measure(fn, sync):
                def run():
                    for _ in range(args.ops):
                        fn()
                return timed(run, sync) / args.ops * 1e6

            dev_us, cpu_us = interleaved(lambda: measure(neuron[name], torch.neuron.synchronize),
                                         lambda: measure(cpu[name], lambda: None), rounds=args.rounds)
            rows.append(report("launch_overhead", name, "us_per_op", dev_us, "cpu_eager", cpu_us,
                               higher_is_better=False))
    return rows


if __name__ == "__main__":
    main()
