"""Streams and events: what a user relies on when code runs asynchronously.

References: CPU results computed by the test, closed forms, and ``torch.cuda``'s
documented stream/event semantics (in-order streams, ``wait_event``/``wait_stream``
ordering, ``elapsed_time`` in milliseconds between completed timing events).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

DEV = "neuron"


def _chain(x: torch.Tensor, n: int) -> torch.Tensor:
    """A chain of dependent elementwise ops; run on CPU it is the reference."""
    for _ in range(n):
        x = torch.tanh(x * 1.01 + 0.1)
    return x


# --------------------------------------------------------------------------------------
# Streams
# --------------------------------------------------------------------------------------

def test_default_and_current_stream():
    d0 = torch.neuron.default_stream()
    assert torch.neuron.current_stream() == d0
    assert d0.device == torch.device(DEV, 0)
    d1 = torch.neuron.default_stream(1)
    assert d1.device == torch.device(DEV, 1)
    assert d1 != d0
    assert torch.neuron.current_stream(1) == d1
    assert torch.neuron.default_stream("neuron:1") == d1


def test_new_streams_are_distinct_neuron_streams():
    s = torch.neuron.Stream()
    assert isinstance(s, torch.Stream)
    assert s.device == torch.device(DEV, 0)
    assert s != torch.neuron.default_stream()
    g = torch.Stream(device=DEV)
    assert g.device.type == DEV
    assert g != torch.neuron.default_stream()
    s1 = torch.neuron.Stream(device=1)
    assert s1.device == torch.device(DEV, 1)
    with torch.neuron.device(1):
        assert torch.neuron.Stream().device == torch.device(DEV, 1)


def test_high_priority_stream_computes():
    high = torch.neuron.Stream(priority=-1)
    assert high.device == torch.device(DEV, 0)
    x = torch.randn(64, 64)
    with torch.neuron.stream(high):
        y = x.to(DEV) @ x.to(DEV)
    high.synchronize()
    torch.testing.assert_close(y.cpu(), x @ x)


def test_stream_priority_attribute():
    # torch.cuda.Stream semantics: .priority reads back; default 0; lower is higher priority.
    low = torch.neuron.Stream()
    high = torch.neuron.Stream(priority=-1)
    assert low.priority == 0
    assert high.priority < low.priority


def test_stream_context_manager_sets_and_restores():
    s = torch.neuron.Stream()
    default = torch.neuron.default_stream()
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream() == s
        assert torch.accelerator.current_stream() == s
    assert torch.neuron.current_stream() == default
    # torch.Stream is itself a context manager.
    with s:
        assert torch.neuron.current_stream() == s
    assert torch.neuron.current_stream() == default
    # A None stream is a no-op (torch.cuda.stream(None)).
    with torch.neuron.stream(None):
        assert torch.neuron.current_stream() == default
    # Restored when the block raises.
    with pytest.raises(KeyError):
        with torch.neuron.stream(s):
            raise KeyError("boom")
    assert torch.neuron.current_stream() == default


def test_stream_context_on_other_device_switches_device():
    # torch.cuda.stream(s) makes s's device current inside the block.
    s1 = torch.neuron.Stream(device=1)
    assert torch.neuron.current_device() == 0
    with torch.neuron.stream(s1):
        assert torch.neuron.current_device() == 1
        assert torch.neuron.current_stream() == s1
        x = torch.arange(10.0, device=DEV) * 2
    assert torch.neuron.current_device() == 0
    assert torch.neuron.current_stream(1) == torch.neuron.default_stream(1)
    assert x.device == torch.device(DEV, 1)
    assert torch.equal(x.cpu(), torch.arange(10.0) * 2)


def test_current_stream_is_per_thread():
    # As CUDA: the current stream is a property of the host thread.
    s = torch.neuron.Stream()
    seen = {}

    def worker():
        seen["default"] = torch.neuron.current_stream() == torch.neuron.default_stream()

    with torch.neuron.stream(s):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert torch.neuron.current_stream() == s
    assert seen == {"default": True}


def test_set_stream():
    s = torch.neuron.Stream()
    default = torch.neuron.default_stream()
    try:
        torch.neuron.set_stream(s)
        assert torch.neuron.current_stream() == s
        y = torch.ones(5, device=DEV) + 1
        s.synchronize()
        assert torch.equal(y.cpu(), torch.full((5,), 2.0))
    finally:
        torch.neuron.set_stream(default)
    assert torch.neuron.current_stream() == default


def test_work_on_side_stream_then_synchronize():
    s = torch.neuron.Stream()
    x = torch.randn(128, 128)
    xd = x.to(DEV)
    torch.neuron.synchronize()
    with torch.neuron.stream(s):
        y = _chain(xd, 30)
    s.synchronize()
    assert s.query() is True
    torch.testing.assert_close(y.cpu(), _chain(x, 30))


def test_hundreds_of_queued_ops_then_one_read():
    torch.manual_seed(0)
    x = torch.randn(64, 64)
    w = torch.randn(64, 64) / 8
    xd, wd = x.to(DEV), w.to(DEV)
    ref = x
    for i in range(300):
        if i % 3 == 0:
            xd, ref = xd @ wd, ref @ w
        elif i % 3 == 1:
            xd, ref = torch.tanh(xd), torch.tanh(ref)
        else:
            xd, ref = xd * 1.5 + 0.25, ref * 1.5 + 0.25
    out = xd.cpu()  # the only synchronising read
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_in_place_updates_stay_in_order():
    x = torch.zeros(1000, device=DEV)
    for i in range(200):
        x.add_(1.0)
        x.mul_(1.0 if i % 2 else 1.0)
    assert torch.equal(x.cpu(), torch.full((1000,), 200.0))


# --------------------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------------------

def test_event_record_query_synchronize():
    e = torch.neuron.Event()
    assert e.query() is True  # never recorded: nothing to wait for (CUDA semantics)
    x = torch.randn(256, 256, device=DEV)
    for _ in range(10):
        x = torch.tanh(x @ x / 16)
    e.record()
    e.synchronize()
    assert e.query() is True
    s = torch.neuron.Stream()
    e2 = s.record_event()
    e2.synchronize()
    assert e2.query() is True


def test_event_wait_orders_default_stream_after_side_stream():
    side = torch.neuron.Stream()
    x = torch.randn(128, 128)
    xd = x.to(DEV)
    torch.neuron.synchronize()
    with torch.neuron.stream(side):
        y = _chain(xd, 40)
        e = torch.neuron.Event()
        e.record()
    e.wait()  # current (default) stream waits for the event
    z = y.sum(0)
    torch.testing.assert_close(z.cpu(), _chain(x, 40).sum(0))
    torch.neuron.synchronize()


def _synced_timing_events(n_matmuls: int):
    a = torch.randn(512, 512, device=DEV)
    torch.neuron.synchronize()
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(n_matmuls):
        a = torch.tanh(a @ a / 23)
    end.record()
    end.synchronize()
    host_ms = (time.perf_counter() - t0) * 1e3
    return start, end, host_ms


def test_elapsed_time_of_neuron_events():
    start, end, host_ms = _synced_timing_events(10)
    ms = start.elapsed_time(end)
    # Ten 512x512 matmuls take a measurable time, and device time between the two events
    # cannot exceed the host time from the first record to the end of the wait.
    assert 0 < ms <= host_ms


def test_elapsed_time_of_generic_torch_events():
    a = torch.randn(512, 512, device=DEV)
    torch.neuron.synchronize()
    start = torch.Event(device=DEV, enable_timing=True)
    mid = torch.Event(device=DEV, enable_timing=True)
    end = torch.Event(device=DEV, enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(5):
        a = torch.tanh(a @ a / 23)
    mid.record()
    for _ in range(5):
        a = torch.tanh(a @ a / 23)
    end.record()
    end.synchronize()
    host_ms = (time.perf_counter() - t0) * 1e3
    first, second, total = start.elapsed_time(mid), mid.elapsed_time(end), start.elapsed_time(end)
    assert first > 0 and second > 0
    assert total <= host_ms
    # Timestamps on one stream add up.
    assert total == pytest.approx(first + second, rel=1e-6, abs=1e-3)


def test_elapsed_time_requires_timing_events():
    a = torch.randn(64, 64, device=DEV)
    e1, e2 = torch.Event(device=DEV), torch.Event(device=DEV)  # enable_timing=False
    e1.record()
    a = a @ a
    e2.record()
    e2.synchronize()
    # torch.Event raises ValueError here, torch.cuda.Event a RuntimeError: accept either.
    with pytest.raises((RuntimeError, ValueError)):
        e1.elapsed_time(e2)
    # Unrecorded timing events cannot be timed either.
    t1, t2 = torch.Event(device=DEV, enable_timing=True), torch.Event(device=DEV, enable_timing=True)
    with pytest.raises((RuntimeError, ValueError)):
        t1.elapsed_time(t2)


# --------------------------------------------------------------------------------------
# Cross-stream ordering
# --------------------------------------------------------------------------------------

def test_wait_event_makes_writes_visible_repeatedly():
    """Stream B waits on an event recorded on stream A after a long chain that
    writes a tensor; B then reads it. Repeated to catch races."""
    a_stream, b_stream = torch.neuron.Stream(), torch.neuron.Stream()
    base = torch.randn(256, 256)
    ref = _chain(base, 20).sum(0)
    for it in range(30):
        src = base.to(DEV)
        torch.neuron.synchronize()  # src is complete before A starts
        with torch.neuron.stream(a_stream):
            x = _chain(src, 20)
            ev = torch.neuron.Event()
            ev.record(a_stream)
        with torch.neuron.stream(b_stream):
            b_stream.wait_event(ev)
            y = x.sum(0)
        b_stream.synchronize()
        torch.testing.assert_close(y.cpu(), ref, msg=lambda m: f"iteration {it}: {m}")
        torch.neuron.synchronize()


def test_wait_stream_makes_writes_visible_repeatedly():
    a_stream, b_stream = torch.neuron.Stream(), torch.neuron.Stream()
    base = torch.randn(256, 256)
    ref = _chain(base, 20) @ base
    based = base.to(DEV)
    torch.neuron.synchronize()
    for it in range(20):
        with torch.neuron.stream(a_stream):
            x = _chain(based, 20)
        b_stream.wait_stream(a_stream)
        with torch.neuron.stream(b_stream):
            y = x @ based
        b_stream.synchronize()  # y was produced on B; the read below runs on the default stream
        torch.testing.assert_close(y.cpu(), ref, msg=lambda m: f"iteration {it}: {m}")
        torch.neuron.synchronize()


def test_default_stream_waits_for_side_stream_writes_into_existing_tensor():
    # The classic pattern: a side stream fills a preallocated buffer, the default stream
    # waits for the side stream and consumes the buffer.
    side = torch.neuron.Stream()
    base = torch.randn(200, 200)
    buf = torch.zeros(200, 200, device=DEV)
    src = base.to(DEV)
    side.wait_stream(torch.neuron.current_stream())
    for it in range(20):
        with torch.neuron.stream(side):
            buf.copy_(_chain(src, 15))
        torch.neuron.current_stream().wait_stream(side)
        out = (buf * 2).cpu()
        torch.testing.assert_close(out, _chain(base, 15) * 2, msg=lambda m: f"iteration {it}: {m}")
        side.wait_stream(torch.neuron.current_stream())  # next write waits for this read
    torch.neuron.synchronize()


def test_record_stream_api_accepts_neuron_streams():
    side = torch.neuron.Stream()
    x = torch.randn(1000, device=DEV)
    x.record_stream(side)
    x.record_stream(torch.neuron.default_stream())
    x.record_stream(torch.Stream(device=DEV))
    del x
    torch.neuron.synchronize()


def test_synchronize_device_waits_for_all_streams():
    streams = [torch.neuron.Stream() for _ in range(3)]
    base = torch.randn(128, 128)
    src = base.to(DEV)
    torch.neuron.synchronize()
    outs = []
    for i, s in enumerate(streams):
        with torch.neuron.stream(s):
            outs.append(_chain(src * (i + 1), 20))
    torch.neuron.synchronize()
    for s in streams:
        assert s.query() is True
    for i, o in enumerate(outs):
        torch.testing.assert_close(o.cpu(), _chain(base * (i + 1), 20))


# --------------------------------------------------------------------------------------
# Errors raised inside asynchronous tasks
# --------------------------------------------------------------------------------------

def _bad_index(n: int) -> torch.Tensor:
    return torch.tensor([n + 10])


_FAILING_OPS = {
    # name: (fn(device) -> launches the op, op name expected in the message)
    "index_select": (lambda d: torch.index_select(torch.randn(10, device=d), 0, _bad_index(10).to(d)),
                     "index_select"),
    "gather": (lambda d: torch.gather(torch.randn(10, 4, device=d), 0, torch.full((2, 4), 20, device=d)),
               "gather"),
    "take": (lambda d: torch.take(torch.randn(10, 4, device=d), torch.tensor([100], device=d)), "take"),
    "embedding": (lambda d: torch.nn.functional.embedding(_bad_index(10).to(d), torch.randn(10, 4, device=d)),
                  None),
    "scatter_": (lambda d: torch.zeros(10, 4, device=d).scatter_(0, torch.full((2, 4), 20, device=d), 1.0),
                 "scatter"),
}


def _cpu_error_type(fn):
    try:
        fn("cpu")
    except Exception as e:  # the reference behaviour
        return type(e)
    raise AssertionError("the reference CPU call did not raise")


@pytest.mark.parametrize("name", sorted(_FAILING_OPS))
def test_in_task_error_type_matches_cpu_and_names_the_op(name):
    fn, op_name = _FAILING_OPS[name]
    expected = _cpu_error_type(fn)
    with pytest.raises(expected) as info:
        fn(DEV)
        torch.neuron.synchronize()
    if op_name is not None:
        assert op_name in str(info.value)
    # The error was consumed: the device is clean and usable again.
    torch.neuron.synchronize()
    x = torch.arange(100.0)
    torch.testing.assert_close((x.to(DEV) * 3 - 1).cpu(), x * 3 - 1)


def test_in_task_error_surfaces_at_next_sync_and_stream_stays_usable():
    x = torch.randn(10)
    xd = x.to(DEV)
    # The index is computed on the device, so the host cannot know it is bad at launch.
    idx = torch.tensor([5], device=DEV) * 4
    # A first call of a signature runs while the host waits (it validates the
    # arguments); a valid one first, so the failing call is a later one.
    torch.index_select(xd, 0, idx // 4).cpu()
    try:
        torch.index_select(xd, 0, idx)
    except IndexError:
        pytest.fail("the error of an asynchronous task was raised at launch without NEURON_LAUNCH_BLOCKING")
    later = xd * 2  # queued behind the failing task
    with pytest.raises(IndexError, match="index_select"):
        later.cpu()  # the next synchronisation reports the error
    # Only once:
    torch.neuron.synchronize()
    # The same stream keeps working and computes correctly, including work queued behind the error.
    torch.testing.assert_close(later.cpu(), x * 2)
    for _ in range(50):
        xd = xd * 1.1 + 0.1
        x = x * 1.1 + 0.1
    torch.testing.assert_close(xd.cpu(), x)


def test_in_task_error_surfaces_at_item():
    xd = torch.randn(10, device=DEV)
    y = torch.index_select(xd, 0, torch.tensor([30], device=DEV))
    with pytest.raises(IndexError, match="index_select"):
        y.sum().item()
    assert (xd[:3] * 0 + 1).sum().item() == 3.0


def test_in_task_error_on_side_stream():
    side = torch.neuron.Stream()
    xd = torch.randn(10, device=DEV)
    torch.neuron.synchronize()
    with torch.neuron.stream(side):
        torch.index_select(xd, 0, torch.tensor([30], device=DEV))
    with pytest.raises(IndexError, match="index_select"):
        side.synchronize()
    # The side stream and the default stream both still work.
    with torch.neuron.stream(side):
        y = xd * 2
    side.synchronize()
    torch.testing.assert_close(y.cpu(), xd.cpu() * 2)


def test_in_task_error_surfaces_at_device_synchronize():
    side = torch.neuron.Stream()
    xd = torch.randn(10, device=DEV)
    torch.take(xd, torch.tensor([9], device=DEV))  # validates the signature (a first call waits)
    torch.neuron.synchronize()
    with torch.neuron.stream(side):
        torch.take(xd, torch.tensor([99], device=DEV))
    with pytest.raises(IndexError, match="take"):
        torch.neuron.synchronize()
    torch.neuron.synchronize()


_LAUNCH_BLOCKING_SCRIPT = """
    import json, traceback, torch
    out = {}
    x = torch.randn(10, device="neuron")
    idx = torch.tensor([5], device="neuron") * 4
    try:
        y = torch.index_select(x, 0, idx)  # LAUNCH LINE
        out["raised_at_launch"] = False
    except Exception as e:
        out["raised_at_launch"] = True
        out["type"] = type(e).__name__
        out["message"] = str(e)
        out["lineno"] = traceback.extract_tb(e.__traceback__)[0].lineno
    try:
        out["after"] = (x * 2 - x).cpu().tolist() == x.cpu().tolist()
    except Exception as e:
        out["after_error"] = repr(e)
    print(json.dumps(out))
