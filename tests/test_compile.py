"""torch.compile on neuron: the `neuron` backend, Inductor for the device, options, fallback, metrics.

Every compiled result is compared with the same model run eagerly on CPU.
Compiling costs seconds per graph, so the models are small and few.
"""

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
import torch
import torch.nn.functional as F

import torchneuron
from torchneuron.compile import backend as neuron_backend_module

torch._dynamo.config.cache_size_limit = 64


@pytest.fixture(autouse=True)
def _fresh_dynamo(request):
    torch._dynamo.reset()
    torchneuron.reset_dynamo_metrics()
    yield
    if request.node.get_closest_marker("compile_fallback") is None:
        assert torchneuron.get_dynamo_metrics()["fallback_reasons"] == [], "a graph ran eagerly"
    torch._dynamo.reset()


def _twins(make, seed=0):
    """The same freshly initialised module on CPU and on neuron."""
    torch.manual_seed(seed)
    cpu = make()
    dev = make().to("neuron")
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x))).log_softmax(-1)


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = F.max_pool2d(self.bn(self.conv(x)).relu(), 2)
        return self.fc(y.mean((2, 3)))


class TinyTransformer(torch.nn.Module):
    def __init__(self, d=32, heads=4, vocab=50):
        super().__init__()
        self.heads = heads
        self.emb = torch.nn.Embedding(vocab, d)
        self.norm1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.norm2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        x = x + self.mlp(self.norm2(x))
        return self.head(x)


def _assert_grads_match(cpu, dev, atol=1e-4, rtol=1e-4):
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=atol, rtol=rtol, msg=lambda m: f"grad of {name}: {m}")


def test_backend_is_found_through_the_entry_point_without_importing_torchneuron():
    code = textwrap.dedent("""
        import sys, torch
        assert "torchneuron" not in sys.modules
        fn = torch._dynamo.lookup_backend("neuron")
        assert fn.__module__ == "torchneuron.compile.backend", fn
        print("ok")
    """)
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "neuron" in torch._dynamo.list_backends()


def test_dynamo_device_interface_is_registered():
    from torch._dynamo.device_interface import get_interface_for_device

    torchneuron.compile.register()
    iface = get_interface_for_device("neuron")
    assert iface.device_count() == torch.neuron.device_count()
    assert iface.current_stream() == torch.neuron.current_stream()
    assert isinstance(iface.Event(), torch.Event) and isinstance(iface.Stream(), torch.Stream)
    assert iface.get_device_properties(0).name == torch.neuron.get_device_properties(0).name
    iface.synchronize()


def test_mlp_training_matches_cpu():
    cpu, dev = _twins(MLP)
    compiled = torch.compile(dev, backend="neuron")
    x = torch.randn(8, 16)
    out = compiled(x.to("neuron"))
    assert out.device.type == "neuron"
    ref = cpu(x)
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    ref.sum().backward()
    _assert_grads_match(cpu, dev)
    metrics = torchneuron.get_dynamo_metrics()
    assert metrics["compiled_graphs"] == 1 and metrics["fallbacks"] == 0
    assert metrics["compile_seconds"] > 0


def test_set_default_backend_then_module_compile_trains_a_cnn():
    cpu, dev = _twins(CNN)
    previous = torch.compiler.get_default_backend()
    torch.compiler.set_default_backend("neuron")
    try:
        dev.compile()
        opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.1)
        opt_dev = torch.optim.SGD(dev.parameters(), lr=0.1)
        for step in range(2):
            x = torch.randn(4, 3, 8, 8)
            target = torch.randint(0, 5, (4,))
            loss_dev = F.cross_entropy(dev(x.to("neuron")), target.to("neuron"))
            loss_cpu = F.cross_entropy(cpu(x), target)
            torch.testing.assert_close(loss_dev.cpu(), loss_cpu, atol=1e-5, rtol=1e-5)
            loss_dev.backward()
            loss_cpu.backward()
            _assert_grads_match(cpu, dev)
            opt_dev.step()
            opt_cpu.step()
            opt_dev.zero_grad()
            opt_cpu.zero_grad()
        torch.testing.assert_close(dev.bn.running_var.cpu(), cpu.bn.running_var, atol=1e-6, rtol=1e-5)
    finally:
        torch.compiler.set_default_backend(previous)
    assert torchneuron.get_dynamo_metrics()["compiled_graphs"] >= 1


