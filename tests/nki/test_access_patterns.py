"""Access patterns (``tensor.ap``) against NumPy references: HBM and on-chip, as sources and
destinations, reinterpreting dtypes, with scalar and vector (gather/scatter) offsets, and their rules."""

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

from tests.nki.test_language import rand, run


def plan_of(kernel):
    (plan,) = kernel._plans.values()
    return plan


@nki.jit
def hbm_patterns(a):
    """a: (64, 32) HBM; four (32, 16) reads through access patterns."""
    out = nl.ndarray((4, 32, 16), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((32, 16), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a.ap([[64, 32], [2, 16]], offset=1))       # odd columns of every other row
    nisa.dma_copy(dst=out[0], src=t)
    nisa.dma_copy(dst=t, src=a.ap([[1, 32], [32, 16]]))                  # transposed: a[0:16, 0:32].T
    nisa.dma_copy(dst=out[1], src=t)
    nisa.dma_copy(dst=t, src=a.ap([[0, 32], [1, 16]], offset=40 * 32))  # step 0: row 40 repeated
    nisa.dma_copy(dst=out[2], src=t)
    view = a[8:40, 16:32]
    nisa.dma_copy(dst=t, src=view.ap([[32, 32], [1, 16]], offset=None))  # offset=None: the view's own
    nisa.dma_copy(dst=out[3], src=t)
    return out


def test_hbm_access_patterns_address_the_whole_tensor():
    a = rand(64, 32)
    out = run(hbm_patterns, a)
    np.testing.assert_array_equal(out[0], a[0::2, 1::2])
    np.testing.assert_array_equal(out[1], a[0:16, 0:32].T)
    np.testing.assert_array_equal(out[2], np.broadcast_to(a[40, 0:16], (32, 16)))
    np.testing.assert_array_equal(out[3], a[8:40, 16:32])


@nki.jit
def sbuf_patterns(a):
    """a: (128, 64). Writes the columns of a tile in reverse pairs and reads them back strided."""
    out = nl.ndarray((2, 128, 32), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 64), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    half = nl.ndarray((128, 32), dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=half, src=t.ap([[64, 128], [2, 32]], offset=1))       # odd columns (src)
    nisa.dma_copy(dst=out[0], src=half)
    u = nl.ndarray((128, 2, 32), dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=u.ap([[64, 128], [1, 32]], offset=32), src=half)      # second half only (dst)
    nisa.tensor_copy(dst=u.ap([[64, 128], [1, 32]]), src=t[:, 0:32])
    nisa.tensor_scalar(dst=half, data=u[:, 1, :], op0=nl.multiply, operand0=2.0)
    nisa.dma_copy(dst=out[1], src=half)
    return out


def test_sbuf_access_patterns_as_source_and_destination():
    a = rand(128, 64)
    out = run(sbuf_patterns, a)
    np.testing.assert_array_equal(out[0], a[:, 1::2])
    np.testing.assert_array_equal(out[1], 2 * a[:, 1::2])


@nki.jit
def matmul_through_patterns(a, b):
    """a: (64, 128) K x M, b: (64, 32) K x N; stationary read through an .ap, product into a PSUM .ap."""
    ta = nl.ndarray((64, 128), dtype=a.dtype, buffer=nl.sbuf)
    tb = nl.ndarray((64, 32), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=ta, src=a)
    nisa.dma_copy(dst=tb, src=b)
    acc = nl.ndarray((64, 2, 32), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc.ap([[64, 64], [1, 32]], offset=32), stationary=ta.ap([[128, 64], [2, 64]]), moving=tb)
    res = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc[:, 1, :])
    out = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


def test_access_patterns_as_matmul_operands_and_destination():
    a, b = rand(64, 128), rand(64, 32)
    out = run(matmul_through_patterns, a, b)
    np.testing.assert_allclose(out, a[:, 0::2].T @ b, rtol=1e-5, atol=1e-5)


@nki.jit
def reinterpret(a):
    """a: (128, 32) int32 in HBM; its int16 halves, read from HBM and from an SBUF tile."""
    out = nl.ndarray((2, 128, 32), dtype=nl.int16, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 32), dtype=nl.int16, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a.ap([[64, 128], [2, 32]], offset=1, dtype=nl.int16))   # high halves
    nisa.dma_copy(dst=out[0], src=t)
    w = nl.ndarray((128, 32), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=w, src=a)
    nisa.tensor_copy(dst=t, src=w.ap([[64, 128], [2, 32]], dtype=nl.int16))           # low halves
    nisa.dma_copy(dst=out[1], src=t)
    return out


def test_dtype_reinterprets_the_bytes():
    a = np.random.default_rng(0).integers(-2**31, 2**31, size=(128, 32), dtype=np.int32)
    out = run(reinterpret, a)
    halves = a.view(np.int16)
    np.testing.assert_array_equal(out[0], halves[:, 1::2])
    np.testing.assert_array_equal(out[1], halves[:, 0::2])


