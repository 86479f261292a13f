"""Sparse layouts on neuron (COO, CSR, CSC, BSR, BSC): construction,
conversion, to_dense, matmul with dense, reductions, in-place updates and
autograd, each compared with the same computation on CPU."""

import pytest
import torch

import torchneuron

N = torch.device("neuron", 0)


def dense(*shape, seed=0, density=0.5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    return x * (torch.rand(shape, generator=g) < density)


def same(actual, expected):
    assert actual.device.type == "neuron", actual.device
    assert actual.layout == expected.layout, (actual.layout, expected.layout)
    got = actual.cpu()
    if expected.layout != torch.strided:
        got, expected = got.to_dense(), expected.to_dense()
    torch.testing.assert_close(got, expected)


CONVERSIONS = {
    "coo": lambda t: t.to_sparse(),
    "coo sparse_dim=1": lambda t: t.to_sparse(1),
    "csr": lambda t: t.to_sparse_csr(),
    "csc": lambda t: t.to_sparse_csc(),
    "bsr": lambda t: t.to_sparse_bsr((2, 2)),
    "bsc": lambda t: t.to_sparse_bsc((2, 2)),
}


@pytest.mark.parametrize("layout", sorted(CONVERSIONS))
def test_conversion_on_the_device_and_back_matches_cpu(layout):
    x = dense(4, 6)
    convert = CONVERSIONS[layout]
    s = convert(x.to(N))
    same(s, convert(x))
    same(s.to_dense(), x)
    moved = convert(x).to(N)  # a host sparse tensor moved to the device
    same(moved, convert(x))
    back = s.cpu()
    assert back.device.type == "cpu" and back.layout == s.layout
    torch.testing.assert_close(back.to_dense(), x)


def test_coo_construction_on_the_device_and_its_parts():
    i = torch.tensor([[0, 1, 1], [2, 0, 2]])
    v = torch.tensor([3.0, 4.0, 5.0])
    s = torch.sparse_coo_tensor(i.to(N), v.to(N), (2, 3))
    ref = torch.sparse_coo_tensor(i, v, (2, 3))
    same(s, ref)
    assert s._nnz() == 3 and s.sparse_dim() == 2 and s.dense_dim() == 0 and not s.is_coalesced()
    # The parts are the device tensors themselves (views, as on CPU), not copies.
    s._values().mul_(2)
    torch.testing.assert_close(s.to_dense().cpu(), (ref * 2).to_dense())
    assert s._indices().device == N


def test_csr_construction_on_the_device_and_its_parts():
    crow, col, v = torch.tensor([0, 2, 3]), torch.tensor([0, 2, 1]), torch.tensor([1.0, 2.0, 3.0])
    s = torch.sparse_csr_tensor(crow.to(N), col.to(N), v.to(N), (2, 3))
    ref = torch.sparse_csr_tensor(crow, col, v, (2, 3))
    same(s, ref)
    for part in ("crow_indices", "col_indices", "values"):
        assert getattr(s, part)().device == N
        torch.testing.assert_close(getattr(s, part)().cpu(), getattr(ref, part)())
    assert s._nnz() == 3


MATMULS = {
    "sparse.mm coo": lambda s, d: torch.sparse.mm(s.to_sparse(), d),
    "coo @ dense": lambda s, d: s.to_sparse() @ d,
    "csr @ dense": lambda s, d: s.to_sparse_csr() @ d,
    "csc @ dense": lambda s, d: s.to_sparse_csc() @ d,
    "addmm coo": lambda s, d: torch.addmm(torch.ones(4, 3, device=d.device), s.to_sparse(), d),
    "sampled_addmm": lambda s, d: torch.sparse.sampled_addmm((s[:, :4] != 0).float().to_sparse_csr(), s, s.t()),
    "sparse.mm coo x coo": lambda s, d: torch.sparse.mm(s.to_sparse(), d.to_sparse()),
}


@pytest.mark.parametrize("name", sorted(MATMULS))
def test_matmul_with_sparse_operands_matches_cpu(name):
    s, d = dense(4, 6, seed=1), torch.randn(6, 3, generator=torch.Generator().manual_seed(2))
    fn = MATMULS[name]
    same(fn(s.to(N), d.to(N)), fn(s, d))


REDUCTIONS = {
    "sparse.sum": lambda s: torch.sparse.sum(s),
    "sparse.sum dim": lambda s: torch.sparse.sum(s, dim=1),
    "sum dense result": lambda s: s.sum(),
    "coalesce": lambda s: (s + s).coalesce(),
    "mul scalar": lambda s: s * 3,
    "neg": lambda s: -s,
    "sin": lambda s: torch.sin(s),
    "softmax": lambda s: torch.sparse.softmax(s, dim=1),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_coo_reductions_and_elementwise_ops_match_cpu(name):
    x = dense(5, 4, seed=3)
    fn = REDUCTIONS[name]
    same(fn(x.to(N).to_sparse()), fn(x.to_sparse()))


def test_in_place_updates_that_change_the_number_of_non_zeros():
    a, b = dense(4, 4, seed=4), dense(4, 4, seed=5)

    def run(device):
        s = a.to(device).to_sparse()
        s.add_(b.to(device).to_sparse())
        s.mul_(0.5)
        return s

    result = run(N)
    assert result._nnz() == run("cpu")._nnz()
    same(result, run("cpu"))


def test_gradients_through_sparse_ops_match_cpu():
    def run(device):
        w = dense(4, 6, seed=6).to(device).requires_grad_()
        d = torch.randn(6, 3, generator=torch.Generator().manual_seed(7)).to(device).requires_grad_()
        y = torch.sparse.mm(w.to_sparse(), d)
        (y * torch.arange(12.0).reshape(4, 3).to(device)).sum().backward()
        return w.grad, d.grad

    for got, want in zip(run(N), run("cpu")):
        same(got, want)


def test_a_sparse_leaf_gets_a_sparse_gradient_as_on_cpu():
    def run(device):
        s = dense(4, 6, seed=8).to(device).to_sparse().requires_grad_()
        torch.sparse.sum(s * 2).backward()
        return s.grad

    got, want = run(N), run("cpu")
    assert got.layout == want.layout == torch.sparse_coo
    same(got.coalesce(), want.coalesce())


def test_bad_input_raises_cpus_error_and_the_device_stays_usable():
    s = dense(4, 6).to(N).to_sparse()
    with pytest.raises(RuntimeError) as on_device:
        torch.sparse.mm(s, torch.randn(5, 3, device=N))
    with pytest.raises(RuntimeError) as on_cpu:
        torch.sparse.mm(dense(4, 6).to_sparse(), torch.randn(5, 3))
    assert type(on_device.value) is type(on_cpu.value)
    same(s.to_dense() * 2, dense(4, 6) * 2)


def test_sparse_ops_are_reported_as_host_round_trips():
    torchneuron.clear_op_tracking()
    s = dense(4, 6).to(N).to_sparse()
    torch.sparse.mm(s, torch.randn(6, 2, device=N))
    fallbacks = torchneuron.get_fallback_ops()
    assert fallbacks == {"aten::_to_sparse": 1, "aten::addmm": 1}, fallbacks  # sparse.mm is addmm on CPU too


def test_a_kernel_that_looks_at_requires_grad_sees_it_on_the_host_copy():
    """CPU's sparse.mm with amax keeps the argmax indices its backward needs
    only when an input requires grad: the round trip must pass the flag on
    (without it the backward read out of bounds)."""

    def run(device):
        x = dense(5, 5, seed=9).to(device).to_sparse_csr().requires_grad_()
        w = torch.randn(5, 3, generator=torch.Generator().manual_seed(10)).to(device).requires_grad_()
        y = torch.sparse.mm(x, w, "amax")
        return torch.autograd.grad(y, [x, w], torch.ones_like(y))

    for got, want in zip(run(N), run("cpu")):
        same(got, want)
