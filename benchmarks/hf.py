"""A tiny Hugging Face Llama: training and greedy generation, tokens/s.

Neuron eager, neuron compiled and CPU eager, measured in one run, interleaved.
Training: AdamW steps on batches of 8 × 64 tokens (compiled: the model under
`torch.compile(backend="neuron")`). Generation: greedy decoding of 32 tokens
after a 16-token prompt, batch 1 (compiled: a static KV cache, which makes
`generate()` compile the decoding step by itself on neuron, as on CUDA).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved_all, report  # noqa: E402

import torchneuron  # noqa: E402

VOCAB, SEQ, BATCH = 1024, 64, 8
PROMPT, NEW_TOKENS = 16, 32


def build(device: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(config).to(device)


def training(device: str, steps: int, compiled: bool):
    model = build(device).train()
    forward = torch.compile(model, backend="neuron") if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(3, VOCAB, (BATCH, SEQ), generator=gen) for _ in range(steps)]

    def run() -> float:
        t0 = time.perf_counter()
        for ids in batches:
            ids = ids.to(device)
            loss = forward(input_ids=ids, labels=ids).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        loss.item()
        return steps * BATCH * SEQ / (time.perf_counter() - t0)

    return run


def generation(device: str, compiled: bool):
    model = build(device).eval()
    prompt = torch.randint(3, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(1)).to(device)
    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    kwargs.update(cache_implementation="static") if compiled else kwargs.update(disable_compile=True)

    def run() -> float:
        t0 = time.perf_counter()
        tokens = model.generate(prompt, **kwargs)
        tokens.cpu()
        return NEW_TOKENS / (time.perf_counter() - t0)

    return run


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5, help="training steps per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    rows = []

    t0 = time.perf_counter()
    train = {"neuron_eager": training("neuron", args.steps, compiled=False),
             "neuron_compiled": training("neuron", args.steps, compiled=True),
             "cpu_eager": training("cpu", args.steps, compiled=False)}
    train["neuron_compiled"]()                       # compiles forward and backward
    compile_seconds = time.perf_counter() - t0
    tps = interleaved_all(train, rounds=args.rounds)
    for case in ("neuron_eager", "neuron_compiled"):
        rows.append(report("hf", f"llama_train_{case}", "tokens_per_s", tps[case], "cpu_eager", tps["cpu_eager"],
                           higher_is_better=True))
    rows.append(report("hf", "llama_train_compiled_vs_eager", "tokens_per_s", tps["neuron_compiled"], "neuron_eager",
                       tps["neuron_eager"], higher_is_better=True, compile_seconds=round(compile_seconds, 1)))

    torchneuron.reset_dynamo_metrics()
    t0 = time.perf_counter()
    generate = {"neuron_eager": generation("neuron", compiled=False),
                "neuron_compiled": generation("neuron", compiled=True),
                "cpu_eager": generation("cpu", compiled=False)}
    generate["neuron_compiled"]()
    compile_seconds = time.perf_counter() - t0
    tps = interleaved_all(generate, rounds=args.rounds, warmup=1)
    for case in ("neuron_eager", "neuron_compiled"):
        rows.append(report("hf", f"llama_generate_{case}", "tokens_per_s", tps[case], "cpu_eager", tps["cpu_eager"],
                           higher_is_better=True))
    rows.append(report("hf", "llama_generate_compiled_vs_eager", "tokens_per_s", tps["neuron_compiled"],
                       "neuron_eager", tps["neuron_eager"], higher_is_better=True,
                       compile_seconds=round(compile_seconds, 1),
                       recompiles=[r["reason"].strip().splitlines()[-1].strip()
                                   for r in torchneuron.get_dynamo_metrics()["recompile_reasons"]]))
    return rows


if __name__ == "__main__":
    main()
