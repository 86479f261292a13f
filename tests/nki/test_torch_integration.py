"""NKI kernels in PyTorch: device tasks on the current stream, operators in eager, compile and autograd."""

import numpy as np
import pytest
import torch

import torchneuron
import torchneuron.nki as nki
import torchneuron.nki.language as nl


@nki.jit
def scale_add(a, b, alpha=2.0):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range(a.shape[0] // 128):
        rows = slice(t * 128, (t + 1) * 128)
        nl.store(out[rows, :], value=nl.load(a[rows, :]) * alpha + nl.load(b[rows, :]))
    return out


@nki.jit
def scale(g, alpha=2.0):
    out = nl.ndarray(g.shape, dtype=g.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range(g.shape[0] // 128):
        rows = slice(t * 128, (t + 1) * 128)
        nl.store(out[rows, :], value=nl.load(g[rows, :]) * alpha)
    return out


scale_add_op = torchneuron.nki_op("nki_test::scale_add")(scale_add)
scale_op = torchneuron.nki_op("nki_test::scale")(scale)


def _setup(ctx, inputs, output):
    ctx.alpha = inputs[2]


def _backward(ctx, grad):
    return scale_op(grad, ctx.alpha), grad, None


scale_add_op.register_autograd(_backward, setup_context=_setup)


def test_a_kernel_call_is_an_asynchronous_task_on_the_current_stream():
    w = torch.randn(512, 512, device="neuron") / 23
    x = torch.randn(512, 512, device="neuron")
    scale_add(x, x, 0.5)  # the first call of a signature checks the kernel on the host: not timed here
    torch.neuron.synchronize()
    ref, w_cpu = x.cpu(), w.cpu()
    for _ in range(30):  # queue work ahead of the kernel (no host read in between: w.cpu() would wait for it)
        x = x @ w
        ref = ref @ w_cpu
    out = scale_add(x, x, 0.5)
    assert not torch.neuron.current_stream().query(), "the host waited for the device"
    torch.testing.assert_close(out.cpu(), ref * 1.5, rtol=1e-4, atol=1e-5)

    side = torch.neuron.Stream()
    side.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(side):
        out2 = scale_add(x, x, 1.0)
    side.synchronize()
    torch.testing.assert_close(out2.cpu(), ref * 2, rtol=1e-4, atol=1e-5)


def test_operator_schema_and_eager_calls_on_neuron_and_cpu():
    assert str(scale_add_op._opoverload._schema) == \
        "nki_test::scale_add(Tensor a, Tensor b, float alpha=2.) -> Tensor"
    a, b = torch.randn(256, 64), torch.randn(256, 64)
    torch.testing.assert_close(scale_add_op(a, b, 3.0), a * 3 + b)
    out = scale_add_op(a.to("neuron"), b.to("neuron"))
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), a * 2 + b)


def test_autograd_through_a_backward_kernel():
    a = torch.randn(128, 32, device="neuron", requires_grad=True)
    b = torch.randn(128, 32, device="neuron", requires_grad=True)
    (scale_add_op(a, b, 3.0) * torch.arange(32.0, device="neuron")).sum().backward()
    ca, cb = a.detach().cpu().requires_grad_(), b.detach().cpu().requires_grad_()
    ((ca * 3 + cb) * torch.arange(32.0)).sum().backward()
    torch.testing.assert_close(a.grad.cpu(), ca.grad)
    torch.testing.assert_close(b.grad.cpu(), cb.grad)


def test_compiled_without_graph_break_forward_and_backward():
    torch._dynamo.reset()
    torchneuron.reset_dynamo_metrics()

    def f(x, y):
        return torch.relu(scale_add_op(x * 2, y, 0.5)).sum()

    compiled = torch.compile(f, backend="neuron", fullgraph=True)
    x = torch.randn(256, 64, device="neuron", requires_grad=True)
    y = torch.randn(256, 64, device="neuron", requires_grad=True)
    loss = compiled(x, y)
    loss.backward()
    cx, cy = x.detach().cpu().requires_grad_(), y.detach().cpu().requires_grad_()
    ref = torch.relu(cx * 2 * 0.5 + cy).sum()
    ref.backward()
    torch.testing.assert_close(loss.cpu(), ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(x.grad.cpu(), cx.grad)
    torch.testing.assert_close(y.grad.cpu(), cy.grad)
    metrics = torchneuron.get_dynamo_metrics()
    assert metrics["graph_breaks"] == 0 and metrics["compiled_graphs"] == 1


def test_wrap_nki_a_grid_kernel_and_a_mutating_kernel():
    @nki.jit
    def add_rows(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        r = nl.program_id(0) * 128 + nl.arange(128)[:, None]
        c = nl.arange(a.shape[1])[None, :]
        nl.store(out[r, c], value=nl.load(a[r, c]) + nl.load(b[r, c]))
        return out

    op = torchneuron.wrap_nki(add_rows[2])
    assert torchneuron.wrap_nki(add_rows[2]) is op
    a, b = torch.randn(256, 16, device="neuron"), torch.randn(256, 16, device="neuron")
    torch.testing.assert_close(op(a, b).cpu(), (a + b).cpu())
    compiled = torch.compile(lambda a, b: op(a, b) * 2, backend="neuron", fullgraph=True)
    torch.testing.assert_close(compiled(a, b).cpu(), ((a + b) * 2).cpu())

    @nki.jit
    def bump(x):
        nl.store(x, value=nl.load(x) + 1)

    inc = torchneuron.wrap_nki(bump, mutates_args=("x",))
    t = torch.zeros(8, 8, device="neuron")
    assert inc(t) is None
    inc(t)
    torch.testing.assert_close(t.cpu(), torch.full((8, 8), 2.0))


def test_simulate_forms_take_and_return_numpy():
    a, b = np.ones((128, 8), np.float32), np.full((128, 8), 2, np.float32)
    out = nki.simulate(scale_add)(a, b, 3.0)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, 5)
    np.testing.assert_array_equal(nki.simulate_kernel(scale_add, a, b), 4)
    # simulate takes CPU copies of device tensors
    out = nki.simulate(scale_add)(torch.ones(128, 8, device="neuron"), torch.ones(128, 8))
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, torch.full((128, 8), 3.0))


def test_kernel_plans_are_cached_per_signature():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(a))
        return out

    k(np.zeros((4, 4), np.float32))
    k(np.ones((4, 4), np.float32))
    assert len(k._plans) == 1
    k(np.zeros((4, 8), np.float32))
    assert len(k._plans) == 2


