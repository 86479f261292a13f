"""nc_matmul inside batched loops: every way the operands can vary with the loops (shared moving
side, shared stationary side, both varying with layouts whose loop dims do not merge, accumulation
across a loop), against NumPy, on NumPy arrays, CPU tensors and neuron tensors; the loops must
really batch (the plan says so), or the tests would check the one-iteration path only."""

import itertools
import random

import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki.isa._tensor import contract

P = 128


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@nki.jit
def shared_moving(x, w):
    """out[t] = x[t] @ w for row tiles t: the stationary side is x[t]^T loaded transposed into a
    [K, nc, rows] tile (loop dims that do not merge with the rows), the moving side is one w."""
    N, K = x.shape
    nt = N // P
    out = nl.ndarray((N, w.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    wt = nl.ndarray(w.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt, src=w)
    xT = nl.ndarray((K, nt, P), dtype=nl.float32, buffer=nl.sbuf)
    for t in nl.affine_range(nt):
        xt = nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[t * P:(t + 1) * P, :])
        xT_ps = nl.ndarray((K, P), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=xT_ps, data=xt)
        nisa.tensor_copy(dst=xT[:, t, :], src=xT_ps)
    for t in nl.affine_range(nt):
        y_ps = nl.ndarray((P, w.shape[1]), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=y_ps, stationary=xT[:, t, :], moving=wt)
        y = nl.ndarray((P, w.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=y, src=y_ps)
        nisa.dma_copy(dst=out[t * P:(t + 1) * P, :], src=y)
    return out


@nki.jit
def expert_matmuls(xT, w):
    """out[e] = x @ w[e] for every expert e (token generation: a few token rows), contracting
    H = kt * 128 by accumulating over a loop into one PSUM tile; the stationary x^T is shared by all
    experts, the moving weights are in place in one [128, E, kt, I] tile (loop dims that merge)."""
    H, T = xT.shape
    E, _, I = w.shape
    kt = H // P
    out = nl.ndarray((E, T, I), dtype=nl.float32, buffer=nl.shared_hbm)
    x_sb = nl.ndarray((P, kt, T), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=x_sb, src=xT.reshape((kt, P, T)).permute((1, 0, 2)))
    w_sb = nl.ndarray((P, E, kt, I), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=w_sb, src=w.reshape((E, kt, P, I)).permute((2, 0, 1, 3)))
    for e in nl.affine_range(E):
        y_ps = nl.ndarray((T, I), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(kt):
            nisa.nc_matmul(dst=y_ps, stationary=x_sb[:, k, :], moving=w_sb[:, e, k, :])
        y = nl.ndarray((T, I), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=y, src=y_ps)
        nisa.dma_copy(dst=out[e], src=y)
    return out


@nki.jit
def blockwise(a, b):
    """out[i, j] = sum over k of a[k-block, i-block]^T @ b[k-block, j-block] for square 128-blocks:
    stationary and moving both vary, with the contraction loop accumulated into PSUM."""
    K, M = a.shape
    _, N = b.shape
    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    a_sb = nl.ndarray((P, K // P, M), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=a_sb, src=a.reshape((K // P, P, M)).permute((1, 0, 2)))
    b_sb = nl.ndarray((P, K // P, N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=b_sb, src=b.reshape((K // P, P, N)).permute((1, 0, 2)))
    for i in nl.affine_range(M // P):
        for j in nl.affine_range(N // P):
            acc = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // P):
                nisa.nc_matmul(dst=acc, stationary=a_sb[:, k, i * P:(i + 1) * P], moving=b_sb[:, k, j * P:(j + 1) * P])
            o = nl.ndarray((P, P), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=o, src=acc)
            nisa.dma_copy(dst=out[i * P:(i + 1) * P, j * P:(j + 1) * P], src=o)
    return out


@nki.jit
def constant_side_summed(x, w):
    """sum over a loop of x[t]^T @ w with w the same in every iteration: one side constant in the
    summed loop (the emulator sums the other side first)."""
    N, K = x.shape
    out = nl.ndarray((K, w.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    wt = nl.ndarray((P, w.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=wt, src=w)
    acc = nl.ndarray((K, w.shape[1]), dtype=nl.float32, buffer=nl.psum)
    for t in nl.affine_range(N // P):
        xt = nl.ndarray((P, K), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt, src=x[t * P:(t + 1) * P, :])
        nisa.nc_matmul(dst=acc, stationary=xt, moving=wt)
    o = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o, src=acc)
    nisa.dma_copy(dst=out, src=o)
    return out


def _references():
    x, w = rand(512, 128, seed=1), rand(128, 384, seed=2)
    xT, we = rand(256, 4, seed=3), rand(8, 256, 512, seed=4)
    a, b = rand(384, 256, seed=5), rand(384, 256, seed=6)
    xs, ws = rand(384, 96, seed=7), rand(128, 64, seed=8)
    sum_x = xs.astype(np.float64).reshape(3, 128, 96).sum(0)
    return [
        (shared_moving, (x, w), x.astype(np.float64) @ w),
        (expert_matmuls, (xT, we), np.einsum("ht,ehi->eti", xT.astype(np.float64), we)),
        (blockwise, (a, b), a.T.astype(np.float64) @ b),
        (constant_side_summed, (xs, ws), sum_x.T @ ws),
    ]


CASES = _references()


@pytest.mark.parametrize("kernel, args, expected", CASES, ids=[c[0].__name__ for c in CASES])
@pytest.mark.parametrize("where", ["numpy", "cpu", "neuron"])
def test_batched_matmuls_match_numpy(kernel, args, expected, where):
    fresh = nki.jit(kernel.fn)
    if where == "numpy":
        got = nki.simulate(fresh)(*args)
    elif where == "cpu":
        got = fresh(*(torch.from_numpy(a) for a in args)).numpy()
    else:
        got = fresh(*(torch.from_numpy(a).to("neuron") for a in args)).cpu().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)
    (plan,) = fresh._plans.values()
    assert plan.unbatchable == frozenset(), plan.batching_note  # every loop ran batched


def test_contract_matches_einsum_for_any_layout_and_broadcast():
    """The contraction behind batched matmuls, on random memory layouts (permuted storage), operands
    the same in some iterations (size 1) and any subset of the loops summed."""
    rng = random.Random(0)

    def operand(lead, k, f):
        shape = list(lead) + [k, f]
        order = list(range(len(shape)))
        rng.shuffle(order)
        base = torch.randn([shape[d] for d in order])
        return base.permute([order.index(d) for d in range(len(shape))])

    for _ in range(300):
        n = rng.randint(0, 3)
        sizes = [rng.randint(1, 4) for _ in range(n)]
        k, x, y = rng.randint(1, 9), rng.randint(1, 7), rng.randint(1, 7)
        s = operand([d if rng.random() < 0.7 else 1 for d in sizes], k, x)
        m = operand([d if rng.random() < 0.7 else 1 for d in sizes], k, y)
        summed = [i for i in range(n) if rng.random() < 0.5]
        expected = np.einsum("...kx,...ky->...xy", np.broadcast_to(s.numpy(), sizes + [k, x]).astype(np.float64),
                             np.broadcast_to(m.numpy(), sizes + [k, y]).astype(np.float64))
        for i in summed:
            expected = expected.sum(axis=i, keepdims=True)
        got = contract(s, m, summed, sizes)
        np.testing.assert_allclose(got.expand(expected.shape).numpy(), expected, rtol=1e-4, atol=1e-4)
        for i in summed:
            assert got.shape[i] == 1
    # a layout where the loop dims of one operand do not merge (a GEMM per outer iteration)
    s = torch.randn(8, 128, 16, 32).permute(0, 2, 1, 3)[:, :4]  # [8, 4, 128, 32], loop strides 65536 and 32
    m = torch.randn(64, 128).t().expand(8, 4, 128, 64)
    expected = np.einsum("abkx,abky->abxy", s.double().numpy(), m.double().numpy())
    np.testing.assert_allclose(contract(s, m, [], [8, 4]).numpy(), expected, rtol=1e-4, atol=1e-4)
