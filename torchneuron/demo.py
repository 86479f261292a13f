"""Train a small character-level GPT on the bundled corpus, then sample from it.

    python -m torchneuron.demo [--device neuron] [--steps N]
                               [--compare-cpu | --no-compare-cpu] [--seed S]

The model code is plain device-agnostic PyTorch; by default the same training is
repeated on CPU so the final losses can be compared.
"""
import argparse
import math
import os
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm import tqdm

CONTEXT = 64
BATCH = 16
D_MODEL = 128
N_LAYER = 4
N_HEAD = 4
LR = 3e-3
DEFAULT_STEPS = 400
LOG_EVERY = 10
PROMPT = "Return the "
SAMPLE_CHARS = 200
TEMPERATURE = 0.8


def corpus_path():
    """$TORCHNEURON_DEMO_CORPUS if set, else examples/data/corpus.txt of the repo checkout."""
    override = os.environ.get("TORCHNEURON_DEMO_CORPUS")
    if override:
        return Path(override)
    return Path(__file__).resolve().parent.parent / "examples" / "data" / "corpus.txt"


class Block(nn.Module):
    """Pre-LN transformer block: causal multi-head self-attention, then a GELU MLP."""

    def __init__(self, d_model, n_head, context):
        super().__init__()
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )
        # A buffer, so .to(device) moves the mask along with the weights.
        self.register_buffer("causal", torch.tril(torch.ones(context, context, dtype=torch.bool)))

    def attention(self, x):
        b, t, d = x.shape
        # (b, t, 3*d) -> three tensors of shape (b, heads, t, head_dim)
        q, k, v = self.qkv(x).view(b, t, 3, self.n_head, d // self.n_head).permute(2, 0, 3, 1, 4)
        # Plain matmul/softmax rather than F.scaled_dot_product_attention so the
        # demo only relies on basic ops a new backend is likely to implement.
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.n_head)
        scores = scores.masked_fill(~self.causal[:t, :t], float("-inf"))
        out = scores.softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, t, d))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A small GPT; the defaults are the demo's, benchmarks pick other sizes."""

    def __init__(self, vocab_size, d_model=D_MODEL, n_layer=N_LAYER, n_head=N_HEAD, context=CONTEXT):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.Sequential(*(Block(d_model, n_head, context) for _ in range(n_layer)))
        self.ln_f = nn.LayerNorm(d_model)
        # Untied head: weight tying relies on .to() swapping tensor data in place,
        # which PyTorch skips for some out-of-tree tensor types (silently untying).
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.blocks(self.tok(idx) + self.pos(pos))
        return self.head(self.ln_f(x))


def train(data, vocab_size, device, steps, seed):
    """Train from seed-determined weights and batches; returns (model, losses, tokens/s)."""
    torch.manual_seed(seed)
    # Built on CPU and then moved, so every device starts from identical weights.
    model = GPT(vocab_size).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    # Batches come from a CPU generator so they do not depend on the device RNG.
    batch_gen = torch.Generator().manual_seed(seed)
    offsets = torch.arange(CONTEXT + 1)
    losses = []
    bar = tqdm(range(steps), desc=f"train[{device}]")
    start = time.perf_counter()
    for step in bar:
        starts = torch.randint(len(data) - CONTEXT - 1, (BATCH, 1), generator=batch_gen)
        chunk = data[starts + offsets].to(device)
        x, y = chunk[:, :-1], chunk[:, 1:]
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        # .item() waits for the device, so only fetch the loss every few steps.
        if step % LOG_EVERY == 0 or step == steps - 1:
            losses.append(loss.item())
            rate = (step + 1) * BATCH * CONTEXT / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{rate:.0f}")
    bar.close()
    return model, losses, rate


@torch.no_grad()
def generate(model, prompt, stoi, itos, seed):
    model.eval()
    device = next(model.parameters()).device
    idx = torch.tensor([[stoi[c] for c in prompt]], device=device)
    # Sampled on the device from a seeded device generator: the loop never
    # waits for the device, and the text is read once, at the end. (Reading
    # the logits with .cpu() each character was the top wait the profiler
    # found; see docs/profiler.md.)
    gen = torch.Generator(device=device).manual_seed(seed)
    for _ in range(SAMPLE_CHARS):
        logits = model(idx[:, -CONTEXT:])[0, -1]
        nxt = torch.multinomial((logits / TEMPERATURE).softmax(-1), 1, generator=gen)
        idx = torch.cat([idx, nxt.view(1, 1)], dim=1)
    return "".join(itos[i] for i in idx[0].tolist())


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m torchneuron.demo",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="neuron", help="device to train on (default: neuron)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                        help=f"training steps (default: {DEFAULT_STEPS})")
    parser.add_argument("--compare-cpu", action=argparse.BooleanOptionalAction, default=True,
                        help="repeat the training on CPU and compare final losses")
    parser.add_argument("--seed", type=int, default=0, help="seeds weights, batches and sampling")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    device = torch.device(args.device)

    text = corpus_path().read_text(encoding="ascii")
    itos = sorted(set(text))
    stoi = {c: i for i, c in enumerate(itos)}
    data = torch.tensor([stoi[c] for c in text])
    print(f"corpus: {len(text)} chars, vocab {len(itos)}")

    model, losses, rate = train(data, len(itos), device, args.steps, args.seed)
    print(f"loss: {losses[0]:.4f} -> {losses[-1]:.4f}")
    sample = generate(model, PROMPT, stoi, itos, args.seed)
    print(f"--- sample ---\n{sample}\n--------------")

    metrics = {"device": str(device), "steps": args.steps, "initial_loss": losses[0],
               "final_loss": losses[-1], "tokens_per_s": rate, "sample": sample}
    summary = f"summary: device={device} final_loss={losses[-1]:.4f}"
    if args.compare_cpu:
        _, cpu_losses, cpu_rate = train(data, len(itos), torch.device("cpu"), args.steps, args.seed)
        abs_diff = abs(losses[-1] - cpu_losses[-1])
        metrics.update(cpu_final_loss=cpu_losses[-1], cpu_tokens_per_s=cpu_rate, abs_diff=abs_diff)
        summary += f" cpu_final_loss={cpu_losses[-1]:.4f} abs_diff={abs_diff:.4f}"
        summary += f" tokens/s={rate:.0f} (cpu {cpu_rate:.0f})"
    else:
        summary += f" tokens/s={rate:.0f}"
    print(summary)
    return metrics


if __name__ == "__main__":
    main()
