"""End-to-end: the one-line change trains a model to the same loss as CPU."""

import torch
import torch.nn.functional as F

import torchneuron


def _mlp():
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
    )


def test_backend_autoloads_with_import_torch():
    assert torch.device("neuron").type == "neuron"
    assert torch.neuron.is_available()
    assert torch.accelerator.current_accelerator().type == "neuron"


def test_training_matches_cpu():
    torch.manual_seed(0)
    ref = _mlp()
    model = _mlp()
    model.load_state_dict(ref.state_dict())
    model = model.to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    for _ in range(10):
        for m, o, dev in ((model, opt, "neuron"), (ref, ref_opt, "cpu")):
            loss = F.cross_entropy(m(x.to(dev)), y.to(dev))
            o.zero_grad()
            loss.backward()
            o.step()
            if dev == "neuron":
                device_loss = loss.item()
            else:
                cpu_loss = loss.item()
    assert abs(device_loss - cpu_loss) < 1e-5
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-5)


def test_device_agnostic_code_runs_on_neuron():
    device = torch.accelerator.current_accelerator()
    x = torch.randn(8, 8, device=device)
    assert x.device.type == "neuron"
    torch.testing.assert_close((x @ x).cpu(), x.cpu() @ x.cpu())


def test_op_tracking_counts_launches():
    torchneuron.clear_op_tracking()
    a = torch.ones(4, device="neuron")
    (a * 3).sum().item()
    executed = torchneuron.get_executed_ops()
    assert any(name.startswith("aten::mul") for name in executed)
    assert "aten::_local_scalar_dense" in executed
    assert torchneuron.get_fallback_ops() == {}
    torch.nonzero(a)
    assert "aten::nonzero" in torchneuron.get_fallback_ops()