def test_transformer_inference_and_training_match_cpu():
    cpu, dev = _twins(TinyTransformer)
    compiled = torch.compile(dev, backend="neuron")
    tokens = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(compiled(tokens.to("neuron")).cpu(), cpu(tokens), atol=1e-4, rtol=1e-4)
    logits = compiled(tokens.to("neuron"))
    loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten().to("neuron"))
    ref = F.cross_entropy(cpu(tokens).flatten(0, 1), tokens.flatten())
    torch.testing.assert_close(loss.cpu(), ref, atol=1e-5, rtol=1e-5)
    loss.backward()
    ref.backward()
    _assert_grads_match(cpu, dev, atol=2e-4, rtol=1e-3)


def test_inductor_backend_compiles_neuron_tensors():
    def f(x, w):
        return (x @ w).relu().sum(1) + x.sin().mean()

    x, w = torch.randn(8, 8), torch.randn(8, 8)
    out = torch.compile(f, backend="inductor")(x.to("neuron"), w.to("neuron"))
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), f(x, w), atol=1e-5, rtol=1e-5)


def test_compiled_kernels_run_asynchronously_on_the_current_stream():
    f = torch.compile(lambda x: (x * 2 + 1).relu(), backend="neuron")
    x = torch.randn(1000, device="neuron")
    f(x)  # compile
    torch.neuron.synchronize()
    big = torch.randn(1200, 1200, device="neuron")
    stream = torch.neuron.current_stream()
    for _ in range(3):
        big = big @ big  # queued ahead of the compiled kernel
        big = big / big.norm()
    out = f(x)
    assert not stream.query(), "the compiled call waited for the device"
    torch.testing.assert_close(out.cpu(), (x.cpu() * 2 + 1).relu())
    # and on a side stream, ordered after the side stream's own work
    side = torch.neuron.Stream()
    side.wait_stream(stream)
    with torch.neuron.stream(side):
        out2 = f(out)
    side.synchronize()
    torch.testing.assert_close(out2.cpu(), (out.cpu() * 2 + 1).relu())


def test_graph_breaks_run_pieces_on_the_device_and_are_counted():
    def f(x):
        y = x.sin() * 2
        print("graph break")
        return y.cos() + 1

    x = torch.randn(16)
    out = torch.compile(f, backend="neuron")(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), f(x), atol=1e-6, rtol=1e-6)
    metrics = torchneuron.get_dynamo_metrics()
    assert metrics["graph_breaks"] == 1 and metrics["compiled_graphs"] == 2
    assert any("print" in reason for reason in metrics["graph_break_reasons"])


def test_dynamic_shapes_compile_once_and_automatic_dynamic_recompiles_are_counted():
    def f(x):
        return (x * x).sum(0) - x.mean()

    dynamic = torch.compile(f, backend="neuron", dynamic=True)
    for n in (3, 5, 9):
        x = torch.randn(n, 4)
        torch.testing.assert_close(dynamic(x.to("neuron")).cpu(), f(x), atol=1e-5, rtol=1e-5)
    assert torchneuron.get_dynamo_metrics()["compiled_graphs"] == 1

    torch._dynamo.reset()
    torchneuron.reset_dynamo_metrics()
    automatic = torch.compile(f, backend="neuron")
    for n in (3, 5, 9):
        x = torch.randn(n, 4)
        torch.testing.assert_close(automatic(x.to("neuron")).cpu(), f(x), atol=1e-5, rtol=1e-5)
    metrics = torchneuron.get_dynamo_metrics()
    assert metrics["compiled_graphs"] == 2 and metrics["recompiles"] == 1
    assert "size mismatch" in metrics["recompile_reasons"][0]["reason"]


def test_compiled_dropout_draws_from_the_neuron_generator():
    def f(x):
        return F.dropout(x, 0.5, training=True)

    x = torch.ones(4096, device="neuron")
    compiled = torch.compile(f, backend="neuron")
    torch.manual_seed(7)
    a = compiled(x).cpu()
    b = compiled(x).cpu()
    torch.manual_seed(7)
    c = compiled(x).cpu()
    assert not torch.equal(a, b), "two calls drew the same mask"
    torch.testing.assert_close(a, c)  # reseeding the device generator reproduces it
    assert set(a.unique().tolist()) == {0.0, 2.0}
    assert 1700 < int((a == 0).sum()) < 2400


def _failing_inner_compile(*args, **kwargs):
    raise RuntimeError("injected codegen failure")