def test_nki_op_schema_follows_the_kernels_own_mutable_arguments():
    @nki.jit(mutates_args=("x",))
    def inc(x):
        nl.store(x, value=nl.load(x) + 1)

    op = torchneuron.nki_op("nki_test::inc")(inc)
    assert str(op._opoverload._schema) == "nki_test::inc(Tensor(a!) x) -> ()"
    t = torch.zeros(4, 4, device="neuron")
    op(t)
    torch.testing.assert_close(t.cpu(), torch.ones(4, 4))


def test_a_kernel_that_waits_for_the_device_fails_instead_of_hanging():
    g = torch.ones(3, device="neuron")

    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        scale = float(g.sum())          # host code reading device data from inside a device task
        nl.store(out, value=nl.load(a) * scale)
        return out

    a = torch.ones(4, 4, device="neuron")
    out = kernel(a)                     # the check pass runs on the host, where this is fine
    with pytest.raises(RuntimeError, match="waits for its own stream"):
        torch.neuron.synchronize()
    torch.testing.assert_close((a + 1).cpu(), torch.full((4, 4), 2.0))  # the stream stays usable
    del out


def test_a_raw_kernel_call_in_compiled_code_runs_at_a_graph_break():
    torch._dynamo.reset()

    def f(x):
        return scale(x + 1, 2.0) - 1

    x = torch.randn(128, 16, device="neuron")
    torch.testing.assert_close(torch.compile(f, backend="neuron")(x).cpu(), (x.cpu() + 1) * 2 - 1)


def test_kernels_call_kernels_inline():
    @nki.jit
    def outer(a):
        return scale(a, 3.0)            # a kernel called on kernel tensors runs inline

    torch.testing.assert_close(outer(torch.ones(128, 4, device="neuron")).cpu(), torch.full((128, 4), 3.0))
