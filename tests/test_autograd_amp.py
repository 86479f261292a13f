"""Autograd, autocast and GradScaler on ``neuron``.

References: the same computation on CPU (gradients, losses, scaler decisions),
closed forms (derivatives of x**3), and CUDA's autocast policy as published in
``ATen/autocast_mode.h`` and the torch.amp documentation.
"""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

DEV = "neuron"


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def assert_grads_match(dev_model, cpu_model, rtol=1e-4, atol=1e-5):
    for (name, p), q in zip(dev_model.named_parameters(), cpu_model.parameters()):
        assert p.grad is not None, f"{name} has no gradient"
        assert p.grad.device.type == "neuron", f"{name}.grad on {p.grad.device}"
        assert p.grad.dtype == q.grad.dtype
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


# --------------------------------------------------------------------------- autograd

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 12)
        self.fc1 = nn.Linear(12, 32)
        self.ln = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 5)

    def forward(self, tokens):
        h = self.emb(tokens).mean(dim=1)
        h = F.gelu(self.fc1(h))
        h = self.ln(h)
        return self.fc2(h)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2)
        self.fc = nn.Linear(8 * 2 * 2, 4)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv1(x))), 2)
        x = F.relu(self.conv2(x))
        return self.fc(x.flatten(1))


def _both(make):
    torch.manual_seed(0)
    ref = make()
    dev = copy.deepcopy(ref).to(DEV)
    return ref, dev


def test_mlp_gradients_match_cpu():
    ref, dev = _both(MLP)
    tokens = torch.randint(0, 20, (16, 7), generator=torch.Generator().manual_seed(1))
    target = torch.randint(0, 5, (16,), generator=torch.Generator().manual_seed(2))
    loss_ref = F.cross_entropy(ref(tokens), target)
    loss_dev = F.cross_entropy(dev(tokens.to(DEV)), target.to(DEV))
    loss_ref.backward()
    loss_dev.backward()
    torch.testing.assert_close(loss_dev.cpu(), loss_ref, rtol=1e-5, atol=1e-6)
    assert_grads_match(dev, ref)


def test_cnn_gradients_match_cpu():
    ref, dev = _both(CNN)
    x = rand(4, 3, 12, 12, seed=1)
    target = torch.tensor([0, 3, 1, 2])
    loss_ref = F.cross_entropy(ref(x), target)
    loss_dev = F.cross_entropy(dev(x.to(DEV)), target.to(DEV))
    loss_ref.backward()
    loss_dev.backward()
    torch.testing.assert_close(loss_dev.cpu(), loss_ref, rtol=1e-5, atol=1e-5)
    assert_grads_match(dev, ref, rtol=1e-4, atol=1e-4)


def test_input_gradients_and_accumulation():
    x = rand(6, 5, seed=1)
    w = rand(5, 3, seed=2)
    results = {}
    for device in ("cpu", DEV):
        xd = x.detach().to(device).requires_grad_()
        wd = w.detach().to(device).requires_grad_()
        for _ in range(2):  # gradients accumulate across backward calls
            out = torch.tanh(xd @ wd).pow(2).sum(dim=1)
            out.backward(torch.arange(6.0, device=device))
        results[device] = (xd.grad, wd.grad)
        assert xd.grad.device.type == device
    for a, b in zip(results[DEV], results["cpu"]):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)


def test_gradients_through_views_and_in_place():
    x = rand(4, 6, seed=3)
    res = {}
    for device in ("cpu", DEV):
        leaf = x.detach().to(device).requires_grad_()
        y = leaf * 2
        y[:, 1].mul_(3)  # in place on a view of a non-leaf
        y.t()[2:].add_(y.t()[:4].exp())
        z = torch.cat([y[::2], y[1::2].flip(0)]).softmax(dim=1)
        idx = torch.tensor([0, 2, 3], device=device)
        loss = (z.index_select(0, idx) * torch.arange(6.0, device=device)).sum() + z.gather(1, idx.view(3, 1)).sum()
        loss.backward()
        res[device] = leaf.grad
    torch.testing.assert_close(res[DEV].cpu(), res["cpu"], rtol=1e-5, atol=1e-6)


