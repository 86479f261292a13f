"""Copies between host and neuron devices, and serialization of neuron tensors.

Every expected value is the CPU tensor the data came from (or the same
computation on CPU); results are read back with ``.cpu()`` and compared
with ``torch.testing.assert_close``.
"""

import copy
import io

import pytest
import torch
import torch.nn.functional as F

N0 = torch.device("neuron", 0)
N1 = torch.device("neuron", 1)


@pytest.fixture(autouse=True)
def _two_devices():
    assert torch.neuron.device_count() >= 2, "these tests expect two neuron devices (NEURON_RT_NUM_CORES default 2)"


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-100, 100, shape, generator=g).to(dtype)


def same(dev_tensor, expected, device=None, **tol):
    if device is None:
        assert dev_tensor.device.type == "neuron", f"{dev_tensor.device} is not a neuron device"
    else:
        assert dev_tensor.device == torch.device(device), f"{dev_tensor.device} != {device}"
    assert dev_tensor.dtype == expected.dtype, f"{dev_tensor.dtype} != {expected.dtype}"
    assert dev_tensor.shape == expected.shape
    torch.testing.assert_close(dev_tensor.cpu(), expected, rtol=tol.get("rtol", 0), atol=tol.get("atol", 0))


def busy(device=N0):
    """Queue enough work on the device's current stream that later launches
    wait behind it: exposes copies that do not respect stream order."""
    a = torch.randn(384, 384, device=device)
    for _ in range(12):
        a = torch.tanh(a @ a * 0.01)
    return a


# --------------------------------------------------------------------------- host <-> device

@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool],
    ids=str,
)
def test_host_device_round_trip(dtype):
    x = rand(5, 7, dtype=dtype) if dtype != torch.bool else rand(5, 7) > 0
    d = x.to("neuron")
    assert d.device == N0 and d.dtype == dtype and d.is_contiguous()
    same(d, x)
    back = d.cpu()
    assert back.device.type == "cpu"
    torch.testing.assert_close(back, x, rtol=0, atol=0)
    assert back.data_ptr() != x.data_ptr()


def test_complex_round_trip():
    x = torch.randn(4, 3, dtype=torch.complex64)
    same(x.to("neuron"), x)


def test_copy_methods_and_factories():
    x = rand(3, 4)
    same(x.neuron(), x, device=N0)
    same(x.neuron(1), x, device=N1)
    same(x.to(device="neuron:1"), x, device=N1)
    same(torch.tensor(x.tolist(), device="neuron"), x)
    same(torch.as_tensor(x, device="neuron"), x)
    d = torch.empty(3, 4, device="neuron")
    d.copy_(x)
    same(d, x)
    assert d.cpu().tolist() == x.tolist()
    s = torch.tensor(4.25)
    same(s.to("neuron"), s)
    e = torch.empty(0, 3)
    same(e.to("neuron"), e)
    same(e.to("neuron").cpu(), e, device="cpu")


def test_to_same_device_returns_self():
    d = rand(3, 4).to("neuron")
    assert d.to("neuron") is d
    assert d.to(N0) is d
    c = d.to("neuron", copy=True)
    assert c is not d and c.data_ptr() != d.data_ptr()
    same(c, d.cpu())


def test_noncontiguous_sources_host_to_device():
    x = rand(6, 8)
    same(x.t().to("neuron"), x.t())
    same(x[:, 1::3].to("neuron"), x[:, 1::3])
    same(x[2:5].to("neuron"), x[2:5])
    same(x.flip(1)[::2].to("neuron"), x.flip(1)[::2])
    col = rand(6, 1)
    same(col.expand(6, 5).to("neuron"), col.expand(6, 5))
    same(x.unsqueeze(0).expand(3, 6, 8).permute(2, 0, 1).to("neuron"), x.unsqueeze(0).expand(3, 6, 8).permute(2, 0, 1))
    same(x.as_strided((3, 3), (1, 8), 2).to("neuron"), x.as_strided((3, 3), (1, 8), 2))


def test_noncontiguous_sources_device_to_host():
    x = rand(6, 8)
    d = x.to("neuron")
    torch.testing.assert_close(d.t().cpu(), x.t(), rtol=0, atol=0)
    torch.testing.assert_close(d[:, 1::3].cpu(), x[:, 1::3], rtol=0, atol=0)
    torch.testing.assert_close(d[3:].cpu(), x[3:], rtol=0, atol=0)
    torch.testing.assert_close(d[:1].expand(4, 8).cpu(), x[:1].expand(4, 8), rtol=0, atol=0)
    torch.testing.assert_close(d.permute(1, 0)[::2, 1:].cpu(), x.permute(1, 0)[::2, 1:], rtol=0, atol=0)


