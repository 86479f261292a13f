"""Profile the demo: a few training steps of its GPT, then sampling, on neuron.

    python examples/profiler/profile_demo.py [--steps 10] [--out profile-demo]
    torchneuron explore profile-demo

The walkthrough in docs/profiler.md starts here.
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from torchneuron import demo
from torchneuron.profiler import export_parquet


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="training steps to profile")
    parser.add_argument("--out", default="profile-demo", help="export directory")
    args = parser.parse_args(argv)

    text = demo.corpus_path().read_text(encoding="ascii")
    itos = sorted(set(text))
    stoi = {c: i for i, c in enumerate(itos)}
    data = torch.tensor([stoi[c] for c in text])
    device = torch.device("neuron")
    model, _, _ = demo.train(data, len(itos), device, 2, seed=0)  # warm-up: first calls check their plans
    demo.generate(model, demo.PROMPT, stoi, itos, seed=0)

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        with record_function("train"):
            model, _, _ = demo.train(data, len(itos), device, args.steps, seed=0)
        with record_function("generate"):
            demo.generate(model, demo.PROMPT, stoi, itos, seed=0)
    export_parquet(prof, args.out)
    print(f"exported to {args.out}; next: torchneuron explore {args.out}")


if __name__ == "__main__":
    main()
