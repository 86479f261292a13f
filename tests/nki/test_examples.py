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

FP32 = dict(rtol=1e-5, atol=1e-5)


def _check(kernel, reference, inputs, *, numpy=True, **tol):
    """Runs ``kernel`` on neuron copies of ``inputs`` and in the simulator; both must match ``reference``."""
    expected = reference(*inputs)

    out = kernel(*(x.to("neuron") for x in inputs))
    assert out.device.type == "neuron" and out.dtype == expected.dtype and out.shape == expected.shape
    torch.neuron.synchronize()
    torch.testing.assert_close(out.cpu(), expected, **tol)

    host = [x.numpy() for x in inputs] if numpy else inputs
    sim = nki.simulate(kernel)(*host)
    if numpy:
        assert isinstance(sim, np.ndarray)
        sim = torch.from_numpy(sim)
    torch.testing.assert_close(sim, expected, **tol)


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


@pytest.mark.parametrize("shape", [(256, 512), pytest.param((200, 1000), id="partial-tile")])
def test_rmsnorm(shape):
    torch.manual_seed(0)
    x, w = torch.randn(shape), torch.rand(shape[1]) + 0.5
    _check(rmsnorm.rmsnorm_kernel, rmsnorm.reference, [x, w], **FP32)


def test_rmsnorm_eps():
    torch.manual_seed(0)
    x, w = torch.randn(128, 256) * 1e-2, torch.rand(256)
    out = rmsnorm.rmsnorm_kernel(x.to("neuron"), w.to("neuron"), eps=1e-3)
    torch.testing.assert_close(out.cpu(), rmsnorm.reference(x, w, eps=1e-3), **FP32)


@pytest.mark.parametrize("H,S", [(2, 384), (1, 128)])
def test_causal_attention(H, S):
    torch.manual_seed(0)
    q, k, v = (torch.randn(H, S, 64) for _ in range(3))
    _check(attention.causal_attention_kernel[H], attention.reference, [q, k, v], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("module", [tensor_add, matmul, softmax, rmsnorm, attention],
                         ids=lambda m: m.__name__.removeprefix("nki_example_"))
def test_example_main(module, capsys):
    """Each example runs as a script and reports small errors."""
    module.main()
    lines = [line for line in capsys.readouterr().out.splitlines() if "error:" in line]
    errors = [float(line.rsplit(":", 1)[1]) for line in lines]
    assert errors and max(errors) < 1e-2, lines
