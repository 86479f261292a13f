"""Device activity in torch.profiler, and its Parquet export.

References are independent of the recorder: the ops the test itself ran, the
lines it ran them from (inspect), sizes and FLOPs from closed forms, and
torch.profiler's own view of the same profile.
"""

import inspect
import json
import os
import re
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from torchneuron import _C
from torchneuron.profiler import SCHEMA_VERSION, export_parquet, parquet_trace_handler
from torchneuron.profiler.schema import TABLES

DEVICE_AND_HOST = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
DOCS = os.path.join(os.path.dirname(__file__), "..", "docs", "profiler.md")


def line_here() -> int:
    """The caller's line number."""
    return inspect.currentframe().f_back.f_lineno


def device_events(prof):
    return [e for e in prof.profiler.kineto_results.events() if e.device_type() == torch.autograd.DeviceType.PrivateUse1]


def read(directory, table):
    return pq.read_table(os.path.join(directory, f"{table}.parquet")).to_pylist()


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to("neuron")


def train_step(model, opt, x):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def test_device_activity_is_supported():
    assert ProfilerActivity.PrivateUse1 in torch.profiler.supported_activities()


def test_tasks_are_sane_and_match_torch_profiler(tmp_path):
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 32, device="neuron")
    train_step(model, opt, x)  # warm-up: first calls check their output plans
    side = torch.neuron.Stream()
    with profile(activities=DEVICE_AND_HOST) as prof:
        for _ in range(2):
            train_step(model, opt, x)
        with torch.neuron.stream(side):
            y = x * 2
        torch.neuron.synchronize()
    export_parquet(prof, tmp_path)
    tasks = read(tmp_path, "tasks")
    summary = read(tmp_path, "summary")[0]

    events = device_events(prof)
    assert Counter(e.name() for e in events) == Counter(t["name"] for t in tasks)
    assert {"aten::addmm", "aten::mm", "aten::mul.Tensor"} <= {t["name"] for t in tasks}
    by_stream = {}
    for t in tasks:
        assert summary["start_ns"] <= t["enqueue_ns"] <= t["start_ns"] <= t["end_ns"] <= summary["end_ns"]
        assert t["duration_ns"] == t["end_ns"] - t["start_ns"] and t["queued_ns"] == t["start_ns"] - t["enqueue_ns"]
        by_stream.setdefault((t["device"], t["stream"]), []).append(t)
    assert {(0, 0), (0, side.stream_id)} <= set(by_stream)
    for lane in by_stream.values():  # a stream runs its tasks in enqueue order, one at a time
        for before, after in zip(lane, lane[1:]):
            assert after["enqueue_ns"] >= before["enqueue_ns"]
            assert after["start_ns"] >= before["end_ns"]
    # Every task is linked to the host op that launched it (tasks name the overload too).
    host = {e.correlation_id(): e.name() for e in prof.profiler.kineto_results.events()
            if e.device_type() == torch.autograd.DeviceType.CPU}
    for e in events:
        assert host[e.linked_correlation_id()] == e.name().split(".")[0]
    assert torch.equal(y.cpu(), x.cpu() * 2)


def test_key_averages_charge_device_time_to_ops_and_ranges():
    a = torch.randn(128, 128, device="neuron")
    (a @ a).sum().item()
    with profile(activities=DEVICE_AND_HOST) as prof:
        with record_function("matmuls"):
            for _ in range(3):
                b = a @ a
        torch.neuron.synchronize()
    rows = {r.key: r for r in prof.key_averages()}
    assert rows["aten::mm"].count == 3
    assert rows["aten::mm"].self_device_time_total > 0
    # The range encloses the device work its ops launched.
    assert rows["matmuls"].device_time_total >= rows["aten::mm"].self_device_time_total
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=5)
    assert "NEURON" in table and "aten::mm" in table
    assert torch.allclose(b.cpu(), a.cpu() @ a.cpu(), rtol=1e-4, atol=1e-3)


