"""Compiled training step of a small GPT (the demo's model) with AdamW, one run.

Cases, each a ratio of two loops measured interleaved in this process:
- neuron compiled (backend="neuron") vs CPU compiled (backend="inductor"), target >= 1.0;
- neuron compiled vs neuron eager, target >= 1.3 at d=64;
- neuron reduce-overhead vs neuron compiled (default mode) at d=64, target >= 1.3;
and the compile time of the first step in a fresh process with an empty Inductor cache (cold)
against a second fresh process reusing that cache (warm).

The model and loss are compiled; the optimizer step runs eagerly in every loop.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_step  # noqa: E402
from _common import interleaved, report  # noqa: E402
from train_step import BATCH, CONTEXT  # noqa: E402


def make_loop(device: str, d_model: int, steps: int, backend: str | None, mode: str | None = None):
    """train_step's loop with the loss computation compiled by `backend` (eager when None)."""
    compile_loss = functools.partial(torch.compile, backend=backend, mode=mode) if backend else None
    return train_step.make_loop(device, d_model, steps, compile_loss)


def first_step_seconds(d_model: int) -> float:
    """Child process: the first compiled step (compile included), in seconds."""
    import torchneuron  # noqa: F401

    run = make_loop("neuron", d_model, 1, "neuron")
    return run()


def compile_times(d_model: int) -> tuple[float, float, dict]:
    """(cold, warm) first-step seconds in two fresh processes sharing one new cache dir."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        times, metrics = [], {}
        for _ in range(2):
            out = subprocess.run([sys.executable, __file__, "--child-first-step", str(d_model)], env=env,
                                 capture_output=True, text=True, check=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            times.append(result["seconds"])
            metrics = result["cache_hits"]
        return times[0], times[1], metrics


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10, help="steps per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--child-first-step", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_first_step:
        seconds = first_step_seconds(args.child_first_step)
        import torchneuron

        print(json.dumps({"seconds": seconds, "cache_hits": torchneuron.get_dynamo_metrics()["cache_hits"]}))
        return []

    import torchneuron  # noqa: F401

    rows = []
    tokens = BATCH * CONTEXT
    for d in args.dims:
        compiled = make_loop("neuron", d, args.steps, "neuron")
        cpu_inductor = make_loop("cpu", d, args.steps, "inductor")
        dev_s, cpu_s = interleaved(compiled, cpu_inductor, rounds=args.rounds)
        rows.append(report("compile", f"gpt_d{d}", "tokens_per_s", tokens / dev_s, "cpu_inductor", tokens / cpu_s,
                           higher_is_better=True, candidate="neuron_compiled"))
        eager = make_loop("neuron", d, args.steps, None)
        dev_s, eager_s = interleaved(compiled, eager, rounds=args.rounds)
        rows.append(report("compile", f"gpt_d{d}", "tokens_per_s", tokens / dev_s, "neuron_eager",
                           tokens / eager_s, higher_is_better=True, candidate="neuron_compiled"))
        if d == min(args.dims):
            replay = make_loop("neuron", d, args.steps, "neuron", mode="reduce-overhead")
            ro_s, dev_s = interleaved(replay, compiled, rounds=args.rounds)
            rows.append(report("compile", f"gpt_d{d}", "tokens_per_s", tokens / ro_s, "neuron_compiled",
                               tokens / dev_s, higher_is_better=True, candidate="neuron_reduce_overhead"))
    d = min(args.dims)
    cold, warm, hits = compile_times(d)
    rows.append(report("compile", f"gpt_d{d}_first_step", "seconds", warm, "cold_cache", cold,
                       higher_is_better=False, candidate="warm_cache", warm_cache_hits=hits))
    return rows


if __name__ == "__main__":
    main()
