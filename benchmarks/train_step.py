"""Training step of a small GPT with AdamW: neuron eager vs CPU eager, one run.

Also reports the allocator's peak reserved / peak allocated over the loop
(target ≤ 1.25). Targets (issue 2): ≥ 0.9x CPU throughput at d=128 and
≥ 1.0x at d=256 (asynchronous execution should hide host time).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, report  # noqa: E402

from torchneuron.demo import GPT  # noqa: E402

VOCAB, LAYERS, HEADS, CONTEXT, BATCH = 96, 4, 4, 64, 8


def make_loop(device: str, d_model: int, steps: int, compile_loss=None, compile_step=None):
    """A training loop; `compile_loss` and `compile_step` (e.g. torch.compile partials) wrap the
    loss computation and the optimizer step."""
    torch.manual_seed(0)
    model = GPT(VOCAB, d_model=d_model, n_layer=LAYERS, n_head=HEADS, context=CONTEXT).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(VOCAB, (BATCH, CONTEXT + 1), generator=gen) for _ in range(steps)]

    def loss_of(x, y):
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())

    step_loss = compile_loss(loss_of) if compile_loss else loss_of
    optimizer_step = compile_step(opt.step) if compile_step else opt.step

    def run() -> float:
        """Seconds per step over `steps` steps, ending with the device idle."""
        t0 = time.perf_counter()
        for chunk in batches:
            chunk = chunk.to(device)
            loss = step_loss(chunk[:, :-1], chunk[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            optimizer_step()
        loss.item()  # waits for the device
        return (time.perf_counter() - t0) / steps

    return run


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10, help="steps per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dims", type=int, nargs="+", default=[128, 256])
    args = parser.parse_args(argv)
    rows = []
    tokens = BATCH * CONTEXT
    for d in args.dims:
        neuron, cpu = make_loop("neuron", d, args.steps), make_loop("cpu", d, args.steps)
        torch.neuron.reset_peak_memory_stats()
        dev_s, cpu_s = interleaved(neuron, cpu, rounds=args.rounds)
        rows.append(report("train_step", f"gpt_d{d}", "tokens_per_s", tokens / dev_s, "cpu_eager", tokens / cpu_s,
                           higher_is_better=True, layers=LAYERS, seq=CONTEXT, batch=BATCH))
        peak_reserved = torch.neuron.max_memory_reserved()
        peak_allocated = torch.neuron.max_memory_allocated()
        ratio = peak_reserved / peak_allocated
        print(f'{{"bench": "train_step", "case": "gpt_d{d}", "metric": "peak_reserved_over_peak_allocated", '
              f'"value": {ratio:.3f}, "target": 1.25, "peak_reserved": {peak_reserved}, '
              f'"peak_allocated": {peak_allocated}}}', flush=True)
    return rows


if __name__ == "__main__":
    main()
