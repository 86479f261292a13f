"""Adaptive eager: deferral and every flush trigger, recognition, compilation
and replay, failures, metrics, and parity with eager and CPU."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pyarrow.parquet as pq
import pytest
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import torchneuron
from torchneuron import adaptive
from torchneuron.profiler import export_parquet

COMPILE_TIMEOUT = 300


@pytest.fixture(autouse=True)
def _fresh_mode():
    torch.neuron.synchronize()
    saved = adaptive.configure()
    adaptive.reset()
    adaptive.configure(idle_ms=60_000)  # the tests decide when segments flush
    yield
    adaptive.set_enabled(False)
    torch.neuron.synchronize()
    adaptive.configure(**saved)
    adaptive.reset()


def flushed() -> int:
    return adaptive.get_metrics()["segments"]


def chain(x):
    return ((x * 2) + 1).relu()


def warm(fn, *args):
    """Runs once in plain eager: the first call of an op checks its plan and is never deferred."""
    fn(*args)
    torch.neuron.synchronize()


def _capture(y):
    graph = torch.accelerator.Graph()
    with graph:
        y.mul_(1)
    return graph


def _collective(y):
    store = dist.HashStore()
    dist.init_process_group("neuron", store=store, rank=0, world_size=1)
    try:
        dist.all_reduce(y)
    finally:
        dist.destroy_process_group()


TRIGGERS = {
    "device synchronize": lambda y: torch.neuron.synchronize(),
    "stream synchronize": lambda y: torch.neuron.current_stream().synchronize(),
    "stream query": lambda y: torch.neuron.current_stream().query(),
    "item": lambda y: y[0].item(),
    "copy to the host": lambda y: y.cpu(),
    "data-dependent op": lambda y: torch.nonzero(y),
    "event record": lambda y: torch.neuron.Event().record(),
    "cross-stream wait": lambda y: torch.neuron.Stream().wait_stream(torch.neuron.current_stream()),
    "copy from the host": lambda y: y.copy_(torch.ones(y.shape)),
    "graph capture": _capture,
    "collective": _collective,
}


@pytest.mark.parametrize("trigger", TRIGGERS)
def test_each_trigger_flushes_the_pending_segment_in_order(trigger):
    x = torch.randn(64, device="neuron")
    warm(chain, x)
    warm(lambda t: t.mul_(1), x.clone())
    before = flushed()
    with adaptive.enabled():
        y = chain(x)
        assert flushed() == before, "the ops ran before anything observed them"
        TRIGGERS[trigger](y)
        assert flushed() == before + 1
    if trigger not in ("copy from the host",):
        torch.testing.assert_close(y.cpu(), chain(x.cpu()))


def test_a_segment_flushes_at_the_size_limit():
    x = torch.randn(64, device="neuron")
    warm(chain, x)
    adaptive.configure(max_ops=5)
    before = flushed()
    with adaptive.enabled():
        y = chain(x)  # 3 ops
        assert flushed() == before
        y = chain(y)  # 6: the fifth op flushes
        assert flushed() == before + 1
        assert adaptive.get_metrics()["ops_deferred"] == 5
    torch.testing.assert_close(y.cpu(), chain(chain(x.cpu())))


def test_a_segment_flushes_when_the_host_stops_issuing_work():
    x = torch.randn(64, device="neuron")
    warm(chain, x)
    adaptive.configure(idle_ms=20)
    before = flushed()
    with adaptive.enabled():
        y = chain(x)
        deadline = time.monotonic() + 10
        while flushed() == before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert flushed() == before + 1
        assert adaptive.get_metrics()["op_by_op"].get("flushed where no program may run (idle flush, stream worker)") == 1
    torch.testing.assert_close(y.cpu(), chain(x.cpu()))


def test_switching_the_mode_on_and_off_mid_run_keeps_results_and_order():
    x = torch.randn(32, 32, device="neuron")
    w = torch.randn(32, 32, device="neuron")
    xc, wc = x.cpu(), w.cpu()
    warm(lambda: (x @ w).tanh().add_(x))
    for step in range(8):
        adaptive.set_enabled(step % 2 == 0)
        x = (x @ w).tanh().add_(x)
        xc = (xc @ wc).tanh().add_(xc)
    adaptive.set_enabled(False)
    torch.testing.assert_close(x.cpu(), xc, rtol=1e-4, atol=1e-5)
    assert adaptive.get_metrics()["ops_deferred"] == 12  # 3 ops in each of the 4 steps with the mode on


def test_streams_and_events_order_deferred_work_across_streams():
    x = torch.randn(256, device="neuron")
    warm(lambda: (x * 2, x + 1, x * 3))
    side = torch.neuron.Stream()
    main = torch.neuron.current_stream()
    with adaptive.enabled():
        a = x * 2
        side.wait_stream(main)
        with torch.neuron.stream(side):
            b = a + 1
            done = torch.neuron.Event()
            done.record()
        main.wait_event(done)
        c = b * 3
        assert torch.equal(c.cpu(), (x.cpu() * 2 + 1) * 3)
        assert done.query()


def test_graph_capture_with_the_mode_on_records_eager_tasks():
    x = torch.randn(16, 16, device="neuron")
    y = torch.zeros(16, 16, device="neuron")
    warm(lambda: y.copy_((x @ x).relu() + 1))
    with adaptive.enabled():
        z = x * 2  # deferred, then flushed by the capture
        graph = torch.accelerator.Graph()
        with graph:
            y.copy_((x @ x).relu() + 1)
        for _ in range(2):
            x.copy_(torch.randn(16, 16))
            graph.replay()
            torch.testing.assert_close(y.cpu(), (x.cpu() @ x.cpu()).relu() + 1)
    assert z.shape == x.shape


def test_deterministic_algorithms_turn_the_mode_off():
    x = torch.randn(64, device="neuron")
    warm(chain, x)
    torch.use_deterministic_algorithms(True)
    try:
        with adaptive.enabled():
            chain(x)
            torch.neuron.synchronize()
    finally:
        torch.use_deterministic_algorithms(False)
    assert adaptive.get_metrics()["ops_deferred"] == 0


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=COMPILE_TIMEOUT, env={**os.environ, **env})


def test_the_environment_variable_turns_it_on_and_launch_blocking_keeps_it_off():
    code = """
        import torch, torchneuron
        from torchneuron import adaptive
        x = torch.randn(8, device="neuron"); (x * 2).sum(); torch.neuron.synchronize()
        (x * 2).sum(); torch.neuron.synchronize()
        print(adaptive.is_enabled(), adaptive.get_metrics()["ops_deferred"])
    """
    on = _run(code, TORCHNEURON_ADAPTIVE_EAGER="1")
    assert on.returncode == 0, on.stderr
    assert on.stdout.split() == ["True", "2"]
    blocking = _run(code, TORCHNEURON_ADAPTIVE_EAGER="1", NEURON_LAUNCH_BLOCKING="1")
    assert blocking.returncode == 0, blocking.stderr
    assert blocking.stdout.split() == ["True", "0"]


# ---- recognition, compilation, replay ---------------------------------------------------


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 4))


def _train(device: str, steps: int, adaptive_on: bool, schedule: bool = False, optimizer: str = "adamw"):
    model = _mlp().to(device)
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    else:  # its update is _foreach_add_(params, buffers, alpha=-lr)
        opt = torch.optim.SGD(model.parameters(), lr=1e-1, momentum=0.9, weight_decay=1e-2, foreach=True)
    # A learning rate that changes every step (so do AdamW's weight-decay factor and SGD's alpha).
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1 / (1 + step)) if schedule else None
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(8, 16, generator=gen).to(device)
    y = torch.randint(0, 4, (8,), generator=gen).to(device)
    losses = []
    with adaptive.enabled(adaptive_on):
        for step in range(steps):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if scheduler:
                scheduler.step()
            losses.append(loss.item())
            if adaptive_on and step == 2:
                assert adaptive.wait_for_compiles(COMPILE_TIMEOUT)
    memory = None
    if device == "neuron":
        gc.collect()
        torch.neuron.synchronize()
        memory = torch.neuron.memory_allocated()  # model, gradients, optimizer state
    return losses, [p.detach().cpu() for p in model.parameters()], memory


def test_fifty_training_steps_match_eager_and_cpu_and_replay_as_one_task():
    cpu_losses, cpu_params, _ = _train("cpu", 50, False)
    eager_losses, eager_params, eager_memory = _train("neuron", 50, False)
    losses, params, memory = _train("neuron", 50, True)
    m = adaptive.get_metrics()
    assert m["failures"] == [], m["failures"]
    assert m["compiled"] >= 1 and m["replays"] >= 45, m
    assert m["ops_per_replay"] > 20 and m["launches_saved"] >= 45 * 20
    torch.testing.assert_close(losses, eager_losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-4, atol=1e-5)
    for p, e, c in zip(params, eager_params, cpu_params):
        torch.testing.assert_close(p, e, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(p, c, rtol=1e-4, atol=1e-5)
    assert memory == eager_memory


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_a_learning_rate_schedule_keeps_the_step_recurring(optimizer):
    # The optimizer's scalars that follow the learning rate are lifted out of the
    # segment's signature, so every step is the same compiled segment.
    eager_losses, eager_params, _ = _train("neuron", 12, False, schedule=True, optimizer=optimizer)
    losses, params, _ = _train("neuron", 12, True, schedule=True, optimizer=optimizer)
    m = adaptive.get_metrics()
    assert m["failures"] == [], m["failures"]
    assert m["replays"] >= 8 and m["distinct_segments"] <= 3, m
    torch.testing.assert_close(losses, eager_losses, rtol=1e-5, atol=1e-6)
    for p, e in zip(params, eager_params):
        torch.testing.assert_close(p, e, rtol=1e-5, atol=1e-6)


def _hot(fn, *args, times: int = 4):
    """Runs fn until its segment is compiled and replayed."""
    warm(fn, *args)
    with adaptive.enabled():
        for i in range(times):
            out = fn(*args)
            torch.neuron.synchronize()
            if i == 1:
                assert adaptive.wait_for_compiles(COMPILE_TIMEOUT)
    assert adaptive.get_metrics()["replays"] >= 1, adaptive.get_metrics()
    return out


def test_intermediates_nothing_references_are_not_written_and_live_ones_are():
    x = torch.randn(128, device="neuron")

    def step(x, keep: list):
        t = x.sin()
        u = t * 3
        keep.append(u)  # live: written back
        return (u + t).cos()  # t dies with this frame

    kept: list = []
    out = _hot(step, x, kept)
    assert adaptive.get_metrics()["intermediates_elided"] >= 2  # t and u + t, per replay
    xc = x.cpu()
    torch.testing.assert_close(kept[-1].cpu(), xc.sin() * 3)
    torch.testing.assert_close(out.cpu(), (xc.sin() * 3 + xc.sin()).cos())


def test_advanced_indexing_with_none_entries_and_views_replays_like_eager():
    # x[:, idx] is aten::index with indices [None, idx] (a Tensor?[]); x.t()[2]
    # is a view of an input with its own layout.
    x = torch.randn(7, 8, device="neuron")
    idx = torch.tensor([7, 0, 3], device="neuron")

    def step(x, idx):
        return (x[:, idx] * 2).sum(1) + x.t()[2]

    out = _hot(step, x, idx)
    assert adaptive.get_metrics()["failures"] == []
    xc = x.cpu()
    torch.testing.assert_close(out.cpu(), (xc[:, idx.cpu()] * 2).sum(1) + xc.t()[2])


UPDATES = {
    "row fill": lambda x: x[0].fill_(2),
    "column mul": lambda x: x[:, 1].mul_(3),
    "transposed rows add": lambda x: x.t()[1:3].add_(1),
    "last rows sin": lambda x: x[2:].sin_(),
}


@pytest.mark.parametrize("update", list(UPDATES))
def test_an_in_place_update_of_part_of_an_input_then_a_read_of_all_of_it_replays_like_eager(update):
    # The segment first reaches x's storage through the view the update writes; the
    # program must read the rest of the storage as it is and see the update where it is
    # (the fuzzer's seed 1688: the replay returned tanh(2) everywhere, silently).
    start = torch.randn(4, 4)
    x = start.to("neuron")

    def step(x):
        UPDATES[update](x)
        return torch.tanh(x) + x[1:3, 1:3].sum()

    out = _hot(step, x)  # five calls; the last ones replay
    assert adaptive.get_metrics()["failures"] == []
    cpu = start.clone()
    for _ in range(4):
        step(cpu)
    torch.testing.assert_close(out.cpu(), step(cpu))
    torch.testing.assert_close(x.cpu(), cpu)


def test_an_error_inside_a_fused_program_is_reported_as_eager_reports_it():
    table = torch.randn(10, 4, device="neuron")

    def lookup(idx):
        return (torch.index_select(table * 2, 0, idx) + 1).sum(0)

    good = torch.tensor([1, 2, 3], device="neuron")
    _hot(lookup, good)
    bad = torch.tensor([1, 12, 3], device="neuron")
    replays = adaptive.get_metrics()["replays"]
    with adaptive.enabled():
        out = lookup(bad)  # kept, as in _hot: which results are live is part of a segment's structure
        with pytest.raises(IndexError) as fused:
            torch.neuron.synchronize()
    assert adaptive.get_metrics()["replays"] == replays + 1  # it ran as the fused program
    del out
    lookup(bad)
    with pytest.raises(IndexError) as eager:
        torch.neuron.synchronize()
    assert str(fused.value) == str(eager.value)
    assert "aten::index_select" in str(fused.value)
    # The device goes on computing.
    torch.testing.assert_close(lookup(good).cpu(), (torch.index_select(table.cpu() * 2, 0, good.cpu()) + 1).sum(0))


@pytest.mark.parametrize("where", ["first", "after its kernels"])
def test_a_program_that_launches_a_synchronous_op_runs_that_occurrence_op_by_op(monkeypatch, where):
    """A fused program cannot take a synchronous op into its one task (the op
    would wait for that task): the occurrence is aborted and runs op by op,
    counted as aborted and not as a failure, also when the program collected
    kernels before it (they are not the whole segment)."""
    real_load = adaptive._ENGINE.load

    def load(key, desc):
        program = real_load(key, desc)

        def synchronising(tensors):
            if where == "first":
                torch.nonzero(tensors[0])  # data-dependent: runs synchronously
            result = program(tensors)
            if where != "first":
                torch.nonzero(tensors[0])
            return result
        return synchronising

    monkeypatch.setattr(adaptive._ENGINE, "load", load)
    x = torch.randn(64, device="neuron")
    warm(chain, x)
    with adaptive.enabled():
        for i in range(5):
            out = chain(x)
            torch.neuron.synchronize()
            if i == 1:
                assert adaptive.wait_for_compiles(COMPILE_TIMEOUT)
    m = adaptive.get_metrics()
    assert m["replays"] == 0 and m["aborted_replays"] >= 1 and m["failures"] == [], m
    torch.testing.assert_close(out.cpu(), chain(x.cpu()))


@pytest.mark.parametrize("during", ["load", "program"])
def test_ctrl_c_while_a_segment_loads_or_replays_reaches_the_user_and_loses_no_op(monkeypatch, during):
    """A KeyboardInterrupt raised while the engine loads a program or the program
    runs is the user's, not a compile failure: it propagates from the call that
    flushed, the segment's ops still run, and a later occurrence replays."""
    real_load = adaptive._ENGINE.load
    interrupts = []

    def interrupt_once():
        if not interrupts:
            interrupts.append(1)
            raise KeyboardInterrupt

    def load(key, desc):
        if during == "load":
            interrupt_once()
        program = real_load(key, desc)

        def interrupted(tensors):
            if during == "program":
                interrupt_once()
            return program(tensors)
        return interrupted

    monkeypatch.setattr(adaptive._ENGINE, "load", load)
    x = torch.randn(64, device="neuron")
    expected = chain(x.cpu())
    warm(chain, x)
    caught = 0
    with adaptive.enabled():
        for i in range(6):
            out = chain(x)
            try:
                torch.neuron.synchronize()
            except KeyboardInterrupt:
                caught += 1
            torch.testing.assert_close(out.cpu(), expected)
            if i == 1:
                assert adaptive.wait_for_compiles(COMPILE_TIMEOUT)
    m = adaptive.get_metrics()
    assert caught == 1 and m["failures"] == [] and m["replays"] >= 1, (caught, m)


