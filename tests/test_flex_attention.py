"""FlexAttention on neuron tensors, eager and compiled, forward and backward, against CPU.

The reference is attention written out in CPU tensor math (FlexAttention has
no CPU backward), with the score and mask functions applied to index grids.
"""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torchneuron

B, H, S, D = 2, 2, 64, 16
WINDOW = 16


def causal(b, h, q, kv):
    return q >= kv


def sliding_window(b, h, q, kv):
    return (q >= kv) & (q - kv <= WINDOW)


def relative_bias(score, b, h, q, kv):
    return score + (q - kv).to(score.dtype) * 0.05


def head_scale(score, b, h, q, kv):
    return score * (h + 1).to(score.dtype) * 0.5


def reference_attention(q, k, v, score_mod=None, block_mask=None, enable_gqa=False, mask_mod=None):
    """softmax(score_mod(q k^T / sqrt(d)) masked by mask_mod) v, on CPU."""
    if enable_gqa:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    b, h, s, d = q.shape
    grid = (torch.arange(b).view(b, 1, 1, 1), torch.arange(h).view(1, h, 1, 1),
            torch.arange(s).view(1, 1, s, 1), torch.arange(k.shape[2]).view(1, 1, 1, -1))
    scores = q @ k.transpose(-2, -1) * d**-0.5
    if score_mod is not None:
        scores = score_mod(scores, *grid)
    if mask_mod is not None:
        scores = scores.masked_fill(~mask_mod(*grid), float("-inf"))
    return scores.softmax(-1) @ v


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, S, D, generator=g) for _ in range(3)]


def _run(fn, device, tensors, score_mod, mask_mod, grad_out):
    q, k, v = (t.detach().to(device).requires_grad_() for t in tensors)
    if fn is reference_attention:
        out = fn(q, k, v, score_mod=score_mod, mask_mod=mask_mod)
    else:
        mask = create_block_mask(mask_mod, B, H, S, S, device=device) if mask_mod else None
        out = fn(q, k, v, score_mod=score_mod, block_mask=mask)
    out.backward(grad_out.to(device))
    return [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)]


CASES = {
    "score_mod": (relative_bias, None),
    "causal": (None, causal),
    "sliding_window": (None, sliding_window),
    "head_scale+causal": (head_scale, causal),
}


@pytest.fixture(autouse=True)
def _no_eager_fallback():
    torchneuron.reset_dynamo_metrics()
    yield
    assert torchneuron.get_dynamo_metrics()["fallback_reasons"] == [], "a graph ran eagerly"


@pytest.fixture(scope="module")
def compiled_flex():
    return torch.compile(flex_attention, backend="neuron")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_flex_attention_matches_cpu(case, mode, compiled_flex):
    score_mod, mask_mod = CASES[case]
    tensors = _inputs()
    grad_out = torch.randn(B, H, S, D)
    expected = _run(reference_attention, "cpu", tensors, score_mod, mask_mod, grad_out)
    fn = flex_attention if mode == "eager" else compiled_flex
    got = _run(fn, "neuron", tensors, score_mod, mask_mod, grad_out)
    for name, g, e in zip(("out", "dq", "dk", "dv"), got, expected):
        torch.testing.assert_close(g, e, atol=2e-4, rtol=2e-4, msg=lambda m: f"{case} {mode} {name}: {m}")


def test_compiled_flex_attention_with_a_learned_bias_and_gqa():
    bias_cpu = torch.randn(S, requires_grad=True)
    kv_heads = 1

    def run(device, fn):
        g = torch.Generator().manual_seed(3)
        q = torch.randn(B, H, S, D, generator=g).to(device).requires_grad_()
        k = torch.randn(B, kv_heads, S, D, generator=g).to(device).requires_grad_()
        v = torch.randn(B, kv_heads, S, D, generator=g).to(device).requires_grad_()
        bias = bias_cpu.detach().to(device).requires_grad_()

        def learned(score, b, h, qi, kv):
            return score + bias[kv]

        if fn is reference_attention:
            out = fn(q, k, v, score_mod=learned, mask_mod=causal, enable_gqa=True)
        else:
            mask = create_block_mask(causal, B, H, S, S, device=device)
            out = fn(q, k, v, score_mod=learned, block_mask=mask, enable_gqa=True)
        out.sum().backward()
        return [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad, bias.grad)]

    expected = run("cpu", reference_attention)
    got = run("neuron", torch.compile(flex_attention, backend="neuron"))
    for name, g, e in zip(("out", "dq", "dk", "dv", "dbias"), got, expected):
        torch.testing.assert_close(g, e, atol=1e-3, rtol=1e-3, msg=lambda m: f"{name}: {m}")


def test_flex_attention_under_neuron_autocast():
    q, k, v = (t.to("neuron").requires_grad_() for t in _inputs(5))
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = flex_attention(q, k, v)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    ref = reference_attention(*(t.detach().cpu().bfloat16().float() for t in (q, k, v)))
    torch.testing.assert_close(out.cpu().float(), ref, atol=3e-2, rtol=3e-2)
    assert q.grad.dtype == torch.float32


def test_other_devices_are_still_checked():
    q = torch.randn(1, 1, 8, 8, device="neuron")
    with pytest.raises(ValueError, match="same device"):
        flex_attention(q, q.cpu(), q.cpu())
