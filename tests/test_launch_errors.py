"""When errors and warnings of eager ops surface (issue 27).

CUDA validates an op's arguments on the host and raises at the call; only
device-side asserts (an index value out of range inside a kernel) surface at a
later synchronisation. The emulator runs the CPU kernel, checks included, in a
task on a stream worker: the first call of each op signature therefore waits
for its task, so argument errors and warnings surface at the call, with the CPU
kernel's own type and message. CPU is the reference for both.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

DEV = "neuron"


def _cpu_error(fn, *cpu_args):
    with pytest.raises(Exception) as info:
        fn(*cpu_args)
    return info.value


# Argument errors the CPU kernel raises in its body (the Meta kernel accepts
# them), each as (name, op, make CPU arguments).
_ARGUMENT_ERRORS = [
    ("index_fill_ complex value into int",
     lambda x, i: x.index_fill_(1, i, 1 + 1j),
     lambda: (torch.zeros(3, 4, dtype=torch.int64), torch.tensor([0, 2]))),
    ("mm float32 @ float64",
     lambda a, b: torch.mm(a, b),
     lambda: (torch.ones(2, 3), torch.ones(3, 2, dtype=torch.float64))),
    ("add with float alpha on integers",
     lambda a, b: torch.add(a, b, alpha=1.5),
     lambda: (torch.ones(3, dtype=torch.int64), torch.ones(3, dtype=torch.int64))),
    ("add out= float result into long",
     lambda a, out: torch.add(a, a, out=out),
     lambda: (torch.ones(3), torch.empty(3, dtype=torch.int64))),
    ("masked_fill_ with a non-bool mask",
     lambda x, m: x.masked_fill_(m, 1.0),
     lambda: (torch.zeros(4), torch.tensor([1, 0, 1, 0]))),
]


@pytest.mark.parametrize("name,op,make", _ARGUMENT_ERRORS, ids=[e[0] for e in _ARGUMENT_ERRORS])
def test_argument_errors_raise_at_the_call_with_the_cpu_error(name, op, make):
    expected = _cpu_error(op, *make())
    for attempt in range(2):  # the same signature again: it must raise again, at the call
        args = [a.to(DEV) for a in make()]
        with pytest.raises(type(expected)) as info:
            op(*args)
        assert str(expected).splitlines()[0] in str(info.value), (attempt, str(info.value))
    # The error was taken at the call: nothing is left to surface later, and
    # the device keeps working.
    torch.neuron.synchronize()
    x = torch.arange(4.0, device=DEV)
    assert (x * 2).sum().item() == 12.0


def test_only_the_first_call_of_a_signature_waits():
    """Validation costs one wait per signature, not one per call."""
    a = torch.randn(768, 768, device=DEV) / 28  # keeps the products near unit scale
    stream = torch.neuron.current_stream()
    b = a @ a  # a new signature: the call returns once its task has run
    assert stream.query()
    for _ in range(4):
        b = b @ a  # validated: these return at once, queued behind each other
    assert not stream.query()
    torch.neuron.synchronize()
    ref = a.cpu() @ a.cpu()
    for _ in range(4):
        ref = ref @ a.cpu()
    torch.testing.assert_close(b.cpu(), ref, rtol=1e-3, atol=1e-2)


def test_value_dependent_errors_stay_asynchronous_and_name_the_op():
    """An index out of range is a device-side assert on CUDA: it surfaces at the
    next synchronisation, naming the op. A first call validates the signature,
    so the bad index comes on a later call."""
    x = torch.arange(5.0, device=DEV)
    good = torch.tensor([0, 4], device=DEV)
    torch.index_select(x, 0, good).cpu()
    bad = torch.tensor([0, 9], device=DEV)
    y = torch.index_select(x, 0, bad)  # does not raise here
    with pytest.raises(IndexError, match="index_select"):
        torch.neuron.synchronize()
    del y
    torch.neuron.synchronize()  # taken once


# ----------------------------------------------------------------------------- warnings


def _deprecated_mask_index(t, m):
    return t[m]


def test_kernel_warnings_reach_python_warnings_at_the_call():
    t = torch.arange(3.0)
    m = torch.tensor([1, 0, 1], dtype=torch.uint8)
    with warnings.catch_warnings(record=True) as cpu:
        warnings.simplefilter("always")
        _deprecated_mask_index(t, m)
    assert any("uint8" in str(w.message) for w in cpu), "CPU reference no longer warns"
    for call in range(2):  # first and later calls of the signature
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            r = _deprecated_mask_index(t.to(DEV), m.to(DEV))
        assert [str(w.message) for w in got] == [str(w.message) for w in cpu], call
        torch.testing.assert_close(r.cpu(), t[m.bool()])


def test_warning_filters_apply_to_kernel_warnings():
    t, m = torch.arange(3.0, device=DEV), torch.tensor([1, 0, 1], dtype=torch.uint8, device=DEV)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="uint8"):
            t[m]
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("ignore")
        t[m]
    assert got == []


def test_internal_out_variant_attempts_do_not_warn():
    """The launcher tries an op's out= kernel first; a refused attempt (here a
    resize of a scratch output) must not leak its warning to the user, since
    the user called the functional op."""
    p, y = torch.rand(3), torch.rand(3)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        r = F.binary_cross_entropy(p.to(DEV), y.to(DEV))
        r.cpu()
    assert [str(w.message) for w in got] == []
    torch.testing.assert_close(r.cpu(), F.binary_cross_entropy(p, y))


# ----------------------------------------------------------------------------- quantized tensors


@pytest.mark.parametrize("make", [
    lambda x: torch.quantize_per_tensor(x, 0.1, 0, torch.quint8),
    lambda x: torch.quantize_per_channel(x.view(2, 2), torch.tensor([0.1, 0.2], device=x.device),
                                         torch.tensor([0, 0], device=x.device), 0, torch.qint8),
    lambda x: torch.empty(4, dtype=torch.qint8, device=x.device),
    lambda x: torch._empty_affine_quantized([4], scale=0.1, zero_point=0, dtype=torch.quint8, device=x.device),
    lambda x: torch.quantize_per_tensor(x.cpu(), 0.1, 0, torch.quint8).to(x.device),
], ids=["quantize_per_tensor", "quantize_per_channel", "empty", "_empty_affine_quantized", "copy to neuron"])
def test_quantized_tensors_are_refused_at_the_call(make):
    """Never a silently different dtype: PyTorch's quantized tensors are a CPU
    feature; neuron refuses them clearly (TorchAO's layouts are plain tensors)."""
    x = torch.randn(4, device=DEV)
    with pytest.raises(NotImplementedError, match="quantized"):
        make(x)
    torch.neuron.synchronize()
    torch.testing.assert_close((x * 2).cpu(), x.cpu() * 2)


def test_device_capability_lists_no_quantized_dtypes():
    dtypes = torch.accelerator.get_device_capability(DEV)["supported_dtypes"]
    assert torch.float32 in dtypes and torch.bfloat16 in dtypes
    assert not {torch.quint8, torch.qint8, torch.qint32} & set(dtypes)


# ----------------------------------------------------------------------------- autocast and the legacy profiler


def test_autocast_refuses_what_cuda_autocast_refuses():
    p, y = torch.rand(3, device=DEV), torch.rand(3, device=DEV)
    with torch.autocast(DEV, dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, y)
        # what the message recommends works
        F.binary_cross_entropy_with_logits(p, y).cpu()
    F.binary_cross_entropy(p, y).cpu()  # outside autocast it is fine


def test_legacy_autograd_profiler_reports_device_times(capfd):
    a = torch.randn(128, 128, device=DEV)
    with torch.autograd.profiler.profile(use_device=DEV) as prof:
        for _ in range(3):
            b = a @ a
        b.cpu()
    err = capfd.readouterr().err
    assert "not enabled" not in err
    mm = [e for e in prof.function_events if e.name == "aten::mm"]
    assert len(mm) == 3
    for e in mm:
        assert 0 <= e.cpu_time_total < 60e6  # microseconds
        assert 0 <= e.device_time_total < 60e6
    assert sum(e.device_time_total for e in mm) > 0
    assert "aten::mm" in prof.key_averages().table(sort_by="cpu_time_total")


@pytest.mark.parametrize("poll", ["stream", "event"])
def test_polling_a_stream_or_event_reports_a_failed_task(poll):
    """As CUDA's query returns the error: a loop that polls instead of
    synchronising must not go on to read a failed result."""
    x = torch.arange(5.0, device=DEV)
    torch.take(x, torch.tensor([4], device=DEV)).cpu()  # validates the signature
    y = torch.take(x, torch.tensor([40], device=DEV))  # fails on the device, later
    stream = torch.neuron.current_stream()
    done = stream.record_event() if poll == "event" else None
    with pytest.raises(IndexError, match="take"):
        while not (done.query() if done is not None else stream.query()):
            pass
    del y
    torch.neuron.synchronize()  # the error was taken by the query
    assert stream.query()
