"""Copies between host and device, as the host and autograd see them.

Device work runs on stream workers, later than the host line that launched it.
If a task body wrote the user's destination tensor through its autograd-aware
object, the worker would rewrite that tensor's autograd history (cutting its
gradient to zero, with no error) and bump its version counter behind the
host's back. Every path that shares the mechanism is here: non-blocking copies
in both directions, pinned and pageable memory, side streams, copies issued by
autograd's own device thread, graph capture and adaptive eager. Each result
and gradient is compared with the same program on CPU.
"""

import pytest
import torch

from tests.test_copies import busy
from torchneuron import adaptive

SHAPE = (5, 5, 5, 5)


def cpu_grad(fn):
    """The reference: the same program on CPU tensors."""
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0), requires_grad=True)
    (g,) = torch.autograd.grad(fn(x).sum(), [x])
    return g


def neuron_grad(fn):
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0)).to("neuron").requires_grad_()
    (g,) = torch.autograd.grad(fn(x).sum(), [x])
    return g.cpu()


# A non-blocking copy's destination may be read only once the copy is known
# complete (the sanitizer reports the read otherwise), so it synchronises.
@pytest.mark.parametrize("how", ["blocking", "blocking, synchronized", "non_blocking, synchronized", "non_blocking, event"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_the_gradient_through_a_device_to_host_copy_reaches_its_source(how, dtype):
    weight = torch.linspace(-1, 1, 625).reshape(SHAPE)

    def fn(x):
        y = x.to("cpu", dtype, non_blocking=how.startswith("non_blocking"), copy=True)
        if x.device.type == "neuron" and "synchronized" in how:
            torch.neuron.synchronize()
        if x.device.type == "neuron" and "event" in how:
            torch.neuron.current_stream().record_event().synchronize()
        return y.float() * weight

    g = neuron_grad(fn)
    torch.testing.assert_close(g, cpu_grad(fn))


def test_the_issue_snippet_prints_ones():
    x = torch.randn(5, 5, 5, 5, device="neuron", requires_grad=True)
    y = x.to("cpu", torch.float64, non_blocking=True, copy=True)
    torch.neuron.synchronize()
    (g,) = torch.autograd.grad(y.float().sum(), [x])
    assert g.cpu().unique().tolist() == [1.0]


def test_a_non_blocking_copy_leaves_the_destination_history_and_version_to_the_host():
    x = torch.randn(SHAPE, device="neuron", requires_grad=True)
    y = x.to("cpu", non_blocking=True)
    assert y.is_pinned()
    fn, version = y.grad_fn, y._version
    torch.neuron.synchronize()
    assert y.grad_fn is fn, f"the copy task replaced the history: {fn} -> {y.grad_fn}"
    assert y._version == version == torch.randn(2, requires_grad=True).to(torch.float64)._version
    torch.testing.assert_close(y, x.detach().cpu())


@pytest.mark.parametrize("non_blocking", [True, False], ids=["non_blocking", "blocking"])
def test_copy_into_a_host_tensor_that_requires_grad_sends_the_gradient_to_both_sides(non_blocking):
    def run(device):
        src = torch.arange(12.0).reshape(3, 4).to(device).requires_grad_()
        base = torch.ones(3, 4, requires_grad=True)
        dst = (base * 2).pin_memory() if device != "cpu" else base * 2
        dst.copy_(src, non_blocking=non_blocking)
        if device != "cpu":
            torch.neuron.synchronize()
        (dst * torch.arange(12.0).reshape(3, 4)).sum().backward()
        return src.grad.cpu(), base.grad

    for got, want in zip(run("neuron"), run("cpu")):
        torch.testing.assert_close(got, want)


def test_a_non_blocking_host_to_device_copy_of_pinned_memory_that_requires_grad():
    def run(device):
        leaf = torch.linspace(0, 1, 24, requires_grad=True)
        src = (leaf * 3).reshape(4, 6)
        if device != "cpu":
            src = src.pin_memory()
        version = src._version
        d = src.to(device, non_blocking=True)
        if device != "cpu":
            torch.neuron.synchronize()
        assert src._version == version
        (d * d).sum().backward()
        return leaf.grad

    torch.testing.assert_close(run("neuron"), run("cpu"))


def test_copies_on_a_side_stream_keep_the_gradient():
    s = torch.neuron.Stream()

    def fn(x):
        if x.device.type != "neuron":
            return (x * 2).to(torch.float64)
        s.wait_stream(torch.neuron.current_stream())
        with torch.neuron.stream(s):
            y = (x * 2).to("cpu", torch.float64, non_blocking=True)
            event = torch.neuron.Event()
            event.record(s)
        event.synchronize()
        return y

    torch.testing.assert_close(neuron_grad(fn), cpu_grad(fn))


def test_copies_issued_by_autograds_device_thread_keep_their_values():
    """A host leaf used on the device: its gradient comes back by a copy the
    backward pass issues from autograd's neuron thread."""

    def run(device):
        w = torch.linspace(-2, 2, 30, requires_grad=True)
        h = w.reshape(5, 6).to(device, non_blocking=True)
        y = torch.tanh(h @ h.t()).to("cpu", non_blocking=True)
        if device != "cpu":
            torch.neuron.synchronize()
        (y * torch.arange(25.0).reshape(5, 5)).sum().backward()
        return w.grad

    torch.testing.assert_close(run("neuron"), run("cpu"))


def test_a_captured_graph_replays_a_copy_into_pinned_memory_without_touching_its_history():
    x = torch.randn(8, device="neuron")
    out = torch.empty(8, pin_memory=True)
    graph = torch.accelerator.Graph()
    with graph:
        out.copy_(x * 3, non_blocking=True)
    assert out._version == 1  # the host's copy_ at capture, as on CPU
    for _ in range(3):
        graph.replay()
    torch.neuron.synchronize()
    torch.testing.assert_close(out, x.cpu() * 3)
    assert out.grad_fn is None and out._version == 1


def test_with_adaptive_eager_on_the_gradient_through_a_copy_is_kept():
    adaptive.set_enabled(True)
    try:
        def fn(x):
            y = torch.tanh(x * 2).to("cpu", torch.float64, non_blocking=True, copy=True)
            if x.device.type == "neuron":
                torch.neuron.synchronize()
            return y

        torch.testing.assert_close(neuron_grad(fn), cpu_grad(fn))
    finally:
        adaptive.set_enabled(False)
        torch.neuron.synchronize()


@pytest.mark.parametrize("non_blocking", [True, False], ids=["non_blocking", "blocking"])
def test_a_copy_back_from_pinned_memory_follows_the_copy_that_fills_it(non_blocking):
    """As on CUDA, both copies are on one stream, so the second reads what the
    first wrote, however long the stream takes to get there."""
    x = busy() * 0 + 7
    h = x.to("cpu", non_blocking=True)
    assert h.is_pinned()
    d = h.to("neuron", non_blocking=non_blocking)
    assert d.cpu().unique().tolist() == [7.0]


def test_a_blocking_copy_from_pinned_memory_has_read_it_when_it_returns():
    h = torch.full((64, 64), 3.0).pin_memory()
    busy()
    d = h.to("neuron")
    h.fill_(-1)  # the host may reuse its buffer once a blocking copy returned
    assert d.cpu().unique().tolist() == [3.0]
