"""Async-semantics fuzzer: random race-free programs, run on neuron and on CPU.

A program is a list of abstract steps (ops, views, in-place updates, copies in
both directions through pinned and pageable memory, frees, side streams,
synchronisations, backward passes, adaptive eager on and off). `render` turns
it into Python source and adds the ordering a correct program needs: a stream
switch waits for the previous stream (by `wait_stream`, an event, or a host
synchronisation, chosen by the program), a tensor used on a stream other than
the one it was allocated on is `record_stream`ed there, and the host
synchronises before it touches a non-blocking copy's memory. The same source
runs with `DEV = "neuron"` and with `DEV = "cpu"` (where the stream helpers do
nothing); every value, gradient and raised exception type must agree.

A failing seed is shrunk step by step (the rendering keeps the shrunk program
race-free) and printed as a script that reproduces it.

    pytest tests/test_fuzz_async.py                       # default tier: a fixed seed range
    pytest -m slow tests/test_fuzz_async.py               # the long range (make test-slow)
    TORCHNEURON_FUZZ_SEEDS=1000:3000 pytest -m slow tests/test_fuzz_async.py
    TORCHNEURON_FUZZ_ADAPTIVE=0 pytest tests/test_fuzz_async.py   # without adaptive eager steps
"""

from __future__ import annotations

import contextlib
import os
import random

import pytest
import torch

from torchneuron import adaptive

DEFAULT_SEEDS = range(0, 150)
ADAPTIVE = os.environ.get("TORCHNEURON_FUZZ_ADAPTIVE", "1") == "1"
SLOW_SEEDS = range(1000, 4000)
STEPS = 40

UNARY = ["torch.tanh({})", "torch.sigmoid({})", "torch.sin({})", "({} * 0.5)", "({} + 1)"]
BINARY = ["({} + {})", "({} * {})", "torch.tanh({} @ {})"]
VIEWS = {".t()": lambda s: s[::-1], "[1:3]": lambda s: (2, s[1]), ".reshape(-1)[:8].view(2, 4)": lambda s: (2, 4)}
INPLACE = ["{}.mul_(0.5)", "{}.add_({})", "{}.copy_({})", "{}[0].fill_(2)"]
WAITS = ["wait_stream", "event", "host", "device"]


# --------------------------------------------------------------------------- generating


def generate(seed: int, steps: int = STEPS) -> list[tuple]:
    """Abstract steps; names refer to earlier steps' results, and a step whose
    operands are gone (freed, or shrunk away) is dropped by `render`."""
    rng = random.Random(seed)
    out: list[tuple] = []
    names: list[str] = []
    hosts: list[str] = []
    for i in range(steps):
        name = f"v{i}"
        kind = rng.choices(
            ["new", "leaf", "unary", "binary", "view", "inplace", "to_host", "host_inplace", "to_device", "free",
             "stream", "sync", "backward", "adaptive", "busy"],
            [4, 3, 6, 6, 3, 4, 4, 2, 3, 2, 3, 1, 2, 1 if ADAPTIVE else 0, 1],
        )[0]
        pick = lambda pool: rng.choice(pool) if pool else None  # noqa: E731
        if kind in ("new", "leaf"):
            out.append((kind, name, rng.randrange(1 << 16), rng.choice(["pageable", "pageable_nb", "pinned_nb"])))
            names.append(name)
        elif kind == "unary" and names:
            out.append(("unary", name, pick(names), rng.choice(UNARY)))
            names.append(name)
        elif kind == "binary" and names:
            out.append(("binary", name, pick(names), pick(names), rng.choice(BINARY)))
            names.append(name)
        elif kind == "view" and names:
            out.append(("view", name, pick(names), rng.choice(list(VIEWS))))
            names.append(name)
        elif kind == "inplace" and names:
            out.append(("inplace", pick(names), rng.choice(INPLACE), pick(names)))
        elif kind == "to_host" and names:
            out.append(("to_host", name, pick(names), rng.random() < 0.7, rng.random() < 0.3))
            hosts.append(name)
        elif kind == "host_inplace" and hosts:
            out.append(("host_inplace", pick(hosts)))
        elif kind == "to_device" and hosts:
            out.append(("to_device", name, pick(hosts), rng.random() < 0.7))
            names.append(name)
        elif kind == "free" and names + hosts:
            out.append(("free", pick(names + hosts)))
        elif kind == "stream":
            out.append(("stream", rng.randrange(3), rng.choice(WAITS)))
        elif kind == "sync":
            out.append(("sync",))
        elif kind == "backward" and names:
            out.append(("backward", rng.sample(names + hosts, min(3, len(names + hosts)))))
        elif kind == "adaptive":
            out.append(("adaptive", rng.random() < 0.5))
        elif kind == "busy":
            out.append(("busy",))
    return out