def test_a_thread_that_reads_while_another_flushes_waits_for_the_flush(monkeypatch):
    """A read from a second thread while the first is replaying the stream's
    segment (here: slowly) waits for the segment's task; it does not pass the
    flush in progress and read the result before it is computed."""
    real_load = adaptive._ENGINE.load
    inside, slow = threading.Event(), []

    def load(key, desc):
        program = real_load(key, desc)

        def slow_program(tensors):
            if slow:
                inside.set()
                time.sleep(0.5)  # releases the GIL: the reader runs
            return program(tensors)
        return slow_program

    monkeypatch.setattr(adaptive._ENGINE, "load", load)
    x = torch.zeros(64, device="neuron")

    def step():
        x.add_(1)  # each occurrence computes new values
        return chain(x)

    warm(step)
    read = {}

    def reader(y):
        assert inside.wait(60)
        read["y"] = y.cpu()

    with adaptive.enabled():
        for i in range(4):
            y = step()  # kept, as below: the same live results, the same segment
            torch.neuron.synchronize()
            if i == 1:
                assert adaptive.wait_for_compiles(COMPILE_TIMEOUT)
        slow.append(True)
        y = step()
        thread = threading.Thread(target=reader, args=(y,))
        thread.start()
        torch.neuron.synchronize()  # this thread flushes: the program runs, slowly
        thread.join()
    assert adaptive.get_metrics()["replays"] >= 2
    torch.testing.assert_close(read["y"], chain(torch.full((64,), 6.0)))