"""


def test_launch_blocking_raises_at_the_launching_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "TORCHNEURON_"))}
    env["NEURON_LAUNCH_BLOCKING"] = "1"
    script = textwrap.dedent(_LAUNCH_BLOCKING_SCRIPT)
    launch_lineno = 1 + next(i for i, ln in enumerate(script.splitlines()) if "LAUNCH LINE" in ln)
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["raised_at_launch"] is True, out
    assert out["type"] == "IndexError"  # as CPU's index_select
    assert "index_select" in out["message"]
    assert out["lineno"] == launch_lineno, out
    # The process carries on normally after the error.
    assert out.get("after") is True, out


def test_resize_on_a_side_stream_keeps_old_contents_until_copied():
    # resize_ copies the old contents on the current (busy) side stream; the
    # old block, allocated on the default stream, must not be reused there
    # before that copy has run.
    n = 1024
    x = torch.arange(n, dtype=torch.float32, device="neuron")
    big = torch.randn(600, 600, device="neuron")
    torch.neuron.synchronize()
    side = torch.neuron.Stream()
    with torch.neuron.stream(side):
        for _ in range(4):
            big = big @ big
        x.resize_(2 * n)
    y = torch.empty(n, device="neuron")
    y.fill_(-7.0)
    torch.neuron.synchronize()
    assert torch.equal(x[:n].cpu(), torch.arange(n, dtype=torch.float32))