# --------------------------------------------------------------------------- rendering


class _Value:
    def __init__(self, shape, host=False, stream=0, base=None, f64=False):
        self.shape, self.host, self.stream, self.f64 = shape, host, stream, f64
        self.base = base or self  # views share their base's allocation
        self.used_on: set[int] = {stream}
        self.host_pending: set[int] = set()  # streams with a non-blocking copy of this host memory in flight


def render(steps: list[tuple]) -> list[str]:
    lines: list[str] = []
    vals: dict[str, _Value] = {}
    cur = 0

    def use(name):
        """The device is about to touch `name` on the current stream."""
        v = vals[name].base
        if not v.host and cur not in v.used_on:
            lines.append(f"record({name}, S{cur})")
            v.used_on.add(cur)

    def host_touch(name):
        """The host is about to read or write host value `name`."""
        v = vals[name].base
        for s in sorted(v.host_pending):
            lines.append(f"S{s}.synchronize()")
        v.host_pending.clear()

    def alive(*names):
        return all(n in vals for n in names)

    for step in steps:
        kind = step[0]
        if kind in ("new", "leaf"):
            _, name, seed, how = step
            src = f"torch.randn(4, 4, generator=torch.Generator().manual_seed({seed}))"
            if how == "pinned_nb":
                src = f"pinned({src})"
            nb = how != "pageable"
            grad = ".requires_grad_()" if kind == "leaf" else ""
            lines.append(f"{name} = {src}.to(DEV, non_blocking={nb}, copy=True){grad}")
            vals[name] = _Value((4, 4), stream=cur)
        elif kind == "unary" and alive(step[2]):
            _, name, a, fn = step
            use(a)
            lines.append(f"{name} = {fn.format(a)}")
            vals[name] = _Value(vals[a].shape, stream=cur, f64=vals[a].f64)
        elif kind == "binary" and alive(step[2], step[3]):
            _, name, a, b, fn = step
            shape = vals[a].shape
            # mm checks dtypes only when its kernel runs (a deferred error, not
            # the launch-time one of CPU and CUDA): the programs keep them equal.
            if vals[b].shape != shape or ("@" in fn and (shape[0] != shape[1] or vals[a].f64 != vals[b].f64)):
                continue
            use(a), use(b)
            lines.append(f"{name} = {fn.format(a, b)}")
            vals[name] = _Value(shape, stream=cur, f64=vals[a].f64 or vals[b].f64)
        elif kind == "view" and alive(step[2]):
            _, name, a, how = step
            if vals[a].shape != (4, 4):
                continue
            lines.append(f"{name} = {a}{how}")
            vals[name] = _Value(VIEWS[how](vals[a].shape), stream=vals[a].stream, base=vals[a].base, f64=vals[a].f64)
        elif kind == "inplace" and alive(step[1], step[3]):
            _, a, how, b = step
            if vals[a].host or vals[b].host or ("{}" in how[3:] and vals[a].shape != vals[b].shape):
                continue
            use(a), use(b)
            lines.append(how.format(a, b))
        elif kind == "to_host" and alive(step[2]):
            _, name, a, nb, f64 = step
            use(a)
            dtype = "torch.float64, " if f64 else ""
            lines.append(f'{name} = {a}.to("cpu", {dtype}non_blocking={nb}, copy=True)')
            vals[name] = _Value(vals[a].shape, host=True, f64=f64 or vals[a].f64)
            if nb:
                vals[name].host_pending.add(cur)
        elif kind == "host_inplace" and alive(step[1]):
            host_touch(step[1])
            lines.append(f"{step[1]}.mul_(-1)")
        elif kind == "to_device" and alive(step[2]):
            _, name, h, nb = step
            lines.append(f"{name} = {h}.to(DEV, non_blocking={nb}, copy=True)")
            vals[name] = _Value(vals[h].shape, stream=cur, f64=vals[h].f64)
            if nb:  # may read the pinned memory later: the host must not write it before
                vals[h].base.host_pending.add(cur)
        elif kind == "free" and alive(step[1]):
            lines.append(f"del {step[1]}")
            del vals[step[1]]
        elif kind == "stream" and step[1] != cur:
            _, new, how = step
            lines.append(
                {
                    "wait_stream": f"S{new}.wait_stream(S{cur})",
                    "event": f"S{new}.wait_event(S{cur}.record_event())",
                    "host": f"S{cur}.synchronize()",
                    "device": "sync()",
                }[how]
            )
            if how in ("host", "device"):
                for v in vals.values():
                    v.base.host_pending.discard(cur) if how == "host" else v.base.host_pending.clear()
            lines.append(f"use(S{new})")
            cur = new
        elif kind == "sync":
            lines.append("sync()")
            for v in vals.values():
                v.base.host_pending.clear()
        elif kind == "backward":
            names = [n for n in step[1] if n in vals]
            if not names:
                continue
            for n in names:
                host_touch(n) if vals[n].host else use(n)
            terms = " + ".join(f"({n}.double() * {i + 1}).sum()" for i, n in enumerate(names))
            lines.append(f"grads = backward({terms})")
        elif kind == "adaptive":
            lines.append(f"adaptive({step[1]})")
        elif kind == "busy":
            lines.append("busy()")
    return lines


