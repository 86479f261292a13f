"""The device module a user relies on: ``torch.neuron``, ``torch.accelerator``,
the ``Tensor``/``Module``/storage methods, the environment variables, the
import itself and ``python -m torchneuron info``.

References are independent of the code under test: CPU results, the public
hardware figures (docs: ARCHITECTURE §10), the values the test itself puts in
the environment, and ``torch.cuda``'s documented semantics.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

GiB = 1 << 30
MiB = 1 << 20

# Public figures (Trn2 = NeuronCore-v3, Trn3 = NeuronCore-v4).
PLATFORM_FACTS = {
    "trn2": dict(core_name="NeuronCore-v3", cores_per_chip=8, hbm_per_chip=96 * GiB, sbuf=28 * MiB,
                 psum=2 * MiB, partitions=128, hbm_tbps=(2.9, 3.0)),
    "trn3": dict(core_name="NeuronCore-v4", cores_per_chip=8, hbm_per_chip=144 * GiB, sbuf=32 * MiB,
                 psum=2 * MiB, partitions=128, hbm_tbps=(4.7, 4.9)),
}

_OUR_ENV_PREFIXES = ("NEURON_", "TORCHNEURON_", "TORCH_DEVICE_BACKEND_AUTOLOAD")
SUBPROCESS_TIMEOUT = 120


def _clean_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OUR_ENV_PREFIXES)}
    env.update(overrides)
    return env


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)


def _run_parallel(jobs: dict[str, tuple[list[str], dict[str, str]]], max_parallel: int = 4):
    """Runs independent subprocesses a few at a time; returns {name: (rc, stdout, stderr)}."""
    results: dict[str, tuple[int, str, str]] = {}
    pending = list(jobs.items())
    running: list[tuple[str, subprocess.Popen]] = []
    try:
        while pending or running:
            while pending and len(running) < max_parallel:
                name, (cmd, env) = pending.pop(0)
                running.append((name, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                                       stderr=subprocess.PIPE, text=True)))
            name, proc = running.pop(0)
            out, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
            results[name] = (proc.returncode, out, err)
    finally:
        for _, proc in running:
            proc.kill()
            proc.wait()
    return results


def _last_json(stdout: str) -> dict:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no JSON result in output:\n{stdout}"
    return json.loads(lines[-1])


# --------------------------------------------------------------------------------------
# Subprocess scripts. Each prints one JSON line with what it observed; the tests assert.
# --------------------------------------------------------------------------------------

_PROPS_SCRIPT = """
    import json, torch
    n = torch.neuron.device_count()
    out = {"count": n, "acc_count": torch.accelerator.device_count(), "available": torch.neuron.is_available(),
           "devices": []}
    for i in range(n):
        p = torch.neuron.get_device_properties(i)
        out["devices"].append({
            "name": p.name, "get_device_name": torch.neuron.get_device_name(i),
            "total_memory": p.total_memory, "mem_total": torch.neuron.mem_get_info(i)[1],
            "platform": getattr(p, "platform", None), "core_name": getattr(p, "core_name", None),
            "physical_core": getattr(p, "physical_core", None),
            "cores_per_chip": getattr(p, "cores_per_chip", None),
            "sbuf_bytes": getattr(p, "sbuf_bytes", None), "psum_bytes": getattr(p, "psum_bytes", None),
            "partitions": getattr(p, "partitions", None),
            "hbm_bandwidth_tbps": getattr(p, "hbm_bandwidth_tbps", None),
        })
        x = torch.arange(10.0)
        y = (x.to(f"neuron:{i}") * 3 + 1).cpu()
        out["devices"][-1]["compute_ok"] = bool(torch.equal(y, x * 3 + 1))
    print(json.dumps(out))