@pytest.mark.compile_fallback
def test_a_graph_that_fails_to_compile_runs_eagerly_with_one_warning_each(monkeypatch):
    monkeypatch.setattr(neuron_backend_module, "compile_fx_inner", _failing_inner_compile)
    cpu, dev = _twins(MLP)
    before = torch.neuron.memory_allocated()
    compiled = torch.compile(dev, backend="neuron")
    x = torch.randn(8, 16)
    # (caches off: a cache hit would not compile, so nothing could fail)
    with warnings.catch_warnings(record=True) as caught, torch._inductor.config.patch(force_disable_caches=True):
        warnings.simplefilter("always")
        out = compiled(x.to("neuron"))
        out.sum().backward()
        out2 = compiled(x.to("neuron"))
    ref = cpu(x)
    ref.sum().backward()
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out2.cpu(), ref, atol=1e-5, rtol=1e-5)
    _assert_grads_match(cpu, dev)
    # One warning per graph that failed (the forward and the backward), none on later calls.
    messages = sorted(str(w.message) for w in caught if "failed to compile" in str(w.message))
    assert len(messages) == 2, messages
    assert messages[0].startswith("torch.compile(backend='neuron'): the backward of graph 0/0 of forward")
    assert messages[1].startswith("torch.compile(backend='neuron'): the forward of graph 0/0 of forward")
    assert all("RuntimeError: injected codegen failure" in m for m in messages)
    metrics = torchneuron.get_dynamo_metrics()
    assert metrics["fallbacks"] == 2 and "injected" in metrics["fallback_reasons"][0]["reason"]
    del out, out2, compiled
    dev.zero_grad(set_to_none=True)
    torch.neuron.synchronize()
    assert torch.neuron.memory_allocated() <= before  # nothing the fallback allocated is left


def _inductor_error_inner_compile(*args, **kwargs):
    from torch._inductor.exc import InductorError
    raise InductorError(RuntimeError("injected lowering failure"), None)


@pytest.mark.compile_fallback
def test_an_inductor_error_falls_back_to_eager_too(monkeypatch):
    """Inductor wraps its own failures in InductorError, a ShortenTraceback
    (which Dynamo also uses to steer itself): it is still a compile failure."""
    monkeypatch.setattr(neuron_backend_module, "compile_fx_inner", _inductor_error_inner_compile)
    compiled = torch.compile(lambda t: torch.sin(t) * 2, backend="neuron")
    x = torch.randn(8)
    with warnings.catch_warnings(record=True) as caught, torch._inductor.config.patch(force_disable_caches=True):
        warnings.simplefilter("always")
        out = compiled(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), torch.sin(x) * 2)
    assert any("injected lowering failure" in str(w.message) for w in caught)