def test_noncontiguous_destinations():
    x = rand(6, 8)
    src = rand(8, 6, seed=1)
    # host -> transposed device destination
    d, c = x.to("neuron"), x.clone()
    d.t().copy_(src)
    c.t().copy_(src)
    same(d, c)
    # host -> sliced device destination leaves the rest of the base alone
    d, c = x.to("neuron"), x.clone()
    d[1:5, ::3].copy_(src[:4, :3])
    c[1:5, ::3].copy_(src[:4, :3])
    same(d, c)
    # device -> sliced host destination
    h = torch.zeros(6, 8)
    hc = torch.zeros(6, 8)
    h[:, 2:4].copy_(d[:, :2])
    hc[:, 2:4].copy_(c[:, :2])
    torch.testing.assert_close(h, hc, rtol=0, atol=0)
    # device -> transposed host destination
    h = torch.zeros(8, 6).t()
    h.copy_(d)
    torch.testing.assert_close(h, c, rtol=0, atol=0)
    # device -> device, non-contiguous on both sides
    d2 = torch.zeros(8, 6, device="neuron")
    c2 = torch.zeros(8, 6)
    d2[::2].copy_(d.t()[1::2])
    c2[::2].copy_(c.t()[1::2])
    same(d2, c2)


def test_copy_into_expanded_destination_raises_like_cpu():
    src = rand(4, 5)
    with pytest.raises(RuntimeError) as cpu_err:
        torch.zeros(1, 5).expand(4, 5).copy_(src)
    with pytest.raises(type(cpu_err.value)):
        torch.zeros(1, 5, device="neuron").expand(4, 5).copy_(src)
        torch.neuron.synchronize()
    with pytest.raises(type(cpu_err.value)):
        torch.zeros(1, 5, device="neuron").expand(4, 5).copy_(src.to("neuron"))
        torch.neuron.synchronize()


def test_broadcasting_copy():
    row = rand(5)
    for src in (row, row.to("neuron"), row.to("neuron:1")):
        d = torch.zeros(4, 5, device="neuron")
        d.copy_(src)
        same(d, row.expand(4, 5).contiguous())
    col = rand(4, 1)
    d = torch.zeros(4, 5, device="neuron")
    d.copy_(col.to("neuron"))
    same(d, col.expand(4, 5).contiguous())
    d.copy_(torch.tensor(2.5))
    same(d, torch.full((4, 5), 2.5))
    h = torch.zeros(3, 4, 5)
    h.copy_(d)
    torch.testing.assert_close(h, torch.full((3, 4, 5), 2.5))
    with pytest.raises(RuntimeError):
        torch.zeros(4, 5).copy_(rand(3))
    with pytest.raises(RuntimeError):  # may surface at the next synchronisation
        torch.zeros(4, 5, device="neuron").copy_(rand(3))
        torch.neuron.synchronize()
    with pytest.raises(RuntimeError):
        torch.zeros(4, 5, device="neuron").copy_(rand(3).to("neuron"))
        torch.neuron.synchronize()
    d = torch.zeros(4, 5, device="neuron")  # the device still works
    d.copy_(row)
    same(d, row.expand(4, 5).contiguous())


# --------------------------------------------------------------------------- dtype conversion

def test_dtype_conversion_during_copy():
    x = rand(4, 6) * 10
    same(x.to("neuron", torch.float16), x.to(torch.float16))
    same(x.to("neuron", dtype=torch.bfloat16), x.to(torch.bfloat16))
    same(x.to("neuron", torch.int32), x.to(torch.int32))
    same(x.to("neuron", torch.float64), x.to(torch.float64))
    same(x.to("neuron", torch.bool), x.to(torch.bool))
    same(x.to("neuron").to(torch.float16), x.to(torch.float16))
    same(x.to("neuron").half().float(), x.half().float())
    same(x.to("neuron").to("neuron:1", torch.bfloat16), x.to(torch.bfloat16), device=N1)
    torch.testing.assert_close(x.to("neuron").to("cpu", torch.float64), x.double(), rtol=0, atol=0)
    i = rand(4, 6, dtype=torch.int64)
    same(i.to("neuron", torch.float32), i.float())
    same(i.to("neuron", torch.uint8), i.to(torch.uint8))  # wraps like CPU
    same(x.t().to("neuron", torch.float16), x.t().half())


