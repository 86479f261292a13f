"""nki.language against NumPy/PyTorch references, on the simulator and on the neuron device."""

import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


def run(kernel, *arrays, grid=None):
    """Runs on NumPy inputs in the simulator and on neuron tensors; checks both agree, returns NumPy."""
    k = kernel[grid] if grid else kernel
    sim = nki.simulate(k)(*arrays)
    dev = k(*(torch.from_numpy(a).to("neuron") if isinstance(a, np.ndarray) else a for a in arrays))
    sims = sim if isinstance(sim, tuple) else (sim,)
    devs = dev if isinstance(dev, tuple) else (dev,)
    for s, d in zip(sims, devs):
        np.testing.assert_array_equal(s, d.cpu().numpy())
    return sim


def rand(*shape, dtype=np.float32):
    return np.random.default_rng(sum(shape)).standard_normal(shape).astype(dtype)


@nki.jit
def add_spmd(a, b):
    c = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    ix = nl.program_id(0) * 128 + nl.arange(128)[:, None]
    iy = nl.program_id(1) * 256 + nl.arange(256)[None, :]
    nl.store(c[ix, iy], value=nl.load(a[ix, iy]) + nl.load(b[ix, iy]))
    return c


def test_spmd_grid_tensor_add():
    a, b = rand(256, 512), rand(256, 512) + 1
    np.testing.assert_allclose(run(add_spmd, a, b, grid=(2, 2)), a + b)


@nki.jit
def grid_ids(a):
    out = nl.ndarray((nl.num_programs(), 4), dtype=nl.int32, buffer=nl.shared_hbm)
    row = nl.program_id(0) * nl.num_programs(1) + nl.program_id(1)
    t = nl.full((1, 4), 0, dtype=nl.int32)
    t[0, 0] = nl.program_id(0)
    t[0, 1] = nl.program_id(1)
    t[0, 2] = nl.num_programs(0) * 10 + nl.num_programs(1)
    t[0, 3] = nl.program_ndim()
    nl.store(out[row:row + 1, :], value=t)
    return out


def test_program_ids_and_counts():
    out = run(grid_ids, rand(1, 1), grid=(2, 3))
    expected = [[i, j, 23, 2] for i in range(2) for j in range(3)]
    np.testing.assert_array_equal(out, expected)


@nki.jit
def index_forms(a):
    out = nl.ndarray((4, 128, 64), dtype=a.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:64]
    nl.store(out[0], value=nl.load(a[0:128, 0:64]))                       # slices
    nl.store(out[1], value=nl.load(a[nl.ds(64, 128), nl.ds(32, 64)]))     # nl.ds
    nl.store(out[2], value=nl.load(a[i_p + 32, i_f * 2]))                 # an index expression (strided gather)
    t = nl.load(a[nl.arange(64)[None, :], nl.arange(128)[:, None]])       # transposed access
    nl.store(out[3], value=t)
    return out


def test_index_forms():
    a = rand(256, 256)
    out = run(index_forms, a)
    np.testing.assert_array_equal(out[0], a[0:128, 0:64])
    np.testing.assert_array_equal(out[1], a[64:192, 32:96])
    np.testing.assert_array_equal(out[2], a[32:160, 0:128:2])
    np.testing.assert_array_equal(out[3], a[0:64, 0:128].T)


