"""The stream sanitizer's cost: µs per eager op with it on, against neuron
eager with it off, interleaved in one run.

On pays Python bookkeeping and a stack capture per op. Off is free by
construction: the launch path has no sanitizer code, and the trace points in
event record/wait and the synchronize calls are one atomic load each.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, report, timed  # noqa: E402

from torchneuron import sanitizer  # noqa: E402


def step(a, b, side):
    """Small ops on two streams, ordered as a correct program orders them."""
    c = torch.add(a, b)
    c.mul_(0.5)
    side.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(side):
        d = torch.relu(c)
    torch.neuron.current_stream().wait_stream(side)
    return d.sum()


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300, help="steps per measurement (4 ops and 2 waits each)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    a, b = torch.randn(64, 64, device="neuron"), torch.randn(64, 64, device="neuron")
    side = torch.neuron.Stream()

    def measure(mode):
        def run():
            for _ in range(args.steps):
                step(a, b, side)
        if mode == "on":
            sanitizer.enable()
        try:
            return timed(run, torch.neuron.synchronize) / (4 * args.steps) * 1e6
        finally:
            if mode == "on":
                sanitizer.disable()

    rows = []
    with torch.no_grad():
        off, on = interleaved(lambda: measure("off"), lambda: measure("on"), rounds=args.rounds)
        rows.append(report("sanitizer", "on", "us_per_op", on, "sanitizer_off", off, higher_is_better=False))
    return rows


if __name__ == "__main__":
    main()
