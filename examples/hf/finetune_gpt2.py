"""Train a tiny GPT-2 with Hugging Face Trainer on neuron, then generate.

    python examples/hf/finetune_gpt2.py [--steps 600] [--out hf-gpt2]

Everything is local: the text ships in examples/data/corpus.txt, the BPE
tokenizer is trained on it here with `tokenizers`, and the model is built from
a config (random weights). Nothing in this script names the device: Trainer
finds `neuron` by itself (see examples/hf/README.md), and `--cpu` (`use_cpu=True`)
runs the same script on the CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, Trainer, TrainingArguments

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus.txt"


def train_tokenizer(text: str, vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer learnt from the corpus (a few seconds)."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        [text], trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


class Blocks(torch.utils.data.Dataset):
    """Consecutive windows of `length` tokens; labels are the inputs (the model shifts them)."""

    def __init__(self, ids: torch.Tensor, length: int):
        self.ids, self.length = ids, length

    def __len__(self):
        return (len(self.ids) - 1) // self.length

    def __getitem__(self, i):
        block = self.ids[i * self.length:(i + 1) * self.length]
        return {"input_ids": block, "labels": block}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--out", default="hf-gpt2", help="Trainer's output directory")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU instead")
    args = parser.parse_args(argv)

    text = CORPUS.read_text(encoding="ascii")
    tokenizer = train_tokenizer(text, vocab_size=1024)
    ids = torch.tensor(tokenizer(text)["input_ids"])
    split = int(len(ids) * 0.95)
    train, held_out = Blocks(ids[:split], 64), Blocks(ids[split:], 64)

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=128, n_layer=4, n_head=4,
                                       bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id))
    training = TrainingArguments(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=16,
                                 per_device_eval_batch_size=16, learning_rate=2e-3, warmup_steps=args.steps // 10,
                                 lr_scheduler_type="cosine", weight_decay=0.01, logging_steps=max(1, args.steps // 10),
                                 save_strategy="no", report_to=[], seed=0, use_cpu=args.cpu)
    trainer = Trainer(model=model, args=training, train_dataset=train, eval_dataset=held_out)
    print(f"training on {training.device}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
          f"{len(train)} blocks of 64 tokens, vocabulary {len(tokenizer)}")
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    held_out_loss = trainer.evaluate()["eval_loss"]

    model.eval()
    prompt = tokenizer("Return a new", return_tensors="pt").to(training.device)
    # A tiny model's greedy text loops; the repetition penalty keeps the sample readable.
    tokens = model.generate(**prompt, max_new_tokens=40, do_sample=False, repetition_penalty=1.3,
                            pad_token_id=tokenizer.eos_token_id)
    sample = tokenizer.decode(tokens[0])
    print(f"\n--- greedy sample ---\n{sample}\n---")
    summary = {"device": str(training.device), "steps": args.steps, "first_loss": losses[0], "last_loss": losses[-1],
               "held_out_loss": held_out_loss, "held_out_perplexity": math.exp(held_out_loss),
               "tokens_per_second": args.steps * 16 * 64 / seconds, "sample": sample}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