def test_copy_between_dtypes():
    x = rand(4, 6) * 10
    for src_dt, dst_dt in [(torch.float32, torch.float16), (torch.float16, torch.float32), (torch.float32, torch.int64),
                           (torch.int64, torch.bfloat16), (torch.bool, torch.float32), (torch.float64, torch.float32)]:
        src = x.to(src_dt) if src_dt != torch.bool else x > 0
        expected = torch.empty(4, 6, dtype=dst_dt).copy_(src)
        # host -> device
        d = torch.empty(4, 6, dtype=dst_dt, device="neuron")
        d.copy_(src)
        same(d, expected)
        # device -> device (same device and across devices)
        d2 = torch.empty(4, 6, dtype=dst_dt, device="neuron")
        d2.copy_(src.to("neuron"))
        same(d2, expected)
        d3 = torch.empty(4, 6, dtype=dst_dt, device="neuron:1")
        d3.copy_(src.to("neuron:0"))
        same(d3, expected, device=N1)
        # device -> host
        h = torch.empty(4, 6, dtype=dst_dt)
        h.copy_(src.to("neuron"))
        torch.testing.assert_close(h, expected, rtol=0, atol=0)
    c = torch.randn(3, 3, dtype=torch.complex64)
    d = torch.empty(3, 3, dtype=torch.complex128, device="neuron").copy_(c.to("neuron"))
    same(d, c.to(torch.complex128))


# --------------------------------------------------------------------------- device <-> device

def test_device_to_device_same_device():
    x = rand(5, 6)
    d = x.to("neuron")
    c = d.clone()
    assert c.data_ptr() != d.data_ptr()
    same(c, x)
    e = torch.empty_like(d).copy_(d)
    same(e, x)
    d.add_(1)  # the copies are independent of the source
    same(c, x)
    same(e, x)
    same(d, x + 1)


def test_cross_device_round_trip():
    x = rand(5, 6)
    d0 = x.to("neuron:0")
    d1 = d0.to("neuron:1")
    assert d1.device == N1
    same(d1, x, device=N1)
    back = d1.to("neuron:0")
    assert back.device == N0
    same(back, x, device=N0)
    same(d0.t().to("neuron:1"), x.t(), device=N1)
    same(d0[:, ::2].to("neuron:1"), x[:, ::2], device=N1)
    dst = torch.zeros(6, 5, device="neuron:1")
    dst.copy_(d0.t())
    same(dst, x.t().contiguous(), device=N1)
    dst0 = torch.zeros(5, 6, device="neuron:0")
    dst0[1:].copy_(d1[1:])
    expected = x.clone()
    expected[0] = 0
    same(dst0, expected, device=N0)


def test_cross_device_copy_respects_both_streams():
    """A cross-device copy sees every write queued before it on the source
    device, and later ops on the destination see the copied data."""
    x = rand(256, 256)
    d0 = x.to("neuron:0")
    busy(N0)
    y0 = (d0 @ d0).relu_()  # queued behind the busy work on neuron:0
    y1 = y0.to("neuron:1")
    z1 = y1 * 2
    expected = (x @ x).relu_()
    same(z1, expected * 2, device=N1, rtol=1e-4, atol=1e-4)
    # and the other direction
    busy(N1)
    w1 = z1 - 1
    w0 = w1.to("neuron:0")
    same(w0, expected * 2 - 1, device=N0, rtol=1e-4, atol=1e-4)


def test_copy_is_stream_ordered_with_compute():
    """An op queued before an overwrite of its input sees the old value."""
    x = rand(64, 64)
    d = x.to("neuron")
    busy(N0)
    y = d * 2  # queued, still pending
    d.copy_(torch.zeros(64, 64))  # overwrite the input afterwards
    same(y, x * 2)
    same(d, torch.zeros(64, 64))
    h = torch.empty(64, 64)
    z = d + 5
    h.copy_(z)  # device -> host waits for z
    torch.testing.assert_close(h, torch.full((64, 64), 5.0))


# --------------------------------------------------------------------------- non_blocking

@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])
def test_non_blocking_host_to_device(pinned):
    x = rand(1000, 100)
    src = x.pin_memory() if pinned else x.clone()
    assert src.is_pinned() == pinned
    busy()
    d = src.to("neuron", non_blocking=True)
    assert d.device == N0
    out = d * 3
    same(out, x * 3)
    d2 = torch.empty(1000, 100, device="neuron")
    d2.copy_(src, non_blocking=True)
    torch.neuron.synchronize()
    same(d2, x)


