"""Batched execution of affine_range loops and grids: same results as one iteration at a time."""

import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import _kernel
from tests.nki.test_isa import tiled_matmul
from tests.nki.test_language import add_spmd, masked_copy, rand


def plan_of(kernel):
    (plan,) = kernel._plans.values()
    return plan


def sequential(kernel, *args, monkeypatch):
    monkeypatch.setattr(_kernel, "BATCHING", False)  # as TORCHNEURON_NKI_BATCH=0 does
    fresh = nki.jit(kernel.fn)[kernel.grid] if kernel.grid else nki.jit(kernel.fn)
    out = fresh(*args)
    assert plan_of(fresh).unbatchable is None
    monkeypatch.undo()
    return out


def test_a_tiled_matmul_batches_every_loop_into_one_contraction(monkeypatch):
    kernel = nki.jit(tiled_matmul.fn)
    a, b = rand(384, 256), rand(384, 1024)
    out = kernel(a, b)
    assert plan_of(kernel).unbatchable == frozenset()
    np.testing.assert_allclose(out, a.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out, sequential(kernel, a, b, monkeypatch=monkeypatch), rtol=1e-4, atol=1e-4)


def test_a_grid_runs_all_programs_at_once():
    kernel = nki.jit(add_spmd.fn)[2, 2]
    a, b = rand(256, 512), rand(256, 512)
    np.testing.assert_array_equal(kernel(a, b), a + b)
    assert plan_of(kernel).unbatchable == frozenset()


