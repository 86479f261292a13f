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


# --- Captured tensors (score_mod / mask_mod closing over device tensors) ------
#
# The score function may read tensors it closes over: constants (ALiBi slopes),
# learned parameters (a bias table, a temperature, a per-head gate) whose
# gradients FlexAttention returns, integer tables (document ids) in the mask.
# Reference: the same math written out on CPU in float64, with autograd.

CB, CH, CS, CD = 2, 2, 32, 8


def _captured_case(seed):
    """q, k, v and the captured tensors, on CPU in float64."""
    g = torch.Generator().manual_seed(seed)
    qkv = [torch.randn(CB, CH, CS, CD, generator=g, dtype=torch.float64) for _ in range(3)]
    captured = {
        "slopes": torch.tensor([0.5, 0.125], dtype=torch.float64),  # ALiBi: a constant
        "table": 0.3 * torch.randn(CS, CS, generator=g, dtype=torch.float64),
        "temperature": torch.tensor(0.8, dtype=torch.float64),
        "gate": torch.tensor([1.0, -1.0], dtype=torch.float64),
        "doc": torch.arange(CS) // 12,  # three documents
    }
    return qkv, captured


LEARNED = ("table", "temperature", "gate")


def _score(t):
    def score_mod(score, b, h, q, kv):
        # Constant slopes (the report: they failed the compiled backward), a
        # learned table read by index, a learned tensor used whole, a Python
        # scalar, and a learned tensor only compared (its gradient is zero).
        biased = (score + t["table"][q, kv] - t["slopes"][h] * (q - kv)) * t["temperature"]
        return torch.where(t["gate"][h] > 0, biased, biased * 0.5)
    return score_mod


def _document_causal(t):
    def mask_mod(b, h, q, kv):
        return (q >= kv) & (t["doc"][q] == t["doc"][kv])
    return mask_mod


def _on(device, captured, grad_names=()):
    dtype = torch.float64 if device == "cpu" else torch.float32
    return {name: x.detach().to(device, dtype if x.is_floating_point() else x.dtype).requires_grad_(name in grad_names)
            for name, x in captured.items()}


def _run_captured(fn, device, qkv, t, make_mask, grad_out):
    dtype = torch.float64 if device == "cpu" else torch.float32
    q, k, v = (x.detach().to(device, dtype).requires_grad_() for x in qkv)
    mask_mod = make_mask(t) if make_mask else None
    if fn is reference_attention:
        out = reference_attention(q, k, v, score_mod=_score(t), mask_mod=mask_mod)
    else:
        mask = create_block_mask(mask_mod, CB, CH, CS, CS, device=device) if mask_mod else None
        out = fn(q, k, v, score_mod=_score(t), block_mask=mask)
    out.backward(grad_out.to(device, dtype))
    # The tensor the score function only compares gets zeros here, None on CPU.
    grads = [t[n].grad if t[n].grad is not None else torch.zeros_like(t[n]) for n in LEARNED]
    return [x.detach().double().cpu() for x in (out, q.grad, k.grad, v.grad, *grads)]


def _assert_matches_cpu(fn, qkv, t, make_mask, grad_out, what):
    expected = _run_captured(reference_attention, "cpu", qkv, _on("cpu", t, LEARNED), make_mask, grad_out)
    got = _run_captured(fn, "neuron", qkv, t, make_mask, grad_out)
    for name, g, e in zip(("out", "dq", "dk", "dv", *(f"d{n}" for n in LEARNED)), got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=2e-4, rtol=2e-4, msg=lambda m: f"{what} {name}: {m}")


@pytest.mark.parametrize(("mode", "mask"), [("eager", None), ("eager", "document"), ("compiled", "document")])
def test_flex_attention_with_captured_tensors_matches_cpu(mode, mask):
    qkv, captured = _captured_case(7)
    grad_out = torch.randn(CB, CH, CS, CD, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    fn = flex_attention if mode == "eager" else torch.compile(flex_attention, backend="neuron")
    make_mask = _document_causal if mask else None
    _assert_matches_cpu(fn, qkv, _on("neuron", captured, LEARNED), make_mask, grad_out, f"{mode} {mask}")


def test_compiled_flex_attention_reads_captured_tensors_at_each_call():
    # Captured tensors are graph inputs: an in-place update must be seen, as on CUDA.
    # (The graph of the compiled case above: no compile of its own.)
    qkv, captured = _captured_case(7)
    grad_out = torch.randn(CB, CH, CS, CD, dtype=torch.float64)
    t = _on("neuron", captured, LEARNED)
    compiled = torch.compile(flex_attention, backend="neuron")
    for step in range(2):
        _assert_matches_cpu(compiled, qkv, t, _document_causal, grad_out, f"call {step}")
        t["slopes"].mul_(4)
        with torch.no_grad():
            t["table"].mul_(-1)
        for n in LEARNED:
            t[n].grad = None


def test_compiled_flex_attention_backward_at_a_second_sequence_length():
    # The second length makes the graph dynamic: sizes reach the pass as SymInts.
    # (The first length is that of the compiled causal case above, whose graph it can reuse.)
    compiled = torch.compile(flex_attention, backend="neuron")
    for s in (S, S // 2):
        g = torch.Generator().manual_seed(s)
        tensors = [torch.randn(B, H, s, D, generator=g) for _ in range(3)]
        grad_out = torch.randn(B, H, s, D, generator=g)
        q, k, v = (x.to("neuron").requires_grad_() for x in tensors)
        mask = create_block_mask(causal, B, H, s, s, device="neuron")
        compiled(q, k, v, block_mask=mask).backward(grad_out.to("neuron"))
        cq, ck, cv = (x.requires_grad_() for x in tensors)
        reference_attention(cq, ck, cv, mask_mod=causal).backward(grad_out)
        for got, expected in zip((q.grad, k.grad, v.grad), (cq.grad, ck.grad, cv.grad)):
            torch.testing.assert_close(got.cpu(), expected, atol=2e-4, rtol=2e-4)


def test_a_captured_tensor_both_indexed_and_used_whole_is_refused():
    # Its gradient would mix a sum over scores with per-score terms: refused, not summed wrong.
    w = torch.tensor([0.5, 0.25], device="neuron", requires_grad=True)
    q, k, v = (x.to("neuron").requires_grad_() for x in _inputs(11))
    out = flex_attention(q, k, v, score_mod=lambda score, b, h, qi, kv: score * w.sum() + w[h])
    with pytest.raises(NotImplementedError, match="both indexed and used whole"):
        out.sum().backward()