@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])
def test_non_blocking_device_to_host(pinned):
    x = rand(1000, 100)
    d = x.to("neuron")
    busy()
    y = d * 3
    h = torch.empty(1000, 100, pin_memory=pinned)
    h.copy_(y, non_blocking=True)
    if pinned:
        torch.neuron.synchronize()  # a non-blocking copy into pinned memory completes with the stream
    torch.testing.assert_close(h, x * 3)
    r = y.to("cpu", non_blocking=True)
    torch.neuron.synchronize()
    assert r.device.type == "cpu"
    torch.testing.assert_close(r, x * 3)


def test_non_blocking_pinned_round_trip_with_event():
    x = rand(512, 512)
    src = x.pin_memory()
    dst = torch.empty(512, 512).pin_memory()
    d = src.to("neuron", non_blocking=True)
    y = d.mul(2).add_(1)
    dst.copy_(y, non_blocking=True)
    ev = torch.neuron.Event()
    ev.record()
    ev.synchronize()
    torch.testing.assert_close(dst, x * 2 + 1)


def test_pageable_source_modified_after_non_blocking_copy():
    """Pageable memory is staged: changing the source after the call returns
    must not change what lands on the device (CUDA semantics)."""
    for trial in range(3):
        x = rand(2048, 1024, seed=trial)  # 8 MiB
        src = x.clone()
        busy()  # the copy would otherwise run immediately
        d = src.to("neuron", non_blocking=True)
        src.fill_(-1.0)  # right after the copy returned
        same(d, x)
        dst = torch.empty(2048, 1024, device="neuron")
        src = x.clone()
        busy()
        dst.copy_(src, non_blocking=True)
        src.zero_()
        del src
        same(dst, x)


def test_blocking_copy_source_modified_afterwards():
    x = rand(300, 300)
    src = x.clone()
    busy()
    d = src.to("neuron")
    src.add_(100)
    same(d, x)


# --------------------------------------------------------------------------- large tensors

def test_large_tensor_round_trip():
    n = 8 * 1024 * 1024
    x = torch.arange(n, dtype=torch.int64).to(torch.float32).mul_(0.5)
    d = x.to("neuron")
    assert d.numel() == n
    back = d.cpu()
    assert torch.equal(back, x)
    assert d.sum().item() == pytest.approx(x.double().sum().item(), rel=1e-5)
    d1 = d.to("neuron:1")
    assert torch.equal(d1[-1000:].cpu(), x[-1000:])
    assert torch.equal(d1.cpu(), x)
    h = d.to("neuron", torch.float16).cpu()
    assert torch.equal(h, x.half())
    t = x.view(2048, 4096).t()
    assert torch.equal(t.to("neuron").cpu(), t)


# --------------------------------------------------------------------------- serialization

def _roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def test_save_load_tensors_keep_device():
    x, y = rand(3, 4), rand(5, dtype=torch.int64)
    obj = {"a": x.to("neuron:0"), "b": y.to("neuron:1"), "h": x.to("neuron", torch.bfloat16)}
    out = _roundtrip(obj)
    same(out["a"], x, device=N0)
    same(out["b"], y, device=N1)
    same(out["h"], x.bfloat16(), device=N0)


@pytest.mark.parametrize(
    "map_location,expected",
    [("cpu", torch.device("cpu")), ("neuron:1", N1), (torch.device("neuron", 0), N0), ("neuron", N0)],
    ids=["cpu", "neuron:1", "device(neuron,0)", "neuron"],
)
def test_save_load_map_location(map_location, expected):
    x, y = rand(3, 4), rand(6)
    out = _roundtrip({"a": x.to("neuron:0"), "b": y.to("neuron:1"), "c": x}, map_location=map_location)
    for k, ref in (("a", x), ("b", y)):
        assert out[k].device == expected, f"{k} loaded on {out[k].device}, expected {expected}"
        torch.testing.assert_close(out[k].cpu(), ref, rtol=0, atol=0)
    # map_location moves CPU-saved tensors too
    assert out["c"].device == expected
    torch.testing.assert_close(out["c"].cpu(), x, rtol=0, atol=0)


def test_save_load_map_location_dict_and_callable():
    x = rand(3, 4)
    out = _roundtrip({"a": x.to("neuron:0"), "b": x.to("neuron:1")}, map_location={"neuron:0": "neuron:1", "neuron:1": "neuron:0"})
    same(out["a"], x, device=N1)
    same(out["b"], x, device=N0)
    out = _roundtrip(x.to("neuron:1"), map_location=lambda storage, loc: storage)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, x, rtol=0, atol=0)