def test_strict_mode_raises_the_compile_error():
    code = textwrap.dedent("""
        import torch, torchneuron
        from torchneuron.compile import backend
        def fail(*a, **k):
            raise RuntimeError("injected codegen failure")
        backend.compile_fx_inner = fail
        f = torch.compile(lambda x: x.sin() + 1, backend="neuron")
        x = torch.randn(4, device="neuron")
        before = torch.neuron.memory_allocated()
        try:
            f(x)
        except Exception as e:
            assert "injected codegen failure" in str(e), e
            assert torch.neuron.memory_allocated() == before
            print((torch.ones(2, device="neuron") * 3).sum().item())
        else:
            raise SystemExit("no error")
    """)
    env = dict(os.environ, TORCHNEURON_COMPILE_STRICT="1", TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("6.0")


def test_unknown_mode_and_options_are_rejected_by_name():
    f = torch.compile(lambda x: x + 1, backend="neuron", mode="fastest")
    with pytest.raises(Exception, match="unrecognized mode='fastest'"):
        f(torch.ones(2, device="neuron"))
    torch._dynamo.reset()
    g = torch.compile(lambda x: x + 2, backend="neuron", options={"no_such_option": 1})
    with pytest.raises(Exception, match="unexpected optimization option 'no_such_option'"):
        g(torch.ones(2, device="neuron"))
    torch._dynamo.reset()
    h = torch.compile(lambda x: x + 3, backend="neuron", options={"cpp_wrapper": True})
    with pytest.raises(Exception, match="'cpp_wrapper' is not supported"):
        h(torch.ones(2, device="neuron"))
    torch._dynamo.reset()
    k = torch.compile(lambda x: x + 4, backend="neuron", options={"triton.max_tiles": 2})
    with pytest.warns(UserWarning, match="'triton.max_tiles' only affects GPU"):
        out = k(torch.ones(2, device="neuron"))
    assert out.cpu().tolist() == [5.0, 5.0]


def test_tensors_on_two_devices_fail_like_eager():
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two neuron devices (NEURON_RT_NUM_CORES >= 2)")
    a = torch.randn(3, device="neuron:0")
    b = torch.randn(3, device="neuron:1")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device") as eager:
        a + b
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device") as compiled:
        torch.compile(lambda x, y: x + y, backend="neuron")(a, b)
    for err in (eager, compiled):
        assert "neuron:0" in str(err.value) and "neuron:1" in str(err.value)
    assert (a + a).device == a.device  # the device still computes


def test_metrics_reset():
    torch.compile(lambda x: x * 3, backend="neuron")(torch.ones(2, device="neuron"))
    assert torchneuron.get_dynamo_metrics()["compiled_graphs"] == 1
    torchneuron.reset_dynamo_metrics()
    metrics = torchneuron.get_dynamo_metrics()
    assert metrics["compiled_graphs"] == 0 and metrics["graph_breaks"] == 0 and metrics["fallbacks"] == 0


@pytest.mark.slow  # a second process compiles or loads from cold: slow tier
def test_a_second_process_reuses_the_on_disk_caches(tmp_path):
    code = textwrap.dedent("""
        import json, torch, torchneuron
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.body = model
            def forward(self, x):
                return self.body(x).softmax(-1)
        net = Net()
        x = torch.randn(4, 8)
        expected = net(x)
        for mode in ("default", "reduce-overhead"):
            torch._dynamo.reset()
            dev = Net().to("neuron")
            dev.load_state_dict(net.state_dict())
            compiled = torch.compile(dev, backend="neuron", mode=mode)
            for _ in range(3):
                out = compiled(x.to("neuron"))
                torch.testing.assert_close(out.cpu(), expected)
                out.sum().backward()
        print(json.dumps(torchneuron.get_dynamo_metrics()["cache_hits"]))
    """)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path))
    hits = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        hits.append(json.loads(out.stdout.strip().splitlines()[-1]))
    # The first process compiles once and its reduce-overhead run reuses that
    # graph (the mode is not part of the key); the second process compiles nothing.
    assert hits[0]["aot_autograd"] == 1 and hits[1]["aot_autograd"] == 2, hits


def test_host_scalars_read_by_compiled_kernels_are_taken_at_launch():
    def f(x, s):
        return (x * s).sin() + 1

    compiled = torch.compile(f, backend="neuron")
    x = torch.ones(1 << 18, device="neuron")
    for i in range(3):
        s = torch.tensor(float(i))
        y = compiled(x, s)
        s.fill_(100.0)  # after the launch: must not reach the queued kernel
        torch.testing.assert_close(y[:4].cpu(), f(x[:4].cpu(), torch.tensor(float(i))))


def test_a_program_compiled_by_another_build_is_never_loaded(monkeypatch):
    """Inductor's disk cache keys graphs on torch, not on the backend's code: the
    build's identity must be in the key, or an upgrade loads stale generated code."""
    from torch._dynamo.utils import counters

    from torchneuron.compile import flex_attention

    def f(x):
        return torch.tanh(x) * 3 + 1

    x = torch.randn(8, 8, device="neuron")
    want = f(x.cpu())

    def compile_once():
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(f, backend="neuron")(x).cpu(), want)
        return counters["inductor"]["fxgraph_cache_miss"], counters["inductor"]["fxgraph_cache_hit"]

    compile_once()
    miss, hit = compile_once()
    assert hit >= 1, "the same build must hit the cache"
    another = f"another-build-{os.getpid()}-{time.time_ns()}"  # never compiled before, by any run
    monkeypatch.setattr(flex_attention, "build_id", lambda: another)
    assert compile_once()[0] == miss + 1, "a program of another build was loaded"


def test_one_compile_thread_compiles_inline_without_deadlock(tmp_path):
    # With one compile thread, Inductor's submit ran the compile under the kernel's file
    # lock that load_async already held: a 600 s hang (vLLM sets one thread on import).
    code = ("import torch, torchneuron\n"
            "f = torch.compile(lambda x: torch.relu(torch.sin(x)) * 2, backend='neuron')\n"
            "x = torch.randn(100)\n"
            "assert torch.allclose(f(x.to('neuron')).cpu(), torch.relu(torch.sin(x)) * 2)\n")
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=240)