def test_chrome_trace_has_named_lanes_per_stream(tmp_path):
    x = torch.randn(64, device="neuron")
    side = torch.neuron.Stream()
    with profile(activities=DEVICE_AND_HOST) as prof:
        x.add(1)
        with torch.neuron.stream(side):
            x.mul(2)
        torch.neuron.synchronize()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert {(e["name"], e["tid"]) for e in kernels} >= {("aten::add.Tensor", 0), ("aten::mul.Tensor", side.stream_id)}
    assert all(e["pid"] == 0 for e in kernels)
    names = {(e["name"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("pid") == 0 and e["name"] in ("process_name", "thread_name")}
    assert names[("process_name", 0)] == "neuron:0"
    assert names[("thread_name", 0)] == "stream 0 (default)"
    assert names[("thread_name", side.stream_id)] == f"stream {side.stream_id}"
    add = next(e for e in kernels if e["name"] == "aten::add.Tensor")
    assert add["args"]["source"].endswith(f"test_profiler.py:{line_of(test_chrome_trace_has_named_lanes_per_stream, 'x.add(1)')}")


def line_of(function, text: str) -> int:
    """Line number of the first line of `function` containing `text`."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_source_lines_costs_copies_syncs_and_memory(tmp_path):
    m, k, n = 48, 32, 16
    a_cpu, b_cpu = torch.randn(m, k), torch.randn(k, n)
    with profile(activities=DEVICE_AND_HOST) as prof:
        a = a_cpu.to("neuron"); upload_line = line_here()
        b = b_cpu.to("neuron")
        c = a @ b; mm_line = line_here()
        value = c.sum().item(); item_line = line_here()
        back = c.cpu(); download_line = line_here()
        torch.neuron.synchronize(); sync_line = line_here()
    export_parquet(prof, tmp_path)
    tasks = read(tmp_path, "tasks")
    here = os.path.realpath(__file__)

    mm = next(t for t in tasks if t["name"] == "aten::mm")
    assert (os.path.realpath(mm["source_file"]), mm["source_line"], mm["source_from"]) == (here, mm_line, "launch")
    assert mm["source_function"] == "test_source_lines_costs_copies_syncs_and_memory"
    assert mm["flops"] == 2 * m * k * n
    assert mm["bytes_read"] == (m * k + k * n) * 4 and mm["bytes_written"] == m * n * 4
    assert mm["host_op"] == "aten::mm"

    copies = read(tmp_path, "copies")
    uploads = [c for c in copies if c["direction"] == "host_to_device"]
    assert [(c["bytes"], c["source_line"]) for c in uploads] == [(m * k * 4, upload_line), (k * n * 4, upload_line + 1)]
    downloads = [c for c in copies if c["direction"] == "device_to_host"]
    assert (m * n * 4, download_line) in [(c["bytes"], c["source_line"]) for c in downloads]

    syncs = {(s["what"], s["source_line"]) for s in read(tmp_path, "syncs")}
    assert ("aten::_local_scalar_dense", item_line) in syncs  # .item()
    assert ("copy_ (device to host)", download_line) in syncs  # .cpu()
    assert ("device synchronize", sync_line) in syncs
    assert all(s["end_ns"] >= s["start_ns"] for s in read(tmp_path, "syncs"))

    memory = read(tmp_path, "memory")
    product = [r for r in memory if r["bytes"] > 0 and r["source_line"] == mm_line]
    assert product and product[0]["bytes"] >= m * n * 4 and product[0]["host_op"] == "aten::mm"
    assert memory[-1]["allocated_bytes"] == torch.neuron.memory_allocated()
    assert read(tmp_path, "summary")[0]["peak_allocated_bytes"] == max(r["allocated_bytes"] for r in memory)
    assert value == pytest.approx(float((a_cpu @ b_cpu).sum()), rel=1e-4)
    assert torch.allclose(back, a_cpu @ b_cpu, rtol=1e-4, atol=1e-4)


def test_backward_tasks_carry_their_forward_line(tmp_path):
    w = torch.randn(8, 8, device="neuron", requires_grad=True)
    x = torch.randn(4, 8, device="neuron")
    with profile(activities=DEVICE_AND_HOST) as prof:
        y = (x @ w).relu(); forward_line = line_here()
        y.sum().backward()
        torch.neuron.synchronize()
    export_parquet(prof, tmp_path)
    backward = [t for t in read(tmp_path, "tasks") if t["source_from"] == "forward"]
    assert backward, "backward tasks were not attributed"
    assert {t["source_line"] for t in backward} == {forward_line}
    # The gradient of the weight, and relu's (relu launches through clamp_min,
    # which has no autograd sequence number of its own).
    assert {"aten::mm", "aten::threshold_backward"} <= {t["name"] for t in backward}
    w_cpu = w.detach().cpu()
    expected = torch.autograd.grad((x.cpu() @ w_cpu.requires_grad_()).relu().sum(), w_cpu)[0]
    assert torch.allclose(w.grad.cpu(), expected, rtol=1e-4, atol=1e-4)


def test_parquet_files_follow_the_documented_schema(tmp_path):
    model = small_model()
    with profile(activities=DEVICE_AND_HOST) as prof:
        model(torch.randn(2, 32, device="neuron")).sum().item()
    export_parquet(prof, tmp_path)
    types = {"int64": pa.int64(), "int32": pa.int32(), "string": pa.string(), "bool": pa.bool_(),
             "double": pa.float64()}
    assert sorted(os.listdir(tmp_path)) == sorted(f"{t}.parquet" for t in TABLES)
    for table, columns in TABLES.items():
        schema = pq.read_schema(tmp_path / f"{table}.parquet")
        assert [(f.name, f.type) for f in schema] == [(c.name, types[c.type]) for c in columns]
        assert schema.metadata[b"torchneuron.schema_version"].decode() == SCHEMA_VERSION
    described = {(r["table"], r["column"]): r for r in read(tmp_path, "schema")}
    assert set(described) == {(t, c.name) for t, cols in TABLES.items() if t != "schema" for c in cols}
    assert all(r["meaning"] and r["schema_version"] == SCHEMA_VERSION for r in described.values())
    docs = open(DOCS).read()
    assert f"Schema version: {SCHEMA_VERSION}" in docs
    for table, columns in TABLES.items():
        section = re.search(rf"^### `{table}`\n(.*?)(?=^### |\Z)", docs, re.S | re.M)
        assert section, f"docs/profiler.md has no section for table {table}"
        documented = re.findall(r"^\| `(\w+)` \|", section.group(1), re.M)
        assert documented == [c.name for c in columns], f"docs/profiler.md: columns of {table}"


def test_schedule_and_on_trace_ready_export_each_cycle(tmp_path):
    start = torch.randn(16)
    x = start.to("neuron")
    x.add(1)
    handler = parquet_trace_handler(tmp_path, worker_name="w")
    with profile(activities=DEVICE_AND_HOST, schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
                 on_trace_ready=handler) as prof:
        for step in range(8):
            x = x.add(1)
            x = x.mul(1)
            prof.step()
    exports = sorted(os.listdir(tmp_path))
    assert exports == ["w.4", "w.8"]
    for name in exports:
        tasks = read(tmp_path / name, "tasks")
        # Only the two active steps: two ops each.
        assert Counter(t["name"] for t in tasks) == {"aten::add.Tensor": 2, "aten::mul.Tensor": 2}
    assert torch.allclose(x.cpu(), start + 8)


def test_graph_replay_is_one_task(tmp_path):
    x = torch.zeros(8, device="neuron")
    x.add_(0).mul_(1)  # warm up outside the capture
    graph = torch.accelerator.Graph()
    with graph:
        x.add_(1)
        x.mul_(2)
    with profile(activities=DEVICE_AND_HOST) as prof:
        graph.replay()
        torch.neuron.synchronize()
    export_parquet(prof, tmp_path)
    tasks = read(tmp_path, "tasks")
    assert [(t["name"], t["kind"]) for t in tasks] == [("graph replay", "graph")]
    assert torch.equal(x.cpu(), torch.full((8,), 2.0))  # (0 + 1) * 2


def test_recording_is_off_outside_device_profiles(tmp_path):
    x = torch.randn(4, device="neuron")
    with profile(activities=DEVICE_AND_HOST):
        x.add(1)
        assert _C._profiler_recording()
    assert not _C._profiler_recording()
    with profile(activities=[ProfilerActivity.CPU]) as cpu_only:
        assert not _C._profiler_recording()
        x.add(1)
    with pytest.raises(ValueError, match="recorded no neuron activity.*ProfilerActivity.PrivateUse1"):
        export_parquet(cpu_only, tmp_path)


def test_export_before_the_profile_stopped_is_refused(tmp_path):
    with profile(activities=DEVICE_AND_HOST) as prof:
        with pytest.raises(ValueError, match="no results yet"):
            export_parquet(prof, tmp_path)


def test_a_failing_task_under_the_profiler_still_raises_and_is_recorded(tmp_path):
    x = torch.randn(4, device="neuron")
    index = torch.tensor([7], device="neuron")  # out of range
    with profile(activities=DEVICE_AND_HOST) as prof:
        with pytest.raises(IndexError, match="aten::index"):
            x[index]
            torch.neuron.synchronize()
    export_parquet(prof, tmp_path)
    assert "aten::index.Tensor" in {t["name"] for t in read(tmp_path, "tasks")}
    assert torch.equal((x + 1).cpu(), x.cpu() + 1)  # the device is still usable


def test_interval_arithmetic():
    from torchneuron.profiler.intervals import covered, overlap, union

    spans = [(10, 20), (0, 5), (15, 30), (30, 32), (40, 41)]
    merged = union(spans)
    assert merged == [(0, 5), (10, 32), (40, 41)]
    assert covered(spans) == 5 + 22 + 1
    starts = [s for s, _ in merged]
    assert overlap(3, 12, merged, starts) == 2 + 2
    assert overlap(33, 40, merged, starts) == 0
    assert overlap(-10, 100, merged, starts) == covered(spans)


def test_compiled_kernels_and_second_device(tmp_path):
    f = torch.compile(lambda x: (x.sin() * 2 + 1).relu().sum(), backend="neuron"); compiled_line = line_here()
    x = torch.randn(256, device="neuron")
    y = torch.randn(16, device="neuron:1")
    f(x)
    with profile(activities=DEVICE_AND_HOST) as prof:
        r = f(x)
        z = y * 3; second_line = line_here()
        torch.neuron.synchronize(1)
    export_parquet(prof, tmp_path)
    tasks = read(tmp_path, "tasks")
    kernel = next(t for t in tasks if t["device"] == 0)
    assert kernel["name"].startswith("cpp_fused_")  # the kernel Inductor generated
    # Attributed to the compiled function (the frame Dynamo runs it in), not to Inductor's generated code.
    assert (kernel["source_line"], kernel["source_function"]) == (
        compiled_line, "test_compiled_kernels_and_second_device.<locals>.<lambda>")
    on_second = [t for t in tasks if t["device"] == 1]
    assert [(t["name"], t["source_line"]) for t in on_second] == [("aten::mul.Tensor", second_line)]
    assert read(tmp_path, "summary")[0]["devices"] == 2
    assert r.item() == pytest.approx(float((x.cpu().sin() * 2 + 1).relu().sum()), rel=1e-5)
    assert torch.allclose(z.cpu(), y.cpu() * 3)