# --------------------------------------------------------------------------- running


class _NullStream:
    """CPU stand-in for a stream: ordering is a no-op on one host thread."""

    def wait_stream(self, other):
        pass

    def record_event(self):
        return None

    def wait_event(self, event):
        pass

    def synchronize(self):
        pass


def namespace(device: str) -> dict:
    """The names a program uses; on CPU the stream helpers do nothing."""
    neuron = device == "neuron"
    streams = [torch.neuron.current_stream(), torch.neuron.Stream(), torch.neuron.Stream(priority=-1)]
    ns: dict = {}

    def backward(loss):
        """Gradients of `loss` for every leaf of the program that requires grad."""
        leaves = [v for k, v in sorted(ns.items()) if _is_value(k) and v.is_leaf and v.requires_grad]
        grads = torch.autograd.grad(loss, leaves, allow_unused=True, retain_graph=True) if leaves else ()
        return [None if g is None else g.cpu() for g in grads]

    def busy():
        """Device work that keeps the current stream busy for a while."""
        a = torch.randn(256, 256, device="neuron")
        for _ in range(4):
            a = torch.tanh(a @ a * 0.01)

    ns.update(
        torch=torch,
        DEV=device,
        backward=backward,
        **{f"S{i}": s if neuron else _NullStream() for i, s in enumerate(streams)},
    )
    if neuron:
        ns.update(use=torch.neuron.set_stream, record=lambda t, s: t.record_stream(s), pinned=lambda t: t.pin_memory(),
                  sync=torch.neuron.synchronize, adaptive=adaptive.set_enabled, busy=busy)
    else:
        ns.update(use=lambda s: None, record=lambda t, s: None, pinned=lambda t: t, sync=lambda: None,
                  adaptive=lambda on: None, busy=lambda: None)
    return ns


def _is_value(name: str) -> bool:
    return name[0] == "v" and name[1:].isdigit()


def execute(lines: list[str], device: str) -> list:
    """Runs the program; returns what it observed: per line the exception type
    it raised (if any), every backward pass's gradients, and the final value
    of every tensor still alive."""
    ns = namespace(device)
    observed: list = []
    previous = torch.neuron.current_stream()
    try:
        for i, line in enumerate(lines):
            try:
                exec(line, {"__builtins__": __builtins__}, ns)  # noqa: S102 - our own generated program
            except Exception as e:  # noqa: BLE001 - the type is compared with CPU's
                observed.append((i, type(e).__name__))
            if line.startswith("grads ="):
                observed.append((i, ns.pop("grads", None)))
        try:
            ns["sync"]()
        except Exception as e:  # noqa: BLE001 - an error that surfaced only at the end
            observed.append(("end", type(e).__name__))
    finally:
        torch.neuron.set_stream(previous)
        adaptive.set_enabled(False)
    for name in sorted(k for k in ns if _is_value(k)):
        t = ns[name]
        observed.append((name, t.detach().cpu().clone(), t.requires_grad))
    return observed


def mismatch(lines: list[str]) -> str | None:
    """Why neuron and CPU disagree on the program, or None."""
    try:
        got, want = execute(lines, "neuron"), execute(lines, "cpu")
    except Exception as e:  # noqa: BLE001 - an escape from execute is itself a finding
        return f"the program crashed the harness: {type(e).__name__}: {e}"
    if len(got) != len(want):
        return f"observations differ: neuron {_brief(got)} vs cpu {_brief(want)}"
    for g, w in zip(got, want):
        try:
            _same(g, w)
        except AssertionError as e:
            return f"at {w[0]!r}: {e}"
    return None


