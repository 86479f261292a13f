"""Random numbers on ``neuron``: reproducible, statistically sane, isolated.

References are independent of the generator under test: re-running the same
seeded program, closed-form moments of the distributions, and the CPU
generator's own sequence.
"""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

DEV = "neuron"
N = 100_000
_WEIGHTS = torch.rand(4, 100, generator=torch.Generator().manual_seed(0)) + 0.1

# Each op draws random numbers on the default neuron generator (or `gen`).
OPS = {
    "randn": lambda gen=None: torch.randn(1000, device=DEV, generator=gen),
    "rand": lambda gen=None: torch.rand(1000, device=DEV, generator=gen),
    "randint": lambda gen=None: torch.randint(0, 1 << 30, (1000,), device=DEV, generator=gen),
    "normal_": lambda gen=None: torch.empty(1000, device=DEV).normal_(2.0, 3.0, generator=gen),
    "uniform_": lambda gen=None: torch.empty(1000, device=DEV).uniform_(-1.0, 4.0, generator=gen),
    "torch.normal": lambda gen=None: torch.normal(torch.zeros(1000, device=DEV), torch.ones(1000, device=DEV), generator=gen),
    "bernoulli": lambda gen=None: torch.bernoulli(torch.full((1000,), 0.5, device=DEV), generator=gen),
    "bernoulli_p": lambda gen=None: torch.empty(1000, device=DEV).bernoulli_(0.3, generator=gen),
    "multinomial": lambda gen=None: torch.multinomial(torch.ones(50, device=DEV), 1000, replacement=True, generator=gen),
    "multinomial_noreplace": lambda gen=None: torch.multinomial(_WEIGHTS.to(DEV), 30, generator=gen),
    "randperm": lambda gen=None: torch.randperm(1000, device=DEV, generator=gen),
    "exponential_": lambda gen=None: torch.empty(1000, device=DEV).exponential_(generator=gen),
    "random_": lambda gen=None: torch.empty(1000, device=DEV).random_(0, 1000, generator=gen),
    "randn_fp16": lambda gen=None: torch.randn(1000, device=DEV, dtype=torch.float16, generator=gen),
    "rand_bf16": lambda gen=None: torch.rand(1000, device=DEV, dtype=torch.bfloat16, generator=gen),
    "randn_fp64": lambda gen=None: torch.randn(1000, device=DEV, dtype=torch.float64, generator=gen),
}

# Ops that take no generator argument: driven by the default generator only.
DEFAULT_ONLY_OPS = {
    "dropout": lambda: F.dropout(torch.ones(1000, device=DEV), p=0.5, training=True),
    "dropout_module": lambda: torch.nn.Dropout(0.3).train()(torch.ones(40, 25, device=DEV)),
    "randn_like": lambda: torch.randn_like(torch.empty(1000, device=DEV)),
    "randint_like": lambda: torch.randint_like(torch.empty(1000, device=DEV), 0, 1 << 20),
    "rrelu": lambda: F.rrelu(-torch.ones(1000, device=DEV), training=True),
}

ALL_OPS = {**OPS, **DEFAULT_ONLY_OPS}


def _draw(fn, *args):
    return fn(*args).cpu()