def test_a_segment_flushed_from_another_stream_replays_on_its_own(monkeypatch):
    """A synchronize() on the default stream flushes a side stream's segment: its
    program must allocate (and order its memory) on the side stream, the one
    its fused task runs on, not on the flushing thread's current stream."""
    real_load = adaptive._ENGINE.load
    seen = []

    def load(key, desc):
        program = real_load(key, desc)

        def noting_the_stream(tensors):
            seen.append(torch.neuron.current_stream())
            return program(tensors)
        return noting_the_stream

    monkeypatch.setattr(adaptive._ENGINE, "load", load)
    side = torch.neuron.Stream()
    x = torch.randn(64, device="neuron")
    side.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(side):
        warm(chain, x)
    with adaptive.enabled():
        for i in range(5):
            with torch.neuron.stream(side):
                out = chain(x)
            torch.neuron.synchronize()  # from the default stream
            if i == 1:
                assert adaptive.wait_for_compiles(COMPILE_TIMEOUT)
    assert adaptive.get_metrics()["replays"] >= 2 and seen, adaptive.get_metrics()
    assert all(stream == side for stream in seen), seen
    torch.testing.assert_close(out.cpu(), chain(x.cpu()))


@pytest.mark.parametrize("change", ["t_()", ".data ="])
def test_an_input_changed_on_the_host_before_the_flush_is_read_as_recorded(change):
    """A segment takes its inputs' layout and storage when an op is recorded: a
    host-side change of the tensor object before the flush (an in-place
    transpose, `.data =`) does not reach the ops recorded before it, as in eager."""
    w = torch.randn(4, 4, device="neuron")
    v = torch.randn(4, device="neuron")
    other = torch.randn(4, 4, device="neuron")
    expected = (w.cpu() * 2 + v.cpu()).relu()

    def step():
        y = (w * 2 + v).relu()
        if change == "t_()":
            w.t_()
            out = y.cpu()  # flushes, with w transposed
            w.t_()
        else:
            kept, w.data = w.data, other
            out = y.cpu()  # flushes, with w on other's storage
            w.data = kept
        return out

    warm(step)
    with adaptive.enabled():
        for i in range(6):
            torch.testing.assert_close(step(), expected, rtol=0, atol=0)
            if i == 1:
                assert adaptive.wait_for_compiles(COMPILE_TIMEOUT)
    m = adaptive.get_metrics()
    assert m["replays"] >= 2 and m["failures"] == [], m