@nki.jit
def masked_copy(a):
    """Rows not a multiple of 128: the last tile is masked (its indices reach past the end)."""
    n, d = a.shape
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range((n + 127) // 128):
        i_p = t * 128 + nl.arange(128)[:, None]
        i_f = nl.arange(d)[None, :]
        inside = (i_p < n) & (i_f < d)            # a mask that moves with t (rows) and one that does not
        x = nl.load(a[i_p, i_f], mask=inside)
        nl.store(out[i_p, i_f], value=x * 2, mask=inside)
    return out


def test_masks_cover_a_ragged_last_tile():
    a = rand(300, 40)
    np.testing.assert_allclose(run(masked_copy, a), a * 2)


UNARY = {"exp": np.exp, "abs": np.abs, "negative": np.negative, "square": np.square, "tanh": np.tanh,
         "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "relu": lambda x: np.maximum(x, 0), "sin": np.sin,
         "cos": np.cos, "sign": np.sign, "floor": np.floor, "ceil": np.ceil,
         "silu": lambda x: x / (1 + np.exp(-x)), "softplus": lambda x: np.log1p(np.exp(x)),
         "gelu": lambda x: torch.nn.functional.gelu(torch.from_numpy(x)).numpy()}
POSITIVE_UNARY = {"log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "reciprocal": lambda x: 1 / x}


def unary_kernel(name):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=getattr(nl, name)(nl.load(a)))
        return out
    return kernel


@pytest.mark.parametrize("name", sorted(UNARY) + sorted(POSITIVE_UNARY))
def test_unary(name):
    a = rand(128, 64)
    if name in POSITIVE_UNARY:
        a = np.abs(a) + 0.1
    ref = {**UNARY, **POSITIVE_UNARY}[name](a)
    np.testing.assert_allclose(run(unary_kernel(name), a), ref, rtol=1e-5, atol=1e-5)


BINARY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
          "maximum": np.maximum, "minimum": np.minimum, "greater": np.greater, "less_equal": np.less_equal,
          "equal": np.equal}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_with_broadcast_and_scalar(name):
    @nki.jit
    def kernel(a, b):
        out = nl.ndarray((2,) + a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        x, y = nl.load(a), nl.load(b)
        nl.store(out[0], value=getattr(nl, name)(x, y, dtype=nl.float32))      # (128, 64) with (128, 1)
        nl.store(out[1], value=getattr(nl, name)(x, 0.5, dtype=nl.float32))
        return out

    a, b = rand(128, 64), rand(128, 1) + 2
    out = run(kernel, a, b)
    np.testing.assert_allclose(out[0], BINARY[name](a, b).astype(np.float32), rtol=1e-6)
    np.testing.assert_allclose(out[1], BINARY[name](a, np.float32(0.5)).astype(np.float32), rtol=1e-6)


@nki.jit
def operators(a, b):
    out = nl.ndarray((5,) + a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    x, y = nl.load(a), nl.load(b)
    nl.store(out[0], value=x + y * 2)
    nl.store(out[1], value=(x - y) / 4)
    nl.store(out[2], value=-x)
    acc = nl.zeros(a.shape, dtype=a.dtype)
    acc += x
    acc *= y
    nl.store(out[3], value=acc)
    nl.store(out[4], value=nl.where(x > y, x, y))
    return out


def test_python_operators_in_place_updates_and_where():
    a, b = rand(64, 32), rand(64, 32) * 2
    out = run(operators, a, b)
    np.testing.assert_allclose(out[0], a + b * 2, rtol=1e-6)
    np.testing.assert_allclose(out[1], (a - b) / 4, rtol=1e-6)
    np.testing.assert_allclose(out[2], -a)
    np.testing.assert_allclose(out[3], a * b, rtol=1e-6)
    np.testing.assert_allclose(out[4], np.where(a > b, a, b))


@pytest.mark.parametrize("name,ref", [("sum", np.sum), ("max", np.max), ("min", np.min), ("mean", np.mean),
                                      ("prod", np.prod), ("var", np.var)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(name, ref, keepdims):
    @nki.jit
    def kernel(a):
        t = nl.load(a)
        r1 = getattr(nl, name)(t, axis=2, keepdims=keepdims)
        r2 = getattr(nl, name)(t, axis=(1, 2), keepdims=keepdims)
        o1 = nl.ndarray(r1.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        o2 = nl.ndarray(r2.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(o1, value=r1)
        nl.store(o2, value=r2)
        return o1, o2

    a = (rand(128, 4, 8) * 0.5 + 1).astype(np.float32)
    o1, o2 = run(kernel, a)
    np.testing.assert_allclose(o1, ref(a, axis=2, keepdims=keepdims), rtol=1e-5)
    np.testing.assert_allclose(o2, ref(a, axis=(1, 2), keepdims=keepdims), rtol=1e-5)


def test_boolean_reductions():
    @nki.jit
    def kernel(a):
        t = nl.load(a)
        out = nl.ndarray((a.shape[0], 2), dtype=nl.uint8, buffer=nl.shared_hbm)
        nl.store(out[:, 0:1], value=nl.all(t > 0, axis=1, keepdims=True))
        nl.store(out[:, 1:2], value=nl.any(t > 0, axis=1, keepdims=True))
        return out

    a = rand(128, 8)
    a[:3] = 1.0
    a[3:6] = -1.0
    out = run(kernel, a)
    np.testing.assert_array_equal(out[:, 0], (a > 0).all(axis=1))
    np.testing.assert_array_equal(out[:, 1], (a > 0).any(axis=1))


@pytest.mark.parametrize("transpose_x", [True, False])
def test_matmul_accumulates_in_psum(transpose_x):
    @nki.jit
    def kernel(x, y):
        k, n = y.shape
        out = nl.ndarray((128, n), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, n), nl.float32, buffer=nl.psum)
        for kt in nl.affine_range(k // 128):
            if transpose_x:
                xt = nl.load(x[kt * 128:(kt + 1) * 128, :])          # [K, M]
            else:
                xt = nl.load(x[:, kt * 128:(kt + 1) * 128])          # [M, K]
            acc += nl.matmul(xt, nl.load(y[kt * 128:(kt + 1) * 128, :]), transpose_x=transpose_x)
        nl.store(out, value=nl.copy(acc))
        return out

    x = rand(256, 128) if transpose_x else rand(128, 256)
    y = rand(256, 512)
    ref = (x.T if transpose_x else x).astype(np.float64) @ y
    np.testing.assert_allclose(run(kernel, x, y), ref, rtol=1e-4, atol=1e-4)


def test_transpose_softmax_rms_norm():
    @nki.jit
    def kernel(a, w):
        out = nl.ndarray((3, 128, 128), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(out[0], value=nl.transpose(t))
        nl.store(out[1], value=nl.softmax(t, axis=1))
        nl.store(out[2], value=nl.rms_norm(t, nl.load(w), axis=1, n=128, epsilon=1e-5))
        return out

    a, w = rand(128, 128), rand(1, 128)
    out = run(kernel, a, w)
    ta = torch.from_numpy(a)
    np.testing.assert_array_equal(out[0], a.T)
    np.testing.assert_allclose(out[1], torch.softmax(ta, dim=1).numpy(), rtol=1e-5, atol=1e-6)
    ref = torch.nn.functional.rms_norm(ta, (128,), eps=1e-5).numpy() * w
    np.testing.assert_allclose(out[2], ref, rtol=1e-4, atol=1e-5)


def test_creation_functions_and_tile_size():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((6, 128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out[0], value=nl.zeros((128, 8), nl.float32))
        nl.store(out[1], value=nl.ones((128, 8), nl.float32))
        nl.store(out[2], value=nl.full((128, 8), 7.5, nl.float32))
        t = nl.load(a)
        z = nl.zeros_like(t)
        o = nl.ones_like(t)
        e = nl.empty_like(t)
        e[...] = t * 3
        nl.store(out[3], value=z)
        nl.store(out[4], value=o)
        nl.store(out[5], value=e)
        return out

    a = rand(128, 8)
    out = run(kernel, a)
    np.testing.assert_array_equal(out[0], 0)
    np.testing.assert_array_equal(out[1], 1)
    np.testing.assert_array_equal(out[2], 7.5)
    np.testing.assert_array_equal(out[3], 0)
    np.testing.assert_array_equal(out[4], 1)
    np.testing.assert_allclose(out[5], a * 3)
    assert (nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax,
            nl.tile_size.psum_fmax) == (128, 128, 512, 512)


def test_loops_of_every_kind():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((128, 3), dtype=a.dtype, buffer=nl.shared_hbm)
        s = nl.zeros((128, 1), nl.float32)
        for i in nl.sequential_range(4):
            s += nl.load(a[:, i:i + 1])
        nl.store(out[:, 0:1], value=s)
        for i in nl.static_range(1, 3):
            nl.store(out[:, i:i + 1], value=nl.load(a[:, i:i + 1]) * i)
        return out

    a = rand(128, 4)
    out = run(kernel, a)
    np.testing.assert_allclose(out[:, 0], a.sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(out[:, 1:], a[:, 1:3] * np.array([1, 2]), rtol=1e-6)


def test_bfloat16_and_float8_are_storage_types():
    @nki.jit
    def kernel(a, f8):
        out = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        out8 = nl.ndarray(f8.shape, dtype=nl.float8_e4m3, buffer=nl.shared_hbm)
        nl.store(out, value=nl.exp(nl.load(a)))               # computed in fp32, stored as bf16
        nl.store(out8, value=nl.load(f8) * 2)
        return out, out8

    a = torch.randn(128, 64).to(torch.bfloat16)
    f8 = torch.randn(128, 64).to(torch.float8_e4m3fn)
    for args in ((a, f8), (a.to("neuron"), f8.to("neuron"))):
        out, out8 = kernel(*args)
        assert out.dtype == torch.bfloat16 and out8.dtype == torch.float8_e4m3fn
        torch.testing.assert_close(out.cpu(), torch.exp(a.float()).to(torch.bfloat16))
        torch.testing.assert_close(out8.cpu().float(), (f8.float() * 2).to(torch.float8_e4m3fn).float())


def test_device_print_prints_when_the_kernel_runs(capsys):
    @nki.jit
    def kernel(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.device_print("tile:", t)
        nl.store(out, value=t)
        return out

    nki.simulate(kernel)(np.arange(4, dtype=np.float32).reshape(2, 2))
    printed = capsys.readouterr().out
    assert printed.count("tile:") == 1 and "3." in printed


def test_eight_psum_accumulators_with_nl_matmul():
    @nki.jit
    def kernel(x, y):
        out = nl.ndarray((8, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        accs = [nl.zeros((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]  # every bank
        xt, yt = nl.load(x), nl.load(y)
        for i, acc in enumerate(accs):
            acc += nl.matmul(xt, yt, transpose_x=True)    # the product is accumulated in place
            nl.store(out[i], value=nl.copy(acc))
        return out

    x, y = rand(64, 128), rand(64, 512)
    out = run(kernel, x, y)
    for i in range(8):
        np.testing.assert_allclose(out[i], x.T.astype(np.float64) @ y, rtol=1e-4, atol=1e-4)


def test_loaded_tiles_written_afterwards_never_write_the_input():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((4,) + a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)                       # shares the input's memory until written
        t += 1.0
        nl.store(out[0], value=t)
        u = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=u, src=a)
        u[:, 0:2] = 0.0                      # a partial write through a view
        nl.store(out[1], value=u)
        v = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=v, src=a)
        nisa.memset(v, 7.0)                  # a whole-tile write
        nl.store(out[2], value=v)
        w = nl.load(a)
        nl.store(out[3], value=w)            # read only: the input, untouched
        return out

    a = rand(128, 4)
    before = a.copy()
    out = run(kernel, a)
    np.testing.assert_array_equal(a, before)
    np.testing.assert_allclose(out[0], a + 1)
    np.testing.assert_array_equal(out[1], np.concatenate([np.zeros((128, 2), np.float32), a[:, 2:]], axis=1))
    np.testing.assert_array_equal(out[2], 7.0)
    np.testing.assert_array_equal(out[3], a)


def test_a_reduced_tile_applies_to_each_partition_row():
    """A reduction without keepdims leaves a [P] tile; in arithmetic it lines up with the partition
    dimension (row-wise), not with the free dimension as NumPy's trailing alignment would."""

    @nki.jit
    def normalise_rows(a):
        t = nl.load(a)
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=t / nl.sum(t, axis=1))
        return out

    a = np.random.default_rng(0).random((128, 128)).astype(np.float32) + 0.5  # square: both alignments run
    np.testing.assert_allclose(run(normalise_rows, a), a / a.sum(axis=1, keepdims=True), rtol=1e-5)
