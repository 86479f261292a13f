"""nki.isa instructions (destination first) against NumPy/PyTorch references."""

import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

from tests.nki.test_language import rand, run


def test_engine_enum_and_version():
    assert {e.name for e in nisa.engine} >= {"tensor", "vector", "scalar", "gpsimd", "dma", "unknown"}
    assert nisa.tensor_engine is nisa.engine.tensor


def test_dma_copy_tensor_copy_memset():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((3, 128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)                      # cast on the way in
        c = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(c, t)
        nisa.dma_copy(dst=out[0], src=c)
        m = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(m, 2.5)
        nisa.dma_copy(dst=out[1], src=m)
        flat = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=flat, src=a)                   # element counts match, shapes need not
        nisa.dma_copy(dst=out[2], src=flat)
        return out

    a = rand(128, 64)
    out = run(kernel, a)
    np.testing.assert_array_equal(out[0], torch.from_numpy(a).to(torch.bfloat16).float().numpy())
    np.testing.assert_array_equal(out[1], 2.5)
    np.testing.assert_array_equal(out[2], a)


@nki.jit
def tiled_matmul(lhsT, rhs):
    k, m = lhsT.shape
    _, n = rhs.shape
    out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
    for mi in nl.affine_range(m // 128):
        for ni in nl.affine_range(n // 512):
            acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            for ki in nl.affine_range(k // 128):
                s = nl.ndarray((128, 128), dtype=lhsT.dtype, buffer=nl.sbuf)
                mv = nl.ndarray((128, 512), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=s, src=lhsT[ki * 128:(ki + 1) * 128, mi * 128:(mi + 1) * 128])
                nisa.dma_copy(dst=mv, src=rhs[ki * 128:(ki + 1) * 128, ni * 512:(ni + 1) * 512])
                nisa.nc_matmul(acc, s, mv)                 # first write overwrites, later ones accumulate
            r = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(r, acc)
            nisa.dma_copy(dst=out[mi * 128:(mi + 1) * 128, ni * 512:(ni + 1) * 512], src=r)
    return out


def test_nc_matmul_psum_accumulation_groups():
    a, b = rand(256, 384), rand(384, 1024)
    np.testing.assert_allclose(run(tiled_matmul, np.ascontiguousarray(a.T), b), a.astype(np.float64) @ b,
                               rtol=1e-4, atol=1e-4)


def test_nc_matmul_accumulate_flag_and_reuse_after_eviction():
    @nki.jit
    def kernel(x, y):
        out = nl.ndarray((3, 128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        s, mv = nl.load(x), nl.load(y)
        acc = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.psum)
        r = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_matmul(acc, s, mv)
        nisa.nc_matmul(acc, s, mv)                         # accumulates: 2 x@y
        nisa.tensor_copy(r, acc)                           # eviction closes the group
        nisa.dma_copy(dst=out[0], src=r)
        nisa.nc_matmul(acc, s, mv)                         # a new group: overwrites
        nisa.tensor_copy(r, acc)
        nisa.dma_copy(dst=out[1], src=r)
        nisa.nc_matmul(acc, s, mv, accumulate=True)        # explicit accumulate onto the evicted value
        nisa.tensor_copy(r, acc)
        nisa.dma_copy(dst=out[2], src=r)
        return out

    x, y = rand(32, 128), rand(32, 64)
    out = run(kernel, x, y)
    ref = x.T.astype(np.float64) @ y
    np.testing.assert_allclose(out[0], 2 * ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out[1], ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out[2], 2 * ref, rtol=1e-4, atol=1e-4)


def test_nc_transpose_on_tensor_and_vector_engines():
    @nki.jit
    def kernel(a, b):
        out = nl.ndarray((128, 96), dtype=nl.float32, buffer=nl.shared_hbm)
        out2 = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.ndarray((128, 96), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(p, nl.load(a))
        nl.store(out, value=nl.copy(p))
        v = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_transpose(v, nl.load(b), engine=nisa.engine.vector)
        nl.store(out2, value=v)
        return out, out2

    a, b = rand(96, 128), rand(16, 32)
    out, out2 = run(kernel, a, b)
    np.testing.assert_array_equal(out, a.T)
    np.testing.assert_array_equal(out2, b.T)


def test_tensor_tensor_tensor_scalar_tensor_reduce():
    @nki.jit
    def kernel(a, b, c):
        out = nl.ndarray((3, 128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        red = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        x, y, col = nl.load(a), nl.load(b), nl.load(c)
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(t, x, y, op=nl.multiply)
        nl.store(out[0], value=t)
        nisa.tensor_scalar(t, x, nl.multiply, col, op1=nl.add, operand1=1.0)         # x * col + 1
        nl.store(out[1], value=t)
        nisa.tensor_scalar(t, x, np.subtract, 3.0, reverse0=True)                     # 3 - x
        nl.store(out[2], value=t)
        r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(r, nl.maximum, x, axis=1, keepdims=True, negate=True)
        nl.store(red, value=r)
        return out, red

    a, b, c = rand(128, 64), rand(128, 64) + 1, rand(128, 1)
    out, red = run(kernel, a, b, c)
    np.testing.assert_allclose(out[0], a * b, rtol=1e-6)
    np.testing.assert_allclose(out[1], a * c + 1, rtol=1e-6)
    np.testing.assert_allclose(out[2], 3 - a, rtol=1e-6)
    np.testing.assert_allclose(red[:, 0], -a.max(axis=1))


def test_activation_with_scale_bias_and_reduce():
    @nki.jit
    def kernel(a, bias):
        out = nl.ndarray((128, 66), dtype=nl.float32, buffer=nl.shared_hbm)
        x, b = nl.load(a), nl.load(bias)
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(t, nl.exp, x, bias=b, scale=0.5, reduce_op=nl.add, reduce_res=s)
        nl.store(out[:, 0:64], value=t)
        nl.store(out[:, 64:65], value=s)
        nisa.activation_reduce(t, nl.tanh, x, reduce_op=nl.add, reduce_res=s)
        nl.store(out[:, 65:66], value=s)
        return out

    a, bias = rand(128, 64), rand(128, 1)
    out = run(kernel, a, bias)
    ref = np.exp(a * 0.5 + bias)
    np.testing.assert_allclose(out[:, :64], ref, rtol=1e-5)
    np.testing.assert_allclose(out[:, 64], ref.sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(out[:, 65], np.tanh(a).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_iota_affine_select_exponential_reciprocal():
    @nki.jit(platform_target="trn3")  # nisa.exponential is a NeuronCore-v4 instruction
    def kernel(a):
        out = nl.ndarray((4, 128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        i = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.iota(i, [[1, 128]], offset=5, channel_multiplier=1000)
        nl.store(out[0], value=i)
        x = nl.load(a)
        causal = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        # keep (row - col >= 0): the lower triangle; elsewhere -inf
        nisa.affine_select(causal, [[-1, 128]], 1, x, -np.inf, cmp_op=nl.greater_equal)
        nl.store(out[1], value=causal)
        e = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        total = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.exponential(e, x, max_value=1.0, reduce_res=total)
        nl.store(out[2], value=e)
        r = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(r, e)
        nl.store(out[3], value=r)
        sums = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(sums, value=total)
        return out, sums

    a = rand(128, 128)
    out, sums = run(kernel, a)
    rows, cols = np.mgrid[0:128, 0:128]
    np.testing.assert_array_equal(out[0], 5 + rows * 1000 + cols)
    np.testing.assert_array_equal(out[1], np.where(rows >= cols, a, -np.inf))
    np.testing.assert_allclose(out[2], np.exp(a - 1), rtol=1e-6)
    np.testing.assert_allclose(out[3], 1 / np.exp(a - 1), rtol=1e-5)
    np.testing.assert_allclose(sums[:, 0], np.exp(a - 1).sum(axis=1), rtol=1e-5)


def test_bn_stats_bn_aggr_give_mean_and_variance():
    @nki.jit
    def kernel(a):
        d = a.shape[1]
        out = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        stats = nl.ndarray((128, 6 * (d // 512)), dtype=nl.float32, buffer=nl.sbuf)
        for c in nl.affine_range(d // 512):
            nisa.bn_stats(stats[:, c * 6:(c + 1) * 6], x[:, c * 512:(c + 1) * 512])
        mv = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(mv, stats)
        nl.store(out, value=mv)
        return out

    a = rand(128, 1024) * 3 + 1
    out = run(kernel, a)
    np.testing.assert_allclose(out[:, 0], a.mean(axis=1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out[:, 1], a.var(axis=1), rtol=1e-4)


def test_max8_gives_top_eight_descending():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        m = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.max8(m, nl.load(a))
        nl.store(out, value=m)
        return out

    a = rand(128, 100)
    np.testing.assert_array_equal(run(kernel, a), -np.sort(-a, axis=1)[:, :8])


@pytest.mark.parametrize("op", [nl.add, np.add, nl.maximum])
def test_alu_ops_accept_nl_functions_and_numpy_ufuncs(op):
    @nki.jit
    def kernel(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(t, nl.load(a), nl.load(b), op)
        nl.store(out, value=t)
        return out

    a, b = rand(16, 16), rand(16, 16)
    ref = np.maximum(a, b) if op is nl.maximum else a + b
    np.testing.assert_allclose(run(kernel, a, b), ref)


def test_nc_matmul_is_transpose_transposes_the_stationary_operand():
    @nki.jit
    def kernel(a, eye):
        out = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)                                   # [128, 64]
        p = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(p, x, nl.load(eye), is_transpose=True)
        nisa.memset(x, 0.0)                              # the PSUM result does not share x's memory
        nl.store(out, value=nl.copy(p))
        return out

    a = rand(128, 64)
    np.testing.assert_array_equal(run(kernel, a, np.eye(128, dtype=np.float32)), a.T)


def test_psum_groups_close_on_eviction_by_assignment_and_on_overwrite():
    @nki.jit
    def kernel(x, y):
        out = nl.ndarray((3, 32, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        ps = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.psum)
        sb = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
        s, m = nl.load(x), nl.load(y)
        for i in nl.sequential_range(2):
            nisa.nc_matmul(ps, s, m)
            sb[...] = ps                                # eviction by tile assignment ends the group
            nl.store(out[i], value=sb)
        ps[...] = 5.0                                   # an overwrite ends it too
        nisa.nc_matmul(ps, s, m)
        nl.store(out[2], value=nl.copy(ps))
        return out

    x, y = rand(8, 32), rand(8, 16)
    ref = x.T.astype(np.float64) @ y
    out = run(kernel, x, y)
    for i in range(3):
        np.testing.assert_allclose(out[i], ref, rtol=1e-5, atol=1e-5)


def test_identity_results_do_not_alias_their_input():
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        x = nl.load(a)
        y = nl.identity(x)
        nisa.memset(x, 0.0)
        nl.store(out, value=y)
        return out

    a = rand(16, 8)
    np.testing.assert_array_equal(run(kernel, a), a)


def test_partition_operands_broadcast_along_every_free_dim():
    @nki.jit
    def kernel(a, s):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(t, nl.load(a), nl.multiply, nl.load(s))
        u = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.activation(u, nl.copy, t, bias=nl.load(s))
        nl.store(out, value=u)
        return out

    a, s = rand(128, 128, 2), rand(128, 1)
    np.testing.assert_allclose(run(kernel, a, s), a * s[:, :, None] + s[:, :, None], rtol=1e-6)