"""

_MALFORMED_SCRIPT = """
    import json, torch
    out = {}
    try:
        out["count"] = torch.neuron.device_count()
    except Exception as e:
        out["count_error"] = f"{type(e).__name__}: {e}"
    try:
        torch.ones(1, device="neuron")
        out["use"] = "ok"
    except Exception as e:
        out["use_error_type"] = type(e).__name__
        out["use_error"] = str(e)
        out["use_error_is_runtime_or_value"] = isinstance(e, (RuntimeError, ValueError))
    print(json.dumps(out))
"""

_MALFORMED = {
    "visible_abc": ("NEURON_RT_VISIBLE_CORES", "abc"),
    "visible_trailing_garbage": ("NEURON_RT_VISIBLE_CORES", "1a"),
    "num_cores_abc": ("NEURON_RT_NUM_CORES", "abc"),
}


@pytest.fixture(scope="module")
def env_runs():
    """All environment-variable subprocesses of this module, run together once."""
    jobs = {
        "num3_trn3": (_python(_PROPS_SCRIPT),
                      _clean_env(NEURON_RT_NUM_CORES="3", NEURON_PLATFORM_TARGET_OVERRIDE="trn3")),
        "visible_1": (_python(_PROPS_SCRIPT), _clean_env(NEURON_RT_VISIBLE_CORES="1")),
        "visible_0,2-3": (_python(_PROPS_SCRIPT), _clean_env(NEURON_RT_VISIBLE_CORES="0,2-3")),
        # The CLI run also covers a range: NEURON_RT_VISIBLE_CORES=0-1.
        "cli": ([sys.executable, "-m", "torchneuron", "info"],
                _clean_env(NEURON_RT_VISIBLE_CORES="0-1", TORCHNEURON_DEVICE_MEMORY="512MiB")),
    }
    for key, (var, value) in _MALFORMED.items():
        jobs[key] = (_python(_MALFORMED_SCRIPT), _clean_env(**{var: value}))
    return _run_parallel(jobs)


def _ok_json(env_runs, key) -> dict:
    rc, out, err = env_runs[key]
    assert rc == 0, f"subprocess {key} failed (rc={rc}):\n{out}\n{err}"
    return _last_json(out)


# --------------------------------------------------------------------------------------
# torch.neuron: discovery, selection, properties
# --------------------------------------------------------------------------------------

def test_default_environment_has_two_available_devices():
    # conftest/pytest runs without NEURON_RT_* overrides: the documented default is 2 cores.
    if "NEURON_RT_NUM_CORES" in os.environ or "NEURON_RT_VISIBLE_CORES" in os.environ:
        pytest.fail("tests must run without NEURON_RT_NUM_CORES / NEURON_RT_VISIBLE_CORES set")
    assert torch.neuron.is_available() is True
    assert torch.neuron.device_count() == 2
    assert torch.accelerator.device_count() == 2


def test_init_and_is_initialized():
    torch.neuron.init()
    torch.neuron.init()  # idempotent
    assert torch.neuron.is_initialized() is True


def test_current_device_and_set_device():
    assert torch.neuron.current_device() == 0
    try:
        torch.neuron.set_device(1)
        assert torch.neuron.current_device() == 1
        assert torch.accelerator.current_device_index() == 1
        # A tensor on the bare "neuron" device lands on the current device.
        assert torch.ones(2, device="neuron").device == torch.device("neuron", 1)
        torch.neuron.set_device("neuron:0")
        assert torch.neuron.current_device() == 0
        torch.neuron.set_device(torch.device("neuron", 1))
        assert torch.neuron.current_device() == 1
        # As torch.cuda.set_device: a negative index is a no-op.
        torch.neuron.set_device(-1)
        assert torch.neuron.current_device() == 1
    finally:
        torch.neuron.set_device(0)
    assert torch.neuron.current_device() == 0


def test_current_device_is_per_thread():
    # As CUDA: the current device is a property of the host thread.
    seen = {}

    def worker():
        seen["initial"] = torch.neuron.current_device()
        torch.neuron.set_device(1)
        seen["after"] = torch.neuron.current_device()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == {"initial": 0, "after": 1}
    assert torch.neuron.current_device() == 0


def test_device_context_manager():
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(1):
        assert torch.neuron.current_device() == 1
        x = torch.ones(3, device="neuron")
        with torch.neuron.device("neuron:0"):
            assert torch.neuron.current_device() == 0
        assert torch.neuron.current_device() == 1
    assert torch.neuron.current_device() == 0
    assert x.device == torch.device("neuron", 1)
    # None and -1 are no-ops (torch.cuda.device semantics).
    with torch.neuron.device(None):
        assert torch.neuron.current_device() == 0
    with torch.neuron.device(-1):
        assert torch.neuron.current_device() == 0
    # The previous device is restored when the block raises.
    with pytest.raises(KeyError):
        with torch.neuron.device(1):
            raise KeyError("boom")
    assert torch.neuron.current_device() == 0


@pytest.mark.parametrize("index", [0, 1])
def test_device_properties_default_platform(index):
    facts = PLATFORM_FACTS["trn2"]
    props = torch.neuron.get_device_properties(index)
    assert props.name == torch.neuron.get_device_name(index)
    assert facts["core_name"] in props.name
    assert "trn2" in props.name
    # The device name says which physical core it is; by default device i is core i.
    assert props.name.endswith(f"core {index}")
    assert props.physical_core == index
    assert props.platform == "trn2"
    assert props.core_name == facts["core_name"]
    assert props.cores_per_chip == facts["cores_per_chip"]
    assert props.sbuf_bytes == facts["sbuf"]
    assert props.psum_bytes == facts["psum"]
    assert props.partitions == facts["partitions"]
    lo, hi = facts["hbm_tbps"]
    assert lo <= props.hbm_bandwidth_tbps <= hi
    # Capacity: positive, at most the per-core share of the chip's HBM, and the same figure
    # mem_get_info reports as total (torch.cuda semantics).
    assert 0 < props.total_memory <= facts["hbm_per_chip"] // facts["cores_per_chip"]
    assert torch.neuron.mem_get_info(index)[1] == props.total_memory
    # Device argument spellings all name the same device.
    for spelling in (f"neuron:{index}", torch.device("neuron", index)):
        other = torch.neuron.get_device_properties(spelling)
        assert (other.name, other.total_memory) == (props.name, props.total_memory)


def test_get_device_name_defaults_to_current_device():
    assert torch.neuron.get_device_name() == torch.neuron.get_device_name(0)
    with torch.neuron.device(1):
        assert torch.neuron.get_device_name() == torch.neuron.get_device_name(1)
        assert torch.neuron.get_device_properties().name == torch.neuron.get_device_name(1)


def test_device_functions_reject_other_device_types():
    with pytest.raises((ValueError, RuntimeError)):
        torch.neuron.get_device_properties("cpu")


def test_synchronize_waits_for_queued_work():
    x = torch.randn(128, 128)
    for dev in range(torch.neuron.device_count()):
        d = x.to(f"neuron:{dev}")
        for _ in range(20):
            d = d * 0.5 + 1.0
        torch.neuron.synchronize(dev)
        ref = x.clone()
        for _ in range(20):
            ref = ref * 0.5 + 1.0
        torch.testing.assert_close(d.cpu(), ref)
    torch.neuron.synchronize()
    torch.neuron.synchronize("neuron:1")
    torch.neuron.synchronize(torch.device("neuron", 0))


def test_manual_seed_reproducible():
    torch.neuron.manual_seed(1234)
    assert torch.neuron.initial_seed() == 1234
    a = torch.randn(100, device="neuron").cpu()
    torch.neuron.manual_seed(1234)
    b = torch.randn(100, device="neuron").cpu()
    assert torch.equal(a, b)
    c = torch.randn(100, device="neuron").cpu()
    assert not torch.equal(a, c)  # the generator advanced


def test_torch_manual_seed_seeds_neuron_too():
    torch.manual_seed(77)
    a = torch.rand(50, device="neuron").cpu()
    torch.manual_seed(77)
    b = torch.rand(50, device="neuron").cpu()
    assert torch.equal(a, b)


def test_manual_seed_all_and_seed():
    torch.neuron.manual_seed_all(99)
    for i in range(torch.neuron.device_count()):
        with torch.neuron.device(i):
            assert torch.neuron.initial_seed() == 99
    torch.neuron.seed()
    s1 = torch.neuron.initial_seed()
    torch.neuron.seed()
    s2 = torch.neuron.initial_seed()
    assert s1 != s2  # non-deterministic seeds (collision is ~2**-64)
    torch.neuron.seed_all()
    seeds = set()
    for i in range(torch.neuron.device_count()):
        with torch.neuron.device(i):
            seeds.add(torch.neuron.initial_seed())
    assert len(seeds) == 1


def test_rng_state_round_trip():
    torch.neuron.manual_seed(5)
    state = torch.neuron.get_rng_state()
    assert state.device.type == "cpu" and state.dtype == torch.uint8
    a = torch.rand(64, device="neuron").cpu()
    torch.neuron.set_rng_state(state)
    b = torch.rand(64, device="neuron").cpu()
    assert torch.equal(a, b)
    states = torch.neuron.get_rng_state_all()
    assert len(states) == torch.neuron.device_count()


def test_amp_supported_dtypes_and_bf16():
    dtypes = torch.neuron.get_amp_supported_dtype()
    assert torch.bfloat16 in dtypes and torch.float16 in dtypes
    assert torch.neuron.is_bf16_supported() is True
    a = torch.randn(8, 8, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        y = a @ a
    assert y.dtype == torch.bfloat16
    ref = (a.cpu().bfloat16() @ a.cpu().bfloat16()).float()
    torch.testing.assert_close(y.float().cpu(), ref, rtol=2e-2, atol=2e-2)


# --------------------------------------------------------------------------------------
# Tensor / Module / storage methods
# --------------------------------------------------------------------------------------

def test_tensor_neuron_method_and_is_neuron():
    x = torch.randn(4, 5)
    assert x.is_neuron is False
    y = x.neuron()
    assert y.is_neuron is True
    assert y.device == torch.device("neuron", 0)
    assert torch.equal(y.cpu(), x)
    z = x.neuron(1)
    assert z.device == torch.device("neuron", 1)
    assert torch.equal(z.cpu(), x)
    w = x.neuron("neuron:1", non_blocking=True)
    assert w.device == torch.device("neuron", 1)
    torch.neuron.synchronize(1)
    assert torch.equal(w.cpu(), x)
    with torch.neuron.device(1):
        assert x.neuron().device == torch.device("neuron", 1)
    # Already on the device: returns the tensor itself, as Tensor.cuda() does.
    assert y.neuron() is y


def test_module_neuron():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4))
    ref = [t.clone() for t in list(m.parameters()) + list(m.buffers())]
    out = m.neuron()
    assert out is m
    for t, r in zip(list(m.parameters()) + list(m.buffers()), ref):
        assert t.device == torch.device("neuron", 0)
        assert torch.equal(t.cpu(), r)
    m.neuron(1)
    assert all(p.device == torch.device("neuron", 1) for p in m.parameters())


def test_untyped_storage_neuron():
    x = torch.tensor([1.5, -2.0, 3.25], dtype=torch.float32)
    cpu_storage = x.untyped_storage()
    assert cpu_storage.is_neuron is False
    s = cpu_storage.neuron()
    assert s.is_neuron is True
    assert s.device == torch.device("neuron", 0)
    assert s.nbytes() == cpu_storage.nbytes()
    assert list(s.cpu()) == list(cpu_storage)
    assert torch.UntypedStorage(16).neuron(1).device == torch.device("neuron", 1)


# --------------------------------------------------------------------------------------
# torch.accelerator (device-agnostic code)
# --------------------------------------------------------------------------------------

def test_accelerator_identity():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch.accelerator.current_accelerator(check_available=True).type == "neuron"
    assert torch.accelerator.device_count() == torch.neuron.device_count()


def test_accelerator_device_index():
    assert torch.accelerator.current_device_index() == 0
    try:
        torch.accelerator.set_device_index(1)
        assert torch.accelerator.current_device_index() == 1
        assert torch.neuron.current_device() == 1
    finally:
        torch.accelerator.set_device_index(0)
    with torch.accelerator.device_index(1):
        assert torch.accelerator.current_device_index() == 1
        assert torch.neuron.current_device() == 1
        assert torch.empty(1, device="neuron").device.index == 1
        assert torch.accelerator.current_stream().device == torch.device("neuron", 1)
    assert torch.accelerator.current_device_index() == 0
    with torch.accelerator.device_index(None):  # no-op
        assert torch.accelerator.current_device_index() == 0


def test_accelerator_streams_and_synchronize():
    default = torch.accelerator.current_stream()
    assert default.device == torch.device("neuron", 0)
    assert default == torch.neuron.default_stream()
    side = torch.Stream(device="neuron")
    try:
        torch.accelerator.set_stream(side)
        assert torch.accelerator.current_stream() == side
        assert torch.neuron.current_stream() == side
        x = torch.arange(1000.0, device="neuron")
        y = (x * 2).sum()
        torch.accelerator.synchronize()
        assert y.item() == 2 * sum(range(1000))
    finally:
        torch.accelerator.set_stream(default)
    assert torch.accelerator.current_stream() == default
    torch.accelerator.synchronize(1)


def test_accelerator_memory_api():
    torch.accelerator.synchronize()
    before = torch.accelerator.memory_allocated()
    x = torch.empty(MiB, dtype=torch.uint8, device="neuron")
    assert torch.accelerator.memory_allocated() - before == MiB
    assert torch.accelerator.memory_allocated(0) == torch.neuron.memory_allocated(0)
    assert torch.accelerator.max_memory_allocated() >= before + MiB
    assert torch.accelerator.memory_reserved() >= torch.accelerator.memory_allocated()
    assert torch.accelerator.max_memory_reserved() >= torch.accelerator.memory_reserved()
    stats = torch.accelerator.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.accelerator.memory_allocated()
    free, total = torch.accelerator.get_memory_info()
    assert (free, total) == torch.neuron.mem_get_info()
    del x
    assert torch.accelerator.memory_allocated() == before
    torch.accelerator.empty_cache()
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.accelerator.memory_allocated()
    torch.accelerator.reset_accumulated_memory_stats()
    torch.accelerator.empty_host_cache()


def test_accelerator_get_device_capability():
    # torch.accelerator.get_device_capability: a dict whose "supported_dtypes" lists the dtypes
    # tensors can be allocated in on the device (PyTorch 2.13 docs).
    caps = torch.accelerator.get_device_capability("neuron:0")
    assert isinstance(caps, dict)
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool):
        assert dt in caps["supported_dtypes"]


# --------------------------------------------------------------------------------------
# Invalid device indices
# --------------------------------------------------------------------------------------

_BAD = 5  # default environment has 2 devices

_INVALID_INDEX_CALLS = {
    "tensor factory": lambda: torch.ones(1, device=f"neuron:{_BAD}"),
    "Tensor.to": lambda: torch.ones(1).to(f"neuron:{_BAD}"),
    "Tensor.neuron": lambda: torch.ones(1).neuron(_BAD),
    "set_device": lambda: torch.neuron.set_device(_BAD),
    "device ctx": lambda: torch.neuron.device(_BAD).__enter__(),
    "get_device_properties": lambda: torch.neuron.get_device_properties(_BAD),
    "get_device_name": lambda: torch.neuron.get_device_name(_BAD),
    "synchronize": lambda: torch.neuron.synchronize(_BAD),
    "Stream": lambda: torch.neuron.Stream(device=_BAD),
    "memory_allocated": lambda: torch.neuron.memory_allocated(_BAD),
    "mem_get_info": lambda: torch.neuron.mem_get_info(_BAD),
    "accelerator.set_device_index": lambda: torch.accelerator.set_device_index(_BAD),
}


@pytest.mark.parametrize("what", sorted(_INVALID_INDEX_CALLS))
def test_invalid_device_index_raises_clear_error(what):
    # torch.cuda raises (RuntimeError "invalid device ordinal" / AssertionError "Invalid device id").
    with pytest.raises((RuntimeError, ValueError, AssertionError, IndexError)) as info:
        _INVALID_INDEX_CALLS[what]()
    assert str(_BAD) in str(info.value)
    # Nothing changed and the device still works.
    assert torch.neuron.current_device() == 0
    assert torch.equal((torch.ones(3, device="neuron") * 2).cpu(), torch.full((3,), 2.0))


# --------------------------------------------------------------------------------------
# Environment variables (subprocesses)
# --------------------------------------------------------------------------------------

def test_num_cores_and_platform_override(env_runs):
    out = _ok_json(env_runs, "num3_trn3")
    facts = PLATFORM_FACTS["trn3"]
    assert out["count"] == 3 and out["acc_count"] == 3 and out["available"] is True
    for i, dev in enumerate(out["devices"]):
        assert dev["compute_ok"]
        assert dev["name"] == dev["get_device_name"]
        assert facts["core_name"] in dev["name"] and "trn3" in dev["name"]
        assert dev["physical_core"] == i
        assert dev["platform"] == "trn3"
        assert dev["core_name"] == facts["core_name"]
        assert dev["sbuf_bytes"] == facts["sbuf"]
        assert dev["psum_bytes"] == facts["psum"]
        assert dev["partitions"] == facts["partitions"]
        assert dev["cores_per_chip"] == facts["cores_per_chip"]
        lo, hi = facts["hbm_tbps"]
        assert lo <= dev["hbm_bandwidth_tbps"] <= hi
        assert 0 < dev["total_memory"] <= facts["hbm_per_chip"] // facts["cores_per_chip"]
        assert dev["mem_total"] == dev["total_memory"]


@pytest.mark.parametrize("visible,physical", [("1", [1]), ("0,2-3", [0, 2, 3])])
def test_visible_cores(env_runs, visible, physical):
    out = _ok_json(env_runs, f"visible_{visible}")
    assert out["count"] == len(physical) == out["acc_count"]
    for i, (dev, core) in enumerate(zip(out["devices"], physical)):
        # Devices are renumbered from 0; their properties name the physical core.
        assert dev["compute_ok"], f"neuron:{i} does not compute"
        assert dev["physical_core"] == core
        assert dev["name"].endswith(f"core {core}")


@pytest.mark.parametrize("key", sorted(_MALFORMED))
def test_malformed_environment_gives_clear_error(env_runs, key):
    var, value = _MALFORMED[key]
    rc, out, err = env_runs[key]
    assert rc == 0, f"{var}={value!r} crashed the process (rc={rc}):\n{err}"
    res = _last_json(out)
    assert "use" not in res, f"{var}={value!r} was accepted: {res}"
    assert res["use_error_is_runtime_or_value"], res
    # The message names the variable and the offending value.
    assert var in res["use_error"], res["use_error"]
    assert value in res["use_error"], res["use_error"]


def test_cli_info(env_runs):
    rc, out, err = env_runs["cli"]
    assert rc == 0, err
    assert torch.__version__ in out
    assert "trn2" in out
    assert "devices: 2" in out
    device_lines = [ln for ln in out.splitlines() if ln.strip().startswith("neuron:")]
    assert [ln.split()[0] for ln in device_lines] == ["neuron:0", "neuron:1"]
    for ln, core in zip(device_lines, [0, 1]):  # NEURON_RT_VISIBLE_CORES=0-1
        assert "NeuronCore-v3" in ln
        assert f"core {core} " in ln
        assert "0.50 GiB" in ln  # TORCHNEURON_DEVICE_MEMORY=512MiB


# --------------------------------------------------------------------------------------
# Import: autoload switch, cost, threads
# --------------------------------------------------------------------------------------

_IMPORT_SCRIPT = """
    import json, os, sys, time
    t0, c0 = time.perf_counter(), time.process_time()
    import torch
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    threads = len(os.listdir("/proc/self/task"))
    out = {"wall": wall, "cpu": cpu, "threads": threads, "registered": hasattr(torch, "neuron")}
    if not out["registered"]:
        import torchneuron
        out["registered_after_import"] = hasattr(torch, "neuron")
    out["initialized_before_use"] = torch.neuron.is_initialized()
    # Cheap queries (as torch.cuda.device_count) start nothing either.
    out["count"] = torch.neuron.device_count()
    out["threads_after_queries"] = len(os.listdir("/proc/self/task"))
    x = torch.arange(12.0).reshape(3, 4)
    y = (x.to("neuron") @ x.t().to("neuron")).cpu()
    out["compute_ok"] = bool(torch.equal(y, x @ x.t()))
    out["device_type"] = str(torch.accelerator.current_accelerator())
    out["initialized_after_use"] = torch.neuron.is_initialized()
    print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def import_runs():
    """Interleaved fresh interpreters with autoload on and off (2 of each)."""
    runs = {"auto": [], "noauto": []}
    for _ in range(2):
        for key, env in (("auto", _clean_env()), ("noauto", _clean_env(TORCH_DEVICE_BACKEND_AUTOLOAD="0"))):
            p = _run(_python(_IMPORT_SCRIPT), env)
            assert p.returncode == 0, f"{key}: {p.stdout}\n{p.stderr}"
            runs[key].append(_last_json(p.stdout))
    return runs