@nki.jit
def partial_reinterpreted_write(a):
    """Writes the low int16 halves of an int32 tile only, then reads the whole tile: undefined."""
    t = nl.ndarray((128, 8), dtype=nl.int32, buffer=nl.sbuf)
    h = nl.ndarray((128, 8), dtype=nl.int16, buffer=nl.sbuf)
    nisa.dma_copy(dst=h, src=a)
    nisa.tensor_copy(dst=t.ap([[16, 128], [2, 8]], dtype=nl.int16), src=h)
    nisa.tensor_copy(dst=t.ap([[16, 128], [2, 8]], offset=1, dtype=nl.int16), src=h)
    out = nl.ndarray((128, 8), dtype=nl.int32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_writes_through_reinterpreting_patterns_define_the_tile():
    a = np.arange(128 * 8, dtype=np.int16).reshape(128, 8)
    out = run(partial_reinterpreted_write, a)
    np.testing.assert_array_equal(out, a.astype(np.int32) * 65537)

    @nki.jit
    def half_written(a):
        t = nl.ndarray((128, 8), dtype=nl.int32, buffer=nl.sbuf)
        h = nl.ndarray((128, 8), dtype=nl.int16, buffer=nl.sbuf)
        nisa.dma_copy(dst=h, src=a)
        nisa.tensor_copy(dst=t.ap([[16, 128], [1, 8]], dtype=nl.int16), src=h)   # t[:, 0:4] only
        out = nl.ndarray((128, 8), dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    with pytest.raises(nki.NKIError, match="undefined-tile") as info:
        half_written(a)
    assert "512 of 1024" in str(info.value)


class Register:
    """Stands for a register: an object holding an integer ``value``."""

    def __init__(self, value):
        self.value = value


@nki.jit
def scalar_offsets(table, idx):
    """table: (64, 16); idx: (1, 1) int32. Rows idx..idx+8 through a tile, an object holding a value,
    an int and a register."""
    out = nl.ndarray((4, 8, 16), dtype=table.dtype, buffer=nl.shared_hbm)
    i = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=i, src=idx)
    t = nl.ndarray((8, 16), dtype=table.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=table.ap([[16, 8], [1, 16]], scalar_offset=i, indirect_dim=0))
    nisa.dma_copy(dst=out[0], src=t)
    nisa.dma_copy(dst=t, src=table.ap([[16, 8], [1, 16]], offset=2, scalar_offset=Register(3)))
    nisa.dma_copy(dst=out[1], src=t)
    nisa.dma_copy(dst=t, src=table.reshape((64, 4, 4)).ap([[16, 8], [1, 16]], scalar_offset=5, indirect_dim=1))
    nisa.dma_copy(dst=out[2], src=t)
    reg = nisa.register_alloc()
    nisa.register_load(reg, i)
    nisa.dma_copy(dst=out[3], src=table[4:64, :].ap([[16, 8], [1, 16]], offset=None, scalar_offset=reg))
    return out


def test_scalar_offset_moves_the_start_by_rows_of_the_indirect_dim():
    table = rand(64, 16)
    out = run(scalar_offsets, table, np.array([[20]], dtype=np.int32))
    np.testing.assert_array_equal(out[0], table[20:28])
    np.testing.assert_array_equal(out[1], table.reshape(-1)[3 * 16 + 2:][:8 * 16].reshape(8, 16))
    np.testing.assert_array_equal(out[2], table.reshape(-1)[5 * 4:][:8 * 16].reshape(8, 16))
    np.testing.assert_array_equal(out[3], table[24:32])


@nki.jit
def window(table, idx):
    """table: (10, 16); rows idx..idx+8."""
    i = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=i, src=idx)
    t = nl.ndarray((8, 16), dtype=table.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=table.ap([[16, 8], [1, 16]], scalar_offset=i))
    out = nl.ndarray((8, 16), dtype=table.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_a_scalar_offset_is_checked_on_the_real_data():
    table = rand(10, 16)
    np.testing.assert_array_equal(run(window, table, np.array([[2]], dtype=np.int32)), table[2:10])
    with pytest.raises(nki.NKIError, match="out-of-bounds"):
        window(table, np.array([[3]], dtype=np.int32))


@nki.jit
def gather_scatter(table, idx):
    """table: (64, 16); idx: (32, 1) int32 rows. Gathers table[idx] and scatters it to out[idx]."""
    rows = nl.ndarray((32, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=rows, src=idx)
    t = nl.ndarray((32, 16), dtype=table.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=table.ap([[16, 32], [1, 16]], vector_offset=rows, indirect_dim=0))
    gathered = nl.ndarray((32, 16), dtype=table.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=gathered, src=t)
    scattered = nl.ndarray((64, 16), dtype=table.dtype, buffer=nl.shared_hbm)
    zero = nl.ndarray((64, 16), dtype=table.dtype, buffer=nl.sbuf)
    nisa.memset(dst=zero, value=0.0)
    nisa.dma_copy(dst=scattered, src=zero)
    nisa.dma_copy(dst=scattered.ap([[16, 32], [1, 16]], vector_offset=rows, indirect_dim=0), src=t)
    return gathered, scattered


def test_vector_offset_gathers_and_scatters_rows():
    table = rand(64, 16)
    idx = np.random.default_rng(1).permutation(64)[:32].astype(np.int32).reshape(32, 1)
    gathered, scattered = run(gather_scatter, table, idx)
    np.testing.assert_array_equal(gathered, table[idx[:, 0]])
    expected = np.zeros_like(table)
    expected[idx[:, 0]] = table[idx[:, 0]]
    np.testing.assert_array_equal(scattered, expected)


def test_vector_offset_outside_the_tensor_is_reported_when_used():
    table = rand(64, 16)
    idx = np.full((32, 1), 3, dtype=np.int32)
    idx[5] = 64
    with pytest.raises(nki.NKIError, match="out-of-bounds"):
        gather_scatter(table, idx)


@nki.jit
def moving_offsets(a):
    """a: (4 * 32, 16); each iteration of an affine_range copies its block through access patterns."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    out2 = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(4):
        t = nl.ndarray((32, 16), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.ap([[16, 32], [1, 16]], offset=i * 512))
        u = nl.ndarray((32, 16), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=u.ap([[16, 32], [1, 16]]), data=t, op0=nl.add, operand0=1.0)
        nisa.dma_copy(dst=out[nl.ds(i * 32, 32), :].ap([[16, 32], [1, 16]], offset=None), src=u)
        nisa.dma_copy(dst=out2.ap([[16, 32], [1, 16]], scalar_offset=i * 32), src=t)
    return out, out2


def test_loop_dependent_offsets_batch():
    a = rand(128, 16)
    out, out2 = run(moving_offsets, a)
    np.testing.assert_array_equal(out, a + 1)
    np.testing.assert_array_equal(out2, a)
    assert plan_of(moving_offsets).unbatchable == frozenset()


def ap_errors(case):
    @nki.jit
    def kernel(a):
        t = nl.ndarray((32, 16), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[0:32, :])
        u = nl.ndarray((32, 16), dtype=a.dtype, buffer=nl.sbuf)
        if case == "partition-step":
            nisa.tensor_copy(dst=u, src=t.ap([[32, 16], [1, 32]]))
        elif case == "hbm-range":
            nisa.dma_copy(dst=u, src=a.ap([[16, 32], [1, 16]], offset=64 * 16 - 100))
        elif case == "partition-range":
            nisa.tensor_copy(dst=u[0:16, :], src=t.ap([[16, 16], [1, 16]], offset=20 * 16))
        elif case == "free-range":
            nisa.tensor_copy(dst=u, src=t.ap([[16, 32], [1, 16]], offset=4))
        elif case == "broadcast-dst":
            nisa.tensor_copy(dst=u.ap([[16, 32], [0, 16]]), src=t)
        out = nl.ndarray((32, 16), dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=u)
        return out
    return kernel


@pytest.mark.parametrize("case, rule", [("partition-step", "access-pattern"), ("hbm-range", "out-of-bounds"),
                                        ("partition-range", "out-of-bounds"), ("free-range", "out-of-bounds"),
                                        ("broadcast-dst", "access-pattern")])
def test_access_pattern_rules(case, rule):
    with pytest.raises(nki.NKIError) as info:
        ap_errors(case)(rand(64, 16))
    assert info.value.rule == rule
    assert ".ap" in info.value.line[2]


@nki.jit
def looped_gather(table, idx):
    """idx: (4, 32) int32; iteration i gathers the rows idx[i] (a gather: the loop runs sequentially)."""
    out = nl.ndarray((4, 32, 16), dtype=table.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(4):
        rows = nl.ndarray((32, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=idx[i])
        t = nl.ndarray((32, 16), dtype=table.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=table.ap([[16, 32], [1, 16]], vector_offset=rows))
        nisa.dma_copy(dst=out[i], src=t)
    return out


def test_dynamic_offsets_hold_scratch_data_while_checked_and_gathers_do_not_batch():
    table = rand(64, 16)
    idx = np.random.default_rng(2).integers(0, 64, size=(4, 32), dtype=np.int32)
    idx[0, 0] = 63   # a row the check pass's scratch indices could not reach past
    np.testing.assert_array_equal(run(looped_gather, table, idx), table[idx])
    assert plan_of(looped_gather).unbatchable  # the loop runs sequentially


def test_memory_that_is_not_row_major():
    a = rand(32, 64).T   # a (64, 32) argument whose memory is column-major
    out = run(hbm_patterns, a)
    np.testing.assert_array_equal(out[0], a[0::2, 1::2])
    np.testing.assert_array_equal(out[1], a[0:16, 0:32].T)
    np.testing.assert_array_equal(out[2], np.broadcast_to(a[40, 0:16], (32, 16)))
    np.testing.assert_array_equal(out[3], a[8:40, 16:32])