def _brief(observed):
    return [o if not isinstance(o[1], (torch.Tensor, list)) else o[0] for o in observed]


def _same(g, w):
    if isinstance(w, torch.Tensor) or isinstance(g, torch.Tensor):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, equal_nan=True)
    elif isinstance(w, (list, tuple)):
        assert isinstance(g, (list, tuple)) and len(g) == len(w), f"{g!r} != {w!r}"
        for a, b in zip(g, w):
            _same(a, b)
    else:
        assert g == w, f"{g!r} != {w!r}"


def shrink(steps: list[tuple]) -> list[tuple]:
    """Drops steps one at a time while the rendered program still fails."""
    changed = True
    while changed:
        changed = False
        for i in reversed(range(len(steps))):
            trial = steps[:i] + steps[i + 1:]
            if mismatch(render(trial)):
                steps, changed = trial, True
    return steps


def reproducer(seed: int, steps: list[tuple]) -> str:
    lines = render(steps)
    body = "\n".join(f"    {line!r}," for line in lines)
    return (
        f"# seed {seed}, shrunk to {len(steps)} steps; the program:\n"
        + "\n".join(lines)
        + "\n\n# to run it on both devices and compare:\n"
        + "from tests.test_fuzz_async import mismatch\n"
        + f"print(mismatch([\n{body}\n]))\n"
    )


def check(seed: int) -> None:
    steps = generate(seed)
    why = mismatch(render(steps))
    if why:
        small = shrink(steps)
        pytest.fail(f"neuron and CPU disagree: {mismatch(render(small)) or why}\n\n{reproducer(seed, small)}")


def _seed_range(default: range) -> range:
    spec = os.environ.get("TORCHNEURON_FUZZ_SEEDS")
    if not spec:
        return default
    lo, hi = (int(x) for x in spec.split(":"))
    return range(lo, hi)


# --------------------------------------------------------------------------- tests


@pytest.fixture(autouse=True)
def _adaptive_off_after():
    yield
    adaptive.set_enabled(False)
    torch.neuron.synchronize()


@pytest.mark.parametrize("seed", DEFAULT_SEEDS)
def test_a_random_program_runs_on_neuron_as_on_cpu(seed):
    check(seed)


@pytest.mark.slow
def test_a_long_seed_range_runs_on_neuron_as_on_cpu():
    failures = []
    for seed in _seed_range(SLOW_SEEDS):
        try:
            check(seed)
        except pytest.fail.Exception as e:
            failures.append(str(e))
            if len(failures) >= 3:
                break
    assert not failures, "\n\n".join(failures)


def test_the_programs_cover_every_kind_of_step():
    rendered = "\n".join(line for seed in DEFAULT_SEEDS for line in render(generate(seed)))
    for needle in ["non_blocking=True", "pinned(", "record(", ".wait_stream(", ".wait_event(", ".synchronize()",
                   "use(S1)", "use(S2)", "sync()", "backward(", "del ", ".mul_(", ".add_(",
                   ".copy_(", "torch.float64", ".t()", "[1:3]", "requires_grad_()", "busy()"]:
        assert needle in rendered, f"no default-tier program contains {needle!r}"


def test_the_fuzzer_finds_and_shrinks_a_planted_divergence(monkeypatch):
    """It can fail: a device whose host synchronisation corrupts pinned
    memory (the kind of bug the fuzzer hunts) is caught and shrunk."""
    real = namespace

    def corrupting(device):
        ns = real(device)
        if device == "neuron":
            def synchronize_and_corrupt():
                torch.neuron.synchronize()
                for v in list(ns.values()):
                    if isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.is_pinned():
                        v.detach().add_(1)

            ns["sync"] = synchronize_and_corrupt
        return ns

    monkeypatch.setitem(globals(), "namespace", corrupting)
    steps = [
        ("new", "v0", 1, "pageable"),
        ("unary", "v1", "v0", UNARY[0]),
        ("to_host", "v2", "v1", True, False),
        ("binary", "v3", "v0", "v0", BINARY[0]),
        ("sync",),
        ("unary", "v4", "v3", UNARY[1]),
    ]
    assert mismatch(render(steps)) is not None
    small = shrink(steps)
    kinds = [s[0] for s in small]
    assert kinds == ["new", "unary", "to_host"], small  # the end of the program synchronises too
    assert "seed 7, shrunk to 3 steps" in reproducer(7, small)
