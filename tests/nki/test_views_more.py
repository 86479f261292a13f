"""The view methods rearrange and vector_select, and nl.dynamic_range induction variables as
access-pattern offsets, against NumPy references on NumPy arrays and neuron tensors."""

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

from tests.nki.test_language import rand, run


# -- rearrange ---------------------------------------------------------------------------------------

@nki.jit
def rearrange_views(a, b):
    """a: (32, 24) HBM, b: (8, 24) HBM."""
    t = nl.ndarray((32, 24), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    u = nl.ndarray((32, 6, 4), dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=u, src=t.rearrange(("b", ("h", "w")), ("b", "w", "h"), {"h": 4}))   # split + reorder
    out0 = nl.ndarray((32, 6, 4), dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out0, src=u)
    out1 = nl.ndarray((32, 24), dtype=a.dtype, buffer=nl.shared_hbm)
    v = nl.ndarray((32, 24), dtype=a.dtype, buffer=nl.sbuf)                                  # written through a
    nisa.tensor_copy(dst=v.rearrange(("p", ("x", "y")), ("p", "y", "x"), {"x": 2}), src=u)  # rearranged dst
    nisa.dma_copy(dst=out1, src=v)
    s = nl.ndarray((4, 2, 24), dtype=b.dtype, buffer=nl.sbuf)                                # HBM: split the rows,
    nisa.dma_copy(dst=s, src=b.rearrange((("g", "r"), "c"), ("r", "g", "c"), {"g": 2}))      # swap the halves
    out2 = nl.ndarray((4, 48), dtype=b.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out2.rearrange(("r", ("g", "c")), ("r", "g", "c"), {"g": 2}), src=s)
    out3 = nl.ndarray((8, 24), dtype=b.dtype, buffer=nl.shared_hbm)                           # merge (g r) back
    nisa.dma_copy(dst=out3, src=b.rearrange((("g", "r"), ("h", "w")), (("g", "r"), ("h", "w")), {"r": 4, "w": 6}))
    return out0, out1, out2, out3


def test_rearrange_splits_reorders_and_merges_against_numpy():
    a, b = rand(32, 24), rand(8, 24)
    out0, out1, out2, out3 = run(rearrange_views, a, b)
    want0 = a.reshape(32, 4, 6).transpose(0, 2, 1)
    np.testing.assert_array_equal(out0, want0)
    want1 = np.empty((32, 24), np.float32)
    want1.reshape(32, 2, 12).transpose(0, 2, 1)[...] = want0.reshape(32, 12, 2)
    np.testing.assert_array_equal(out1, want1)
    np.testing.assert_array_equal(out2, b.reshape(2, 4, 24).transpose(1, 0, 2).reshape(4, 48))
    np.testing.assert_array_equal(out3, b)


def _rearrange_error(src, dst, fixed, shape=(32, 24), buffer="sbuf"):
    @nki.jit
    def kernel(a):
        t = a if buffer == "hbm" else nl.ndarray(shape, dtype=a.dtype, buffer=nl.sbuf)
        t.rearrange(src, dst, fixed)
        return a

    with pytest.raises(nki.NKIError) as info:
        nki.simulate(kernel)(rand(*shape))
    return str(info.value)


@pytest.mark.parametrize("src, dst, fixed, rule, words", [
    (("b", ("h", "w")), ("b", "h"), {"h": 4}, "view", "exactly once"),
    (("b", ("h", "w")), ("b", "w", "h"), None, "view", "are unknown"),
    (("b", ("h", "w")), ("b", "w", "h"), {"h": 5}, "view", "do not split"),
    (("b", "h", "w"), ("b", "h", "w"), None, "view", "3 entries"),
    (("b", ("h", "w")), ("b", ("w", "h")), {"h": 4}, "view", "not contiguous"),
    ((("p", "q"), "c"), ("p", "q", "c"), {"q": 2}, "access-pattern", "partition dimension"),
    (("p", "c"), ("c", "p"), None, "access-pattern", "partition dimension"),
    (("p", ("h", "w")), ("p", "h", "w"), {"h": 4, "z": 2}, "view", "fixed_sizes names"),
    (("b", "b"), ("b", "b"), None, "view", "more than once"),
])
def test_rearrange_errors_name_the_method_and_what_was_expected(src, dst, fixed, rule, words):
    message = _rearrange_error(src, dst, fixed)
    assert f"[{rule}]" in message and "rearrange(" in message and words in message, message


def test_rearrange_on_hbm_may_move_the_first_dimension():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((24, 32), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((24, 32), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.rearrange(("r", "c"), ("c", "r")))
        nisa.dma_copy(dst=out, src=t)
        return out

    a = rand(32, 24)
    np.testing.assert_array_equal(run(kernel, a), a.T)


@nki.jit
def rearrange_in_loop(a):
    """a: (4, 16, 24) HBM; each block's free dim reordered in a batched affine_range loop."""
    out = nl.ndarray((4, 16, 6, 4), dtype=a.dtype, buffer=nl.shared_hbm)
    for k in nl.affine_range(4):
        t = nl.ndarray((16, 24), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[k])
        u = nl.ndarray((16, 6, 4), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=u, src=t.rearrange(("p", ("h", "w")), ("p", "w", "h"), {"w": 6}))
        nisa.dma_copy(dst=out[k], src=u)
    return out


def test_rearrange_in_a_batched_loop():
    a = rand(4, 16, 24)
    np.testing.assert_array_equal(run(rearrange_in_loop, a), a.reshape(4, 16, 4, 6).transpose(0, 1, 3, 2))


# -- vector_select -----------------------------------------------------------------------------------

@nki.jit
def vector_selects(a, idx, rows):
    """a: (16, 4, 8) HBM; idx: (32, 1) int32 rows of a; rows: (16, 1) int32, a permutation."""
    i = nl.ndarray((32, 1), dtype=idx.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=i, src=idx)
    t = nl.ndarray((32, 4, 8), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a.vector_select(0, i))                    # gather: partition p reads a[idx[p]]
    gathered = nl.ndarray((32, 4, 8), dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=gathered, src=t)
    r = nl.ndarray((16, 1), dtype=rows.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=r, src=rows)
    u = nl.ndarray((16, 8), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=u, src=a[:, 2, :])
    scattered = nl.ndarray((16, 8), dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=scattered.vector_select(0, r), src=u)            # scatter: row rows[p] gets partition p
    sub = nl.ndarray((16, 2, 2), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=sub, src=a[:, 1:3, 2:4].vector_select(0, r))    # of a view
    part = nl.ndarray((16, 2, 2), dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=part, src=sub)
    return gathered, scattered, part


def test_vector_select_gathers_and_scatters_rows_against_numpy():
    a = rand(16, 4, 8)
    idx = np.random.default_rng(1).integers(0, 16, (32, 1)).astype(np.int32)
    rows = np.random.default_rng(2).permutation(16).reshape(16, 1).astype(np.int32)
    gathered, scattered, part = run(vector_selects, a, idx, rows)
    np.testing.assert_array_equal(gathered, a[idx[:, 0]])
    want = np.empty((16, 8), np.float32)
    want[rows[:, 0]] = a[:, 2, :]
    np.testing.assert_array_equal(scattered, want)
    np.testing.assert_array_equal(part, a[rows[:, 0], 1:3, 2:4])


@nki.jit
def views_of_vector_select(a, idx):
    """a: (16, 3, 4) HBM; idx: (16, 1) int32, a permutation of the rows."""
    i = nl.ndarray((16, 1), dtype=idx.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=i, src=idx)
    t = nl.ndarray((16, 12), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a.vector_select(0, i).reshape((16, 12)))            # rows stay rows
    flat = nl.ndarray((16, 12), dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=flat, src=t)
    u = nl.ndarray((16, 4, 3), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=u, src=a.vector_select(0, i).permute((0, 2, 1)))
    back = nl.ndarray((16, 3, 4), dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=back.vector_select(0, i).permute((0, 2, 1)), src=u)       # a scatter through a view
    return flat, back


def test_views_of_a_vector_select_keep_its_rows():
    a = rand(16, 3, 4)
    idx = np.random.default_rng(3).permutation(16).reshape(16, 1).astype(np.int32)
    flat, back = run(views_of_vector_select, a, idx)
    np.testing.assert_array_equal(flat, a[idx[:, 0]].reshape(16, 12))
    np.testing.assert_array_equal(back, a)


@pytest.mark.parametrize("case, rule", [("move_rows", "reshape"), ("dtype", "view")])
def test_views_of_a_vector_select_that_move_rows_or_reinterpret_are_errors(case, rule):
    @nki.jit
    def kernel(a, idx):
        i = nl.ndarray((8, 1), dtype=idx.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=i, src=idx)
        g = a.vector_select(0, i)
        if case == "move_rows":
            g.reshape((4, 8))
        else:
            g.view(nl.uint8)
        return a

    with pytest.raises(nki.NKIError) as info:
        nki.simulate(kernel)(rand(8, 4), np.zeros((8, 1), np.int32))
    assert f"[{rule}]" in str(info.value) and "indexed access" in str(info.value), str(info.value)


def test_vector_select_index_outside_the_tensor_is_reported_with_the_real_values():
    a = rand(16, 4, 8)
    idx = np.zeros((32, 1), np.int32)
    idx[5] = 16
    with pytest.raises(nki.NKIError, match="out-of-bounds|index"):
        nki.simulate(vector_selects)(a, idx, np.arange(16, dtype=np.int32).reshape(16, 1))


@pytest.mark.parametrize("case, rule, words", [
    ("dim", "access-pattern", "dimension 0 only"),
    ("on_chip", "access-pattern", "HBM tensors only"),
    ("shape", "access-pattern", "(num_partitions, 1) integer tile in SBUF"),
    ("hbm_index", "access-pattern", "(num_partitions, 1) integer tile in SBUF"),
    ("twice", "index", "already an indexed access"),
])
def test_vector_select_errors_name_the_operand_and_what_was_expected(case, rule, words):
    @nki.jit
    def kernel(a, idx):
        i = nl.ndarray((8, 1), dtype=idx.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=i, src=idx)
        if case == "dim":
            a.vector_select(1, i)
        elif case == "on_chip":
            t = nl.ndarray((8, 4), dtype=a.dtype, buffer=nl.sbuf)
            t.vector_select(0, i)
        elif case == "shape":
            a.vector_select(0, i.reshape((8, 1, 1)))
        elif case == "hbm_index":
            a.vector_select(0, idx)
        else:
            a.vector_select(0, i).vector_select(0, i)
        return a

    with pytest.raises(nki.NKIError) as info:
        nki.simulate(kernel)(rand(8, 4), np.zeros((8, 1), np.int32))
    message = str(info.value)
    assert f"[{rule}]" in message and "vector_select" in message and words in message, message


# -- dynamic_range induction variables as offsets ----------------------------------------------------

@nki.jit
def dynamic_offsets(a, count):
    """a: (R, 16) HBM; count: (1, 1) int32, the number of rows to process (read on chip; the check
    pass's scratch count may exceed R)."""
    rows = a.shape[0]
    out = nl.ndarray((rows, 16), dtype=a.dtype, buffer=nl.shared_hbm)
    out2 = nl.ndarray((rows, 16), dtype=a.dtype, buffer=nl.shared_hbm)
    out3 = nl.ndarray((rows, 8), dtype=a.dtype, buffer=nl.shared_hbm)
    n_tile = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=n_tile, src=count)
    n = nisa.register_alloc(n_tile)
    zero = nl.zeros((rows, 16), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=out, src=zero)
    nisa.dma_copy(dst=out2, src=zero)
    nisa.dma_copy(dst=out3, src=zero[:, 0:8])
    for i in nl.dynamic_range(n):                           # rows 0 .. count-1
        t = nl.ndarray((1, 16), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.ap([[16, 1], [1, 16]], scalar_offset=i))
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
        nisa.dma_copy(dst=out.ap([[16, 1], [1, 16]], offset=i * 16), src=t)   # arithmetic on the variable
        nisa.dma_copy(dst=out2.select(0, rows - 1 - i), src=a.select(0, i))   # select with it
        nisa.dma_copy(dst=out3[i:i + 1, 0:8], src=a[i, nl.ds(8, 8)].reshape((1, 8)))   # slicing with it
    return out, out2, out3


@pytest.mark.parametrize("rows, counts", [(8, (0, 3, 8)), (1, (0, 1))])
def test_dynamic_range_variable_offsets_follow_the_runtime_count(rows, counts):
    a = rand(rows, 16)
    for count in counts:
        out, out2, out3 = run(dynamic_offsets, a, np.array([[count]], np.int32))
        want, want2, want3 = np.zeros((rows, 16), np.float32), np.zeros((rows, 16), np.float32), \
            np.zeros((rows, 8), np.float32)
        want[:count] = 2 * a[:count]
        want2[rows - count:] = a[:count][::-1]
        want3[:count] = a[:count, 8:16]
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(out2, want2)
        np.testing.assert_array_equal(out3, want3)


def test_dynamic_range_variable_outside_the_tensor_is_an_error_in_the_run():
    with pytest.raises(nki.NKIError, match="out-of-bounds") as info:
        nki.simulate(dynamic_offsets)(rand(8, 16), np.array([[9]], np.int32))
    assert "scalar_offset" not in str(info.value) or ".ap" in str(info.value)


def test_dynamic_range_step_must_be_known_when_traced():
    @nki.jit
    def kernel(a):
        for _ in nl.dynamic_range(0, 4, nisa.register_alloc(2)):
            pass
        return a

    with pytest.raises(nki.NKIError, match=r"\[loop-bounds\] nl.dynamic_range: the step"):
        nki.simulate(kernel)(rand(2, 2))
