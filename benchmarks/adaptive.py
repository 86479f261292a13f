"""Adaptive eager vs neuron eager and CPU eager, one run (issue 8).

- Small GPT training (seq 64, batch 8, AdamW): steady state after warm-up vs
  neuron eager, CPU eager, and the same step under torch.compile(backend="neuron")
  (loss and optimizer step: what the compiler makes of it with whole graphs), and
  the warm-up cost: steps and seconds until the first replay of a compiled
  segment (compiled from scratch: a fresh compile cache).
- AdamW (foreach) step over 40 parameters of 128x128, each step its own
  segment (a stream query ends it, in both modes; without one, ten steps
  would be one segment, a different program that takes minutes to compile).
- Launch overhead: host time per small op with the mode on but nothing
  compiled yet (segments never turn hot), vs eager; target: at most 1.25x.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from pathlib import Path

# A fresh compile cache, so the warm-up cost includes compiling.
os.environ.setdefault("TORCHNEURON_ADAPTIVE_CACHE_DIR", tempfile.mkdtemp(prefix="neuron_adaptive_bench_"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor_bench_"))

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, report  # noqa: E402
from train_step import BATCH, CONTEXT, make_loop  # noqa: E402

import optimizer_step  # noqa: E402
from torchneuron import adaptive  # noqa: E402


def in_mode(on: bool, run):
    def measured() -> float:
        with adaptive.enabled(on):
            return run()
    return measured


def warm_up(run_step, limit_s: float) -> tuple[int, float]:
    """Runs single steps in adaptive mode until one replays: (steps, seconds)."""
    start, steps = time.perf_counter(), 0
    with adaptive.enabled():
        while adaptive.get_metrics()["replays"] == 0 and time.perf_counter() - start < limit_s:
            run_step()
            steps += 1
    return steps, time.perf_counter() - start


def gpt(d: int, steps: int, rounds: int, limit_s: float) -> list[dict]:
    adaptive.reset()
    neuron, fused, cpu = (make_loop("neuron", d, steps), make_loop("neuron", d, steps),
                          make_loop("cpu", d, steps))
    neuron_compile = functools.partial(torch.compile, backend="neuron")
    compiled = make_loop("neuron", d, steps, compile_loss=neuron_compile, compile_step=neuron_compile)
    single = make_loop("neuron", d, 1)
    warm_steps, warm_s = warm_up(single, limit_s)
    adaptive.wait_for_compiles(limit_s)
    in_mode(True, fused)()  # loads what finished compiling
    m = adaptive.get_metrics()
    extra = {"layers": 4, "seq": CONTEXT, "batch": BATCH, "warmup_steps_to_first_replay": warm_steps,
             "warmup_seconds": round(warm_s, 1), "compile_seconds": round(m["compile_seconds"], 1),
             "ops_per_replay": round(m["ops_per_replay"], 1), "failures": len(m["failures"])}
    tokens = BATCH * CONTEXT
    rows = []
    a_s, e_s = interleaved(in_mode(True, fused), in_mode(False, neuron), rounds=rounds)
    rows.append(report("adaptive", f"gpt_d{d}", "tokens_per_s", tokens / a_s, "neuron_eager", tokens / e_s,
                       higher_is_better=True, **extra))
    a_s, c_s = interleaved(in_mode(True, fused), cpu, rounds=rounds)
    rows.append(report("adaptive", f"gpt_d{d}", "tokens_per_s", tokens / a_s, "cpu_eager", tokens / c_s,
                       higher_is_better=True))
    start = time.perf_counter()
    compiled()  # compiles
    compile_s = time.perf_counter() - start
    a_s, t_s = interleaved(in_mode(True, fused), compiled, rounds=rounds)
    rows.append(report("adaptive", f"gpt_d{d}", "tokens_per_s", tokens / a_s, "neuron_torch_compile", tokens / t_s,
                       higher_is_better=True, torch_compile_first_run_seconds=round(compile_s, 1)))
    return rows


def end_segment() -> None:
    """What ends a step's segment in training (there: the next batch's copy to the device)."""
    torch.neuron.current_stream().query()


def adamw(steps: int, rounds: int, limit_s: float) -> dict:
    adaptive.reset()
    fused, eager = (optimizer_step.make_steps("neuron", steps, end_segment),
                    optimizer_step.make_steps("neuron", steps, end_segment))
    single = optimizer_step.make_steps("neuron", 1, end_segment)
    warm_steps, warm_s = warm_up(single, limit_s)
    adaptive.wait_for_compiles(limit_s)
    a_ms, e_ms = interleaved(in_mode(True, fused), in_mode(False, eager), rounds=rounds)
    return report("adaptive", f"adamw_foreach_{optimizer_step.PARAMS}x128x128", "ms_per_step", a_ms,
                  "neuron_eager", e_ms, higher_is_better=False, warmup_steps_to_first_replay=warm_steps,
                  warmup_seconds=round(warm_s, 1))


def launch_overhead(ops: int, rounds: int) -> dict:
    a, b = torch.ones(16, device="neuron"), torch.ones(16, device="neuron")
    torch.add(a, b)
    torch.neuron.synchronize()

    def run() -> float:
        """Host microseconds per launch (the device catches up after the clock stops)."""
        t0 = time.perf_counter()
        for _ in range(ops):
            torch.add(a, b)
        elapsed = time.perf_counter() - t0
        torch.neuron.synchronize()
        return elapsed / ops * 1e6

    saved = adaptive.configure()
    adaptive.configure(hot=10**9)  # nothing compiles: the cost of deferring alone
    try:
        a_us, e_us = interleaved(in_mode(True, run), in_mode(False, run), rounds=rounds)
    finally:
        adaptive.configure(**saved)
    return report("adaptive", "add_16_uncompiled", "host_us_per_op", a_us, "neuron_eager", e_us,
                  higher_is_better=False, target_ratio_at_least=0.8)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10, help="steps per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--warmup-limit", type=float, default=300.0, help="seconds to wait for compiles")
    args = parser.parse_args(argv)
    rows = [launch_overhead(2000, args.rounds)]
    rows.append(adamw(args.steps, args.rounds, args.warmup_limit))
    for d in args.dims:
        rows += gpt(d, args.steps, args.rounds, args.warmup_limit)
    return rows


if __name__ == "__main__":
    main()