def _equal(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


# --------------------------------------------------------------------------- reproducibility

@pytest.mark.parametrize("name", list(ALL_OPS))
def test_same_seed_same_numbers(name):
    fn = ALL_OPS[name]
    torch.manual_seed(1234)
    a1, a2 = _draw(fn), _draw(fn)
    torch.manual_seed(1234)
    b1, b2 = _draw(fn), _draw(fn)
    assert _equal(a1, b1) and _equal(a2, b2), f"{name}: same seed gave different numbers"
    assert not torch.equal(a1, a2), f"{name}: two consecutive draws are identical (state did not advance)"
    torch.manual_seed(4321)
    c1 = _draw(fn)
    assert not torch.equal(a1, c1), f"{name}: different seeds gave the same numbers"


def test_sequence_of_mixed_ops_reproducible():
    def program():
        x = torch.randn(64, 64, device=DEV)
        y = F.dropout(x, 0.25, training=True)
        z = y @ torch.rand(64, 8, device=DEV)
        idx = torch.multinomial(z.abs().sum(0) + 1e-3, 4)
        perm = torch.randperm(64, device=DEV)
        return [t.cpu() for t in (x, y, z, idx, perm, torch.randint(0, 100, (5,), device=DEV))]

    torch.manual_seed(7)
    first = program()
    torch.manual_seed(7)
    second = program()
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_fresh_process_gives_same_numbers():
    """Same seed in a new process -> same numbers as in this process."""
    torch.manual_seed(2024)
    here = torch.randn(8, device=DEV).cpu()
    here_dropout = F.dropout(torch.ones(16, device=DEV), 0.5, training=True).cpu()
    code = (
        "import torch, torch.nn.functional as F\n"
        "torch.manual_seed(2024)\n"
        "a = torch.randn(8, device='neuron').cpu()\n"
        "b = F.dropout(torch.ones(16, device='neuron'), 0.5, training=True).cpu()\n"
        "print(repr(a.tolist())); print(repr(b.tolist()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert eval(lines[-2]) == here.tolist()
    assert eval(lines[-1]) == here_dropout.tolist()


def test_manual_seed_seeds_every_device():
    assert torch.neuron.device_count() >= 2
    torch.manual_seed(99)
    a0 = torch.randn(100, device="neuron:0").cpu()
    a1 = torch.randn(100, device="neuron:1").cpu()
    torch.manual_seed(99)
    b1 = torch.randn(100, device="neuron:1").cpu()  # order of devices does not matter: one generator each
    b0 = torch.randn(100, device="neuron:0").cpu()
    assert torch.equal(a0, b0)
    assert torch.equal(a1, b1)
    assert torch.neuron.initial_seed() == 99


def test_neuron_manual_seed_and_initial_seed():
    torch.neuron.manual_seed(5)
    assert torch.neuron.initial_seed() == 5
    a = torch.rand(100, device=DEV).cpu()
    torch.neuron.manual_seed_all(5)
    b = torch.rand(100, device=DEV).cpu()
    assert torch.equal(a, b)
    torch.neuron.seed()
    c = torch.rand(100, device=DEV).cpu()
    assert not torch.equal(a, c)


# --------------------------------------------------------------------------- statistics

def test_randn_statistics():
    torch.manual_seed(0)
    x = torch.randn(N, device=DEV).cpu().double()
    assert abs(x.mean().item()) < 0.02
    assert abs(x.std().item() - 1.0) < 0.02
    assert abs(((x > 0).double().mean()).item() - 0.5) < 0.01
    assert abs((x.abs() < 1).double().mean().item() - 0.6827) < 0.01
    # consecutive samples are uncorrelated
    assert abs(torch.corrcoef(torch.stack([x[:-1], x[1:]]))[0, 1].item()) < 0.02
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        y = torch.randn(N, device=DEV, dtype=dtype)
        assert y.dtype == dtype
        y = y.cpu().double()
        assert abs(y.mean().item()) < 0.02 and abs(y.std().item() - 1.0) < 0.03


def test_rand_and_uniform_statistics():
    torch.manual_seed(0)
    x = torch.rand(N, device=DEV).cpu().double()
    assert x.min().item() >= 0.0 and x.max().item() < 1.0
    assert abs(x.mean().item() - 0.5) < 0.01
    assert abs(x.var().item() - 1 / 12) < 0.005
    hist = torch.histc(x, bins=10, min=0, max=1) / N
    assert torch.all((hist - 0.1).abs() < 0.01), hist
    u = torch.empty(N, device=DEV).uniform_(2.0, 5.0).cpu().double()
    assert u.min().item() >= 2.0 and u.max().item() <= 5.0
    assert abs(u.mean().item() - 3.5) < 0.03


def test_normal_statistics():
    torch.manual_seed(0)
    x = torch.empty(N, device=DEV).normal_(mean=3.0, std=2.0).cpu().double()
    assert abs(x.mean().item() - 3.0) < 0.04
    assert abs(x.std().item() - 2.0) < 0.04
    m = torch.linspace(-5, 5, N).to(DEV)
    y = torch.normal(m, 0.5).cpu().double() - m.cpu().double()
    assert abs(y.mean().item()) < 0.02 and abs(y.std().item() - 0.5) < 0.02


def test_randint_statistics():
    torch.manual_seed(0)
    x = torch.randint(0, 10, (N,), device=DEV)
    assert x.dtype == torch.int64
    x = x.cpu()
    assert x.min().item() == 0 and x.max().item() == 9
    counts = torch.bincount(x, minlength=10).double() / N
    assert torch.all((counts - 0.1).abs() < 0.01), counts
    y = torch.randint(-5, 3, (N,), device=DEV, dtype=torch.int32).cpu()
    assert y.dtype == torch.int32 and y.min().item() == -5 and y.max().item() == 2


def test_bernoulli_statistics():
    torch.manual_seed(0)
    p = torch.full((N,), 0.3, device=DEV)
    x = torch.bernoulli(p).cpu()
    assert set(x.unique().tolist()) == {0.0, 1.0}
    assert abs(x.mean().item() - 0.3) < 0.01
    probs = torch.tensor([0.0, 1.0, 0.5]).repeat(N // 3).to(DEV)
    y = torch.bernoulli(probs).cpu().view(-1, 3)
    assert torch.all(y[:, 0] == 0) and torch.all(y[:, 1] == 1)
    assert abs(y[:, 2].mean().item() - 0.5) < 0.015
    z = torch.empty(N, device=DEV).bernoulli_(0.8).cpu()
    assert abs(z.mean().item() - 0.8) < 0.01


@pytest.mark.parametrize("p", [0.5, 0.2])
def test_dropout_statistics(p):
    torch.manual_seed(0)
    x = torch.rand(N) + 0.5
    y = F.dropout(x.to(DEV), p=p, training=True).cpu()
    kept = y != 0
    assert abs(kept.double().mean().item() - (1 - p)) < 0.01
    torch.testing.assert_close(y[kept], x[kept] / (1 - p))  # kept values scaled by 1/(1-p)
    # in place and module forms agree with the functional form under the same seed
    torch.manual_seed(1)
    a = F.dropout(x.to(DEV), p=p, training=True).cpu()
    torch.manual_seed(1)
    b = x.to(DEV)
    F.dropout(b, p=p, training=True, inplace=True)
    assert torch.equal(a, b.cpu())
    torch.manual_seed(1)
    c = torch.nn.Dropout(p)(x.to(DEV)).cpu()
    assert torch.equal(a, c)


def test_multinomial_statistics():
    torch.manual_seed(0)
    probs = torch.tensor([0.1, 0.0, 0.2, 0.3, 0.4])
    draws = torch.multinomial(probs.to(DEV), N, replacement=True).cpu()
    freq = torch.bincount(draws, minlength=5).double() / N
    assert freq[1].item() == 0.0
    assert torch.allclose(freq, probs.double(), atol=0.01), freq
    # without replacement: distinct indices, never a zero-probability one while others remain
    w = torch.rand(8, 20) + 0.01
    w[:, 3] = 0
    s = torch.multinomial(w.to(DEV), 19).cpu()
    for row in s:
        assert len(set(row.tolist())) == 19 and 3 not in row.tolist()
    # the heaviest category comes first more often than chance
    w = torch.tensor([10.0, 1.0, 1.0, 1.0]).repeat(2000, 1)
    first = torch.multinomial(w.to(DEV), 2)[:, 0].cpu()
    assert abs((first == 0).double().mean().item() - 10 / 13) < 0.03


def test_randperm_is_a_permutation():
    torch.manual_seed(0)
    for n in (1, 2, 17, 1000, 70000):
        p = torch.randperm(n, device=DEV)
        assert p.dtype == torch.int64 and p.device.type == "neuron"
        assert torch.equal(p.cpu().sort().values, torch.arange(n))
    p = torch.randperm(1000, device=DEV).cpu().double()
    # not the identity and no obvious correlation with position
    assert abs(torch.corrcoef(torch.stack([p, torch.arange(1000).double()]))[0, 1].item()) < 0.15
    first = torch.stack([torch.randperm(4, device=DEV)[0] for _ in range(400)]).cpu()
    counts = torch.bincount(first, minlength=4).double() / 400
    assert torch.all((counts - 0.25).abs() < 0.1), counts


def test_exponential_statistics():
    torch.manual_seed(0)
    x = torch.empty(N, device=DEV).exponential_(lambd=2.0).cpu().double()
    assert x.min().item() >= 0
    assert abs(x.mean().item() - 0.5) < 0.01


# --------------------------------------------------------------------------- RNG state

def test_get_set_rng_state_restores_sequence():
    torch.manual_seed(11)
    torch.randn(10, device=DEV)  # advance
    state = torch.neuron.get_rng_state()
    assert state.device.type == "cpu" and state.dtype == torch.uint8
    a = [_draw(ALL_OPS[k]) for k in ("randn", "dropout", "randint", "randperm", "multinomial")]
    torch.randn(1000, device=DEV)  # move on
    torch.neuron.set_rng_state(state)
    b = [_draw(ALL_OPS[k]) for k in ("randn", "dropout", "randint", "randperm", "multinomial")]
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    # the state tensor handed out is a copy: mutating it does not change the generator
    state2 = torch.neuron.get_rng_state()
    state2.zero_()
    c = _draw(OPS["randn"])
    torch.neuron.set_rng_state(torch.neuron.get_rng_state())
    assert not torch.equal(c, a[0])


def test_get_set_rng_state_per_device():
    torch.manual_seed(3)
    s1 = torch.neuron.get_rng_state("neuron:1")
    a = torch.rand(50, device="neuron:1").cpu()
    torch.rand(50, device="neuron:0")
    torch.neuron.set_rng_state(s1, "neuron:1")
    b = torch.rand(50, device="neuron:1").cpu()
    assert torch.equal(a, b)
    states = torch.neuron.get_rng_state_all()
    assert len(states) == torch.neuron.device_count()
    x = [torch.randn(20, device=f"neuron:{i}").cpu() for i in range(2)]
    torch.neuron.set_rng_state_all(states)
    y = [torch.randn(20, device=f"neuron:{i}").cpu() for i in range(2)]
    assert all(torch.equal(p, q) for p, q in zip(x, y))


def test_fork_rng_restores_neuron_state():
    torch.manual_seed(8)
    expected = torch.randn(10, device=DEV).cpu()
    torch.manual_seed(8)
    with torch.random.fork_rng(devices=[0], device_type="neuron"):
        torch.randn(100, device=DEV)
    assert torch.equal(torch.randn(10, device=DEV).cpu(), expected)


# --------------------------------------------------------------------------- explicit generators

@pytest.mark.parametrize("name", list(OPS))
def test_explicit_generator(name):
    fn = OPS[name]
    g = torch.Generator(device=DEV)
    assert g.device.type == "neuron"
    g.manual_seed(77)
    a = _draw(fn, g)
    g.manual_seed(77)
    b = _draw(fn, g)
    assert torch.equal(a, b)
    g.manual_seed(78)
    assert not torch.equal(a, _draw(fn, g))


def test_explicit_generator_is_independent_of_default():
    torch.manual_seed(5)
    expected = torch.randn(100, device=DEV).cpu()
    torch.manual_seed(5)
    g = torch.Generator(device=DEV).manual_seed(5)
    for _ in range(3):
        torch.randn(100, device=DEV, generator=g)  # must not advance the default generator
    assert torch.equal(torch.randn(100, device=DEV).cpu(), expected)
    # seeded alike, explicit and default generators give the same stream
    g.manual_seed(5)
    assert torch.equal(torch.randn(100, device=DEV, generator=g).cpu(), expected)


def test_explicit_generator_state_and_second_device():
    g = torch.Generator(device="neuron").manual_seed(1)
    state = g.get_state()
    a = torch.rand(30, device=DEV, generator=g).cpu()
    g.set_state(state)
    assert torch.equal(torch.rand(30, device=DEV, generator=g).cpu(), a)
    g1 = torch.Generator(device="neuron:1").manual_seed(1)
    assert g1.device == torch.device("neuron", 1)
    b = torch.rand(30, device="neuron:1", generator=g1)
    assert b.device == torch.device("neuron", 1)
    g1.manual_seed(1)
    assert torch.equal(torch.rand(30, device="neuron:1", generator=g1).cpu(), b.cpu())


@pytest.mark.parametrize("name", list(OPS))
def test_cpu_generator_rejected(name):
    g = torch.Generator(device="cpu").manual_seed(0)
    with pytest.raises(RuntimeError, match="(?i)generator") as ei:
        OPS[name](g)
        torch.neuron.synchronize()
    msg = str(ei.value)
    assert "neuron" in msg and "cpu" in msg, f"error should say what was expected and found: {msg}"
    torch.randn(4, device=DEV).cpu()  # the device still works


# --------------------------------------------------------------------------- isolation from CPU

def test_neuron_random_ops_do_not_consume_cpu_generator():
    torch.manual_seed(21)
    expected = torch.randn(100)
    torch.manual_seed(21)
    for fn in ALL_OPS.values():
        fn()
    F.dropout(torch.ones(100, device=DEV), 0.5, training=True)
    torch.neuron.synchronize()
    assert torch.equal(torch.randn(100), expected)


def test_cpu_random_ops_do_not_consume_neuron_generator():
    torch.manual_seed(21)
    expected = torch.randn(100, device=DEV).cpu()
    torch.manual_seed(21)
    torch.randn(1000)
    torch.randperm(100)
    F.dropout(torch.ones(100), 0.5, training=True)
    assert torch.equal(torch.randn(100, device=DEV).cpu(), expected)


def test_seeded_neuron_differs_from_plain_reseed_of_other_device():
    """neuron:0 and neuron:1 generators are separate: drawing on one does not shift the other."""
    torch.manual_seed(4)
    expected = torch.randn(50, device="neuron:1").cpu()
    torch.manual_seed(4)
    torch.randn(500, device="neuron:0")
    assert torch.equal(torch.randn(50, device="neuron:1").cpu(), expected)


# --------------------------------------------------------------------------- async independence

def _program(sync):
    out = []
    for i in range(6):
        a = torch.randn(256, 256, device=DEV)
        if sync:
            torch.neuron.synchronize()
        b = F.dropout(a @ a, 0.3, training=True)
        if sync:
            b.cpu()
        c = torch.multinomial(b.abs().sum(0) + 1e-3, 8)
        d = torch.randperm(100, device=DEV)
        if sync:
            torch.neuron.synchronize()
        e = torch.rand(3, device=DEV)
        out += [b, c, d, e]
    return [t.cpu() for t in out]


def test_results_independent_of_synchronization():
    torch.manual_seed(31)
    free = _program(sync=False)
    torch.manual_seed(31)
    synced = _program(sync=True)
    for a, b in zip(free, synced):
        assert torch.equal(a, b)


def test_results_independent_of_stream():
    torch.manual_seed(31)
    expected = [torch.randn(1000, device=DEV).cpu(), torch.rand(1000, device=DEV).cpu()]
    torch.manual_seed(31)
    s = torch.neuron.Stream()
    # keep the default stream busy so the side stream runs first
    a = torch.randn(384, 384, device=DEV)
    torch.manual_seed(31)
    for _ in range(4):
        a = a @ a * 0.01
    with torch.neuron.stream(s):
        x = torch.randn(1000, device=DEV)
    y = torch.rand(1000, device=DEV)
    torch.neuron.synchronize()
    assert torch.equal(x.cpu(), expected[0])
    assert torch.equal(y.cpu(), expected[1])
