"""The current (destination-first, NKI 0.3) ``nki.isa`` instructions and enums, each against a
NumPy reference, and the rules they check."""

import inspect

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

from tests.nki.test_language import rand, run


def sbuf(a, dtype=None):
    """``a`` (an HBM tensor) copied into a new SBUF tile, cast to ``dtype``."""
    t = nl.ndarray(a.shape, dtype=dtype or a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    return t


def out_of(t, dtype=None):
    """A new shared_hbm tensor holding the tile ``t``."""
    out = nl.ndarray(t.shape, dtype=dtype or t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def ints(*shape, low=0, high=8, seed=0):
    return np.random.default_rng(seed).integers(low, high, shape).astype(np.int32)


def plan_of(kernel):
    (plan,) = kernel._plans.values()
    return plan


# -- enums and target ----------------------------------------------------------------------------
def test_enums_have_the_reference_values_and_constants_is_a_module():
    import torchneuron.nki.isa.constants as constants
    from torchneuron.nki.isa.constants import dge_mode, matmul_perf_mode, oob_mode

    assert {e.name: e.value for e in nisa.engine} == {"unknown": 0, "tensor": 1, "scalar": 2, "gpsimd": 3, "dma": 4,
                                                      "vector": 5, "sync": 6}
    assert [c.name for c in nisa.reduce_cmd] == ["idle", "reset", "reduce", "reset_reduce", "load_reduce"]
    assert nisa.reduce_cmd.load_reduce.value == 4
    assert (dge_mode.unknown, dge_mode.swdge, dge_mode.hwdge, dge_mode.none) == (0, 1, 2, 3)
    assert (oob_mode.error, oob_mode.skip) == (0, 1)
    assert matmul_perf_mode("double_row") is matmul_perf_mode.double_row and matmul_perf_mode.none.value == "none"
    assert (nisa.dma_engine.dma, nisa.dma_engine.gpsimd_dma) == (1, 2)
    assert nisa.nc_version.gen2 < nisa.nc_version.gen3 < nisa.nc_version.gen4
    assert [v.name for v in nisa.nc_version] == ["gen2", "gen3", "gen4"]
    for name in constants.__all__:
        assert getattr(nisa, name) is getattr(constants, name)
    assert nisa.constants is constants and dge_mode is nisa.dge_mode and oob_mode is nisa.oob_mode
    assert nisa.vector_engine is nisa.engine.vector and nisa.NkiValidationError is nki.NKIError


@pytest.mark.parametrize("target, version", [("trn2", 3), ("trn3", 4)])
def test_get_nc_version_follows_the_platform_target(target, version):
    @nki.jit(platform_target=target)
    def kernel(a):
        t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=int(nisa.get_nc_version()))
        return out_of(t)

    assert run(kernel, rand(1, 1))[0, 0] == version


# -- vector engine --------------------------------------------------------------------------------
def test_tensor_copy_predicated_copies_where_the_predicate_holds():
    @nki.jit
    def kernel(a, b, p):
        pred = sbuf(p, nl.uint8)
        x, y = sbuf(a), sbuf(b)
        nisa.tensor_copy_predicated(dst=y, src=x, predicate=pred)
        z = sbuf(b)
        nisa.tensor_copy_predicated(dst=z, src=-1.5, predicate=pred, reverse_pred=True)
        return out_of(y), out_of(z)

    a, b, p = rand(32, 16), rand(32, 16) + 3, ints(32, 16, high=2)
    y, z = run(kernel, a, b, p)
    np.testing.assert_array_equal(y, np.where(p != 0, a, b))
    np.testing.assert_array_equal(z, np.where(p == 0, -1.5, b))


def test_tensor_tensor_and_tensor_scalar_forms():
    @nki.jit
    def kernel(a, b, c):
        x, col = sbuf(a), sbuf(c)
        y = nl.ndarray((32, 2, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=y, src=b)
        t = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=t, data1=x, data2=y, op=nl.subtract)   # free shapes differ, counts agree
        u = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=u, data=x, op0=np.abs, operand0=0.0, op1=nl.multiply, operand1=col)
        v = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=v, data=u, op0=nl.add, operand0=1.0, op1=nl.rsqrt)
        n = sbuf(a, nl.int32)
        m = nl.ndarray((32, 16), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=m, data=n, op0=nl.bitwise_and, operand0=6, op1=nl.left_shift, operand1=1)
        return out_of(t), out_of(u), out_of(v), out_of(m)

    a, b, c = rand(32, 16) * 4, rand(32, 16), np.abs(rand(32, 1)) + 0.1
    t, u, v, m = run(kernel, a, b, c)
    np.testing.assert_allclose(t, a - b, rtol=1e-6)
    np.testing.assert_allclose(u, np.abs(a) * c, rtol=1e-6)
    np.testing.assert_allclose(v, 1 / np.sqrt(np.abs(a) * c + 1), rtol=1e-5)
    np.testing.assert_array_equal(m, (a.astype(np.int32) & 6) << 1)


def test_nc_transpose_picks_the_vector_engine_for_small_sbuf_tiles_and_columns_may_be_views():
    @nki.jit
    def kernel(a, c):
        t = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_transpose(dst=t, data=sbuf(a))
        u = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=u, data=t, op0=nl.multiply, operand0=sbuf(c)[:, 0])   # a (P,) view
        return out_of(u)

    a, c = rand(16, 8), rand(8, 1)
    np.testing.assert_array_equal(run(kernel, a, c), a.T * c)


