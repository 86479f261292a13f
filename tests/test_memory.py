"""Device memory: the caching allocator's accounting and controls, out-of-memory
behaviour, pinned host memory, and stream-safe reuse.

References: byte arithmetic from the tensor sizes (CUDA's caching allocator
rounds each allocation up to a multiple of 512 bytes), the capacity the test sets
in the environment, CPU copies of the data, and ``torch.cuda``'s documented
memory-management semantics.
"""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

DEV = "neuron"
MiB = 1 << 20


def _rounded(nbytes: int) -> int:
    """CUDA caching allocator block size: at least 512 bytes, a multiple of 512."""
    return max(512, (nbytes + 511) // 512 * 512)


@pytest.fixture(autouse=True)
def _no_gc_during_measurement():
    """Tensors kept alive by garbage from earlier tests (e.g. tracebacks) must not be
    freed by the cyclic collector in the middle of a byte count."""
    gc.disable()
    yield
    gc.enable()


# --------------------------------------------------------------------------------------
# Accounting
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("nbytes", [1, 511, 512, 513, 4000, MiB, MiB + 1, 5 * MiB + 3, 12 * MiB + 1])
def test_memory_allocated_tracks_tensor_lifetime(nbytes):
    before = torch.neuron.memory_allocated()
    t = torch.empty(nbytes, dtype=torch.uint8, device=DEV)
    assert torch.neuron.memory_allocated() - before == _rounded(nbytes)
    assert torch.neuron.memory_reserved() >= torch.neuron.memory_allocated()
    del t
    assert torch.neuron.memory_allocated() == before


def test_memory_allocated_counts_op_outputs_not_views():
    before = torch.neuron.memory_allocated()
    x = torch.randn(1000, device=DEV)  # 4000 bytes
    assert torch.neuron.memory_allocated() - before == _rounded(4000)
    v1, v2, v3 = x.view(10, 100), x[::2], x.view(10, 100).t()
    assert torch.neuron.memory_allocated() - before == _rounded(4000)
    y = x * 2 + 1  # x * 2 is a temporary freed when the expression completes
    assert torch.neuron.memory_allocated() - before == 2 * _rounded(4000)
    z = torch.ones(3, 5, dtype=torch.float64, device=DEV)  # 120 bytes
    assert torch.neuron.memory_allocated() - before == 2 * _rounded(4000) + _rounded(120)
    del x, v1, v2, v3, y, z
    assert torch.neuron.memory_allocated() == before


def test_zero_size_tensor_allocates_nothing():
    before = torch.neuron.memory_allocated()
    t = torch.empty(0, device=DEV)
    assert torch.neuron.memory_allocated() == before
    del t


def test_devices_are_accounted_separately():
    before0, before1 = torch.neuron.memory_allocated(0), torch.neuron.memory_allocated(1)
    t = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron:1")
    assert torch.neuron.memory_allocated(1) - before1 == 3 * MiB
    assert torch.neuron.memory_allocated(0) == before0
    with torch.neuron.device(1):
        assert torch.neuron.memory_allocated() - before1 == 3 * MiB
    del t
    assert torch.neuron.memory_allocated(1) == before1


def test_peak_and_reset_peak_memory_stats():
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.memory_allocated()
    assert torch.neuron.max_memory_allocated() == base
    a = torch.empty(8 * MiB, dtype=torch.uint8, device=DEV)
    b = torch.empty(2 * MiB, dtype=torch.uint8, device=DEV)
    del a, b
    c = torch.empty(MiB, dtype=torch.uint8, device=DEV)
    assert torch.neuron.memory_allocated() == base + MiB
    assert torch.neuron.max_memory_allocated() == base + 10 * MiB
    assert torch.neuron.max_memory_reserved() >= torch.neuron.max_memory_allocated()
    assert torch.neuron.max_memory_reserved() >= torch.neuron.memory_reserved()
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == base + MiB
    assert torch.neuron.max_memory_reserved() == torch.neuron.memory_reserved()
    del c


def test_empty_cache_releases_cached_blocks_and_keeps_live_tensors():
    torch.neuron.empty_cache()
    live_ref = torch.randn(300, 300)
    live = live_ref.to(DEV)
    allocated0, reserved0 = torch.neuron.memory_allocated(), torch.neuron.memory_reserved()
    free0, total = torch.neuron.mem_get_info()
    big = torch.empty(48 * MiB, dtype=torch.uint8, device=DEV)
    big.fill_(7)
    torch.neuron.synchronize()  # (releasing memory with pending work: see the subprocess test below)
    reserved1 = torch.neuron.memory_reserved()
    assert reserved1 - reserved0 >= 48 * MiB
    assert torch.neuron.mem_get_info()[0] <= free0 - 48 * MiB  # the device lost that memory
    del big
    # Freed to the cache, not to the device (CUDA semantics).
    assert torch.neuron.memory_allocated() == allocated0
    assert torch.neuron.memory_reserved() == reserved1
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved() <= reserved1 - 48 * MiB
    assert torch.neuron.memory_reserved() >= torch.neuron.memory_allocated()
    assert torch.neuron.memory_allocated() == allocated0
    assert torch.neuron.mem_get_info()[0] >= free0
    # Live tensors are untouched and still usable.
    assert torch.equal(live.cpu(), live_ref)
    torch.testing.assert_close((live @ live).cpu(), live_ref @ live_ref)


def test_cached_block_is_reused_without_growing_reserved():
    torch.neuron.empty_cache()
    a = torch.empty(16 * MiB, dtype=torch.uint8, device=DEV)
    del a
    reserved = torch.neuron.memory_reserved()
    b = torch.empty(16 * MiB, dtype=torch.uint8, device=DEV)
    assert torch.neuron.memory_reserved() == reserved
    del b


def test_mem_get_info():
    for i in range(torch.neuron.device_count()):
        free, total = torch.neuron.mem_get_info(i)
        assert total == torch.neuron.get_device_properties(i).total_memory
        assert 0 <= free <= total
        # The device's used memory is at least what the allocator holds.
        assert total - free >= torch.neuron.memory_reserved(i)


# --------------------------------------------------------------------------------------
# memory_stats / memory_summary
# --------------------------------------------------------------------------------------

CUDA_STYLE_KEYS = [
    "allocated_bytes.all.current", "allocated_bytes.all.peak", "allocated_bytes.all.allocated",
    "allocated_bytes.all.freed", "allocated_bytes.small_pool.current", "allocated_bytes.large_pool.current",
    "reserved_bytes.all.current", "reserved_bytes.all.peak", "active_bytes.all.current",
    "requested_bytes.all.current", "inactive_split_bytes.all.current", "allocation.all.current",
    "active.all.current", "segment.all.current", "inactive_split.all.current",
    "num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
]


def test_memory_stats_has_cuda_keys_and_agrees_with_accessors():
    stats = torch.neuron.memory_stats()
    missing = [k for k in CUDA_STYLE_KEYS if k not in stats]
    assert not missing, missing
    assert stats["allocated_bytes.all.current"] == torch.neuron.memory_allocated()
    assert stats["reserved_bytes.all.current"] == torch.neuron.memory_reserved()
    assert stats["allocated_bytes.all.peak"] == torch.neuron.max_memory_allocated()
    assert stats["reserved_bytes.all.peak"] == torch.neuron.max_memory_reserved()
    assert stats["allocated_bytes.all.current"] == (
        stats["allocated_bytes.small_pool.current"] + stats["allocated_bytes.large_pool.current"])
    assert stats["requested_bytes.all.current"] <= stats["allocated_bytes.all.current"]
    assert stats["allocated_bytes.all.current"] <= stats["reserved_bytes.all.current"]
    assert torch.neuron.memory_stats(1)["allocated_bytes.all.current"] == torch.neuron.memory_allocated(1)


def test_memory_stats_counts_follow_allocations():
    s0 = torch.neuron.memory_stats()
    small = torch.empty(1000, dtype=torch.uint8, device=DEV)  # <= 1 MiB: small pool
    large = torch.empty(4 * MiB, dtype=torch.uint8, device=DEV)  # > 1 MiB: large pool
    s1 = torch.neuron.memory_stats()
    assert s1["allocation.all.current"] - s0["allocation.all.current"] == 2
    assert s1["allocated_bytes.small_pool.current"] - s0["allocated_bytes.small_pool.current"] == 1024
    assert s1["allocated_bytes.large_pool.current"] - s0["allocated_bytes.large_pool.current"] == 4 * MiB
    assert s1["requested_bytes.all.current"] - s0["requested_bytes.all.current"] == 1000 + 4 * MiB
    assert s1["allocated_bytes.all.allocated"] - s0["allocated_bytes.all.allocated"] == 1024 + 4 * MiB
    del small, large
    s2 = torch.neuron.memory_stats()
    assert s2["allocation.all.current"] == s0["allocation.all.current"]
    assert s2["allocated_bytes.all.freed"] - s1["allocated_bytes.all.freed"] == 1024 + 4 * MiB


def test_reset_accumulated_memory_stats():
    x = torch.empty(2048, dtype=torch.uint8, device=DEV)
    del x
    torch.neuron.reset_accumulated_memory_stats()
    stats = torch.neuron.memory_stats()
    assert stats["allocated_bytes.all.allocated"] == 0
    assert stats["allocated_bytes.all.freed"] == 0
    assert stats["num_alloc_retries"] == 0 and stats["num_ooms"] == 0
    y = torch.empty(2048, dtype=torch.uint8, device=DEV)
    assert torch.neuron.memory_stats()["allocated_bytes.all.allocated"] == 2048
    del y


def test_memory_summary_is_readable():
    keep = torch.empty(3 * MiB, dtype=torch.uint8, device=DEV)
    text = torch.neuron.memory_summary()
    assert isinstance(text, str)
    lines = text.splitlines()
    assert len(lines) > 10
    for row in ("Allocated memory", "Reserved memory"):
        assert row in text
    assert "neuron:0" in text or "device ID 0" in text
    assert "neuron:1" in torch.neuron.memory_summary(1) or "device ID 1" in torch.neuron.memory_summary(1)
    assert isinstance(torch.neuron.memory_summary(abbreviated=True), str)
    del keep


# --------------------------------------------------------------------------------------
# Stream-ordered reuse
# --------------------------------------------------------------------------------------

def test_freed_block_reused_on_same_stream_is_ordered():
    # Freeing a tensor whose readers are still queued is safe on the same stream:
    # the next owner's writes run after those readers.
    base = torch.randn(512, 512)
    ref = base
    for _ in range(10):
        ref = torch.tanh(ref @ base / 20)
    for _ in range(5):
        x = base.to(DEV)
        bd = x.clone()
        y = x
        for _ in range(10):
            y = torch.tanh(y @ bd / 20)
        del x
        z = torch.full((512, 512), -1.0, device=DEV)  # may take x's block
        torch.testing.assert_close(y.cpu(), ref)
        assert torch.equal(z.cpu(), torch.full((512, 512), -1.0))


def test_record_stream_protects_memory_used_by_another_stream():
    N = 1 << 18
    m = torch.randn(384, 384, device=DEV)
    for it in range(5):
        side = torch.neuron.Stream()
        x = torch.full((N,), 3.0, device=DEV)  # allocated on the default stream
        side.wait_stream(torch.neuron.current_stream())
        with torch.neuron.stream(side):
            busy = m
            for _ in range(10):  # keep the side stream busy before it reads x
                busy = torch.tanh(busy @ m / 20)
            y = x * 2
        x.record_stream(side)
        del x
        z = torch.empty(N, device=DEV)  # same size, default stream
        z.fill_(-1.0)
        side.synchronize()
        assert torch.equal(y.cpu(), torch.full((N,), 6.0)), f"iteration {it}: side stream saw overwritten data"
        assert torch.equal(z.cpu(), torch.full((N,), -1.0))
        del busy, y, z
        torch.neuron.synchronize()


# --------------------------------------------------------------------------------------
# Pinned host memory
# --------------------------------------------------------------------------------------

def test_pin_memory():
    x = torch.randn(100, 100)
    assert x.is_pinned() is False
    p = x.pin_memory()
    assert p.is_pinned() is True
    assert torch.equal(p, x)
    assert torch.empty(64, pin_memory=True).is_pinned() is True


def test_non_blocking_copies_with_pinned_memory():
    torch.manual_seed(0)
    for _ in range(10):
        x = torch.randn(512, 512)
        src = x.pin_memory()
        d = src.to(DEV, non_blocking=True)  # host -> device
        d = d * 3 - 1
        dst = torch.empty(512, 512).pin_memory()
        dst.copy_(d, non_blocking=True)  # device -> host
        torch.neuron.synchronize()
        assert torch.equal(dst, x * 3 - 1)
        back = (d + 1).to("cpu", non_blocking=True)
        torch.neuron.synchronize()
        assert torch.equal(back, (x * 3 - 1) + 1)


def test_non_blocking_copy_from_pageable_memory_is_correct():
    x = torch.randn(256, 256)
    d = x.to(DEV, non_blocking=True)
    torch.neuron.synchronize()
    assert torch.equal(d.cpu(), x)


def test_empty_host_cache_keeps_live_pinned_tensors():
    p = torch.arange(1000.0).pin_memory()
    torch.accelerator.empty_host_cache()
    assert p.is_pinned()
    assert torch.equal(p.to(DEV, non_blocking=True).cpu(), torch.arange(1000.0))


# --------------------------------------------------------------------------------------
# Out of memory (subprocess with a small device)
# --------------------------------------------------------------------------------------

_OOM_SCRIPT = """
    import json, torch
    MiB = 1 << 20
    out = {"steps": []}
    def step(name, fn):
        try:
            out[name] = fn()
        except BaseException as e:
            out[name + "_error"] = {"type": type(e).__name__, "oom": isinstance(e, torch.OutOfMemoryError),
                                    "runtime": isinstance(e, RuntimeError), "message": str(e)}
        out["steps"].append(name)

    out["total_memory"] = torch.neuron.get_device_properties(0).total_memory
    out["mem_total"] = torch.neuron.mem_get_info(0)[1]
    ref = torch.arange(4 * MiB, dtype=torch.float32)  # 16 MiB
    keep = ref.to("neuron")
    torch.neuron.synchronize()

    def alloc(nbytes, device="neuron"):
        torch.empty(nbytes, dtype=torch.uint8, device=device)

    step("huge", lambda: alloc(100 * MiB))
    out["keep_intact_after_huge"] = bool(torch.equal(keep.cpu(), ref))
    out["num_ooms"] = torch.neuron.memory_stats()["num_ooms"]

    def smaller():
        t = torch.full((4 * MiB,), 2.0, device="neuron")  # 16 MiB
        return float((t + keep).sum().item()) == float((ref + 2.0).sum().item())
    step("smaller_after_oom", smaller)

    # An op whose output does not fit: raises at the call, nothing else is harmed.
    step("op_output", lambda: torch.cat([keep, keep, keep, keep]).shape and None)
    out["keep_intact_after_op"] = bool(torch.equal(keep.cpu(), ref))

    # Cached blocks are freed and the allocation retried before giving up.
    def retry():
        a = torch.empty(40 * MiB, dtype=torch.uint8, device="neuron")
        del a  # 40 MiB cached; 16 MiB live; capacity 64 MiB
        retries0 = torch.neuron.memory_stats()["num_alloc_retries"]
        b = torch.empty(44 * MiB, dtype=torch.uint8, device="neuron")
        b.fill_(1)
        ok = int(b[-1].item()) == 1
        return {"ok": ok, "retries": torch.neuron.memory_stats()["num_alloc_retries"] - retries0}
    step("retry", retry)

    step("huge_dev1", lambda: alloc(100 * MiB, "neuron:1"))
    out["keep_intact_at_end"] = bool(torch.equal(keep.cpu(), ref))
    print(json.dumps(out))
"""


_PENDING_RELEASE_SCRIPT = """
    import sys, torch
    MiB = 1 << 20
    ref = torch.randn(300, 300)
    live = ref.to("neuron")
    keep = torch.empty(16 * MiB, dtype=torch.uint8, device="neuron")
    big = torch.empty(44 * MiB, dtype=torch.uint8, device="neuron")
    for i in range(100):  # queued writes into big, still running when big is freed
        big.fill_(1 + i % 7)
    del big
    if sys.argv[1] == "empty_cache":
        torch.neuron.empty_cache()
    else:
        # 18 MiB live + 44 MiB cached on a 64 MiB device: a 4 MiB request (a 20 MiB segment, as
        # CUDA sizes it) must free the cache and retry.
        retries = torch.neuron.memory_stats()["num_alloc_retries"]
        other = torch.empty(4 * MiB, dtype=torch.uint8, device="neuron")
        assert torch.neuron.memory_stats()["num_alloc_retries"] == retries + 1, "scenario not exercised"
        other.fill_(3)
    host = torch.zeros(40 * MiB, dtype=torch.uint8)  # host memory the process allocates meanwhile
    torch.neuron.synchronize()
    assert int(host.count_nonzero()) == 0, "host memory was overwritten by device work"
    assert torch.equal(live.cpu(), ref)
    if sys.argv[1] != "empty_cache":
        assert bool((other.cpu() == 3).all())
    print("OK")
"""


def _clean_env(**overrides):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "TORCHNEURON_"))}
    env.update(overrides)
    return env


