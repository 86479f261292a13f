"""Cost of the profiler on the small-GPT training step (d=128, AdamW).

- off vs never enabled: a process that ran a device profile before measuring
  against one that never did (target: no difference beyond noise). The two
  are separate processes, run alternately; each reports its median step.
- on vs off, in one process, interleaved: steps inside
  ``torch.profiler.profile(activities=[CPU, PrivateUse1])`` against the same
  steps without it (target ≤ 1.3x). The host-only profile (activities=[CPU])
  is reported too, to show which part of the cost is torch's own.
- the cost per launch while recording: small eager ops (add on 64x64, the
  host-bound worst case) inside a device profile against the same ops without
  one, interleaved.
- the walkthrough of docs/profiler.md: the demo's sampling loop after the fix
  the profiler pointed at (sampling on the device) against the loop before
  it (logits read with .cpu() each character), interleaved.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, report  # noqa: E402
from train_step import make_loop  # noqa: E402

from torchneuron import demo  # noqa: E402

D_MODEL = 128


@torch.no_grad()
def generate_sampling_on_host(model, prompt, stoi, itos, seed):
    """The demo's sampling loop before the walkthrough's fix."""
    model.eval()
    device = next(model.parameters()).device
    idx = torch.tensor([[stoi[c] for c in prompt]], device=device)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(demo.SAMPLE_CHARS):
        logits = model(idx[:, -demo.CONTEXT:])[0, -1].cpu()
        nxt = torch.multinomial((logits / demo.TEMPERATURE).softmax(-1), 1, generator=gen)
        idx = torch.cat([idx, nxt.view(1, 1).to(device)], dim=1)
    return "".join(itos[i] for i in idx[0].tolist())


def _walkthrough(rounds: int) -> dict:
    text = demo.corpus_path().read_text(encoding="ascii")
    itos = sorted(set(text))
    stoi = {c: i for i, c in enumerate(itos)}
    data = torch.tensor([stoi[c] for c in text])
    model, _, _ = demo.train(data, len(itos), torch.device("neuron"), 2, seed=0)

    def timed(fn):
        def measure() -> float:
            t0 = time.perf_counter()
            fn(model, demo.PROMPT, stoi, itos, 0)
            return (time.perf_counter() - t0) * 1e3
        return measure

    after, before = interleaved(timed(demo.generate), timed(generate_sampling_on_host), rounds=rounds)
    return report("profiler", "walkthrough_generate", "ms_per_sample", after, "sampling_on_host", before,
                  higher_is_better=False, chars=demo.SAMPLE_CHARS)


def _launch_cost(rounds: int, ops: int = 2000) -> dict:
    x = torch.randn(64, 64, device="neuron")

    def loop() -> float:
        torch.neuron.synchronize()
        t0 = time.perf_counter()
        for _ in range(ops):
            x.add(1.0)
        torch.neuron.synchronize()
        return (time.perf_counter() - t0) / ops * 1e6

    def recorded() -> float:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]):
            return loop()

    on, off = interleaved(recorded, loop, rounds=rounds)
    return report("profiler", "launch_add_64x64_on", "us_per_op", on, "off", off, higher_is_better=False)


def _child(profile_first: bool, steps: int, rounds: int) -> None:
    """Prints the median milliseconds per step of this process."""
    run = make_loop("neuron", D_MODEL, steps)
    if profile_first:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]):
            run()
    run()  # warm-up
    print(json.dumps(statistics.median(run() * 1e3 for _ in range(rounds))))


def _child_step(profile_first: bool, steps: int, rounds: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", "profiled" if profile_first else "never",
                          "--steps", str(steps), "--rounds", str(rounds)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5, help="steps per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--processes", type=int, default=4, help="process pairs for off vs never enabled")
    parser.add_argument("--child", choices=["never", "profiled"], help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=["walkthrough", "launch"], help="run one case")
    args = parser.parse_args(argv)
    if args.only == "walkthrough":
        return [_walkthrough(args.rounds)]
    if args.only == "launch":
        return [_launch_cost(args.rounds)]
    if args.child:
        _child(args.child == "profiled", args.steps, args.rounds)
        return []

    rows = []
    never, off = [], []
    for _ in range(args.processes):
        never.append(_child_step(False, args.steps, args.rounds))
        off.append(_child_step(True, args.steps, args.rounds))
    rows.append(report("profiler", f"gpt_d{D_MODEL}_off", "ms_per_step", statistics.median(off), "never_enabled",
                       statistics.median(never), higher_is_better=False, processes=args.processes))

    run = make_loop("neuron", D_MODEL, args.steps)

    def under(activities):
        def measure() -> float:
            with profile(activities=activities):
                return run() * 1e3
        return measure

    def plain_run() -> float:
        return run() * 1e3

    device_on, plain = interleaved(under([ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]), plain_run,
                                   rounds=args.rounds)
    rows.append(report("profiler", f"gpt_d{D_MODEL}_on", "ms_per_step", device_on, "off", plain,
                       higher_is_better=False, target_ratio=1 / 1.3))
    host_on, plain = interleaved(under([ProfilerActivity.CPU]), plain_run, rounds=args.rounds)
    rows.append(report("profiler", f"gpt_d{D_MODEL}_host_only_on", "ms_per_step", host_on, "off", plain,
                       higher_is_better=False))
    rows.append(_launch_cost(args.rounds))
    rows.append(_walkthrough(args.rounds))
    return rows


if __name__ == "__main__":
    main()
