"""Low precision on neuron: what float8 training and int8 inference cost and
what they do to the loss, against bf16 in the same run (issue 26).

    python benchmarks/low_precision.py [--steps 300] [--rounds 5]

Cases (one JSON line each, `ratio` > 1 means the low-precision candidate is better):
- train_quality: the demo GPT trained --steps steps with TorchAO float8
  (tensorwise) vs bf16 autocast, same seed and batches; metric final_loss
  (lower is better); `curve` holds the losses every 10 steps of both.
- gpt_demo_train_float8_{tensorwise,rowwise}: ms_per_step, and peak_mib, the
  peak device memory of a step with only that model alive (weights,
  gradients, AdamW state, activations), vs bf16.
- gpt_demo_infer_int8_weight_only: ms_per_forward, peak_mib (weights and
  activations of a forward) and weights_mib of the demo GPT cast to bf16 and
  quantized with TorchAO int8 weight-only, vs the bf16 model.

bf16 means autocast (float32 master weights, matmuls in bf16), the usual way to
train in bf16 and the baseline TorchAO's float8 recipes are measured against.
The float8 models run under the same autocast; their nn.Linear layers are
Float8Linear.

On this device each op runs its CPU kernel, so float8 is not faster for the
reason it is on hardware (twice the tensor-engine rate): a float8 matmul here
is CPU's reference _scaled_mm (upcast, float32 GEMM, scale), plus the amax and
casting ops around it. What it costs on the host is what these figures show.
Requires torchao (pip install -c <(echo torch==2.13.0) 'torchao==0.18.*').
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from _common import interleaved_all, report  # noqa: E402

from torchneuron.demo import BATCH, CONTEXT, GPT, LR, corpus_path  # noqa: E402

DEV = "neuron"
BENCH = "low_precision"
MIB = 2**20


def load_corpus():
    text = corpus_path().read_text(encoding="ascii")
    itos = sorted(set(text))
    stoi = {c: i for i, c in enumerate(itos)}
    return torch.tensor([stoi[c] for c in text]), len(itos)


def float8_linears(mod, fqn):
    return isinstance(mod, nn.Linear) and mod.in_features % 16 == 0 and mod.out_features % 16 == 0


def make_trainer(recipe, data, vocab, seed=0):
    """A model, its optimizer and a step function; recipe None is bf16 autocast."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    torch.manual_seed(seed)
    model = GPT(vocab)
    if recipe is not None:
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                                   module_filter_fn=float8_linears)
    model = model.to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    batches = torch.Generator().manual_seed(seed)
    offsets = torch.arange(CONTEXT + 1)

    def step():
        starts = torch.randint(len(data) - CONTEXT - 1, (BATCH, 1), generator=batches)
        chunk = data[starts + offsets].to(DEV)
        with torch.autocast(DEV, dtype=torch.bfloat16):
            logits = model(chunk[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), chunk[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return model, step


def train_quality(data, vocab, steps):
    curves = {}
    for name, recipe in (("bf16", None), ("float8_tensorwise", "tensorwise")):
        _, step = make_trainer(recipe, data, vocab)
        losses = []
        for i in range(steps):
            loss = step()
            if i % 10 == 0 or i == steps - 1:
                losses.append(round(loss.item(), 4))
        curves[name] = losses
    fp8, bf16 = curves["float8_tensorwise"][-1], curves["bf16"][-1]
    report(BENCH, f"gpt_demo_{steps}_steps_float8_tensorwise", "final_loss", fp8, "bf16_autocast", bf16,
           higher_is_better=False, abs_diff=round(abs(fp8 - bf16), 4), curve_every_10_steps=curves)


def _sync():
    torch.neuron.synchronize()


def _timed_ms(fn):
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    return (time.perf_counter() - t0) * 1000


def _isolated_peak_mib(build, run):
    """Peak device memory of run() with only what build() made alive: its
    weights, gradients, optimizer state and activations (MiB)."""
    import gc
    gc.collect()
    _sync()
    torch.neuron.empty_cache()
    before = torch.neuron.memory_allocated()
    state = build()
    run(state)  # warm: optimizer state and caches exist from here on
    _sync()
    torch.neuron.reset_peak_memory_stats()
    run(state)
    _sync()
    peak = (torch.neuron.max_memory_allocated() - before) / MIB
    del state
    gc.collect()
    return peak


def train_cost(data, vocab, rounds):
    recipes = {"bf16": None, "tensorwise": "tensorwise", "rowwise": "rowwise"}
    peak = {name: _isolated_peak_mib(lambda r=r: make_trainer(r, data, vocab)[1], lambda step: step())
            for name, r in recipes.items()}
    trainers = {name: make_trainer(r, data, vocab)[1] for name, r in recipes.items()}
    ms = interleaved_all({name: (lambda s=s: _timed_ms(s)) for name, s in trainers.items()}, rounds, warmup=2)
    for name in ("tensorwise", "rowwise"):
        report(BENCH, f"gpt_demo_train_float8_{name}", "ms_per_step", ms[name], "bf16_autocast", ms["bf16"],
               higher_is_better=False)
        report(BENCH, f"gpt_demo_train_float8_{name}", "peak_mib", peak[name], "bf16_autocast", peak["bf16"],
               higher_is_better=False)


def infer_cost(data, vocab, rounds):
    from torchao.quantization import Int8WeightOnlyConfig, quantize_
    def build(name):
        torch.manual_seed(0)
        model = GPT(vocab).bfloat16().eval()
        if name != "bf16":
            quantize_(model, Int8WeightOnlyConfig())
        return model.to(DEV)

    g = torch.Generator().manual_seed(0)
    starts = torch.randint(len(data) - CONTEXT - 1, (BATCH, 1), generator=g)
    x = data[starts + torch.arange(CONTEXT)].to(DEV)

    def forward(model):
        with torch.no_grad():
            model(x)

    names = ("bf16", "int8_weight_only")
    weights = {n: _isolated_peak_mib(lambda n=n: build(n), lambda m: None) for n in names}
    peak = {n: _isolated_peak_mib(lambda n=n: build(n), forward) for n in names}
    models = {n: build(n) for n in names}
    ms = interleaved_all({n: (lambda m=m: _timed_ms(lambda: forward(m))) for n, m in models.items()}, rounds,
                         warmup=2)
    with torch.no_grad():
        ref = models["bf16"](x).float()
        out = models["int8_weight_only"](x).float()
    err = ((out - ref).abs().max() / ref.abs().max()).item()
    case = "gpt_demo_infer_int8_weight_only"
    report(BENCH, case, "ms_per_forward", ms["int8_weight_only"], "bf16", ms["bf16"], higher_is_better=False,
           max_rel_logit_err=round(err, 4))
    report(BENCH, case, "peak_mib", peak["int8_weight_only"], "bf16", peak["bf16"], higher_is_better=False)
    report(BENCH, case, "weights_mib", weights["int8_weight_only"], "bf16", weights["bf16"],
           higher_is_better=False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps of the quality case")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per case (median reported)")
    parser.add_argument("--skip-quality", action="store_true", help="only the cost cases")
    args = parser.parse_args(argv)
    try:
        import torchao  # noqa: F401
    except ImportError:
        sys.exit("torchao is not installed: pip install -c <(echo torch==2.13.0) 'torchao==0.18.*'")
    data, vocab = load_corpus()
    if not args.skip_quality:
        train_quality(data, vocab, args.steps)
    train_cost(data, vocab, args.rounds)
    infer_cost(data, vocab, args.rounds)


if __name__ == "__main__":
    main()