def test_autoload_registers_on_import_torch(import_runs):
    for r in import_runs["auto"]:
        assert r["registered"] is True
        assert r["compute_ok"] and r["device_type"] == "neuron"


def test_autoload_disabled_then_import_torchneuron(import_runs):
    for r in import_runs["noauto"]:
        assert r["registered"] is False
        assert r["registered_after_import"] is True
        assert r["compute_ok"] and r["device_type"] == "neuron"


def test_runtime_initializes_lazily(import_runs):
    for r in import_runs["auto"] + import_runs["noauto"]:
        assert r["initialized_before_use"] is False
        assert r["count"] == 2
        assert r["initialized_after_use"] is True


def test_import_starts_no_threads(import_runs):
    baseline = min(r["threads"] for r in import_runs["noauto"])
    for r in import_runs["auto"]:
        assert r["threads"] == baseline, import_runs
        assert r["threads_after_queries"] == baseline, import_runs


def test_import_cost_under_one_second(import_runs):
    # CPU seconds of the interpreter (best of two interleaved runs each): what autoload adds to
    # `import torch`. Wall time is not asserted: on a loaded machine it measures the load.
    auto = min(r["cpu"] for r in import_runs["auto"])
    noauto = min(r["cpu"] for r in import_runs["noauto"])
    assert auto - noauto < 1.0, f"import torch (CPU time): {auto:.2f}s with autoload vs {noauto:.2f}s without"


class _OpaqueWrapper(torch.Tensor):
    """A wrapper subclass that handles no op itself (like TorchAO's MXTensor for this query)."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"_OpaqueWrapper: {func}")


def test_shallow_copy_compatibility_of_a_tensor_subclass_is_answered_as_on_cpu():
    """Module.to() asks it of every parameter; on CPU the composite kernel
    answers above the subclass's __torch_dispatch__, and so must neuron's."""
    for device in ("cpu", "neuron"):
        w = _OpaqueWrapper(torch.zeros(2, device=device))
        assert torch._has_compatible_shallow_copy_type(w, w) is True, device
