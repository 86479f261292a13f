"""NKI example kernels on neuron vs the equivalent PyTorch eager op on CPU, in one run.

Each case times one kernel call including a final synchronisation (median of interleaved
rounds, after warm-up; the first call of a signature, which checks the kernel and chooses its
batching, is excluded). Target (issue 5): matmul and attention >= 0.8x the CPU op.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import interleaved, report, timed  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "nki"


def example(name):
    spec = importlib.util.spec_from_file_location(f"nki_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cases(quick: bool):
    add, mm, softmax, rmsnorm, attention = (example(n) for n in ("tensor_add", "matmul", "softmax", "rmsnorm",
                                                                  "attention"))
    n = 1024 if quick else 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    w = torch.randn(n)
    out = [
        (f"tensor_add_{n}", lambda x, y: add.tensor_add(x, y), lambda x, y: x + y, (a, b)),
        (f"softmax_{n}x{n}", lambda x: softmax.softmax_fused_kernel(x), lambda x: torch.softmax(x, dim=1), (a,)),
        (f"rmsnorm_{n}x{n}", lambda x, g: rmsnorm.rmsnorm_kernel(x, g),
         lambda x, g: torch.nn.functional.rms_norm(x, (n,), g, eps=1e-6), (a, w)),
    ]
    for size in ((1024,) if quick else (1024, 2048)):
        x, y = torch.randn(size, size), torch.randn(size, size)
        out.append((f"matmul_{size}", lambda lhsT, rhs: mm.matmul_kernel(lhsT, rhs),
                    lambda lhsT, rhs: lhsT.t() @ rhs, (x.t().contiguous(), y)))
    heads, d = 8, 64
    for seq in ((1024,) if quick else (1024, 2048)):
        q, k, v = (torch.randn(heads, seq, d) for _ in range(3))
        out.append((f"attention_h{heads}_s{seq}_d{d}", lambda q, k, v: attention.causal_attention_kernel[heads](q, k, v),
                    lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
                        q[None], k[None], v[None], is_causal=True)[0], (q, k, v)))
    return out


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="smaller sizes only")
    args = parser.parse_args(argv)
    sync = torch.neuron.synchronize
    rows = []
    for case, kernel, op, host_args in cases(args.quick):
        dev_args = [t.to("neuron") for t in host_args]
        expected = op(*host_args)
        got = kernel(*dev_args).cpu()  # the first call checks the kernel and chooses its batching
        torch.testing.assert_close(got, expected, rtol=2e-3, atol=2e-3)
        neuron, cpu = interleaved(lambda: timed(lambda: kernel(*dev_args), sync),
                                  lambda: timed(lambda: op(*host_args), lambda: None),
                                  rounds=args.rounds, warmup=1)
        rows.append(report("nki", case, "ms_per_call", neuron * 1e3, "cpu_eager_op", cpu * 1e3,
                           higher_is_better=False))
    return rows


if __name__ == "__main__":
    main()