def test_scalar_tensor_tensor():
    @nki.jit
    def kernel(a, b, c):
        x, y, col = sbuf(a), sbuf(b), sbuf(c)
        t = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=t, data=x, op0=nl.multiply, operand0=col, op1=nl.add, operand1=y)
        u = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=u, data=x, op0=nl.subtract, operand0=2.0, op1=nl.subtract, operand1=y,
                                  reverse0=True, reverse1=True)
        return out_of(t), out_of(u)

    a, b, c = rand(32, 16), rand(32, 16), rand(32, 1)
    t, u = run(kernel, a, b, c)
    np.testing.assert_allclose(t, a * c + b, rtol=1e-6)
    np.testing.assert_allclose(u, b - (2.0 - a), rtol=1e-6)


def test_tensor_reduce_takes_op_before_data_and_every_reduction_op():
    @nki.jit
    def kernel(a, b):
        x, n = sbuf(a), sbuf(b)
        outs = []
        for op in (nl.add, nl.subtract, nl.multiply, nl.minimum, nl.logical_or):
            r = nl.ndarray((16, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_reduce(r, op, x, axis=(1, 2), keepdims=True)
            outs.append(out_of(r))
        for op in (nl.bitwise_or, nl.bitwise_xor):
            r = nl.ndarray((16,), dtype=nl.int32, buffer=nl.sbuf)
            nisa.tensor_reduce(dst=r, op=op, data=n, axis=1)
            outs.append(out_of(r))
        return tuple(outs)

    a, b = rand(16, 2, 3), ints(16, 5, high=64)
    total, diff, prod, low, anyv, bor, bxor = run(kernel, a, b)
    flat = a.reshape(16, -1)
    np.testing.assert_allclose(total[:, 0], flat.sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(diff[:, 0], flat[:, 0] - flat[:, 1:].sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(prod[:, 0], flat.prod(1), rtol=1e-5)
    np.testing.assert_array_equal(low[:, 0], flat.min(1))
    np.testing.assert_array_equal(anyv[:, 0], (flat != 0).any(1))
    np.testing.assert_array_equal(bor, np.bitwise_or.reduce(b, axis=1))
    np.testing.assert_array_equal(bxor, np.bitwise_xor.reduce(b, axis=1))


def test_nc_stream_shuffle_moves_partitions_within_quadrants():
    @nki.jit
    def kernel(a):
        x = sbuf(a)
        wide = nl.ndarray((64, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=wide, value=0.0)
        nisa.nc_stream_shuffle(dst=wide[32:64, :], src=x[0:1, :], shuffle_mask=[0] * 32)   # broadcast a row
        y = sbuf(a)
        mask = [31 - i if i % 4 else 255 for i in range(32)]                              # 255: keep
        nisa.nc_stream_shuffle(dst=y, src=x, shuffle_mask=mask)
        return out_of(wide), out_of(y)

    a = rand(64, 8)
    wide, y = run(kernel, a)
    np.testing.assert_array_equal(wide[:32], 0)
    np.testing.assert_array_equal(wide[32:], np.broadcast_to(a[0], (32, 8)))
    expected = a.copy()
    for p in range(64):
        m = 31 - p % 32
        if p % 4:
            expected[p] = a[(p // 32) * 32 + m]
    np.testing.assert_array_equal(y, expected)


# -- accumulating vector-engine instructions ----------------------------------------------------------
def test_tensor_scalar_reduce_chains_through_the_accumulator():
    @nki.jit
    def kernel(a, b):
        x, y = sbuf(a), sbuf(b)
        t = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        first = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=t, data=x, op0=nl.abs, operand0=0.0, reduce_op=nl.maximum, reduce_res=first)
        both = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(dst=t, data=x, op0=nl.multiply, operand0=2.0, reduce_op=nl.add)
        nisa.tensor_scalar_reduce(dst=t, data=y, op0=nl.multiply, operand0=2.0, reduce_op=nl.add, reduce_res=both,
                                  reduce_cmd=nisa.reduce_cmd.reduce, reduce_res_negate=True)
        loaded = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(t, x, nl.add, 1.0, nl.add, loaded, reduce_cmd=nisa.reduce_cmd.load_reduce,
                                  reduce_init=100.0)
        return out_of(t), out_of(first), out_of(both), out_of(loaded)

    a, b = rand(32, 16), rand(32, 16)
    t, first, both, loaded = run(kernel, a, b)
    np.testing.assert_allclose(t, a + 1, rtol=1e-6)
    np.testing.assert_array_equal(first[:, 0], np.abs(a).max(1))
    np.testing.assert_allclose(both[:, 0], -2 * (a.sum(1) + b.sum(1)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(loaded[:, 0], 100 + (a + 1).sum(1), rtol=1e-5)


def test_select_reduce():
    @nki.jit
    def kernel(a, p, c):
        x, pred, col = sbuf(a), sbuf(p, nl.uint8), sbuf(c)
        t = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        m = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(dst=t, predicate=pred, on_true=x, on_false=col, reduce_res=m,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce)
        u = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(dst=u, predicate=pred, on_true=x, on_false=-9.0, reverse_pred=True)
        return out_of(t), out_of(m), out_of(u)

    a, p, c = rand(32, 16), ints(32, 16, high=2), rand(32, 1) - 3
    t, m, u = run(kernel, a, p, c)
    np.testing.assert_array_equal(t, np.where(p != 0, a, c))
    np.testing.assert_array_equal(m[:, 0], np.where(p != 0, a, c).max(1))
    np.testing.assert_array_equal(u, np.where(p == 0, a, -9.0))


def test_range_select_keeps_a_window_of_free_indices():
    @nki.jit
    def kernel(a, lo, hi):
        x, b0, b1 = sbuf(a), sbuf(lo), sbuf(hi)
        t = nl.ndarray((32, 24), dtype=nl.float32, buffer=nl.sbuf)
        m = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.range_select(dst=t, on_true_tile=x, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=b0,
                          bound1=b1, reduce_res=m, range_start=10, on_false_value=np.finfo(np.float32).min)
        return out_of(t), out_of(m)

    a = rand(32, 24)
    lo = ints(32, 1, low=10, high=20, seed=1).astype(np.float32)
    hi = lo + ints(32, 1, low=1, high=10, seed=2).astype(np.float32)
    t, m = run(kernel, a, lo, hi)
    index = 10 + np.arange(24)
    expected = np.where((index >= lo) & (index < hi), a, np.finfo(np.float32).min)
    np.testing.assert_array_equal(t, expected)
    np.testing.assert_array_equal(m[:, 0], expected.max(1))


@pytest.mark.parametrize("batch", [False, True])
def test_exponential_sums_across_tiles(batch):
    @nki.jit(platform_target="trn3")
    def kernel(a):
        out = nl.ndarray((4, 32, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(4) if batch else nl.sequential_range(4):
            x = sbuf(a[i])
            e = nl.ndarray((32, 8), dtype=nl.float32, buffer=nl.sbuf)
            s = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.exponential(dst=e, src=x[:, 0:8], max_value=1.0, reduce_cmd=nisa.reduce_cmd.load_reduce,
                             reduce_init=0.5)
            nisa.exponential(dst=e, src=x[:, 8:16], max_value=1.0, reduce_res=s, reduce_cmd=nisa.reduce_cmd.reduce)
            nisa.dma_copy(dst=out[i], src=s)
        return out

    a = rand(4, 32, 16)
    np.testing.assert_allclose(run(kernel, a)[..., 0], 0.5 + np.exp(a - 1).sum(-1), rtol=1e-5)
    if batch:  # each iteration resets its own chain: the loop batches
        assert plan_of(kernel).unbatchable == frozenset()


def test_activation_accumulates_across_iterations_sequentially():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.sbuf)
        e = nl.ndarray((32, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.copy, data=sbuf(a[0]), reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset)
        for i in nl.affine_range(4):  # carries the registers between iterations: runs one at a time
            nisa.activation(dst=e, op=nl.exp, data=sbuf(a[i]), reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.activation(dst=e, op=nl.copy, data=sbuf(a[0]), reduce_res=s, reduce_cmd=nisa.reduce_cmd.reduce, scale=0.0)
        nisa.dma_copy(dst=out, src=s)
        return out

    a = rand(4, 32, 8)
    np.testing.assert_allclose(run(kernel, a)[:, 0], np.exp(a).sum((0, 2)), rtol=1e-5)
    assert plan_of(kernel).unbatchable  # the loop ran sequentially


def test_activate2_stages_relu_param_and_reduction():
    @nki.jit(platform_target="trn3")
    def kernel(a, c):
        x, col = sbuf(a), sbuf(c)
        t = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        m = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activate2(dst=t, op=nl.relu, data=x, imm0=col, imm1=0.5, op0=nl.multiply, op1=nl.subtract,
                       relu_param=0.1, reduce_op=nl.abs_max, reduce_res=m, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        u = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activate2(u, nl.exp, x, 2.0, 0.0, nl.subtract, nl.bypass, reverse0=True)
        w = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=w, op=nl.tanh, data=x, scale=col, engine=nisa.engine.gpsimd)  # v4 GpSimd activations
        return out_of(t), out_of(m), out_of(u), out_of(w)

    a, c = rand(32, 16), rand(32, 1)
    t, m, u, w = run(kernel, a, c)
    np.testing.assert_allclose(w, np.tanh(a * c), rtol=1e-5, atol=1e-7)
    pre = a * c - 0.5
    ref = np.where(pre > 0, pre, 0.1 * pre)
    np.testing.assert_allclose(t, ref, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(m[:, 0], np.abs(ref).max(1), rtol=1e-5)
    np.testing.assert_allclose(u, np.exp(2.0 - a), rtol=1e-5)


# -- scans --------------------------------------------------------------------------------------------
def _scan_reference(d0, d1, init, f0, f1):
    acc = np.broadcast_to(np.asarray(init, dtype=np.float64), (d0.shape[0],)).copy()
    out = np.empty(d0.shape, dtype=np.float64)
    for i in range(d0.shape[1]):
        acc = f1(f0(d0[:, i], acc), d1[:, i])
        out[:, i] = acc
    return out


def test_tensor_tensor_scan_runs_recurrences():
    @nki.jit
    def kernel(a, b, c):
        x, y, h0 = sbuf(a), sbuf(b), sbuf(c)
        outs = []
        for op0, op1, initial, r0, r1 in ((nl.multiply, nl.add, h0, False, False), (nl.add, nl.add, 0.0, False, False),
                                          (nl.subtract, nl.subtract, 1.0, True, True),
                                          (nl.maximum, nl.add, h0, False, False)):
            t = nl.ndarray((16, 40), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor_scan(dst=t, data0=x, data1=y, initial=initial, op0=op0, op1=op1, reverse0=r0,
                                    reverse1=r1)
            outs.append(out_of(t))
        return tuple(outs)

    a, b, c = rand(16, 40) * 0.5, rand(16, 40), rand(16, 1)
    linear, cumsum, swapped, maxplus = run(kernel, a, b, c)
    np.testing.assert_allclose(linear, _scan_reference(a, b, c[:, 0], np.multiply, np.add), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(cumsum, np.cumsum(a + b, axis=1), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(swapped, _scan_reference(a, b, 1.0, lambda x, h: h - x, lambda t, y: y - t),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(maxplus, _scan_reference(a, b, c[:, 0], np.maximum, np.add), rtol=1e-5, atol=1e-5)


def test_tensor_scalar_cumulative_carries_its_register():
    @nki.jit
    def kernel(a, c):
        x, carry = sbuf(a), sbuf(c)
        t = nl.ndarray((16, 24), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(dst=t[:, 0:12], src=x[:, 0:12], op0=nl.multiply, op1=nl.add, imm0=2.0,
                                      imm1=carry, reduce_cmd=nisa.reduce_cmd.load_reduce)
        nisa.tensor_scalar_cumulative(dst=t[:, 12:24], src=x[:, 12:24], op0=nl.multiply, op1=nl.add, imm0=2.0,
                                      reduce_cmd=nisa.reduce_cmd.reduce)
        outs = [out_of(t)]
        for op1 in (nl.maximum, nl.subtract, nl.multiply):
            u = nl.ndarray((16, 24), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar_cumulative(u, x, nl.add, op1, 0.5)
            outs.append(out_of(u))
        return tuple(outs)

    a, c = rand(16, 24), rand(16, 1)
    summed, running_max, alternating, product = run(kernel, a, c)
    np.testing.assert_allclose(summed, c + np.cumsum(2 * a, axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(running_max, np.maximum.accumulate(a + 0.5, axis=1))
    reg, expected = np.zeros(16), np.empty((16, 24))
    for i in range(24):  # reg = (x + 0.5) - reg
        reg = (a[:, i] + 0.5) - reg
        expected[:, i] = reg
    np.testing.assert_allclose(alternating, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(product, np.cumprod(a + 0.5, axis=1), rtol=1e-4, atol=1e-6)


# -- top-k search ----------------------------------------------------------------------------------------
def test_max8_find_index8_match_replace8_give_a_top_16():
    @nki.jit
    def kernel(a):
        x = sbuf(a)
        top = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.max8(dst=top, src=x)
        idx = nl.ndarray((16, 8), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.nc_find_index8(dst=idx, data=x, vals=top)
        rest = nl.ndarray((16, 4, 16), dtype=nl.float32, buffer=nl.sbuf)
        where = nl.ndarray((16, 8), dtype=nl.int32, buffer=nl.sbuf)
        nisa.nc_match_replace8(dst=rest, data=x, vals=top, imm=-np.inf, dst_idx=where)
        top2 = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.max8(dst=top2, src=rest)
        return out_of(top), out_of(idx, nl.int32), out_of(where), out_of(top2)

    a = rand(16, 4, 16)
    a[:, 1, 3] = a[:, 2, 5] = 10.0  # a repeated maximum: match_replace8 replaces both occurrences in turn
    top, idx, where, top2 = run(kernel, a)
    flat = a.reshape(16, -1)
    order = np.argsort(-flat, axis=1, kind="stable")
    np.testing.assert_array_equal(top, np.take_along_axis(flat, order[:, :8], 1))
    np.testing.assert_array_equal(top2, np.take_along_axis(flat, order[:, 8:16], 1))
    np.testing.assert_array_equal(where, order[:, :8])
    expected_idx = order[:, :8].copy()
    expected_idx[:, 1] = expected_idx[:, 0]  # find_index8 gives the first occurrence of each value
    np.testing.assert_array_equal(idx, expected_idx)


# -- GpSimd engine ------------------------------------------------------------------------------------
def test_tensor_partition_reduce():
    @nki.jit
    def kernel(a, b):
        x, n = sbuf(a), sbuf(b)
        s = nl.ndarray((1, 2, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(dst=s, op=nl.add, data=x)
        m = nl.ndarray((1, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(m, nl.maximum, x)
        o = nl.ndarray((1, 16), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_partition_reduce(dst=o, op=nl.bitwise_or, data=n)
        return out_of(s), out_of(m), out_of(o)

    a, b = rand(24, 2, 8), ints(24, 16, high=256)
    s, m, o = run(kernel, a, b)
    np.testing.assert_allclose(s[0], a.sum(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(m[0], a.reshape(24, -1).max(0))
    np.testing.assert_array_equal(o[0], np.bitwise_or.reduce(b, axis=0))


def test_nc_n_gather_gathers_within_partitions():
    @nki.jit
    def kernel(a, i):
        data, idx = sbuf(a), sbuf(i, nl.uint32)
        g = nl.ndarray((16, 5), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_n_gather(dst=g, data=data, indices=idx)
        return out_of(g)

    a, i = rand(16, 4, 8), ints(16, 5, high=32)
    np.testing.assert_array_equal(run(kernel, a, i), np.take_along_axis(a.reshape(16, -1), i, 1))


def test_local_gather_gathers_within_groups_of_16_partitions():
    @nki.jit
    def kernel(a, i):
        src, idx = sbuf(a), sbuf(i, nl.uint16)
        g = nl.ndarray((32, 24, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.local_gather(dst=g, src_buffer=src, index=idx, num_elem_per_idx=2, num_valid_indices=24)
        return out_of(g)

    a, i = rand(32, 64), ints(32, 2, high=32) * 2
    g = run(kernel, a, i)
    for core in range(2):
        rows = slice(16 * core, 16 * core + 16)
        offsets = i[rows].T.reshape(-1)[:24]            # partition-major: index[0, 0], index[1, 0], ...
        for p in range(16 * core, 16 * core + 16):
            np.testing.assert_array_equal(g[p], np.stack([a[p, o:o + 2] for o in offsets]))


def test_sequence_bounds():
    @nki.jit
    def kernel(s):
        ids = sbuf(s)
        b = nl.ndarray((1, 2, 12), dtype=nl.int32, buffer=nl.sbuf)
        nisa.sequence_bounds(dst=b, segment_ids=ids)
        return out_of(b)

    s = np.array([[1, 1, 2, 2, 2, 0, 0, 3, 3, 1, 0, 4]], dtype=np.float32)
    starts = [0, 0, 2, 2, 2, 12, 12, 7, 7, 9, 12, 11]
    ends = [2, 2, 5, 5, 5, -1, -1, 9, 9, 10, -1, 12]   # one past the segment's last element
    np.testing.assert_array_equal(run(kernel, s)[0], [starts, ends])


def test_nonzero_with_count_uses_each_cores_first_partition():
    @nki.jit
    def kernel(a):
        x = nl.ndarray((32, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=x, value=0.0)
        nisa.dma_copy(dst=x[0:1, :], src=a[0:1, :])     # only partitions 0 and 16 need data
        nisa.dma_copy(dst=x[16:17, :], src=a[1:2, :])
        r = nl.ndarray((32, 9), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=r, value=7)
        nisa.nonzero_with_count(dst=r, src=x, index_offset=16, padding_val=-1)
        return out_of(r)

    a = np.array([[0, 1, 1, 0, 0, 1, 0, 0], [2, 0, 0, 0, 0, 0, 0, 3]], dtype=np.float32)
    r = run(kernel, a)
    np.testing.assert_array_equal(r[0], [17, 18, 21, -1, -1, -1, -1, -1, 3])
    np.testing.assert_array_equal(r[16], [16, 23, -1, -1, -1, -1, -1, -1, 2])
    np.testing.assert_array_equal(np.delete(r, [0, 16], axis=0), 7)


# -- DMA ------------------------------------------------------------------------------------------------
def test_dma_transpose_permutes_2d_3d_and_4d():
    @nki.jit
    def kernel(a, b, c):
        t2 = nl.ndarray((32, 16), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t2, src=a)                                  # HBM -> SBUF
        t3 = nl.ndarray((4, 3, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t3, src=sbuf(b), axes=(2, 1, 0))           # SBUF -> SBUF
        t4 = nl.ndarray((5, 3, 4, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t4, src=c, axes=(3, 1, 2, 0))
        return out_of(t2, nl.float32), out_of(t3), out_of(t4)

    import torch
    a = torch.randn(16, 32).to(torch.bfloat16)
    b, c = rand(8, 3, 4), rand(2, 3, 4, 5)
    t2, t3, t4 = nki.simulate(kernel)(a, b, c)
    np.testing.assert_array_equal(t2, a.float().numpy().T)
    np.testing.assert_array_equal(t3, b.transpose(2, 1, 0))
    np.testing.assert_array_equal(t4, c.transpose(3, 1, 2, 0))


def test_dma_compute_adds_sources():
    @nki.jit
    def kernel(a, b, c):
        x = sbuf(a)
        acc = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_compute(dst=acc, srcs=[x, b, c], reduce_op=nl.add)
        out = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_compute(out, [acc, b], nl.add, scales=[1.0, 1.0])
        return out

    a, b, c = rand(32, 16), rand(32, 16), rand(32, 16)
    np.testing.assert_allclose(run(kernel, a, b, c), a + 2 * b + c, rtol=1e-6)


def test_dma_copy_modes():
    @nki.jit(platform_target="trn3")
    def kernel(a):
        t = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a, dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.scalar, priority=1)
        u = nl.ndarray((16, 16), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=u, src=t, dge_mode=nisa.dge_mode.none, oob_mode=nisa.oob_mode.skip)
        return out_of(u, nl.float32)

    a = rand(16, 16)
    np.testing.assert_allclose(run(kernel, a), a, rtol=1e-2)

    @nki.jit
    def on_trn2(a):
        t = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a, priority=0)
        return out_of(t)

    with pytest.raises(nki.NKIError) as info:  # QoS priorities are a NeuronCore-v4 feature
        on_trn2(a)
    assert info.value.rule == "target"


# -- registers --------------------------------------------------------------------------------------------
def test_registers_move_load_and_store():
    @nki.jit
    def kernel(a):
        n = sbuf(a, nl.int32)
        r = nisa.register_alloc()
        nisa.register_load(r, n[0:1, 0:1])
        five = nisa.register_alloc(5)
        copy = nisa.register_alloc(n[0:1, 1:2])
        t = nl.ndarray((1, 4), dtype=nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=0)
        for i in range(int(r)):                        # a register as a loop bound
            nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1)
        nisa.register_store(t[0:1, 1:2], five)
        nisa.register_move(five, copy)
        nisa.register_store(t[0:1, 2:3], five)
        out = out_of(t)
        nisa.register_move(five, -3)
        nisa.register_store(out[0:1, 3:4], five)       # into HBM
        return out

    a = np.array([[3, 42]], dtype=np.float32)
    np.testing.assert_array_equal(run(kernel, a), [[3, 5, 42, -3]])


# -- random numbers -------------------------------------------------------------------------------------
def test_rng_streams_are_deterministic_and_restored_with_the_state():
    @nki.jit
    def kernel(a):
        r1 = nl.ndarray((32, 64), dtype=nl.uint16, buffer=nl.sbuf)
        nisa.rng(dst=r1)
        state = nl.ndarray((32, 6), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.rand_get_state(dst=state, engine=nisa.engine.gpsimd)
        r2 = nl.ndarray((32, 64), dtype=nl.int32, buffer=nl.sbuf)
        nisa.rng(dst=r2, engine=nisa.engine.gpsimd)
        nisa.rand_set_state(src_seeds=state, engine=nisa.engine.gpsimd)
        r3 = nl.ndarray((32, 64), dtype=nl.int32, buffer=nl.sbuf)
        nisa.rng(dst=r3, engine=nisa.engine.gpsimd)
        seed = sbuf(a, nl.int32)
        nisa.set_rng_seed(src_seeds=seed)
        r4 = nl.ndarray((32, 64), dtype=nl.int8, buffer=nl.sbuf)
        nisa.rng(dst=r4)
        return out_of(r1, nl.int32), out_of(r2), out_of(r3), out_of(r4)

    one = run(kernel, np.array([[7]], dtype=np.float32))
    again = run(kernel, np.array([[7]], dtype=np.float32))
    other = run(kernel, np.array([[8]], dtype=np.float32))
    r1, r2, r3, r4 = one
    for x, y in zip(one, again):
        np.testing.assert_array_equal(x, y)                    # every call starts from the same state
    np.testing.assert_array_equal(r2, r3)                       # restored state, same stream
    assert r1.min() >= 0 and r1.max() <= 65535 and len(np.unique(r1)) > 1500
    assert r4.min() >= -128 and r4.max() <= 127 and len(np.unique(r4)) > 200
    assert not np.array_equal(r4, other[3])                     # another seed, another stream
    assert not np.array_equal(r1[0], r1[1])                     # lanes differ


def test_rand2_and_vector_state_on_trn3():
    @nki.jit(platform_target="trn3")
    def kernel(a):
        lo = sbuf(a)
        u = nl.ndarray((16, 256), dtype=nl.float32, buffer=nl.sbuf)
        nisa.rand2(dst=u, min=lo, max=3.0)
        state = nl.ndarray((16, 24), dtype=nl.uint32, buffer=nl.psum)
        nisa.rand_get_state(dst=state, engine=nisa.engine.vector)
        s = nl.ndarray((16, 24), dtype=nl.uint32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=state)
        nisa.rand_set_state(src_seeds=s, engine=nisa.engine.vector)
        v = nl.ndarray((16, 256), dtype=nl.float32, buffer=nl.sbuf)
        nisa.rand2(dst=v, min=lo, max=3.0)
        w = nl.ndarray((16, 256), dtype=nl.float32, buffer=nl.sbuf)
        nisa.rand_set_state(src_seeds=s, engine=nisa.engine.vector)
        nisa.rand2(dst=w, min=lo, max=3.0)
        return out_of(u), out_of(v), out_of(w)

    lo = -rand(16, 1) ** 2
    u, v, w = run(kernel, lo)
    assert (u >= lo).all() and (u <= 3).all() and abs(((u - lo) / (3 - lo)).mean() - 0.5) < 0.05
    np.testing.assert_array_equal(v, w)
    assert not np.array_equal(u, v)


def test_dropout_drops_with_the_given_probability_without_rescaling():
    @nki.jit
    def kernel(a, p):
        x, prob = sbuf(a), sbuf(p)
        outs = []
        for q in (0.0, 1.0, prob):
            t = nl.ndarray((64, 256), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dropout(dst=t, data=x, prob=q)
            outs.append(out_of(t))
        return tuple(outs)

    a = rand(64, 256) + 10
    p = np.linspace(0.1, 0.9, 64, dtype=np.float32)[:, None]
    keep_all, drop_all, some = run(kernel, a, p)
    np.testing.assert_array_equal(keep_all, a)
    np.testing.assert_array_equal(drop_all, 0)
    kept = some != 0
    np.testing.assert_array_equal(some[kept], a[kept])
    assert np.abs((1 - kept.mean(1)) - p[:, 0]).max() < 0.15


# -- tensor engine ---------------------------------------------------------------------------------------
def test_nc_matmul_tiling_and_double_row_fp8():
    import torch

    @nki.jit
    def kernel(s, m, s8, m8):
        st, mv = sbuf(s), sbuf(m)
        p = nl.ndarray((32, 64), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=p, stationary=st, moving=mv, tile_position=(64, 32), tile_size=(64, 32))
        q = nl.ndarray((16, 40), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(q, sbuf(s8), sbuf(m8), perf_mode=nisa.matmul_perf_mode.double_row)
        r, u = (nl.ndarray(t.shape, dtype=nl.float32, buffer=nl.sbuf) for t in (p, q))
        nisa.tensor_copy(dst=r, src=p)
        nisa.tensor_copy(dst=u, src=q)
        return out_of(r), out_of(u)

    s, m = rand(64, 32), rand(64, 64)
    s8 = torch.randn(128, 2, 16).to(torch.float8_e4m3fn)
    m8 = torch.randn(128, 2, 40).to(torch.float8_e5m2)
    r, u = nki.simulate(kernel)(s, m, s8, m8)
    np.testing.assert_allclose(r, s.T.astype(np.float64) @ m, rtol=1e-4, atol=1e-4)
    ref = np.einsum("kjm,kjn->mn", s8.double().numpy(), m8.double().numpy())
    np.testing.assert_allclose(u, ref, rtol=1e-4, atol=1e-4)


# -- rules ----------------------------------------------------------------------------------------------
def _iota_into_psum(a):
    t = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.psum)
    nisa.iota(dst=t, pattern=[[1, 16]])


def _activate2_on_trn2(a):
    t = sbuf(a)
    nisa.activate2(dst=t, op=nl.exp, data=t, imm0=1.0, imm1=0.0, op0=nl.multiply, op1=nl.bypass)


def _float_predicate(a):
    t = sbuf(a)
    nisa.tensor_copy_predicated(dst=t, src=t, predicate=t)


def _mixed_op_kinds(a):
    t = sbuf(a, nl.int32)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.bitwise_and, operand0=1, op1=nl.add, operand1=1)


def _partition_reduce_multiply(a):
    t = sbuf(a)
    r = nl.ndarray((1, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_partition_reduce(dst=r, op=nl.multiply, data=t)


def _tile_too_small(a):
    t = sbuf(a)
    p = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=p, stationary=t, moving=t, tile_position=(0, 0), tile_size=(8, 128))


def _short_shuffle_mask(a):
    t = sbuf(a)
    nisa.nc_stream_shuffle(dst=t, src=t, shuffle_mask=[0] * 31)


def _range_select_fill(a):
    t = sbuf(a)
    b = nl.ndarray((16, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=b, value=2.0)
    nisa.range_select(dst=t, on_true_tile=t, comp_op0=nl.less, comp_op1=nl.less, bound0=b, bound1=b,
                      on_false_value=0.0)


def _reduce_init_without_load(a):
    t = sbuf(a)
    r = nl.ndarray((16, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar_reduce(dst=t, data=t, op0=nl.add, operand0=1.0, reduce_op=nl.add, reduce_res=r,
                              reduce_init=2.0)


def _memset_float_into_int(a):
    t = nl.ndarray((16, 16), dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=2.0)


def _dma_transpose_axes(a):
    t = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t, src=a, axes=(0, 1))


def _dma_engine_without_hwdge(a):
    t = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a, engine=nisa.engine.sync)


def _uninitialised_register(a):
    t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.register_store(t, nisa.register_alloc())


def _raw_int_enum(a):
    t = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a, dge_mode=7)


def _accumulator_partitions(a):
    t = sbuf(a)
    nisa.tensor_scalar_reduce(dst=t, data=t, op0=nl.add, operand0=1.0, reduce_op=nl.add)
    nisa.tensor_scalar_reduce(dst=t[0:8, :], data=t[0:8, :], op0=nl.add, operand0=1.0, reduce_op=nl.add,
                              reduce_cmd=nisa.reduce_cmd.reduce)


def _vector_state_on_trn2(a):
    s = nl.ndarray((16, 24), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.rand_set_state(src_seeds=s, engine=nisa.engine.vector)


def _tensor_scalar_on_gpsimd(a):
    t = sbuf(a)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0, engine=nisa.engine.gpsimd)


def _swdge_transpose(a):
    t = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_transpose(dst=t, src=a, dge_mode=nisa.dge_mode.swdge)


def _hwdge_cast(a):
    t = nl.ndarray((16, 16), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a, dge_mode=nisa.dge_mode.hwdge)


def _cumulative_idle(a):
    t = sbuf(a)
    nisa.tensor_scalar_cumulative(dst=t, src=t, op0=nl.add, op1=nl.add, imm0=0.0, reduce_cmd=nisa.reduce_cmd.idle)


def _reverse0_not_supported(a):
    t = sbuf(a)
    nisa.tensor_scalar_reduce(dst=t, data=t, op0=nl.subtract, operand0=1.0, reduce_op=nl.add, reverse0=True)


def _iota_pattern_too_deep(a):
    t = nl.ndarray((16, 16), dtype=nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=t, pattern=[[1, 2]] * 4 + [[1, 1]])


def _find_index8_in_few_elements(a):
    t = sbuf(a)
    r = nl.ndarray((16, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=r, data=t[:, 0:4], vals=t[:, 0:8])


def _double_row_shapes(a):
    t = sbuf(a, nl.float8_e4m3)
    p = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=p, stationary=t, moving=t, perf_mode=nisa.matmul_perf_mode.double_row)


def _nonzero_dst_size(a):
    t = sbuf(a)
    r = nl.ndarray((16, 16), dtype=nl.int32, buffer=nl.sbuf)
    nisa.nonzero_with_count(dst=r, src=t)


def _gather_in_psum(a):
    t = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.psum)
    i = nl.ndarray((16, 4), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_n_gather(dst=i, data=t, indices=i)


RULES = [
    ("gpsimd-sbuf", _iota_into_psum), ("target", _activate2_on_trn2), ("dtype", _float_predicate),
    ("alu-op", _mixed_op_kinds), ("reduce-op", _partition_reduce_multiply), ("matmul-tiling", _tile_too_small),
    ("stream-shuffle", _short_shuffle_mask), ("range-select-fill", _range_select_fill),
    ("reduce-init", _reduce_init_without_load), ("memset-value", _memset_float_into_int),
    ("dma-transpose", _dma_transpose_axes), ("dma-engine", _dma_engine_without_hwdge),
    ("register-uninitialised", _uninitialised_register), ("enum", _raw_int_enum),
    ("accumulator-partitions", _accumulator_partitions), ("target", _vector_state_on_trn2),
    ("engine", _tensor_scalar_on_gpsimd),
    ("matmul-perf-mode", _double_row_shapes), ("shape-mismatch", _nonzero_dst_size),
    ("gpsimd-sbuf", _gather_in_psum), ("dge-mode", _swdge_transpose), ("dma-dtype", _hwdge_cast),
    ("reduce-cmd", _cumulative_idle), ("operands", _reverse0_not_supported), ("pattern", _iota_pattern_too_deep),
    ("max8-size", _find_index8_in_few_elements),
]


@pytest.mark.parametrize("rule, body", RULES, ids=[f"{r}-{b.__name__[1:]}" for r, b in RULES])
def test_rule_violations_name_the_rule_and_the_instruction_line(rule, body):
    @nki.jit
    def kernel(a):
        body(a)
        out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        return out

    with pytest.raises(nki.NKIError) as info:
        kernel(rand(16, 16))
    assert info.value.rule == rule, str(info.value)
    lines, start = inspect.getsourcelines(body)
    filename, lineno, text = info.value.line
    assert filename == __file__ and start < lineno < start + len(lines), str(info.value)
    assert "nisa." in text


# -- batched loops ----------------------------------------------------------------------------------------
def _per_iteration(a, i, p):
    """Every new instruction on iteration i's data (a (4, 32, 16) input, p a (32, 16) 0/1 predicate)."""
    x = sbuf(a[i])
    pred = sbuf(p, nl.uint8)
    col = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=col, op=nl.maximum, data=x, axis=1, keepdims=True)
    results = []

    def new():
        t = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        results.append(t)
        return t

    nisa.tensor_tensor_scan(dst=new(), data0=x, data1=x, initial=col, op0=nl.multiply, op1=nl.add)
    nisa.tensor_scalar_cumulative(dst=new(), src=x, op0=nl.multiply, op1=nl.add, imm0=col)
    s = new()
    nisa.tensor_copy(dst=s, src=x)
    nisa.tensor_copy_predicated(dst=s, src=x, predicate=pred,
                                reverse_pred=True)
    m = nl.ndarray((32, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.select_reduce(dst=new(), predicate=pred, on_true=x, on_false=col, reduce_res=m,
                       reduce_cmd=nisa.reduce_cmd.reset_reduce)
    nisa.scalar_tensor_tensor(dst=new(), data=x, op0=nl.add, operand0=m, op1=nl.multiply, operand1=x)
    g = nl.ndarray((32, 16), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.iota(dst=g, pattern=[[-1, 16]], offset=15)
    nisa.nc_n_gather(dst=new(), data=x, indices=g)
    nisa.nc_stream_shuffle(dst=new(), src=x, shuffle_mask=list(range(31, -1, -1)))
    top = nl.ndarray((32, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=top, src=x)
    nisa.nc_match_replace8(dst=new(), data=x, vals=top, imm=0.0)
    r = nl.ndarray((1, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_partition_reduce(dst=r, op=nl.add, data=x)
    nisa.nc_stream_shuffle(dst=new(), src=r, shuffle_mask=[0] * 32)
    return results


def test_new_instructions_batch_in_affine_loops(monkeypatch):
    from tests.nki.test_batching import sequential

    def body(a, p):
        outs = [nl.ndarray((4, 32, 16), dtype=nl.float32, buffer=nl.shared_hbm) for _ in range(10)]
        for i in nl.affine_range(4):
            for out, t in zip(outs, _per_iteration(a, i, p)):
                nisa.dma_copy(dst=out[i], src=t)
        return tuple(outs)

    kernel = nki.jit(body)
    a, p = rand(4, 32, 16), ints(32, 16, high=2)
    batched = kernel(a, p)
    assert plan_of(kernel).unbatchable == frozenset(), plan_of(kernel).batching_note
    for x, y in zip(batched, sequential(kernel, a, p, monkeypatch=monkeypatch)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def test_nc_matmul_accumulates_per_element_into_overlapping_regions():
    """accumulate=None: elements an earlier matmul of the open group wrote accumulate, the others
    are overwritten, whatever the regions' shapes."""

    @nki.jit
    def overlapping(a, b):
        s = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.sbuf)
        m = nl.ndarray((64, 256), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=a)
        nisa.dma_copy(dst=m, src=b)
        ps = nl.ndarray((32, 384), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(ps[:, 0:256], s, m)                  # opens the group over 0:256
        nisa.nc_matmul(ps[:, 128:256], s, m[:, 0:128])      # inside it: accumulates
        nisa.nc_matmul(ps[:, 192:384], s, m[:, 0:192])      # 192:256 accumulate, 256:384 are new
        out = nl.ndarray((32, 384), dtype=nl.float32, buffer=nl.shared_hbm)
        r = nl.ndarray((32, 384), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=r, src=ps)
        nisa.dma_copy(dst=out, src=r)
        return out

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 32), dtype=np.float32), rng.standard_normal((64, 256), dtype=np.float32)
    p = a.T @ b
    want = np.zeros((32, 384), np.float32)
    want[:, 0:256] = p
    want[:, 128:256] += p[:, 0:128]
    want[:, 192:384] = np.concatenate([want[:, 192:256], np.zeros((32, 128), np.float32)], axis=1) + p[:, 0:192]
    np.testing.assert_allclose(nki.simulate(overlapping)(a, b), want, rtol=1e-4, atol=1e-4)


def _positive(a):
    """(a in SBUF, a uint8 predicate tile of a > 0): the setup of the predicated-copy kernels."""
    x = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=a)
    pred = nl.ndarray(a.shape, dtype=nl.uint8, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=pred, data=x, op0=nl.greater, operand0=0.0)
    return x, pred


def test_tensor_copy_predicated_writes_only_the_selected_elements():
    """The elements the predicate leaves alone need not hold data (no undefined-tile report), and
    stay undefined for a later read."""

    @nki.jit
    def select_positive(a):
        x, pred = _positive(a)
        out_tile = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.memset(dst=out_tile, value=-1.0)
        fresh = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy_predicated(dst=fresh, src=x, predicate=pred)  # fresh: never written before
        nisa.tensor_copy_predicated(dst=out_tile, src=fresh, predicate=pred)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=out_tile)
        return out

    a = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate(select_positive)(a), np.where(a > 0, a, -1.0))

    @nki.jit
    def reads_what_was_not_selected(a):
        x, pred = _positive(a)
        fresh = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy_predicated(dst=fresh, src=x, predicate=pred)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=fresh)
        return out

    with pytest.raises(nki.NKIError, match="undefined-tile"):
        nki.simulate(reads_what_was_not_selected)(a)