@nki.jit
def prefix_sums(a):
    """A loop-carried dependency declared (wrongly) as affine_range, and control flow on the loop
    variable: those loops run one iteration at a time; the others still batch."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    acc = nl.zeros((128, 1), nl.float32)
    for j in nl.affine_range(a.shape[1]):       # carried: acc depends on the previous iteration
        acc[...] = nl.add(acc, nl.load(a[:, j:j + 1]))
        nl.store(out[:, j:j + 1], value=acc)
    return out


@nki.jit
def triangle(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(a.shape[1]):
        t = nl.load(a[:, i:i + 1])
        if i % 2 == 0:                          # Python control flow on the loop variable
            t = t * 2
        nl.store(out[:, i:i + 1], value=t)
    return out


def test_loops_that_cannot_batch_run_sequentially_and_stay_correct():
    a = rand(128, 6)
    np.testing.assert_allclose(prefix_sums(a), np.cumsum(a, axis=1), rtol=1e-5, atol=1e-6)
    assert len(plan_of(prefix_sums).unbatchable) == 1
    np.testing.assert_array_equal(triangle(a), a * np.array([2, 1, 2, 1, 2, 1], np.float32))
    assert len(plan_of(triangle).unbatchable) == 1


@nki.jit
def accumulate(a, step: float = 1.0):
    """Sums the 8-column blocks of ``a`` plus ``step`` per block into an accumulator of a's dtype."""
    out = nl.ndarray((128, 8), dtype=a.dtype, buffer=nl.shared_hbm)
    acc = nl.zeros((128, 8), a.dtype)
    for j in nl.affine_range(a.shape[1] // 8):
        acc += nl.load(a[:, j * 8:(j + 1) * 8])
        acc += step                                 # the same value in every iteration counts each time
    nl.store(out, value=acc)
    return out


def test_accumulation_across_a_batched_loop_sums_every_iteration():
    kernel = nki.jit(accumulate.fn)
    a = rand(128, 64)
    np.testing.assert_allclose(kernel(a), a.reshape(128, 8, 8).sum(axis=1) + 8, rtol=1e-5, atol=1e-5)
    assert plan_of(kernel).unbatchable == frozenset()


def test_tiles_made_in_a_batched_loop_and_used_after_it_hold_the_last_iteration():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        for j in nl.affine_range(4):
            t = nl.load(a[:, j * 4:(j + 1) * 4])
        nl.store(out, value=t)                     # Python semantics: the last iteration's tile
        return out

    a = rand(128, 16)
    np.testing.assert_array_equal(kernel(a), a[:, 12:16])


def test_nested_batched_loops_with_psum_and_a_masked_ragged_tile_on_the_device():
    @nki.jit
    def kernel(x, y):
        out = nl.ndarray((x.shape[1], y.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        for m in nl.affine_range(x.shape[1] // 128):
            acc = nl.ndarray((128, y.shape[1]), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(x.shape[0] // 64):
                s = nl.ndarray((64, 128), nl.float32)
                s[...] = nl.load(x[k * 64:(k + 1) * 64, m * 128:(m + 1) * 128])
                nisa.nc_matmul(acc, s, nl.load(y[k * 64:(k + 1) * 64, :]))
            r = nl.ndarray((128, y.shape[1]), nl.float32)
            nisa.activation(r, nl.relu, acc, scale=0.5)
            nl.store(out[m * 128:(m + 1) * 128, :], value=r)
        return out

    x, y = torch.randn(192, 256), torch.randn(192, 96)
    out = kernel(x.to("neuron"), y.to("neuron")).cpu()
    torch.testing.assert_close(out, torch.relu(x.T @ y * 0.5), rtol=1e-4, atol=1e-4)
    assert plan_of(kernel).unbatchable == frozenset()


def test_a_psum_tile_made_in_a_batched_loop_accumulates_across_a_sequential_one():
    @nki.jit
    def kernel(a, b):
        out = nl.ndarray((4, 32, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(4):
            ps = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.psum)
            for k in nl.sequential_range(2):
                nisa.nc_matmul(ps, nl.load(a[k]), nl.load(b[i, k]))
            nl.store(out[i], value=nl.copy(ps))
        return out

    a, b = rand(2, 8, 32), rand(4, 2, 8, 16)
    ref = np.einsum("kxm,ikxn->imn", a.astype(np.float64), b)
    np.testing.assert_allclose(kernel(a, b), ref, rtol=1e-5, atol=1e-5)
    assert plan_of(kernel).unbatchable == frozenset()


def test_loop_dependent_reads_of_a_loop_invariant_tile_are_per_iteration():
    @nki.jit
    def kernel(x):
        out = nl.ndarray((4, 128, 1), dtype=x.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(4):
            t = nl.load(x)                               # the same in every iteration
            r = t.reshape((128, 4))
            nl.store(out[i], value=r[:, i:i + 1])        # ... read at an offset that moves with i
        return out

    x = np.arange(512, dtype=np.int32).reshape(128, 4)
    np.testing.assert_array_equal(kernel(x)[:, :, 0], x.T)


def test_kernels_that_write_part_of_an_output_still_batch():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((4, 128, 8), dtype=a.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(4):
            nl.store(out[i, :, 0:4], value=nl.load(a[i]))  # columns 4..7 are never written
        return out

    a = rand(4, 128, 4)
    np.testing.assert_array_equal(kernel(a)[:, :, :4], a)
    assert plan_of(kernel).unbatchable == frozenset()


def test_aliased_mutable_arguments_are_not_batched():
    @nki.jit(mutates_args=("dst",))
    def shift(src, dst):
        for i in nl.affine_range(3):
            nl.store(dst[:, i + 1:i + 2], value=nl.load(src[:, i:i + 1]))

    a = np.arange(8, dtype=np.float32).reshape(2, 4).repeat(64, axis=0)
    expected = a.copy()
    for i in range(3):
        expected[:, i + 1] = expected[:, i]
    shift(a, a)
    np.testing.assert_array_equal(a, expected)
    assert plan_of(shift).unbatchable is None


def test_loop_dependent_masks_batch_when_tiles_fit():
    kernel = nki.jit(masked_copy.fn)   # its mask moves with the loop; 512 rows: every tile fits
    a = rand(512, 8)
    np.testing.assert_allclose(kernel(a), a * 2)
    assert plan_of(kernel).unbatchable == frozenset()
    ragged = nki.jit(masked_copy.fn)   # 300 rows: the last tile reaches past the end
    np.testing.assert_allclose(ragged(rand(300, 8)), rand(300, 8) * 2)
    assert len(plan_of(ragged).unbatchable) == 1


def test_low_precision_accumulators_run_sequentially():
    kernel = nki.jit(accumulate.fn)
    out = kernel(torch.zeros(128, 8 * 512, dtype=torch.bfloat16), 0.01)
    expected = torch.zeros(128, 8, dtype=torch.bfloat16)
    for _ in range(512):
        expected += 0.01                          # rounds to bf16 at every step, as hardware does
    torch.testing.assert_close(out, expected)
    assert plan_of(kernel).unbatchable  # the loop runs sequentially


def test_loads_do_not_share_memory_with_inputs_the_kernel_writes():
    @nki.jit(mutates_args=("b",))
    def kernel(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(b, value=nl.zeros(a.shape, a.dtype))     # b may be a
        nl.store(out, value=t)
        return out

    x = rand(128, 4)
    original = x.copy()
    np.testing.assert_array_equal(kernel(x, x), original)
    np.testing.assert_array_equal(x, 0)


def test_overlapping_numpy_views_count_as_aliases():
    @nki.jit(mutates_args=("dst",))
    def shift(src, dst):
        for i in nl.affine_range(3):
            nl.store(dst[i + 1:i + 2, :], value=nl.load(src[i:i + 1, :]))

    base = np.arange(4, dtype=np.float32).reshape(4, 1).repeat(8, axis=1)
    shift(base[0:3], base)     # src is a view into dst
    np.testing.assert_array_equal(base[:, 0], [0, 0, 0, 0])
    assert plan_of(shift).unbatchable is None


def test_a_grid_kernel_cannot_be_called_from_a_kernel():
    @nki.jit
    def outer(a):
        return add_spmd[2](a, a)

    with pytest.raises(nki.NKIError, match="nested-grid"):
        outer(rand(256, 256))