@pytest.fixture(scope="module")
def memory_subprocesses():
    """The subprocesses of this module, run concurrently: {name: (rc, stdout, stderr)}."""
    jobs = {
        "oom": ([sys.executable, "-c", textwrap.dedent(_OOM_SCRIPT)], _clean_env(TORCHNEURON_DEVICE_MEMORY="64MiB")),
        "empty_cache": ([sys.executable, "-c", textwrap.dedent(_PENDING_RELEASE_SCRIPT), "empty_cache"],
                        _clean_env(TORCHNEURON_DEVICE_MEMORY="64MiB")),
        "oom_retry": ([sys.executable, "-c", textwrap.dedent(_PENDING_RELEASE_SCRIPT), "oom_retry"],
                      _clean_env(TORCHNEURON_DEVICE_MEMORY="64MiB")),
    }
    procs = {name: subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, (cmd, env) in jobs.items()}
    results = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=120)
            results[name] = (proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


@pytest.fixture(scope="module")
def oom_run(memory_subprocesses):
    rc, out, err = memory_subprocesses["oom"]
    assert rc == 0, f"the process did not survive (rc={rc}):\n{out}\n{err}"
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("how", ["empty_cache", "oom_retry"])
def test_releasing_cached_memory_waits_for_pending_work(memory_subprocesses, how):
    # A freed block can still be the target of queued device work; returning its segment
    # to the device (empty_cache, or the free-and-retry before an OOM) must wait for that
    # work, as cudaFree does. Otherwise queued tasks write into freed host memory.
    rc, out, err = memory_subprocesses[how]
    assert rc == 0 and "OK" in out, f"rc={rc}\n{out}\n{err[-2000:]}"


def _size_pattern(nbytes: int) -> str:
    mib = nbytes / MiB
    return "|".join([re.escape(f"{mib:.2f} MiB"), re.escape(f"{mib:.1f} MiB"), rf"\b{mib:.0f} ?MiB",
                     rf"\b{nbytes}\b", re.escape(f"{nbytes / 2**30:.2f} GiB")])


def test_capacity_comes_from_environment(oom_run):
    assert oom_run["total_memory"] == 64 * MiB
    assert oom_run["mem_total"] == 64 * MiB


def test_oom_raises_out_of_memory_error_with_figures(oom_run):
    err = oom_run.get("huge_error")
    assert err is not None, "allocating 100 MiB on a 64 MiB device did not raise"
    assert err["oom"], err  # torch.OutOfMemoryError (a RuntimeError), as on CUDA
    assert err["runtime"]
    msg = err["message"]
    assert "neuron:0" in msg or "neuron 0" in msg, msg
    assert re.search(_size_pattern(100 * MiB), msg), f"requested size missing: {msg}"
    assert re.search(_size_pattern(64 * MiB), msg), f"capacity missing: {msg}"
    assert oom_run["num_ooms"] >= 1


def test_oom_names_the_device(oom_run):
    err = oom_run.get("huge_dev1_error")
    assert err is not None and err["oom"], err
    assert "neuron:1" in err["message"] or "neuron 1" in err["message"], err["message"]


def test_process_and_data_survive_oom(oom_run):
    assert oom_run["keep_intact_after_huge"] is True
    assert oom_run.get("smaller_after_oom") is True, oom_run.get("smaller_after_oom_error")
    assert oom_run["keep_intact_at_end"] is True


def test_oom_in_op_output(oom_run):
    err = oom_run.get("op_output_error")
    assert err is not None and err["oom"], err
    assert oom_run["keep_intact_after_op"] is True


def test_oom_frees_cache_and_retries(oom_run):
    res = oom_run.get("retry")
    assert res is not None, oom_run.get("retry_error")
    assert res["ok"] is True
    assert res["retries"] >= 1


def test_resize_to_negative_size_leaves_tensor_unchanged():
    x = torch.arange(4.0, device="neuron")
    with pytest.raises(RuntimeError, match="negative dimension"):
        x.resize_(-1)
    assert x.shape == (4,)
    assert torch.equal(x.cpu(), torch.arange(4.0))


def test_empty_cache_releases_the_gil_while_waiting_for_the_device():
    # A queued task that runs Python (a custom op's CPU kernel) must be able
    # to finish while empty_cache waits for the device.
    code = """
import torch
@torch.library.custom_op("tn_test::twice", mutates_args=(), device_types="cpu")
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2
@twice.register_fake
def _(x):
    return torch.empty_like(x)
a = torch.randn(600, 600, device="neuron")
x = torch.ones(3, device="neuron")
twice(x)
torch.neuron.synchronize()
for _ in range(3):
    a = a @ a
y = twice(x)
del a
torch.neuron.empty_cache()
print(y.cpu().tolist())
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[2.0, 2.0, 2.0]"
