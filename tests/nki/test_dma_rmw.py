"""DMA read-modify-writes and indirect DMA operands: dma_compute's scatter RMW
(dst[indices] += src) and gather RMW (dst += src[indices]), dma_copy(dst_rmw_op=nl.add), with
repeated indices adding up under unique_indices=False and refused under unique_indices=True, against
NumPy (np.add.at), on NumPy arrays, CPU tensors and neuron tensors."""

import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


def _sbuf(a):
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    return t


@nki.jit
def scatter_add(table, idx, upd, unique: bool = False):
    """table[idx[p]] += upd[p] for every partition p, in place (an embedding-gradient update)."""
    rows = table.vector_select(0, _sbuf(idx))
    nisa.dma_compute(dst=rows, srcs=[rows, _sbuf(upd)], reduce_op=nl.add, unique_indices=unique)


@nki.jit
def gather_add(table, idx, base):
    """out = base + table[idx] (a gather RMW into SBUF)."""
    acc = _sbuf(base)
    nisa.dma_compute(dst=acc, srcs=[acc, table.vector_select(0, _sbuf(idx))], reduce_op=nl.add)
    out = nl.ndarray(base.shape, dtype=base.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=acc)
    return out


@nki.jit
def copy_add(table, idx, upd, out):
    """out += upd (a plain read-modify-write), then table[idx] += upd through dma_copy."""
    u = _sbuf(upd)
    nisa.dma_copy(dst=out, src=u, dst_rmw_op=nl.add)
    nisa.dma_copy(dst=table.vector_select(0, _sbuf(idx)), src=u, dst_rmw_op=nl.add, unique_indices=False)


@nki.jit
def copy_multiply(table, upd):
    nisa.dma_copy(dst=table, src=_sbuf(upd), dst_rmw_op=nl.multiply)


def _data(seed=0, rows=16, width=8, n=24):
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((rows, width)).astype(np.float32)
    idx = rng.integers(0, rows, size=(n, 1)).astype(np.int32)
    idx[1] = idx[0]  # at least one repeat
    return table, idx, rng.standard_normal((n, width)).astype(np.float32)


def _run(kernel, where, *args, **kwargs):
    """The kernel on NumPy arrays, CPU or neuron tensors; the arrays afterwards (written in place)."""
    if where == "numpy":
        out = nki.simulate(kernel)(*args, **kwargs)
        return args, out
    tensors = [torch.from_numpy(a.copy()) for a in args]
    if where == "neuron":
        tensors = [t.to("neuron") for t in tensors]
    out = kernel(*tensors, **kwargs)
    to_np = (lambda t: t.cpu().numpy())
    return [to_np(t) for t in tensors], None if out is None else to_np(out)


@pytest.mark.parametrize("where", ["numpy", "cpu", "neuron"])
def test_scatter_rmw_adds_every_repeat_of_an_index(where):
    table, idx, upd = _data()
    expected = table.copy()
    np.add.at(expected, idx[:, 0], upd)
    (got, _, _), _ = _run(scatter_add, where, table, idx, upd, unique=False)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("where", ["numpy", "neuron"])
def test_scatter_rmw_with_distinct_indices_and_unique_indices(where):
    rng = np.random.default_rng(1)
    table = rng.standard_normal((32, 8)).astype(np.float32)
    idx = rng.permutation(32)[:20].reshape(20, 1).astype(np.int32)
    upd = rng.standard_normal((20, 8)).astype(np.float32)
    expected = table.copy()
    expected[idx[:, 0]] += upd
    (got, _, _), _ = _run(scatter_add, where, table, idx, upd, unique=True)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_a_repeated_index_under_unique_indices_is_an_error_of_the_run_naming_the_positions():
    """The indices are data: the run pass finds the repeat (rows 0 and 1 index the same row), before
    the instruction writes."""
    table, idx, upd = _data()
    idx = np.random.default_rng(6).permutation(table.shape[0])[:12].reshape(12, 1).astype(np.int32)
    idx[1], upd = idx[0], upd[:12]
    before = table.copy()
    with pytest.raises(nki.NKIError) as e:
        nki.simulate(scatter_add)(table, idx, upd, unique=True)
    assert e.value.rule == "dma-rmw"
    assert "positions (0, 0) and (1, 0)" in str(e.value) and "unique_indices=False" in str(e.value)
    assert "nisa.dma_compute(dst=rows" in e.value.line[2]
    np.testing.assert_array_equal(table, before)


def test_a_repeated_index_under_unique_indices_fails_the_device_task():
    table, idx, upd = (torch.from_numpy(a).to("neuron") for a in _data())
    scatter_add(table, idx, upd, unique=True)
    with pytest.raises(RuntimeError, match="unique_indices=True"):
        torch.neuron.synchronize()


@pytest.mark.parametrize("where", ["numpy", "cpu", "neuron"])
def test_gather_rmw_adds_the_gathered_rows(where):
    table, idx, _ = _data(2)
    base = np.random.default_rng(3).standard_normal((idx.shape[0], table.shape[1])).astype(np.float32)
    _, got = _run(gather_add, where, table, idx, base)
    np.testing.assert_allclose(got, base + table[idx[:, 0]], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("where", ["numpy", "cpu", "neuron"])
def test_dma_copy_read_modify_write(where):
    table, idx, upd = _data(4)
    out = np.random.default_rng(5).standard_normal(upd.shape).astype(np.float32)
    expected_table, expected_out = table.copy(), out + upd
    np.add.at(expected_table, idx[:, 0], upd)
    (got_table, _, _, got_out), _ = _run(copy_add, where, table, idx, upd, out)
    np.testing.assert_allclose(got_out, expected_out, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got_table, expected_table, rtol=1e-6, atol=1e-6)


def test_dma_copy_read_modify_write_takes_add_only():
    table = np.ones((4, 8), np.float32)
    with pytest.raises(nki.NKIError) as e:
        nki.simulate(copy_multiply)(table, table.copy())
    assert e.value.rule == "dma-rmw" and "dst_rmw_op=nl.add" in str(e.value)


@nki.jit
def indirect_transpose(table, idx):
    t = nl.ndarray((table.shape[1], idx.shape[0]), dtype=table.dtype, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t, src=table.vector_select(0, _sbuf(idx)))


def test_an_indirect_transpose_is_refused_saying_what_to_do():
    with pytest.raises(nki.NKIError) as e:
        nki.simulate(indirect_transpose)(np.ones((16, 8), np.float16), np.zeros((4, 1), np.int32))
    assert e.value.rule == "not-emulated" and "gather with nisa.dma_copy" in str(e.value)


def test_scatter_add_as_an_operator_eager_and_inside_torch_compile():
    """The scatter RMW kernel as an in-place operator (an embedding-gradient update) in a compiled
    function: one graph, table updated in place, repeats adding up."""
    import torchneuron

    torch._dynamo.reset()
    op = torchneuron.nki_op("nki_test::scatter_add_rows", mutates_args=("table",))(scatter_add)
    table, idx, upd = _data(7)
    expected = table.copy()
    np.add.at(expected, idx[:, 0], upd)
    np.add.at(expected, idx[:, 0], 2 * upd)
    t, i, u = (torch.from_numpy(a).to("neuron") for a in (table, idx, upd))
    op(t, i, u, False)  # eager

    def step(t, i, u):
        op(t, i, u * 2, False)
        return t.sum()

    total = torch.compile(step, backend="neuron", fullgraph=True)(t, i, u)
    np.testing.assert_allclose(t.cpu().numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(total.cpu().item(), expected.sum(), rtol=1e-4)