def test_autograd_grad_and_higher_order():
    x = rand(5, seed=4)
    xd = x.to(DEV).requires_grad_()
    y = (xd ** 3).sum()
    (g,) = torch.autograd.grad(y, xd, create_graph=True)
    assert g.device.type == "neuron"
    torch.testing.assert_close(g.detach().cpu(), 3 * x ** 2, rtol=1e-5, atol=1e-6)  # closed form
    (h,) = torch.autograd.grad(g.sum(), xd, create_graph=True)
    torch.testing.assert_close(h.detach().cpu(), 6 * x, rtol=1e-5, atol=1e-6)
    (t,) = torch.autograd.grad(h.sum(), xd)
    torch.testing.assert_close(t.cpu(), torch.full((5,), 6.0))
    # gradient of a function of several inputs, with allow_unused
    a, b, c = (rand(3, seed=s).to(DEV).requires_grad_() for s in (5, 6, 7))
    ga, gb, gc = torch.autograd.grad((a * b.sin()).sum(), (a, b, c), allow_unused=True)
    assert gc is None
    torch.testing.assert_close(ga.cpu(), b.detach().cpu().sin())
    torch.testing.assert_close(gb.cpu(), a.detach().cpu() * b.detach().cpu().cos())


def test_hessian_vector_product_and_jacobian_match_cpu():
    def f(x):
        return (x.sin() * x.roll(1)).sum() + (x @ x) ** 2 / 10

    def g(x):
        return torch.stack([x.prod(), x.exp().sum(), (x ** 2).mean()])

    x, v = rand(6, seed=8), rand(6, seed=9)
    _, hvp_cpu = torch.autograd.functional.hvp(f, x, v)
    _, hvp_dev = torch.autograd.functional.hvp(f, x.to(DEV), v.to(DEV))
    torch.testing.assert_close(hvp_dev.cpu(), hvp_cpu, rtol=1e-4, atol=1e-5)
    jac_cpu = torch.autograd.functional.jacobian(g, x)
    jac_dev = torch.autograd.functional.jacobian(g, x.to(DEV))
    assert jac_dev.device.type == "neuron"
    torch.testing.assert_close(jac_dev.cpu(), jac_cpu, rtol=1e-5, atol=1e-5)


def test_custom_function_and_no_grad():
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 2 * x * grad

    x = rand(4, seed=10)
    xd = x.to(DEV).requires_grad_()
    Square.apply(xd).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), 2 * x)
    with torch.no_grad():
        y = xd * 2
    assert not y.requires_grad
    d = xd.detach()
    d.add_(1)  # detach shares storage
    torch.testing.assert_close(xd.detach().cpu(), x + 1)


