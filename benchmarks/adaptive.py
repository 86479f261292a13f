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
- A whole run from a cold cache (issue 25, ``--cold``): the demo GPT trained for
  ``--steps`` steps in fresh processes, warm-up included: neuron eager, adaptive
  with empty caches, neuron eager again, adaptive again with the caches the first
  adaptive run filled (a second run of the same program; after each adaptive run,
  untimed, the compiles it started finish, up to ``--warmup-limit`` s). Per run: seconds, the
  whole-run and steady-state (last fifth of the steps) ratios to the mean of the
  two eager runs, and per hot segment its size, compile order, seconds from hot to
  first replay and the step of its first replay.
- The background compiler's cost to the program (issue 25 part 3, ``--impact``):
  the demo GPT's eager step time while the compiler process starts and compiles
  the GPT's own step (cut at 64 ops, fresh caches), against the same steps with
  the compiler stopped (SIGSTOP to its process group), in alternating windows;
  the ratio is the median over pairs of adjacent windows. Also the seconds the
  compiler ran until it was warm and until its first program was ready (its time
  to a first replay while the program trains), for each ``--priorities`` choice.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import statistics
import subprocess
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


# Ways the compiler process may yield to the program (``_worker.yield_to_the_program``);
# "default" is what the worker does unless told otherwise.
PRIORITIES = {
    "default": None,
    "as_program": {},  # no yielding at all: what the measurement reports when the compiler competes
    "nice10": {"nice": 10},
    "nice10_1thread": {"nice": 10, "compile_threads": 1},
    "nice19": {"nice": 19},
    "idle": {"sched_idle": True},
    "idle_1thread": {"sched_idle": True, "compile_threads": 1},
}


