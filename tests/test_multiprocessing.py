"""The neuron device and processes: fork after use is refused like CUDA, spawn works.

The fork scenarios run in one fresh interpreter (``subprocess`` with a
timeout), so each fork happens in a process whose only device user is the
script itself; every forked child is waited for with a deadline and killed
if it overruns. Results computed in children are compared with the same
computation on CPU.
"""

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.multiprocessing as mp

TIMEOUT = 120
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Prints one line per probe: "<phase>.<name> ok <repr(value)>" or
# "<phase>.<name> <ExceptionType> <first line of the message>".
_FORK_SCRIPT = r'''
import os, select, sys, time
import torch

def report(key, fn):
    try:
        return f"{key} ok {fn()!r}\n"
    except BaseException as e:
        msg = str(e).splitlines()[0] if str(e) else ""
        return f"{key} {type(e).__name__} {msg}\n"

def in_child(phase, probes, deadline_s=60):
    """Forks; the child runs the probes and writes their reports on a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            for name, fn in probes:
                os.write(w, report(f"{phase}.{name}", fn).encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks, deadline = [], time.time() + deadline_s
    while time.time() < deadline:
        ready, _, _ = select.select([r], [], [], 0.5)
        if ready:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    os.close(r)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.time() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            print(f"{phase}.child_exit timeout")
            return
        time.sleep(0.05)
    sys.stdout.write(b"".join(chunks).decode())
    print(f"{phase}.child_exit ok {os.waitstatus_to_exitcode(status)!r}")

# phase 1: fork before the parent touches the device -- the child may use it (as with CUDA)
in_child("before", [
    ("compute", lambda: (torch.arange(4.0, device="neuron") @ torch.arange(4.0, device="neuron")).item()),
    ("second_device", lambda: torch.full((2,), 3.0, device="neuron:1").sum().item()),
])

# phase 2: the parent uses the device, then forks -- the child must get a clear error
parent_tensor = torch.arange(6.0, device="neuron") * 2
assert parent_tensor.sum().item() == 30.0
in_child("after", [
    ("create", lambda: torch.ones(3, device="neuron").sum().item()),
    ("to_device", lambda: torch.ones(3).to("neuron").cpu().tolist()),
    ("inherited", lambda: parent_tensor.cpu().tolist()),
    ("sync", lambda: torch.neuron.synchronize()),
    ("is_initialized", lambda: torch.neuron.is_initialized()),
    ("cpu_work", lambda: (torch.arange(4.0) * 3).sum().item()),
])
sys.stdout.write(report("after.parent", lambda: (parent_tensor + 1).sum().item()))

# phase 3: the common pattern -- model on the device, DataLoader workers forked for CPU work
def dataloader():
    from torch.utils.data import DataLoader, TensorDataset
    w = torch.arange(12.0).view(4, 3).to("neuron")
    data = torch.arange(64.0).view(16, 4)
    loader = DataLoader(TensorDataset(data), batch_size=4, num_workers=2, multiprocessing_context="fork", timeout=60)
    total = torch.zeros(3, device="neuron")
    for (x,) in loader:
        total += (x.to("neuron") @ w).sum(0)
    return total.cpu().tolist()
sys.stdout.write(report("loader.result", dataloader))
print("loader.expected ok", repr((torch.arange(64.0).view(16, 4) @ torch.arange(12.0).view(4, 3)).sum(0).tolist()))
'''


@pytest.fixture(scope="module")
def fork_results():
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT],
        capture_output=True, text=True, timeout=TIMEOUT, cwd=REPO, env=dict(os.environ),
    )
    results = {}
    for line in proc.stdout.splitlines():
        key, _, rest = line.partition(" ")
        results[key] = rest
    results["_log"] = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
    return results


def _get(results, key):
    assert key in results, f"no result for {key}; script output:\n{results['_log']}"
    return results[key]


def test_fork_after_device_use_raises_clear_error(fork_results):
    assert _get(fork_results, "after.child_exit") == "ok 0"
    for name in ("create", "to_device", "inherited", "sync"):
        rest = _get(fork_results, f"after.{name}")
        assert rest.startswith("RuntimeError "), f"{name}: expected a RuntimeError in the forked child, got: {rest}"
        assert "spawn" in rest, f"{name}: the error should tell the user to use the 'spawn' start method: {rest}"
        assert "fork" in rest, f"{name}: the error should say the process was forked: {rest}"
    assert _get(fork_results, "after.is_initialized") == "ok False"
    assert _get(fork_results, "after.cpu_work") == "ok 18.0"  # CPU work in the child is unaffected
    assert _get(fork_results, "after.parent") == "ok 36.0"  # the parent keeps working


def test_fork_before_device_use_is_fine(fork_results):
    assert _get(fork_results, "before.child_exit") == "ok 0"
    assert _get(fork_results, "before.compute") == "ok 14.0"
    assert _get(fork_results, "before.second_device") == "ok 6.0"


def test_dataloader_fork_workers_with_device_in_parent(fork_results):
    expected = _get(fork_results, "loader.expected")
    assert _get(fork_results, "loader.result") == expected


# --------------------------------------------------------------------------- spawn

def _spawn_worker(rank, queue):
    torch.manual_seed(10 + rank)
    x = torch.randn(32, 16)
    w = torch.randn(16, 8)
    dev = torch.device("neuron", rank)  # one device per rank
    y = torch.relu(x.to(dev) @ w.to(dev)).sum(0)
    # plain Python values: shared-memory tensors would need the child alive until received
    queue.put((rank, str(y.device), y.cpu().tolist(), torch.relu(x @ w).sum(0).tolist(), torch.neuron.is_initialized()))


def test_spawn_children_use_device():
    torch.ones(2, device="neuron").sum().item()  # the parent has initialised the device: spawn is still fine
    queue = mp.get_context("spawn").Queue()
    context = mp.spawn(_spawn_worker, args=(queue,), nprocs=2, join=False, start_method="spawn")
    try:
        results = [queue.get(timeout=TIMEOUT) for _ in range(2)]
        deadline = time.monotonic() + TIMEOUT
        while not context.join(timeout=max(0.1, deadline - time.monotonic())):  # returns after each child
            assert time.monotonic() < deadline, "spawned children did not exit in time"
    finally:
        for p in context.processes:
            if p.is_alive():
                p.kill()
                p.join(10)
    assert all(p.exitcode == 0 for p in context.processes)
    assert sorted(r[0] for r in results) == [0, 1]
    for rank, device, got, expected, initialised in results:
        assert device == f"neuron:{rank}"
        assert initialised
        torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=1e-5)
    # and the parent still works
    assert (torch.arange(3.0, device="neuron") + 1).sum().item() == 6.0
