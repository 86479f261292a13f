"""Precision: autocast results within the tolerances PyTorch's CUDA autocast
tests use, and torch.use_deterministic_algorithms(True) respected.

Autocast is checked as PyTorch checks it on CUDA: an op under autocast must
equal the same op run by hand on inputs cast to the autocast dtype (here, on
CPU), at the torch.testing tolerance of the output dtype.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

DEV = "neuron"
LOW = (torch.bfloat16, torch.float16)


def _inputs(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) for s in shapes]


# (name, function, input shapes): CUDA runs these in the autocast dtype.
LOWER_PRECISION_CASES = [
    ("mm", torch.mm, [(8, 16), (16, 4)]),
    ("matmul", torch.matmul, [(2, 8, 16), (16, 4)]),
    ("bmm", torch.bmm, [(3, 8, 16), (3, 16, 4)]),
    ("addmm", torch.addmm, [(4,), (8, 16), (16, 4)]),
    ("baddbmm", torch.baddbmm, [(3, 8, 4), (3, 8, 16), (3, 16, 4)]),
    ("linear", F.linear, [(8, 16), (4, 16), (4,)]),
    ("conv2d", F.conv2d, [(2, 3, 9, 9), (5, 3, 3, 3), (5,)]),
    ("conv1d", F.conv1d, [(2, 3, 17), (5, 3, 4)]),
    ("sdpa", F.scaled_dot_product_attention, [(2, 4, 8, 16), (2, 4, 8, 16), (2, 4, 8, 16)]),
]

# CUDA runs these in float32 whatever the input dtype.
FP32_CASES = [
    ("softmax", lambda x: torch.softmax(x, -1), [(8, 33)]),
    ("log_softmax", lambda x: torch.log_softmax(x, -1), [(8, 33)]),
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (33,), w, b), [(8, 33), (33,), (33,)]),
    ("exp", torch.exp, [(64,)]),
    ("sum", torch.sum, [(1000,)]),
    ("mse_loss", F.mse_loss, [(8, 5), (8, 5)]),
    ("cosine_similarity", F.cosine_similarity, [(8, 16), (8, 16)]),
]


@pytest.mark.parametrize("low", LOW, ids=str)
@pytest.mark.parametrize("name,fn,shapes", LOWER_PRECISION_CASES, ids=[c[0] for c in LOWER_PRECISION_CASES])
def test_autocast_lower_precision_ops_match_explicit_casts(name, fn, shapes, low):
    inputs = _inputs(*shapes)
    with torch.autocast(DEV, dtype=low):
        out = fn(*[x.to(DEV) for x in inputs])
    control = fn(*[x.to(low) for x in inputs])  # the same computation, cast by hand, on CPU
    assert out.dtype == low
    torch.testing.assert_close(out.cpu(), control)


@pytest.mark.parametrize("low", LOW, ids=str)
@pytest.mark.parametrize("name,fn,shapes", FP32_CASES, ids=[c[0] for c in FP32_CASES])
def test_autocast_fp32_ops_match_float32_on_cpu(name, fn, shapes, low):
    inputs = [x.to(low) for x in _inputs(*shapes)]
    with torch.autocast(DEV, dtype=low):
        out = fn(*[x.to(DEV) for x in inputs])
    control = fn(*[x.float() for x in inputs])
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), control)


def test_autocast_training_step_close_to_float32():
    """A whole step under bf16 autocast stays within bf16's tolerance of the
    float32 step on CPU (loss and gradients)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                                torch.nn.Linear(64, 10))
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    device_model = copy.deepcopy(model).to(DEV)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    with torch.autocast(DEV, dtype=torch.bfloat16):
        device_loss = F.cross_entropy(device_model(x.to(DEV)), y.to(DEV))
    device_loss.backward()
    assert device_loss.dtype == torch.float32  # cross_entropy is on CUDA's float32 list
    torch.testing.assert_close(device_loss.cpu(), loss.detach(), rtol=1.6e-2, atol=1e-2)
    for p, q in zip(model.parameters(), device_model.parameters()):
        assert q.grad.dtype == torch.float32
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=5e-2, atol=1e-2)


# --------------------------------------------------------------------------- deterministic algorithms

@pytest.fixture
def deterministic():
    before = torch.are_deterministic_algorithms_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(before)
    torch.utils.deterministic.fill_uninitialized_memory = fill


def _accumulating_ops(device):
    """Ops whose CUDA kernels accumulate with atomics (nondeterministic order
    there), on inputs with many collisions."""
    DEV = device  # noqa: N806 - the same code runs on CPU for the reference
    g = torch.Generator().manual_seed(0)
    src = torch.randn(4096, 16, generator=g).to(DEV)
    index = torch.randint(0, 7, (4096,), generator=g).to(DEV)
    out = {}
    out["index_add"] = torch.zeros(7, 16, device=DEV).index_add_(0, index, src)
    out["scatter_add"] = torch.zeros(7, 16, device=DEV).scatter_add_(0, index[:, None].expand(-1, 16), src)
    out["scatter_reduce"] = torch.zeros(7, 16, device=DEV).scatter_reduce_(
        0, index[:, None].expand(-1, 16), src, "mean")
    out["index_put"] = torch.zeros(7, 16, device=DEV).index_put_((index,), src, accumulate=True)
    weight = torch.randn(7, 16, generator=g).to(DEV).requires_grad_()
    F.embedding(index, weight).pow(2).sum().backward()
    out["embedding_backward"] = weight.grad
    out["sum"] = src.sum()
    out["cumsum"] = src.flatten().cumsum(0)
    out["matmul"] = src.T @ src
    return {k: v.detach().cpu() for k, v in out.items()}


def test_deterministic_algorithms_give_bitwise_equal_results(deterministic):
    first, second, reference = _accumulating_ops(DEV), _accumulating_ops(DEV), _accumulating_ops("cpu")
    for name in first:
        assert torch.equal(first[name], second[name]), name
        torch.testing.assert_close(first[name], reference[name], msg=name)


def test_deterministic_mode_fills_uninitialized_memory(deterministic):
    floats = torch.empty(5, device=DEV)
    assert torch.isnan(floats.cpu()).all()
    ints = torch.empty(3, dtype=torch.int32, device=DEV)
    assert (ints.cpu() == torch.iinfo(torch.int32).max).all()
    strided = torch.empty_strided((2, 3), (1, 2), dtype=torch.float16, device=DEV)
    assert torch.isnan(strided.cpu()).all()
    grown = torch.zeros(2, device=DEV)
    grown.resize_(6)
    assert torch.equal(grown.cpu()[:2], torch.zeros(2)) and torch.isnan(grown.cpu()[2:]).all()


def test_deterministic_training_run_repeats_bitwise():
    def run():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.2), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4)).to(DEV)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        data = torch.randn(64, 16, device=DEV)
        target = torch.randint(0, 4, (64,), device=DEV)
        for _ in range(5):
            opt.zero_grad()
            F.cross_entropy(model(data), target).backward()
            opt.step()
        return [p.detach().cpu() for p in model.parameters()]

    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first, second = run(), run()
    finally:
        torch.use_deterministic_algorithms(before)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
