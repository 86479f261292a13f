"""The NKI examples (examples/nki) against their torch references: on neuron tensors, and in the
simulator (nki.simulate) on NumPy arrays."""

import importlib.util
import pathlib

import numpy as np
import pytest
import torch

import torchneuron.nki as nki

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "nki"


def _example(name):
    spec = importlib.util.spec_from_file_location(f"nki_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tensor_add = _example("tensor_add")
matmul = _example("matmul")
softmax = _example("softmax")
rmsnorm = _example("rmsnorm")
attention = _example("attention")
flash_attention_prefill = _example("flash_attention_prefill")
attention_decode = _example("attention_decode")
fused_mlp = _example("fused_mlp")
rmsnorm_current = _example("rmsnorm_current")
rope = _example("rope")
moe_tkg = _example("moe_tkg")
cumsum = _example("cumsum")

FP32 = dict(rtol=1e-5, atol=1e-5)


def _check(kernel, reference, inputs, *, numpy=True, scalars=None, **tol):
    """Runs ``kernel`` on neuron copies of ``inputs`` and in the simulator; both must match ``reference``
    (a tensor, or a tuple of tensors for kernels that return several). ``scalars``: keyword
    arguments of all three."""
    scalars = scalars or {}
    expected = reference(*inputs, **scalars)

    out = kernel(*(x.to("neuron") for x in inputs), **scalars)
    torch.neuron.synchronize()
    for got, want in _pairs(out, expected):
        assert got.device.type == "neuron" and got.dtype == want.dtype and got.shape == want.shape
        _close(got.cpu(), want, tol)

    host = [x.numpy() for x in inputs] if numpy else inputs
    sim = nki.simulate(kernel)(*host, **scalars)
    for got, want in _pairs(sim, expected):
        if numpy:
            assert isinstance(got, np.ndarray)
            got = torch.from_numpy(got)
        _close(got, want, tol)


def _pairs(got, expected):
    if isinstance(expected, tuple):
        assert isinstance(got, tuple) and len(got) == len(expected)
        return list(zip(got, expected))
    return [(got, expected)]


def _close(got, want, tol):
    if want.is_floating_point():
        torch.testing.assert_close(got, want, **tol)
    else:  # indices: exact
        assert torch.equal(got, want)


def _grid_add(M, N):
    return tensor_add.tensor_add_kernel[(M + 127) // 128, (N + 511) // 512]


@pytest.mark.parametrize("shape", [(256, 1024), pytest.param((200, 700), id="partial-tiles")])
def test_tensor_add(shape):
    torch.manual_seed(0)
    a, b = torch.randn(shape), torch.randn(shape)
    _check(_grid_add(*shape), tensor_add.reference, [a, b], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["matmul_kernel", "matmul_legacy_kernel"])
def test_matmul(name):
    torch.manual_seed(0)
    K, M, N = 384, 256, 1024
    lhsT, rhs = torch.randn(K, M), torch.randn(K, N)
    _check(getattr(matmul, name), matmul.reference, [lhsT, rhs], rtol=1e-4, atol=1e-4)


def test_matmul_bf16():
    """bf16 operands, fp32 PSUM accumulation, a bf16 result: within bf16 rounding of the fp32 product."""
    torch.manual_seed(0)
    K, M, N = 384, 256, 1024
    lhsT, rhs = torch.randn(K, M).bfloat16(), torch.randn(K, N).bfloat16()

    def reference(a, b):  # fp32 product of the same (bf16-representable) values
        return a.float().T @ b.float()

    out = matmul.matmul_kernel(lhsT.to("neuron"), rhs.to("neuron"))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu().float(), reference(lhsT, rhs), rtol=1.6e-2, atol=1e-3)
    sim = nki.simulate(matmul.matmul_kernel)(lhsT, rhs)  # NumPy has no bf16: CPU tensors in and out
    assert sim.dtype == torch.bfloat16
    torch.testing.assert_close(sim.float(), reference(lhsT, rhs), rtol=1.6e-2, atol=1e-3)


def test_matmul_rejects_partial_tiles():
    with pytest.raises(AssertionError, match="multiples"):
        matmul.matmul_kernel(torch.randn(384, 200).to("neuron"), torch.randn(384, 512).to("neuron"))


@pytest.mark.parametrize("name", ["softmax_kernel", "softmax_fused_kernel"])
@pytest.mark.parametrize("shape", [(256, 1000), pytest.param((200, 3000), id="partial-tile")])
def test_softmax(name, shape):
    torch.manual_seed(0)
    x = torch.randn(shape) * 4
    _check(getattr(softmax, name), softmax.reference, [x], **FP32)


# The older-style RMSNorm example and the current-API one share signature and reference.
RMSNORMS = pytest.mark.parametrize("example", [rmsnorm, rmsnorm_current], ids=["older", "current"])


@RMSNORMS
@pytest.mark.parametrize("shape", [(256, 512), pytest.param((200, 1000), id="partial-tile")])
def test_rmsnorm(example, shape):
    torch.manual_seed(0)
    x, w = torch.randn(shape), torch.rand(shape[1]) + 0.5
    _check(example.rmsnorm_kernel, example.reference, [x, w], **FP32)


@RMSNORMS
def test_rmsnorm_eps(example):
    torch.manual_seed(0)
    x, w = torch.randn(128, 256) * 1e-2, torch.rand(256)
    out = example.rmsnorm_kernel(x.to("neuron"), w.to("neuron"), eps=1e-3)
    torch.testing.assert_close(out.cpu(), example.reference(x, w, eps=1e-3), **FP32)


@pytest.mark.parametrize("H,S", [(2, 384), (1, 128)])
def test_causal_attention(H, S):
    torch.manual_seed(0)
    q, k, v = (torch.randn(H, S, 64) for _ in range(3))
    _check(attention.causal_attention_kernel[H], attention.reference, [q, k, v], rtol=1e-4, atol=1e-5)


# -- production-shaped kernels in the current API ----------------------------------------------------


@pytest.mark.parametrize("H,S,d", [(2, 640, 64), (1, 128, 128)])
def test_flash_attention_prefill(H, S, d):
    """640 = a 512-key block plus one: query tiles with one and with two key blocks."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(H, S, d) for _ in range(3))
    _check(flash_attention_prefill.flash_attention_prefill, flash_attention_prefill.reference, [q, k, v],
           rtol=1e-4, atol=1e-5)


def test_flash_attention_prefill_lnc2_bf16():
    """Two programs, one head each; bf16 operands with fp32 softmax statistics and accumulator."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 256, 64).bfloat16() for _ in range(3))
    kernel = flash_attention_prefill.flash_attention_prefill[2]
    out = kernel(q.to("neuron"), k.to("neuron"), v.to("neuron")).cpu()
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), flash_attention_prefill.reference(q, k, v).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("Hq,Hkv,n,d,ctx", [(4, 2, 2, 64, 1024), (2, 2, 1, 128, 512)])
def test_attention_decode(Hq, Hkv, n, d, ctx):
    torch.manual_seed(0)
    q = torch.randn(Hq, n, d)
    k_cache, v_cache = torch.randn(Hkv, d, ctx), torch.randn(Hkv, ctx, d)
    _check(attention_decode.attention_decode, attention_decode.reference, [q, k_cache, v_cache], rtol=1e-4,
           atol=1e-5)