def test_the_compiler_takes_first_the_segment_that_saves_most_launches_per_compile_second(tmp_path, monkeypatch):
    """Two segments turn hot in the same step: twenty foreach ops over 32 tensors
    (19 launches saved per occurrence, code for 640 tensors to compile: tens of
    seconds) and a chain of 6 ops (5 launches saved, seconds to compile). The chain
    saves more launches per compile second: it is compiled first and replays while
    the other one is still compiling."""
    monkeypatch.setenv("TORCHNEURON_ADAPTIVE_CACHE_DIR", str(tmp_path))  # nothing compiled yet
    # Both are queued before the compiler picks, even when a loaded machine runs the step slowly.
    monkeypatch.setattr(adaptive._ENGINE, "GATHER_SECONDS", 4.0)
    monkeypatch.setattr(adaptive._ENGINE, "_per_unit", adaptive._ENGINE.PER_UNIT_SECONDS)  # not what earlier tests taught it
    # Constants drawn at random: programs no earlier run left in Inductor's cache.
    a, b, c = (float(v) for v in torch.rand(3) + 1)
    tensors = [torch.randn(16 + i, device="neuron") for i in range(32)]
    x = torch.randn(32, device="neuron")

    def large():
        for _ in range(5):
            torch._foreach_mul_(tensors, a)
            torch._foreach_add_(tensors, b)
            torch._foreach_abs_(tensors)
            torch._foreach_sqrt_(tensors)
        torch.neuron.current_stream().query()

    def small():
        y = (((x * a) + b).relu() * c).sin().exp()
        torch.neuron.current_stream().query()
        return y

    warm(large)
    warm(small)
    by_size = {}
    deadline = time.monotonic() + COMPILE_TIMEOUT
    try:
        with adaptive.enabled():
            while time.monotonic() < deadline:
                large()
                out = small()
                by_size = {"large" if r["ops"] >= 20 else "small": r for r in adaptive.get_metrics()["timeline"]}
                if by_size.get("small", {}).get("hot_to_first_replay_seconds") is not None:
                    break
                time.sleep(0.05)
        assert by_size["small"]["hot_to_first_replay_seconds"] is not None, by_size
        assert by_size["small"]["order"] == 0 and by_size["small"]["source"] == "compiler", by_size
        assert by_size["large"]["compile_seconds"] is None, by_size  # still compiling
        torch.testing.assert_close(out.cpu(), (((x.cpu() * a) + b).relu() * c).sin().exp())
    finally:
        adaptive._ENGINE.close()  # abandons the update's compile: it would hold back later tests
    assert adaptive.wait_for_compiles(10)