def test_save_load_cpu_tensor_to_neuron(tmp_path):
    x = rand(4, 4)
    p = tmp_path / "t.pt"
    torch.save(x, p)
    out = torch.load(p, map_location="neuron:1")
    same(out, x, device=N1)


def test_save_load_preserves_views_and_sharing():
    x = rand(4, 6)
    base = x.to("neuron")
    obj = {"base": base, "view": base[1:, ::2], "t": base.t()}
    for kwargs in ({}, {"map_location": "neuron:1"}):
        out = _roundtrip(obj, **kwargs)
        same(out["view"], x[1:, ::2], device=out["base"].device)
        assert out["view"].stride() == base[1:, ::2].stride()
        same(out["t"], x.t(), device=out["base"].device)
        # the loaded tensors still share one storage
        out["base"].zero_()
        same(out["view"], torch.zeros(3, 3), device=out["base"].device)
        same(out["t"], torch.zeros(6, 4), device=out["base"].device)


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))


def test_module_state_dict_round_trip(tmp_path):
    torch.manual_seed(0)
    ref = _mlp()
    model = copy.deepcopy(ref).to("neuron")
    sd_ref = ref.state_dict()
    p = tmp_path / "model.pt"
    torch.save(model.state_dict(), p)
    for map_location, expected in ((None, N0), ("cpu", torch.device("cpu")), ("neuron:1", N1), (torch.device("neuron", 0), N0)):
        sd = torch.load(p, map_location=map_location)
        assert sd.keys() == sd_ref.keys()
        for k, v in sd.items():
            assert v.device == expected, f"{k} on {v.device}, expected {expected}"
            torch.testing.assert_close(v.cpu(), sd_ref[k], rtol=0, atol=0)
    # a CPU model loads a neuron checkpoint mapped to CPU and computes the same thing
    fresh = _mlp()
    fresh.load_state_dict(torch.load(p, map_location="cpu"))
    x = rand(5, 8)
    torch.testing.assert_close(fresh(x), ref(x))
    # a neuron:1 model loads a neuron:0 checkpoint without map_location (copied to its params' device)
    m1 = _mlp().to("neuron:1")
    m1.load_state_dict(torch.load(p))
    assert all(q.device == N1 for q in m1.parameters())
    torch.testing.assert_close(m1(x.to("neuron:1")).cpu(), ref(x), rtol=1e-5, atol=1e-5)


def _train_step(model, opt, x, y):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def test_optimizer_state_round_trip():
    torch.manual_seed(0)
    ref = _mlp()
    model = copy.deepcopy(ref).to("neuron")
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = rand(16, 8, seed=3), torch.randint(0, 3, (16,), generator=torch.Generator().manual_seed(4))
    _train_step(ref, ref_opt, x, y)
    _train_step(model, opt, x.to("neuron"), y.to("neuron"))

    ref_state = ref_opt.state_dict()["state"]
    for map_location, expected in ((None, N0), ("cpu", torch.device("cpu")), ("neuron:1", N1), (torch.device("neuron", 0), N0)):
        sd = _roundtrip(opt.state_dict(), map_location=map_location)
        assert sd["param_groups"] == ref_opt.state_dict()["param_groups"]
        assert sd["state"].keys() == ref_state.keys()
        for pid, st in sd["state"].items():
            for name in ("exp_avg", "exp_avg_sq"):
                assert st[name].device == expected, f"state[{pid}][{name}] on {st[name].device}, expected {expected}"
                torch.testing.assert_close(st[name].cpu(), ref_state[pid][name], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(st["step"].cpu(), ref_state[pid]["step"])

    # resuming from the checkpoint continues exactly like the CPU run
    model_sd = _roundtrip(model.state_dict(), map_location="cpu")
    opt_sd = _roundtrip(opt.state_dict(), map_location="cpu")
    resumed = _mlp()
    resumed.load_state_dict(model_sd)
    resumed = resumed.to("neuron:1")
    resumed_opt = torch.optim.AdamW(resumed.parameters(), lr=1e-2)
    resumed_opt.load_state_dict(opt_sd)
    for st in resumed_opt.state.values():
        assert st["exp_avg"].device == N1  # moved to the parameters' device
    for _ in range(3):
        _train_step(ref, ref_opt, x, y)
        _train_step(resumed, resumed_opt, x.to("neuron:1"), y.to("neuron:1"))
    for p, q in zip(resumed.parameters(), ref.parameters()):
        assert p.device == N1
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-5)