def test_fused_mlp():
    torch.manual_seed(0)
    T, H, I = 8, 512, 1024
    x = torch.randn(T, H)
    w_gate, w_up, w_down = torch.randn(H, I) / H ** 0.5, torch.randn(H, I) / H ** 0.5, torch.randn(I, H) / I ** 0.5
    _check(fused_mlp.fused_mlp, fused_mlp.reference, [x, w_gate, w_up, w_down], rtol=1e-4, atol=1e-5)


def test_fused_mlp_bf16():
    torch.manual_seed(0)
    T, H, I = 4, 512, 512
    args = [torch.randn(T, H), torch.randn(H, I) / H ** 0.5, torch.randn(H, I) / H ** 0.5, torch.randn(I, H) / I ** 0.5]
    args = [a.bfloat16() for a in args]
    out = nki.simulate(fused_mlp.fused_mlp)(*args)  # CPU tensors in, CPU tensors out
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), fused_mlp.reference(*args).float(), rtol=3e-2, atol=3e-2)


def test_rope():
    torch.manual_seed(0)
    Hq, Hk, S, d = 4, 2, 256, 64
    cos, sin = rope.tables(S, d)
    _check(rope.rope_kernel, rope.reference, [torch.randn(Hq, S, d), torch.randn(Hk, S, d), cos, sin], **FP32)


@pytest.mark.parametrize("top_k", [2, 1])
def test_moe_tkg(top_k):
    torch.manual_seed(0)
    T, H, I, E = 4, 512, 512, 8
    args = [torch.randn(T, H), torch.randn(H, E), torch.randn(E, H, 2, I) / H ** 0.5, torch.randn(E, I, H) / I ** 0.5]
    _check(moe_tkg.moe_tkg, moe_tkg.reference, args, scalars={"top_k": top_k}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["cumsum_kernel", "cumsum_cumulative_kernel"])
def test_cumsum(name):
    """300 x 9000: two full row tiles (a batched loop) and a partial one, two column chunks (the carry)."""
    torch.manual_seed(0)
    x = torch.randn(300, 9000)
    _check(getattr(cumsum, name), cumsum.reference, [x], rtol=1e-5, atol=1e-4)


def test_cumsum_bf16():
    """bf16 in and out: the sums are fp32 and rounded once."""
    torch.manual_seed(0)
    x = torch.randn(128, 2500).bfloat16()
    out = nki.simulate(cumsum.cumsum_cumulative_kernel)(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, cumsum.reference(x), rtol=1e-2, atol=1e-1)


def test_cumsum_matmul():
    torch.manual_seed(0)
    x = torch.randn(200, 640)
    _check(cumsum.cumsum_matmul_kernel, cumsum.reference, [x], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("module", [tensor_add, matmul, softmax, rmsnorm, attention, flash_attention_prefill,
                                    attention_decode, fused_mlp, rmsnorm_current, rope, moe_tkg, cumsum],
                         ids=lambda m: m.__name__.removeprefix("nki_example_"))
def test_example_main(module, capsys):
    """Each example runs as a script and reports small errors."""
    module.main()
    lines = [line for line in capsys.readouterr().out.splitlines() if "error:" in line]
    errors = [float(line.rsplit(":", 1)[1]) for line in lines]
    assert errors and max(errors) < 1e-2, lines