def test_checkpoint_with_dropout_matches_plain_run():
    """Activation checkpointing replays dropout with the saved neuron RNG state."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.5), nn.GELU(), nn.Linear(32, 4)).to(DEV)
    x = rand(8, 16, seed=11).to(DEV)

    torch.manual_seed(123)
    model(x).sum().backward()
    plain = [p.grad.cpu().clone() for p in model.parameters()]
    model.zero_grad()

    torch.manual_seed(123)
    out = torch.utils.checkpoint.checkpoint(model, x, use_reentrant=False)
    out.sum().backward()
    for p, q in zip(model.parameters(), plain):
        torch.testing.assert_close(p.grad.cpu(), q)


# --------------------------------------------------------------------------- autocast policy (CUDA's)

def _linear(x, w):
    return F.linear(x, w)


# ops CUDA autocasts to the lower precision type (AT_FORALL_LOWER_PRECISION_FP)
LOWER = {
    "mm": lambda x, w: torch.mm(x, w.t()),
    "matmul": lambda x, w: torch.matmul(x, w.t()),
    "linear": lambda x, w: F.linear(x, w),
    "bmm": lambda x, w: torch.bmm(x.unsqueeze(0), w.t().unsqueeze(0)),
    "addmm": lambda x, w: torch.addmm(x.new_ones(x.shape[0], w.shape[0]), x, w.t()),
    "baddbmm": lambda x, w: torch.baddbmm(x.new_ones(1, x.shape[0], w.shape[0]), x[None], w.t()[None]),
    "einsum": lambda x, w: torch.einsum("ik,jk->ij", x, w),
    "mv": lambda x, w: torch.mv(x, w[0]),
    "addmv": lambda x, w: torch.addmv(x.new_ones(x.shape[0]), x, w[0]),
    "addr": lambda x, w: torch.addr(x.new_ones(x.shape[0], w.shape[1]), x[:, 0], w[0]),
    "prelu": lambda x, w: F.prelu(x, x.new_full((1,), 0.25)),
    "sdpa": lambda x, w: F.scaled_dot_product_attention(x[None], x[None], x[None])[0],
    "conv2d": lambda x, w: F.conv2d(x.view(1, 1, *x.shape), w[:1, :3].repeat(3, 1).view(1, 1, 3, 3)),
}

# ops CUDA autocasts to float32 (AT_FORALL_FP32 and AT_FORALL_FP32_SET_OPT_DTYPE)
FP32 = {
    "softmax": lambda y: torch.softmax(y, dim=-1),
    "log_softmax": lambda y: F.log_softmax(y, dim=-1),
    "layer_norm": lambda y: F.layer_norm(y, y.shape[-1:]),
    "group_norm": lambda y: F.group_norm(y, 1),
    "rms_norm": lambda y: F.rms_norm(y, y.shape[-1:]),
    "sum": lambda y: y.sum(),
    "sum_dim": lambda y: y.sum(dim=1),
    "prod": lambda y: y.prod(),
    "cumsum": lambda y: y.cumsum(0),
    "cumprod": lambda y: y.cumprod(1),
    "exp": torch.exp,
    "log": torch.log,
    "pow": lambda y: torch.pow(y, 2),
    "rsqrt": torch.rsqrt,
    "softplus": F.softplus,
    "logsumexp": lambda y: torch.logsumexp(y, dim=1),
    "mse_loss": lambda y: F.mse_loss(y, torch.zeros_like(y)),
    "l1_loss": lambda y: F.l1_loss(y, torch.zeros_like(y)),
    "nll_loss": lambda y: F.nll_loss(y, torch.zeros(y.shape[0], dtype=torch.long, device=y.device)),
    "bce_with_logits": lambda y: F.binary_cross_entropy_with_logits(y, torch.zeros_like(y)),
    "cosine_similarity": lambda y: F.cosine_similarity(y, y.flip(0)),
    "cdist": lambda y: torch.cdist(y, y),
    "norm": lambda y: torch.linalg.vector_norm(y),
}

# not on any list: run in the input's type
PASSTHROUGH = {
    "relu": torch.relu,
    "add": lambda y: y + y,
    "gelu": F.gelu,
    "max": lambda y: y.amax(dim=1),
    "dropout_eval": lambda y: F.dropout(y, 0.5, training=False),
    "transpose": lambda y: y.t().contiguous(),
}


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(LOWER))
def test_autocast_lower_precision_ops(name, low):
    fn = LOWER[name]
    x, w = rand(4, 8, seed=1), rand(6, 8, seed=2)
    with torch.autocast(DEV, dtype=low):
        out = fn(x.to(DEV), w.to(DEV))
    assert out.dtype == low, f"{name} under autocast({low}) gave {out.dtype}"
    assert out.device.type == "neuron"
    # value: the same op computed on CPU from inputs cast to `low`
    expected = fn(x.to(low), w.to(low))
    torch.testing.assert_close(out.cpu().float(), expected.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(FP32))
def test_autocast_fp32_ops(name, low):
    fn = FP32[name]
    y = (rand(4, 6, seed=3).abs() + 0.5).to(low)  # a lower precision activation, as produced by a matmul
    with torch.autocast(DEV, dtype=low):
        out = fn(y.to(DEV))
    assert out.dtype == torch.float32, f"{name} under autocast({low}) on a {low} input gave {out.dtype}"
    expected = fn(y.float())
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(PASSTHROUGH))
def test_autocast_passthrough_ops(name):
    y = rand(4, 6, seed=3).to(DEV)
    with torch.autocast(DEV, dtype=torch.bfloat16):
        assert PASSTHROUGH[name](y).dtype == torch.float32
        assert PASSTHROUGH[name](y.bfloat16()).dtype == torch.bfloat16


def test_autocast_promote_and_explicit_dtype():
    x = rand(4, 6, seed=4).to(DEV)
    with torch.autocast(DEV, dtype=torch.bfloat16):
        h = x @ x.t()
        assert h.dtype == torch.bfloat16
        # promote ops run in the widest input type
        assert torch.addcmul(x[:, :4], h, h).dtype == torch.float32
        assert torch.atan2(h, x[:, :4]).dtype == torch.float32
        assert torch.cat([h, x[:, :4]]).dtype == torch.float32
        # an explicit dtype wins over the fp32 policy
        assert torch.softmax(h, dim=-1, dtype=torch.float64).dtype == torch.float64
        assert h.sum(dtype=torch.bfloat16).dtype == torch.bfloat16
        # integer inputs are not eligible
        assert torch.arange(5, device=DEV).sum().dtype == torch.int64
        assert torch.mm(torch.ones(2, 2, dtype=torch.int64, device=DEV), torch.ones(2, 2, dtype=torch.int64, device=DEV)).dtype == torch.int64
        # float64 inputs are not eligible for lower precision
        d = x.double()
        assert (d @ d.t()).dtype == torch.float64


def test_autocast_scope_and_device_isolation():
    x = rand(4, 4, seed=5)
    xd = x.to(DEV)
    with torch.autocast(DEV, dtype=torch.bfloat16):
        assert torch.is_autocast_enabled(DEV)
        assert torch.get_autocast_dtype(DEV) == torch.bfloat16
        assert (x @ x).dtype == torch.float32  # CPU tensors are not affected by neuron autocast
        with torch.autocast(DEV, enabled=False):
            assert (xd @ xd).dtype == torch.float32
        assert (xd @ xd).dtype == torch.bfloat16
    assert not torch.is_autocast_enabled(DEV)
    assert (xd @ xd).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (xd @ xd).dtype == torch.float32  # CPU autocast does not touch neuron tensors
    with torch.autocast(DEV):  # CUDA's default: float16
        assert (xd @ xd).dtype == torch.float16


def test_autocast_backward_gives_fp32_grads_close_to_cpu():
    ref, dev = _both(MLP)
    tokens = torch.randint(0, 20, (16, 7), generator=torch.Generator().manual_seed(1))
    target = torch.randint(0, 5, (16,), generator=torch.Generator().manual_seed(2))
    with torch.autocast(DEV, dtype=torch.bfloat16):
        logits = dev(tokens.to(DEV))
        assert logits.dtype == torch.bfloat16
        loss = F.cross_entropy(logits, target.to(DEV))
        assert loss.dtype == torch.float32
    loss.backward()
    F.cross_entropy(ref(tokens), target).backward()
    for p, q in zip(dev.parameters(), ref.parameters()):
        assert p.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=0.1, atol=2e-2)


def test_amp_supported_dtypes():
    dtypes = torch.neuron.get_amp_supported_dtype()
    assert torch.bfloat16 in dtypes and torch.float16 in dtypes
    assert torch.neuron.is_bf16_supported()
    with torch.autocast(DEV, dtype=torch.bfloat16):
        pass
    with torch.autocast(DEV, dtype=torch.float16):
        pass


# --------------------------------------------------------------------------- GradScaler

def _scaler_run(device, make_scaler, inf_at=(), steps=6):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = make_scaler(device)
    x, y = rand(8, 4, seed=1).to(device), rand(8, 2, seed=2).to(device)
    log = []
    for step in range(steps):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        scale_used = scaler.get_scale()
        scaled = scaler.scale(loss)
        before = [p.detach().clone() for p in model.parameters()]
        scaled.backward()
        if step in inf_at:
            model.weight.grad[0, 0] = float("inf")
        scaler.unscale_(opt)
        grads = [p.grad.detach().clone() for p in model.parameters()]
        scaler.step(opt)
        scaler.update()
        changed = any(not torch.equal(a.cpu(), p.detach().cpu()) for a, p in zip(before, model.parameters()))
        log.append(dict(loss=loss.item(), scaled=scaled.item(), scale_used=scale_used, grads=[g.cpu() for g in grads], changed=changed, scale=scaler.get_scale()))
    return log, [p.detach().cpu() for p in model.parameters()]


def test_grad_scaler_scales_unscales_and_matches_cpu():
    make = lambda d: torch.amp.GradScaler(d, init_scale=2.0 ** 10, growth_interval=2)
    dev_log, dev_params = _scaler_run(DEV, make)
    cpu_log, cpu_params = _scaler_run("cpu", make)
    assert dev_log[0]["scale"] == 2.0 ** 10
    for d, c in zip(dev_log, cpu_log):
        assert d["scaled"] == pytest.approx(d["loss"] * d["scale_used"], rel=1e-6)  # loss * scale
        assert d["scaled"] == pytest.approx(c["scaled"], rel=1e-5)
        for gd, gc in zip(d["grads"], c["grads"]):  # unscaled gradients
            torch.testing.assert_close(gd, gc, rtol=1e-5, atol=1e-6)
        assert d["changed"] and c["changed"]
        assert d["scale"] == c["scale"]
    # growth_interval=2 finite steps double the scale: 2**10 -> 2**13 after 6 steps
    assert dev_log[-1]["scale"] == 2.0 ** 13
    for p, q in zip(dev_params, cpu_params):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_grad_scaler_scale_value():
    scaler = torch.amp.GradScaler(DEV)
    loss = torch.tensor(1.5, device=DEV)
    scaled = scaler.scale(loss)
    assert scaled.device.type == "neuron"
    assert scaled.item() == 1.5 * 65536.0  # default init_scale 2**16
    assert scaler.get_scale() == 65536.0
    assert scaler.is_enabled()


def test_grad_scaler_skips_step_on_inf_and_backs_off():
    make = lambda d: torch.amp.GradScaler(d, init_scale=2.0 ** 12, backoff_factor=0.5, growth_interval=100)
    dev_log, dev_params = _scaler_run(DEV, make, inf_at=(1, 3, 4))
    cpu_log, cpu_params = _scaler_run("cpu", make, inf_at=(1, 3, 4))
    expected_scales = [2.0 ** 12, 2.0 ** 11, 2.0 ** 11, 2.0 ** 10, 2.0 ** 9, 2.0 ** 9]
    assert [e["scale"] for e in dev_log] == expected_scales  # halves after each inf step
    assert [e["changed"] for e in dev_log] == [True, False, True, False, False, True]  # inf steps skipped
    assert [e["scale"] for e in cpu_log] == expected_scales
    for p, q in zip(dev_params, cpu_params):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_grad_scaler_nan_and_state_dict():
    torch.manual_seed(0)
    model = nn.Linear(3, 1).to(DEV)
    opt = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler(DEV, init_scale=256.0)
    before = [p.detach().cpu().clone() for p in model.parameters()]
    loss = model(torch.ones(2, 3, device=DEV)).sum() * float("nan")
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 128.0
    for a, p in zip(before, model.parameters()):
        assert torch.equal(a, p.detach().cpu())
    assert len(opt.state) == 0 or all(int(s["step"]) == 0 for s in opt.state.values())
    sd = scaler.state_dict()
    assert sd["scale"] == 128.0
    other = torch.amp.GradScaler(DEV)
    other.load_state_dict(sd)
    assert other.get_scale() == 128.0


# --------------------------------------------------------------------------- training with bf16

def test_bf16_autocast_training_converges_like_fp32_cpu():
    torch.manual_seed(0)
    X = torch.randn(256, 10)
    true_w = torch.randn(10, 3)
    Y = (X @ true_w).argmax(dim=1)

    def make():
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(10, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 3))

    def train(device, autocast):
        model = make().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x, y = X.to(device), Y.to(device)
        losses = []
        for _ in range(60):
            with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        with torch.no_grad():
            acc = (model(x).argmax(1) == y).float().mean().item()
        return losses, acc

    cpu_losses, cpu_acc = train("cpu", autocast=False)
    dev_losses, dev_acc = train(DEV, autocast=True)
    assert cpu_losses[-1] < 0.3 * cpu_losses[0]
    assert dev_losses[-1] < 0.3 * dev_losses[0]
    assert abs(dev_losses[-1] - cpu_losses[-1]) < 0.05 + 0.2 * cpu_losses[-1]
    assert dev_acc > 0.9 and abs(dev_acc - cpu_acc) < 0.05