def _group_cpu_seconds(group: int) -> float:
    """CPU seconds used by the processes of a process group (with their waited-for children)."""
    ticks = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # it exited meanwhile
            continue
        if int(fields[2]) == group:  # fields from the state on: pgrp is the third, utime..cstime the 12th-15th
            ticks += sum(int(v) for v in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def compiler_impact(d: int, priority_name: str, window_s: float, limit_s: float) -> dict:
    """Eager steps of the d-model GPT with the compiler process working (it starts,
    warms up, then compiles the same GPT's step segments) and stopped, window by
    window; see the module docstring."""
    for name in ("TORCHNEURON_ADAPTIVE_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):  # nothing compiled yet
        os.environ[name] = tempfile.mkdtemp(prefix=f"impact_{priority_name}_")
    engine = adaptive._ENGINE
    engine.close()
    adaptive.reset()
    engine.priority = PRIORITIES[priority_name]
    saved = adaptive.configure()
    # Pieces that compile in a minute or two, not one step of minutes; a time limit the
    # stopped windows do not eat into (the compiler's clock runs while it is stopped).
    adaptive.configure(max_ops=64, compile_timeout=10 * limit_s)
    eager, hot = make_loop("neuron", d, 2), make_loop("neuron", d, 1)
    eager()
    hot()
    load = os.getloadavg()[0]
    with adaptive.enabled():  # starts the compiler, which starts warming up
        for _ in range(3):  # the step's pieces turn hot and queue
            hot()
    adaptive.configure(**saved)
    group = engine._child.pid
    pairs = []  # (phase, seconds per step with the compiler working, and stopped)
    active = warm_active = ready_active = 0.0
    cpu = {True: 0.0, False: 0.0}  # the compiler's CPU seconds in the windows where it worked, was stopped
    try:
        while active < limit_s and ready_active == 0.0:
            window = {}
            for working in (True, False) if len(pairs) % 2 == 0 else (False, True):  # ABBA: cancels a drift
                os.killpg(group, signal.SIGCONT if working else signal.SIGSTOP)
                phase = "compiling" if engine.warm_at is not None else "starting"
                t0, cpu0, samples = time.perf_counter(), _group_cpu_seconds(group), []
                while time.perf_counter() - t0 < window_s:
                    samples.append(eager())
                elapsed = time.perf_counter() - t0
                cpu[working] += _group_cpu_seconds(group) - cpu0
                window[working] = statistics.mean(samples)
                if working:
                    active += elapsed
                    if not warm_active and engine.warm_at is not None:
                        warm_active = active
                    if engine.wait_idle(0):  # an answer came: the compiler was idle for part of the window
                        ready_active = active
            if not ready_active:
                pairs.append((phase, window[True], window[False]))
    finally:
        os.killpg(group, signal.SIGCONT)  # never leave it stopped
        engine.close()
        engine.priority = None
    m = adaptive.get_metrics()
    ready = [r for r in m["timeline"] if r["compile_seconds"] is not None]
    ratios = [stopped / working for _phase, working, stopped in pairs]
    by_phase = {phase: round(statistics.median([b / a for p, a, b in pairs if p == phase]), 3)
                for phase in ("starting", "compiling") if any(p == phase for p, _a, _b in pairs)}
    working_ms = statistics.median([a for _p, a, _b in pairs]) * 1e3
    stopped_ms = statistics.median([b for _p, _a, b in pairs]) * 1e3
    return report("adaptive", f"gpt_d{d}_eager_step_while_compiling_{priority_name}", "ms_per_step", working_ms,
                  "compiler_stopped", stopped_ms, higher_is_better=False, target_ratio_at_least=round(1 / 1.15, 3),
                  paired_ratio=round(statistics.median(ratios), 3), paired_ratio_by_phase=by_phase,
                  window_pairs=len(pairs), window_seconds=window_s,
                  compiler_cores_while_working=round(cpu[True] / active, 2),
                  compiler_cpu_seconds_while_stopped=round(cpu[False], 1), priority=engine_priority(priority_name),
                  compiler_seconds_until_warm=round(warm_active, 1) or None,
                  compiler_seconds_until_first_program=round(ready_active, 1) or None,
                  first_program_ops=ready[0]["ops"] if ready else None,
                  failures=[f["reason"][:120] for f in m["failures"]], load_average=round(load, 1))


def engine_priority(name: str) -> dict:
    from torchneuron.adaptive import _worker

    return PRIORITIES[name] if PRIORITIES[name] is not None else _worker.PRIORITY


def _one_run(mode: str, d: int, steps: int, finish_limit_s: float) -> dict:
    """One training run in this (fresh) process: per-step seconds and, in adaptive
    mode, per segment the step of its first replay."""
    import torch.nn.functional as F

    from train_step import HEADS, LAYERS, VOCAB
    from torchneuron.demo import GPT

    torch.manual_seed(0)
    model = GPT(VOCAB, d_model=d, n_layer=LAYERS, n_head=HEADS, context=CONTEXT).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    data = [torch.randint(VOCAB, (BATCH, CONTEXT + 1), generator=gen) for _ in range(16)]
    adaptive.set_enabled(mode != "eager")
    times, first_replay_step = [], {}
    start = time.perf_counter()
    for step in range(steps):
        t0 = time.perf_counter()
        chunk = data[step % len(data)].to("neuron")
        loss = F.cross_entropy(model(chunk[:, :-1]).flatten(0, 1), chunk[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()  # a training loop's logging: waits for the device
        times.append(time.perf_counter() - t0)
        if mode != "eager":
            for r in adaptive.get_metrics()["timeline"]:
                if r["hot_to_first_replay_seconds"] is not None and r["key"] not in first_replay_step:
                    first_replay_step[r["key"]] = step
    total = time.perf_counter() - start
    out = {"mode": mode, "seconds": total, "times": times}
    if mode != "eager":
        m = adaptive.get_metrics()
        out["segments"] = [{**r, "first_replay_step": first_replay_step.get(r["key"])} for r in m["timeline"]]
        out["replays"], out["failures"] = m["replays"], [f["reason"][:120] for f in m["failures"]]
        # Untimed: the compiles the run started finish (within a limit), as they would in the
        # background of a longer run, so that the next run is a second run of a program
        # whose first run compiled its segments. What is left is stopped: it would compete.
        start = time.perf_counter()
        out["compiles_finished"] = adaptive.wait_for_compiles(finish_limit_s)
        out["seconds_to_finish_compiles"] = time.perf_counter() - start
        adaptive._ENGINE.close()
    return out


def cold_runs(d: int, steps: int, max_ops: int | None, finish_limit_s: float) -> list[dict]:
    """Eager, adaptive (cold caches), eager, adaptive (warm: the caches the cold run
    filled), each a fresh process."""
    caches = {"TORCHNEURON_ADAPTIVE_CACHE_DIR": tempfile.mkdtemp(prefix="neuron_adaptive_cold_"),
              "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="inductor_cold_")}
    if max_ops:
        caches["TORCHNEURON_ADAPTIVE_MAX_OPS"] = str(max_ops)
    runs = {}
    for name, mode in [("eager_1", "eager"), ("adaptive_cold", "adaptive"), ("eager_2", "eager"),
                       ("adaptive_warm", "adaptive")]:
        load = os.getloadavg()[0]
        child = subprocess.run([sys.executable, __file__, "--one-run", mode, "--dims", str(d), "--steps", str(steps),
                                "--warmup-limit", str(finish_limit_s)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env={**os.environ, **caches})
        if child.returncode != 0:
            raise RuntimeError(f"the {name} run failed with {child.returncode}")
        runs[name] = json.loads(child.stdout.splitlines()[-1])
        runs[name]["load_before"] = load
    tail = max(1, steps // 5)

    def steady(run):
        return statistics.median(run["times"][-tail:])

    eager_s = (runs["eager_1"]["seconds"] + runs["eager_2"]["seconds"]) / 2
    eager_steady = (steady(runs["eager_1"]) + steady(runs["eager_2"])) / 2
    rows = []
    for name in ("adaptive_cold", "adaptive_warm"):
        run = runs[name]
        segments = [{k: r[k] for k in ("ops", "cost_units", "source", "order", "estimated_seconds", "compile_seconds",
                                       "hot_to_first_replay_seconds", "first_replay_step", "failure")}
                    for r in run["segments"]]
        replayed = [r["first_replay_step"] for r in segments if r["first_replay_step"] is not None]
        rows.append(report("adaptive", f"gpt_d{d}_{steps}_steps_{name}" + (f"_max_ops_{max_ops}" if max_ops else ""),
                           "seconds_per_run", run["seconds"], "neuron_eager", eager_s, higher_is_better=False,
                           steady_state_ratio=round(eager_steady / steady(run), 3),
                           steps_until_first_replay=min(replayed) if replayed else None, replays=run["replays"],
                           untimed_seconds_to_finish_compiles=round(run.get("seconds_to_finish_compiles", 0), 1),
                           compiles_finished=run.get("compiles_finished"),
                           failures=run["failures"], segments=segments,
                           eager_seconds=[round(runs["eager_1"]["seconds"], 1), round(runs["eager_2"]["seconds"], 1)],
                           load_average=[round(runs[n]["load_before"], 1) for n in runs]))
    return rows


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10, help="steps per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--warmup-limit", type=float, default=300.0, help="seconds to wait for compiles")
    parser.add_argument("--cold", action="store_true",
                        help="only the whole runs from a cold cache (issue 25), --steps steps each (default 300)")
    parser.add_argument("--max-ops", type=int, default=None, help="segment size limit for --cold runs")
    parser.add_argument("--impact", action="store_true",
                        help="only the background compiler's cost to eager steps (issue 25 part 3)")
    parser.add_argument("--priorities", nargs="+", choices=sorted(PRIORITIES), default=["default"],
                        help="--impact: how the compiler yields, one measurement each")
    parser.add_argument("--window", type=float, default=2.0, help="--impact: seconds per window")
    parser.add_argument("--one-run", choices=["eager", "adaptive"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_run:
        print(json.dumps(_one_run(args.one_run, args.dims[0], args.steps, args.warmup_limit)))
        return []
    if args.impact:
        return [compiler_impact(d, name, args.window, args.warmup_limit) for d in args.dims for name in args.priorities]
    if args.cold:
        return [row for d in args.dims for row in cold_runs(d, args.steps if args.steps != 10 else 300, args.max_ops,
                                                    args.warmup_limit)]
    rows = [launch_overhead(2000, args.rounds)]
    rows.append(adamw(args.steps, args.rounds, args.warmup_limit))
    for d in args.dims:
        rows += gpt(d, args.steps, args.rounds, args.warmup_limit)
    return rows


if __name__ == "__main__":
    main()
