"""Device graphs: torch.accelerator.Graph capture and replay, and torch.compile(mode="reduce-overhead")."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import torchneuron


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    torchneuron.reset_dynamo_metrics()
    yield
    torch._dynamo.reset()


def test_capture_records_without_running_and_replay_runs_on_current_inputs():
    x = torch.randn(16, 16, device="neuron")
    w = torch.randn(16, 16, device="neuron")
    y = torch.zeros(16, 16, device="neuron")
    graph = torch.accelerator.Graph()
    with graph:
        y.copy_((x @ w).relu() + 1)
    assert y.abs().sum().item() == 0, "a captured task ran during capture"
    for _ in range(3):
        x.copy_(torch.randn(16, 16))
        graph.replay()
        torch.testing.assert_close(y.cpu(), (x.cpu() @ w.cpu()).relu() + 1)


def test_replay_follows_the_current_stream_and_is_ordered_with_eager_work():
    x = torch.ones(1000, device="neuron")
    graph = torch.accelerator.Graph()
    with graph:
        x.mul_(2)
    side = torch.neuron.Stream()
    side.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(side):
        x.add_(1)  # eager, then the replay, then eager again: in order on `side`
        graph.replay()
        x.add_(1)
    side.synchronize()
    torch.testing.assert_close(x.cpu(), torch.full((1000,), 2 + 2 + 1.0))


def test_synchronising_inside_a_capture_is_an_error_and_the_device_stays_usable():
    x = torch.randn(8, device="neuron")
    graph = torch.accelerator.Graph()
    with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
        with graph:
            (x * 2).sum().item()
    with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing"):
        with torch.accelerator.Graph():
            x.cpu()
    assert (x * 2).sum().item() == pytest.approx(float(x.sum().item()) * 2, rel=1e-5)


def test_graph_misuse_errors():
    graph = torch.accelerator.Graph()
    with pytest.raises(RuntimeError, match="replay before a capture ended"):
        graph.replay()
    x = torch.zeros(4, device="neuron")
    with graph:
        x.add_(1)
    with pytest.raises(RuntimeError, match="call reset\\(\\) first"):
        graph.capture_begin()
    graph.replay()
    graph.reset()
    with pytest.raises(RuntimeError, match="replay before a capture ended"):
        graph.replay()
    assert x.cpu().tolist() == [1.0] * 4


def test_graph_memory_is_not_reused_while_the_graph_lives():
    x = torch.randn(256, device="neuron")
    graph = torch.accelerator.Graph()
    with graph:
        y = x * 3
    address = y.data_ptr()
    del y  # the replay still writes there
    others = [torch.empty(256, device="neuron") for _ in range(4)]
    assert address not in {t.data_ptr() for t in others}
    before = torch.neuron.memory_allocated()
    graph.reset()
    assert torch.neuron.memory_allocated() < before  # released with the graph
    del others


def test_graphs_can_share_a_pool():
    a = torch.ones(4, device="neuron")
    g1 = torch.accelerator.Graph()
    with g1:
        b = a + 1
    g2 = torch.accelerator.Graph(pool=g1.pool())
    with g2:
        c = b * 3
    assert g2.pool() == g1.pool()
    g1.replay()
    g2.replay()
    assert c.cpu().tolist() == [6.0] * 4


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.norm(F.gelu(self.fc1(x))))


def _twins():
    torch.manual_seed(0)
    cpu = MLP()
    dev = MLP().to("neuron")
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev


def test_reduce_overhead_training_matches_cpu_as_inputs_change():
    cpu, dev = _twins()
    compiled = torch.compile(dev, backend="neuron", mode="reduce-overhead")
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.05)
    opt_dev = torch.optim.SGD(dev.parameters(), lr=0.05)
    for step in range(5):
        x = torch.randn(8, 16)
        loss_dev = compiled(x.to("neuron")).square().mean()
        loss_cpu = cpu(x).square().mean()
        torch.testing.assert_close(loss_dev.cpu(), loss_cpu, atol=1e-5, rtol=1e-5, msg=f"step {step}")
        loss_dev.backward()
        loss_cpu.backward()
        for p, q in zip(cpu.parameters(), dev.parameters()):
            torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-5, rtol=1e-4, msg=f"step {step}")
        opt_dev.step()
        opt_cpu.step()
        opt_dev.zero_grad()
        opt_cpu.zero_grad()
    metrics = torchneuron.get_dynamo_metrics()
    # forward and backward: one warm-up call each, then recorded once and replayed
    assert metrics["graph_recordings"] == 2 and metrics["graph_replays"] == 2 * 4
    assert metrics["graph_replay_fallbacks"] == [] and metrics["fallbacks"] == 0


def test_reduce_overhead_outputs_survive_later_replays_and_shape_changes_record_again():
    cpu, dev = _twins()
    compiled = torch.compile(dev, backend="neuron", mode="reduce-overhead")
    with torch.no_grad():
        xs = [torch.randn(8, 16) for _ in range(4)]
        outs = [compiled(x.to("neuron")) for x in xs]  # warm-up, record, replay, replay
        for x, out in zip(xs, outs):
            torch.testing.assert_close(out.cpu(), cpu(x), atol=1e-5, rtol=1e-5)
        wide = torch.randn(3, 16)
        torch.testing.assert_close(compiled(wide.to("neuron")).cpu(), cpu(wide), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(compiled(wide.to("neuron")).cpu(), cpu(wide), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(compiled(wide.to("neuron")).cpu(), cpu(wide), atol=1e-5, rtol=1e-5)
    metrics = torchneuron.get_dynamo_metrics()
    assert metrics["graph_recordings"] == 2, metrics
    assert metrics["graph_replays"] == 3 + 2


def test_reduce_overhead_records_again_when_a_parameter_moves():
    cpu, dev = _twins()
    compiled = torch.compile(dev, backend="neuron", mode="reduce-overhead")
    x = torch.randn(8, 16)
    with torch.no_grad():
        for _ in range(3):
            compiled(x.to("neuron"))
        new_weight = torch.randn(4, 32)
        dev.fc2.weight = torch.nn.Parameter(new_weight.to("neuron"))  # another address
        cpu.fc2.weight = torch.nn.Parameter(new_weight)
        out = compiled(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), cpu(x), atol=1e-5, rtol=1e-5)


def test_reduce_overhead_updates_mutated_inputs_and_random_ops_vary():
    def step(x, buf):
        buf.add_(x)  # an input the graph mutates
        return F.dropout(buf, 0.5, training=True)

    compiled = torch.compile(step, backend="neuron", mode="reduce-overhead")
    buf = torch.zeros(512, device="neuron")
    masks = []
    for i in range(4):
        out = compiled(torch.ones(512, device="neuron"), buf)
        masks.append(out.cpu() == 0)
        assert buf.cpu().eq(i + 1).all(), f"call {i}: mutation of the input lost"
    assert not all(torch.equal(masks[1], m) for m in masks[2:]), "replays reused one dropout mask"
    assert torchneuron.get_dynamo_metrics()["graph_replays"] >= 2


def test_a_graph_that_cannot_be_recorded_runs_without_replay_with_a_warning():
    from torchneuron.compile.graphs import GraphReplay

    def compiled(args):  # a compiled graph (boxed convention) that reads a value on the host
        (x,) = args
        args.clear()
        return [x * float(x.sum().item())]

    replay = GraphReplay(compiled, (), (), "the test graph")
    xs = [torch.randn(8) for _ in range(3)]
    with pytest.warns(UserWarning, match="the test graph runs without graph replay: operation not permitted when"):
        results = [replay([x.to("neuron")])[0].cpu() for x in xs]
    for x, r in zip(xs, results):
        torch.testing.assert_close(r, x * float(x.sum()))
    metrics = torchneuron.get_dynamo_metrics()
    assert len(metrics["graph_replay_fallbacks"]) == 1 and metrics["graph_replays"] == 0
    assert (torch.ones(3, device="neuron") * 2).sum().item() == 6  # the device is fine


def test_data_dependent_graphs_run_without_replay_and_stay_correct():
    def f(x):
        return torch.nonzero(x > 1).float().sum(0) + 1

    compiled = torch.compile(f, backend="neuron", mode="reduce-overhead")
    xs = [torch.randint(0, 4, (4, 9)).float() for _ in range(3)]
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        with pytest.warns(UserWarning, match="runs without graph replay"):
            results = [compiled(x.to("neuron")).cpu() for x in xs]
    for x, r in zip(xs, results):
        torch.testing.assert_close(r, f(x))


def test_unsupported_mode_names_the_mode():
    f = torch.compile(lambda x: x + 1, backend="neuron", mode="max-autotune-no-cudagraphs")
    with pytest.warns(UserWarning, match="neuron has no kernel variants to autotune"):
        out = f(torch.ones(2, device="neuron"))
    assert out.cpu().tolist() == [2.0, 2.0]


def test_graphs_with_host_kernels_are_not_replayed():
    class HostThenDevice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(4, device="neuron"))

        def forward(self, c):
            return self.w + (c * 2).sin().to("neuron")  # c is a CPU tensor

    module = HostThenDevice()
    compiled = torch.compile(module, backend="neuron", mode="reduce-overhead")
    with torch.no_grad(), pytest.warns(UserWarning, match="runs without graph replay"):
        for i in range(4):
            c = torch.full((4,), float(i))
            torch.testing.assert_close(compiled(c).cpu(), (c * 2).sin())
    assert torchneuron.get_dynamo_metrics()["graph_replays"] == 0


def test_empty_outputs_keep_their_dtype_under_replay():
    def f(x, idx):
        return x * 2, idx[:0] + 1

    compiled = torch.compile(f, backend="neuron", mode="reduce-overhead")
    x = torch.randn(4, device="neuron")
    idx = torch.arange(3, device="neuron")
    for _ in range(3):
        a, b = compiled(x, idx)
        assert b.dtype == torch.int64 and b.shape == (0,)
        torch.testing.assert_close(a.cpu(), x.cpu() * 2)


def test_pageable_host_copies_cannot_be_captured():
    x = torch.zeros(4, device="neuron")
    with pytest.raises(RuntimeError, match="copy_ from pageable host memory"):
        with torch.accelerator.Graph():
            x.copy_(torch.ones(4))
    x.copy_(torch.ones(4))
    assert x.cpu().tolist() == [1.0] * 4


def test_memory_freed_during_a_capture_is_reused_within_it():
    x = torch.randn(1 << 20, device="neuron")  # 4 MiB
    base = torch.neuron.memory_allocated()
    graph = torch.accelerator.Graph()
    with graph:
        y = x
        for _ in range(10):
            y = y * 1.5  # each intermediate dies at the next step
    held = torch.neuron.memory_allocated() - base
    assert held <= 3 * x.nbytes, f"the graph holds {held / x.nbytes:.1f} intermediates"
    for _ in range(2):
        graph.replay()
        torch.testing.assert_close(y.cpu(), x.cpu() * 1.5**10, rtol=1e-5, atol=1e-5)