def test_a_segment_that_cannot_be_compiled_runs_op_by_op_with_its_reason():
    x = torch.randn(16, device="neuron")

    def reinterpret(x):
        y = x * 2
        return y.view(torch.int32) + 1  # a view of a result as another dtype

    warm(reinterpret, x)
    with adaptive.enabled():
        for _ in range(3):
            out = reinterpret(x)
            torch.neuron.synchronize()
    m = adaptive.get_metrics()
    assert m["replays"] == 0
    assert len(m["failures"]) == 1 and "view" in m["failures"][0]["reason"], m["failures"]
    assert torch.equal(out.cpu(), (x.cpu() * 2).view(torch.int32) + 1)


def test_the_profiler_shows_a_fused_task_with_the_ops_it_replaced(tmp_path):
    x = torch.randn(256, device="neuron")

    def step(x):
        return (x * 2 + 1).tanh()

    _hot(step, x)
    with adaptive.enabled(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        out = step(x)
        torch.neuron.synchronize()
    export_parquet(prof, tmp_path)
    tasks = pq.read_table(tmp_path / "tasks.parquet").to_pylist()
    fused = [t for t in tasks if t["kind"] == "fused"]
    assert len(fused) == 1, [(t["name"], t["kind"]) for t in tasks]
    assert fused[0]["replaced_ops"] == "aten::mul.Tensor, aten::add.Tensor, aten::tanh"
    torch.testing.assert_close(out.cpu(), (x.cpu() * 2 + 1).tanh())


@pytest.mark.slow  # a second process compiles or loads from cold: slow tier
def test_a_second_process_loads_compiled_segments_from_disk(tmp_path):
    code = """
        import json, torch, torchneuron
        from torch._dynamo.utils import counters
        from torchneuron import adaptive
        # A setting of the program's own: the child must compile with it too.
        torch._inductor.config.realize_reads_threshold = 5
        x = torch.randn(32, device="neuron")
        step = lambda: (x.exp() - 1).mul(x).sum()
        step(); torch.neuron.synchronize()
        with adaptive.enabled():
            for i in range(4):
                out = step(); torch.neuron.synchronize()
                if i == 1:
                    adaptive.wait_for_compiles(300)
        m = adaptive.get_metrics()
        print(json.dumps({"replays": m["replays"], "compile_seconds": m["compile_seconds"],
                          "cache_hits": counters["inductor"]["fxgraph_cache_hit"],
                          "cache_misses": counters["inductor"]["fxgraph_cache_miss"], "failures": m["failures"]}))
    """
    # Fresh caches: the program is compiled here, by the first process's child.
    env = {"TORCHNEURON_ADAPTIVE_CACHE_DIR": str(tmp_path / "segments"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    first = _run(code, **env)
    assert first.returncode == 0, first.stderr
    first = json.loads(first.stdout.splitlines()[-1])
    assert first["failures"] == [] and first["compile_seconds"] > 0 and first["replays"] >= 1
    # The child compiled with this process's Inductor config (its own setting and
    # thread count too), so loading the program here was a cache hit, not a
    # second compile.
    assert first["cache_misses"] == 0 and first["cache_hits"] >= 1, first
    second = _run(code, **env)
    assert second.returncode == 0, second.stderr
    second = json.loads(second.stdout.splitlines()[-1])
    # Nothing compiled: the index said it was, and Inductor's cache had the program.
    assert second["compile_seconds"] == 0 and second["cache_hits"] >= 1 and second["replays"] >= 2, second


def test_a_compile_over_the_time_limit_is_abandoned_and_the_segment_runs_op_by_op(tmp_path):
    code = """
        import json, torch, torchneuron
        from torchneuron import adaptive
        x = torch.randn(32, device="neuron")
        step = lambda: ((x * 2) + 1).relu()
        step(); torch.neuron.synchronize()
        with adaptive.enabled():
            for i in range(4):
                out = step(); torch.neuron.synchronize()
                if i == 1:
                    assert adaptive.wait_for_compiles(300)
        m = adaptive.get_metrics()
        right = torch.equal(out.cpu(), ((x.cpu() * 2) + 1).relu())
        print(json.dumps({"replays": m["replays"], "failures": m["failures"], "right": right}))
    """
    result = _run(code, TORCHNEURON_ADAPTIVE_CACHE_DIR=str(tmp_path / "segments"),
                  TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), TORCHNEURON_ADAPTIVE_COMPILE_TIMEOUT="0.01")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["right"] and out["replays"] == 0, out
    assert len(out["failures"]) == 1 and "took longer than 0.01 s" in str(out["failures"][0]), out
    # Not recorded in the index: another process may try again.
    assert not (tmp_path / "segments" / f"{out['failures'][0]['key']}.json").exists()


@pytest.mark.parametrize("name,value,expected", [
    ("TORCHNEURON_ADAPTIVE_COMPILE_TIMEOUT", "abc", "expected a positive number of seconds"),
    ("TORCHNEURON_ADAPTIVE_HOT", "1.5", "expected a positive integer"),
    ("TORCHNEURON_ADAPTIVE_IDLE_MS", "0", "expected a positive number of milliseconds"),
])
def test_an_invalid_setting_in_the_environment_is_reported_at_the_first_device_use(name, value, expected):
    result = _run("""
        import torch, torchneuron
        try:
            torch.ones(1, device="neuron")
        except RuntimeError as error:
            print(error)
    """, **{name: value})
    assert result.returncode == 0, result.stderr
    assert f"invalid environment: {name}='{value}': {expected}" in result.stdout, result.stdout


def test_metrics_and_configuration_are_checked():
    with pytest.raises(ValueError, match="hot and max_ops must be at least 1"):
        adaptive.configure(hot=0)
    with pytest.raises(ValueError, match="compile_timeout positive; .*compile_timeout=-1"):
        adaptive.configure(compile_timeout=-1)
    saved = adaptive.configure()
    try:
        assert adaptive.configure(compile_timeout=12.5)["compile_timeout"] == 12.5
        assert adaptive.configure() == {**saved, "compile_timeout": 12.5}
    finally:
        adaptive.configure(**saved)
    assert torchneuron.get_adaptive_metrics().keys() >= {
        "segments", "distinct_segments", "hot", "compiled", "replays", "ops_per_replay", "launches_saved",
        "compile_seconds", "failures"}
    with torchneuron.adaptive_eager():
        assert adaptive.is_enabled()
    assert not adaptive.is_enabled()


def test_freeing_a_tensor_used_on_a_stream_with_a_compiled_segment_pending_leaves_the_segment_pending():
    # The free records its event after the side stream's enqueued work, without flushing
    # the pending segment (no op in it can use the freed memory: the segment holds its
    # inputs); the segment replays at the next synchronisation, with eager's result.
    side = torch.neuron.Stream()
    x = torch.randn(512, device="neuron")
    other = torch.randn(512, device="neuron")  # allocated on the default stream
    other.record_stream(side)
    with torch.neuron.stream(side):
        _hot(chain, x)
        replays = adaptive.get_metrics()["replays"]
        with adaptive.enabled():
            out = chain(x)  # the compiled segment, pending on the side stream
            del other  # records the event on the side stream
            assert adaptive.get_metrics()["replays"] == replays
            side.synchronize()
            assert adaptive.get_metrics()["replays"] == replays + 1
    torch.testing.assert_close(out.cpu(), chain(x.cpu()))


def test_a_free_while_another_thread_flushes_does_not_wait_for_that_flush():
    """A free runs wherever the last reference drops (the garbage collector, in the middle
    of an import) with whatever locks that thread holds, while a flush may call Python,
    which may need such a lock (an import lock). A free must not wait for the flush: here
    the engine, called by the main thread's flush, waits for a lock the freeing thread holds
    while it frees memory the flushing stream used. That used to hang (the fuzzer's slow
    tier: the adaptive compiler's warm-up import and a program's load)."""
    script = textwrap.dedent("""
        import threading, torch, torchneuron
        from torchneuron import adaptive
        adaptive.configure(idle_ms=60_000, hot=1)
        held, in_flush = threading.Lock(), threading.Event()

        def submit(desc):  # called by the flush, holding the stream's flush
            in_flush.set()
            with held:
                pass
            return "a-key", "failed", "not compiled in this test"
        adaptive._ENGINE.submit = submit

        side = torch.neuron.Stream()
        x = torch.randn(64, device="neuron")
        used = [torch.randn(64, device="neuron")]  # allocated on the default stream ...
        used[0].record_stream(side)                # ... and used on the side one
        ((x * 2) + 1).relu()                        # first calls are never deferred
        torch.neuron.synchronize()

        def free_while_holding_the_lock():
            with held:
                in_flush.wait()
                used.clear()  # the last reference: an event on `side`, which is flushing
        thread = threading.Thread(target=free_while_holding_the_lock)
        thread.start()
        with torch.neuron.stream(side):
            adaptive.set_enabled(True)
            y = ((x * 2) + 1).relu()  # deferred on the side stream
            side.synchronize()        # flushes: the engine is asked, and waits for the lock
        thread.join()
        adaptive.set_enabled(False)
        torch.testing.assert_close(y.cpu(), ((x.cpu() * 2) + 1).relu())
        print("done", adaptive.get_metrics()["hot"])
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "done 1" in run.stdout, (run.stdout, run.stderr)


def test_the_compiler_process_exits_quietly_when_the_program_is_gone(tmp_path):
    # The program may exit while a compile runs: the child records the outcome in
    # the index and exits without a traceback when its answer has nowhere to go.
    from torchneuron.adaptive import _engine

    child = subprocess.Popen([sys.executable, "-m", "torchneuron.adaptive._worker"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=dict(os.environ, TORCHNEURON_ADAPTIVE_CACHE_DIR=str(tmp_path)))
    child.stdout.close()  # the program is gone before the answer
    _engine._send(child.stdin, ("a-key", {}, {}, 60.0))  # not a segment: fails at once
    child.stdin.close()
    assert child.wait(timeout=120) == 0
    assert child.stderr.read().decode() == ""
    entry = json.loads((tmp_path / "a-key.json").read_text())
    assert entry["ok"] is False and entry["reason"]


def test_freeing_memory_another_stream_used_flushes_without_deadlock():
    """Freeing a block that another stream used records an event there, and the stream's
    segment frees the memory it held when it flushes. A free once flushed that segment and its
    end's free waited for the allocator lock the first still held (a hang, seen in the
    fuzzer's slow tier); frees no longer flush at all."""
    script = textwrap.dedent("""
        import torch, torchneuron
        from torchneuron import adaptive
        adaptive.configure(idle_ms=60_000)
        side = torch.neuron.Stream()
        for _ in range(2):  # the first call of an op is never deferred
            used = torch.randn(64, device="neuron")
            with torch.neuron.stream(side):
                y = torch.randn(64, device="neuron")
                used.record_stream(side)
                torch.neuron.synchronize()
                adaptive.set_enabled(True)
                z = y * 2 + 1          # deferred on the side stream: the segment holds y's memory
                del y, z
            del used                   # used on `side`: an event there, after the enqueued work
            adaptive.set_enabled(False)
            torch.neuron.synchronize()
        print("done")
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "done" in run.stdout, run.stderr



def test_the_compiler_process_runs_only_on_idle_cycles_in_its_own_process_group(tmp_path, monkeypatch):
    """The engine's compiler runs under SCHED_IDLE, every thread of it (and, by
    inheritance, every process it starts: Inductor's compile workers, the C++
    compiler), in a process group of its own that close() ends whole. What keeps it
    off the program's critical path; its measured cost: tests/test_adaptive_slow.py."""
    from torchneuron.adaptive import _engine

    monkeypatch.setenv("TORCHNEURON_ADAPTIVE_CACHE_DIR", str(tmp_path))
    engine = _engine.Engine()
    try:
        engine.prestart()
        group = engine._child.pid
        assert os.getpgid(group) == group != os.getpgid(0)
        deadline, policies = time.monotonic() + COMPILE_TIMEOUT, {}
        while time.monotonic() < deadline:  # until the child has lowered itself, after its first imports
            policies = _policies(group)
            if policies and set(policies.values()) == {os.SCHED_IDLE}:
                break
            time.sleep(0.1)
        assert policies and set(policies.values()) == {os.SCHED_IDLE}, policies
    finally:
        engine.close()
    assert not os.path.exists(f"/proc/{group}")  # ended and reaped


def _policies(pid: int) -> dict:
    """Scheduling policy of each live thread of a process."""
    policies = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            policies[int(task)] = os.sched_getscheduler(int(task))
        except OSError:  # a thread that ended meanwhile
            pass
    return policies
