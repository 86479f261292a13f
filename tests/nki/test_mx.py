"""The NeuronCore-v4 MX instructions (nisa.quantize_mx, nisa.nc_matmul_mx) and the packed MX dtypes,
against references computed here with NumPy and ml_dtypes: OCP MX block quantisation (with the
NKI reference's scale, twice the OCP sample algorithm's) and a float64 dequantize-then-matmul."""

import ml_dtypes
import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

FP8 = {"float8_e4m3fn_x4": (ml_dtypes.float8_e4m3fn, 8), "float8_e5m2_x4": (ml_dtypes.float8_e5m2, 15)}
BYTES = {"float8_e4m3fn_x4": 4, "float8_e5m2_x4": 4, "float4_e2m1fn_x4": 2}   # bytes per packed element


# -- independent references ----------------------------------------------------------------------
def ref_quantize(x, fmt):
    """x [P, 4F] (float) -> (fp8 codes [P, 4F] uint8, scale bits [P // 8, F] uint8).

    Groups are 8 partitions x 4 consecutive values; shared exponent floor(log2(amax)) - emax, plus
    one (the NKI reference: "a block scale that is two times larger" than OCP's sample algorithm)."""
    element, emax = FP8[fmt]
    x = np.asarray(x, dtype=np.float64)
    p, f4 = x.shape
    groups = x.reshape(p // 8, 8, f4 // 4, 4)
    amax = np.abs(groups).max(axis=(1, 3))
    with np.errstate(divide="ignore"):
        shared = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - emax + 1, -127)
    shared = np.clip(shared, -127, 127)
    scale = np.power(2.0, shared)[:, None, :, None]
    codes = (groups / scale).astype(element).view(np.uint8).reshape(p, f4)
    return codes, (shared + 127).astype(np.uint8)


def ref_values(code_bytes, fmt, k, f):
    """Host bytes of packed elements [k, f * BYTES] -> their values [k, f, 4] (float64)."""
    b = np.ascontiguousarray(code_bytes, dtype=np.uint8).reshape(k, -1)
    if fmt in FP8:
        return b.view(FP8[fmt][0]).astype(np.float64).reshape(k, f, 4)
    codes = np.stack([b & 0xF, b >> 4], axis=-1).reshape(k, f * 4)  # the low nibble is the first value
    return codes.view(ml_dtypes.float4_e2m1fn).astype(np.float64).reshape(k, f, 4)


def ref_mx_matmul(st, st_scale, st_fmt, mv, mv_scale, mv_fmt):
    """Dequantize both operands with their block scales ([K // 8, F] bits) and multiply in float64:
    out[m, n] = sum over k, j of S[k, m, j] V[k, n, j]."""
    k, m = st_scale.shape[0] * 8, st_scale.shape[1]
    n = mv_scale.shape[1]
    s = ref_values(st, st_fmt, k, m) * np.repeat(2.0 ** (st_scale.astype(np.float64) - 127), 8, axis=0)[..., None]
    v = ref_values(mv, mv_fmt, k, n) * np.repeat(2.0 ** (mv_scale.astype(np.float64) - 127), 8, axis=0)[..., None]
    return np.einsum("kmj,knj->mn", s, v)


def random_operand(rng, fmt, k, f):
    """Random finite packed data as host bytes [k, f * BYTES] and scale bits [k // 8, f]."""
    if fmt in FP8:
        codes = rng.normal(0, 3, size=(k, f * 4)).astype(FP8[fmt][0]).view(np.uint8)
    else:
        nibbles = rng.integers(0, 16, size=(k, f * 4), dtype=np.uint8).reshape(k, f * 2, 2)
        codes = nibbles[..., 0] | (nibbles[..., 1] << 4)
    return np.ascontiguousarray(codes), rng.integers(118, 134, size=(k // 8, f), dtype=np.uint8)


def as_numpy(t):
    return t.cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def host_inputs(kind, *arrays):
    """The arrays as NumPy arrays, CPU tensors or neuron tensors."""
    if kind == "numpy":
        return arrays
    tensors = [torch.from_numpy(np.ascontiguousarray(a).view(np.uint16)).view(torch.bfloat16)
               if a.dtype == ml_dtypes.bfloat16 else torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
    return tensors if kind == "cpu" else [t.to("neuron") for t in tensors]


# -- kernels ---------------------------------------------------------------------------------------
def quantize_kernel(fmt, scale_dtype=nl.uint8):
    @nki.jit(platform_target="trn3")
    def quantize(x):
        p, f4 = x.shape
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        q = nl.ndarray((p, f4 // 4), dtype=fmt, buffer=nl.sbuf)
        scales = nl.ndarray((p if p > 32 else 4, f4 // 4), dtype=scale_dtype, buffer=nl.sbuf)
        nisa.quantize_mx(dst=q, src=t, dst_scale=scales)
        q_out = nl.ndarray(q.shape, dtype=fmt, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=q_out, src=q)
        s_out = nl.ndarray((p // 8, f4 // 4), dtype=scale_dtype, buffer=nl.shared_hbm)
        for quadrant in range(p // 32):  # the first 4 partitions of each quadrant hold its scales
            nisa.dma_copy(dst=s_out[4 * quadrant:4 * quadrant + 4], src=scales[32 * quadrant:32 * quadrant + 4])
        return q_out, s_out
    return quantize


def load_scales(scales_hbm, row, k, f, dtype=nl.uint8):
    """Host scales [.., f] (contiguous, one row per 8 partitions) from ``row`` on -> an SBUF scale tile
    with each quadrant's scales in its first 4 partitions."""
    tile = nl.ndarray((k if k > 32 else 4, f), dtype=dtype, buffer=nl.sbuf)
    for quadrant in range(k // 32):
        first = row + 4 * quadrant
        nisa.dma_copy(dst=tile[32 * quadrant:32 * quadrant + 4], src=scales_hbm[first:first + 4])
    return tile


def matmul_kernel(st_fmt, mv_fmt, k, dst_dtype=nl.float32, k_tiles=1):
    """out = sum over k_tiles of MX matmuls, the operands' bytes viewed as packed elements."""
    @nki.jit(platform_target="trn3")
    def mx_matmul(st, st_scale, mv, mv_scale):
        m = st_scale.shape[1]
        n = mv_scale.shape[1]
        st_x4 = st.view(st_fmt)                      # [k_tiles * k, m] packed elements
        acc = nl.ndarray((m, n), dtype=dst_dtype, buffer=nl.psum)
        for kt in nl.affine_range(k_tiles):
            a = nl.ndarray((k, m), dtype=st_fmt, buffer=nl.sbuf)
            nisa.dma_copy(dst=a, src=st_x4[kt * k:(kt + 1) * k])
            b = nl.ndarray((k, n), dtype=mv_fmt, buffer=nl.sbuf)   # the same through an access pattern
            nisa.dma_copy(dst=b, src=mv.ap(pattern=[[n, k], [1, n]], offset=kt * k * n, dtype=mv_fmt))
            sa = load_scales(st_scale, kt * (k // 8), k, m)
            sb = load_scales(mv_scale, kt * (k // 8), k, n)
            nisa.nc_matmul_mx(dst=acc, stationary=a, moving=b, stationary_scale=sa, moving_scale=sb)
        res = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=res, src=acc)
        out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=res)
        return out
    return mx_matmul


@nki.jit(platform_target="trn3")
def quantize_matmul(x, y):
    """x [K, 4M], y [K, 4N] (bf16, already in the interleaved layout): quantize both on chip
    (e4m3 and e5m2) and multiply them."""
    k, m4 = x.shape
    n4 = y.shape[1]
    tiles = []
    for src, fmt in ((x, nl.float8_e4m3fn_x4), (y, nl.float8_e5m2_x4)):
        t = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src)
        q = nl.ndarray((k, src.shape[1] // 4), dtype=fmt, buffer=nl.sbuf)
        s = nl.ndarray((k, src.shape[1] // 4), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.quantize_mx(dst=q, src=t, dst_scale=s)
        tiles.append((q, s))
    acc = nl.ndarray((m4 // 4, n4 // 4), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul_mx(dst=acc, stationary=tiles[0][0], moving=tiles[1][0], stationary_scale=tiles[0][1],
                      moving_scale=tiles[1][1])
    res = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    out = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


def bf16_input(rng, p, f4):
    """Random bf16 values with the cases that matter: an all-zero group, a group whose largest value
    is a power of two, tiny and large magnitudes."""
    x = (rng.normal(0, 1, size=(p, f4)) * np.exp2(rng.integers(-6, 7, size=(p, 1)))).astype(ml_dtypes.bfloat16)
    x[0:8, 0:4] = 0
    x[8:16, 4:8] = 0.25
    x[9, 5] = -4.0
    return x


# -- tests -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["numpy", "cpu", "neuron"])
@pytest.mark.parametrize("fmt, p", [("float8_e4m3fn_x4", 32), ("float8_e5m2_x4", 128)])
def test_quantize_mx_matches_ocp_block_quantisation(kind, fmt, p):
    x = bf16_input(np.random.default_rng(1), p, 64)
    q, s = quantize_kernel(getattr(nl, fmt))(*host_inputs(kind, x))
    codes, scales = ref_quantize(x.astype(np.float32), fmt)
    q = as_numpy(q)
    assert q.dtype == np.int32 and q.shape == (p, 16)   # the packed dtype's storage: its bits
    np.testing.assert_array_equal(q.view(np.uint8).reshape(p, 64), codes)
    np.testing.assert_array_equal(as_numpy(s), scales)
    assert scales[0, 0] == 0 and scales[1, 1] == 2 - FP8[fmt][1] + 1 + 127   # zero group; amax 4 = 2 ** 2


def test_quantize_mx_writes_float8_e8m0fnu_scales():
    x = bf16_input(np.random.default_rng(2), 64, 32)
    q, s = nki.simulate(quantize_kernel(nl.float8_e4m3fn_x4, nl.float8_e8m0fnu))(x)
    codes, scales = ref_quantize(x.astype(np.float32), "float8_e4m3fn_x4")
    assert s.dtype == ml_dtypes.float8_e8m0fnu
    np.testing.assert_array_equal(s.view(np.uint8), scales)
    np.testing.assert_array_equal(q.view(np.uint8).reshape(64, 32), codes)


@pytest.mark.parametrize("kind", ["numpy", "cpu", "neuron"])
@pytest.mark.parametrize("st_fmt, mv_fmt, k", [("float8_e4m3fn_x4", "float8_e5m2_x4", 128),
                                               ("float4_e2m1fn_x4", "float8_e4m3fn_x4", 64),
                                               ("float4_e2m1fn_x4", "float4_e2m1fn_x4", 32)])
def test_nc_matmul_mx_matches_dequantized_matmul(kind, st_fmt, mv_fmt, k):
    rng = np.random.default_rng(3)
    m, n = 16, 48
    st, st_scale = random_operand(rng, st_fmt, k, m)
    mv, mv_scale = random_operand(rng, mv_fmt, k, n)
    out = matmul_kernel(getattr(nl, st_fmt), getattr(nl, mv_fmt), k)(*host_inputs(kind, st, st_scale, mv, mv_scale))
    want = ref_mx_matmul(st, st_scale, st_fmt, mv, mv_scale, mv_fmt)
    np.testing.assert_allclose(as_numpy(out), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_nc_matmul_mx_accumulates_over_k_tiles_into_bf16_psum():
    rng = np.random.default_rng(4)
    k, m, n, tiles = 64, 8, 1024, 3   # a bf16 result allows a 1024-wide moving tile
    st, st_scale = random_operand(rng, "float8_e4m3fn_x4", k * tiles, m)
    mv, mv_scale = random_operand(rng, "float8_e5m2_x4", k * tiles, n)
    out = nki.simulate(matmul_kernel(nl.float8_e4m3fn_x4, nl.float8_e5m2_x4, k, nl.bfloat16, tiles))(
        st, st_scale, mv, mv_scale)
    want = ref_mx_matmul(st, st_scale, "float8_e4m3fn_x4", mv, mv_scale, "float8_e5m2_x4")
    np.testing.assert_allclose(out, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


@pytest.mark.parametrize("kind", ["numpy", "neuron"])
def test_quantize_then_matmul_on_chip(kind):
    rng = np.random.default_rng(5)
    k, m, n = 128, 32, 64
    x, y = bf16_input(rng, k, 4 * m), bf16_input(rng, k, 4 * n)
    out = quantize_matmul(*host_inputs(kind, x, y))
    xc, xs = ref_quantize(x.astype(np.float32), "float8_e4m3fn_x4")
    yc, ys = ref_quantize(y.astype(np.float32), "float8_e5m2_x4")
    want = ref_mx_matmul(xc, xs, "float8_e4m3fn_x4", yc, ys, "float8_e5m2_x4")
    np.testing.assert_allclose(as_numpy(out), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # and the quantisation error itself is what fp8 allows: close to the bf16 product
    exact = np.einsum("kmj,knj->mn", x.astype(np.float64).reshape(k, m, 4), y.astype(np.float64).reshape(k, n, 4))
    assert np.abs(as_numpy(out) - exact).max() < 0.15 * np.abs(exact).max()


def test_mx_matmul_as_an_operator_inside_torch_compile():
    import torchneuron

    op = torchneuron.wrap_nki(quantize_matmul)

    def f(x, y):
        return op(x * 2, y) + 1

    rng = np.random.default_rng(6)
    x, y = bf16_input(rng, 64, 32), bf16_input(rng, 64, 64)
    xt, yt = host_inputs("neuron", x, y)
    xc, xs = ref_quantize(2 * x.astype(np.float32), "float8_e4m3fn_x4")
    yc, ys = ref_quantize(y.astype(np.float32), "float8_e5m2_x4")
    want = ref_mx_matmul(xc, xs, "float8_e4m3fn_x4", yc, ys, "float8_e5m2_x4") + 1
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="neuron", fullgraph=True)
    for fn in (f, compiled):
        np.testing.assert_allclose(fn(xt, yt).cpu().numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_mx_instructions_are_refused_on_trn2():
    x = bf16_input(np.random.default_rng(7), 32, 16)
    quantize = quantize_kernel(nl.float8_e4m3fn_x4)
    with pytest.raises(nki.NKIError, match=r"\[target\] nisa.quantize_mx needs NeuronCore-v4 \(trn3\) or newer, but "
                       r"the kernel targets trn2 \(NeuronCore-v3\).*platform_target=\"trn3\"") as e:
        nki.simulate(nki.jit(quantize.fn, platform_target="trn2"))(x)
    assert e.value.rule == "target" and "nisa.quantize_mx(" in e.value.line[2]
    st, st_scale = random_operand(np.random.default_rng(8), "float8_e4m3fn_x4", 32, 8)
    matmul = matmul_kernel(nl.float8_e4m3fn_x4, nl.float8_e4m3fn_x4, 32)
    with pytest.raises(nki.NKIError, match=r"nisa.nc_matmul_mx needs NeuronCore-v4 \(trn3\).*targets trn2.*"
                       r"NEURON_PLATFORM_TARGET_OVERRIDE=trn3"):
        nki.simulate(nki.jit(matmul.fn, platform_target="trn2"))(st, st_scale, st, st_scale)


def _run_trn3(body, *arrays):
    nki.simulate(nki.jit(body, platform_target="trn3"))(*arrays)


def test_packed_formats_do_not_mix_and_packed_values_are_not_numbers():
    data = np.zeros((32, 16), np.uint8)

    def dma_between_formats(a):
        t = nl.ndarray((32, 4), dtype=nl.float8_e5m2_x4, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.view(nl.float8_e4m3fn_x4))

    with pytest.raises(nki.NKIError, match=r"\[dtype\] nisa.dma_copy: src .* float8_e4m3fn_x4 in hbm and dst .* "
                       r"float8_e5m2_x4 in sbuf must have the same dtype"):
        _run_trn3(dma_between_formats, data)

    def dma_bits_into_packed(a):
        t = nl.ndarray((32, 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.view(nl.int32))

    with pytest.raises(nki.NKIError, match=r"must have the same dtype.*\.view\(dtype\) or \.ap"):
        _run_trn3(dma_bits_into_packed, data)

    def arithmetic_on_packed(a):
        t = nl.ndarray((32, 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.view(nl.float8_e4m3fn_x4))
        nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.add)

    with pytest.raises(nki.NKIError, match=r"\[dtype\] nisa.tensor_tensor data1 of .*float8_e4m3fn_x4 in sbuf: "
                       r"nl.float8_e4m3fn_x4 is a packed MX dtype.*only nisa.quantize_mx writes"):
        _run_trn3(arithmetic_on_packed, data)

    def plain_matmul_of_packed(a):
        t = nl.ndarray((32, 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.view(nl.float8_e4m3fn_x4))
        acc = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=t, moving=t)

    with pytest.raises(nki.NKIError, match=r"\[dtype\] nisa.nc_matmul stationary of .* packed MX dtype"):
        _run_trn3(plain_matmul_of_packed, data)

    def fp8_operand_to_mx_matmul(a):
        t = nl.ndarray((32, 16), dtype=nl.float8_e4m3fn, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.view(nl.float8_e4m3fn))
        s = nl.ndarray((4, 16), dtype=nl.uint8, buffer=nl.sbuf)
        acc = nl.ndarray((16, 16), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(dst=acc, stationary=t, moving=t, stationary_scale=s, moving_scale=s)

    with pytest.raises(nki.NKIError, match=r"\[mx-dtype\] nisa.nc_matmul_mx: stationary .* float8_e4m3fn in sbuf "
                       r"must have a packed MX dtype"):
        _run_trn3(fp8_operand_to_mx_matmul, data)

    with pytest.raises(nki.NKIError, match=r"\[dtype\] nl.full of .*: nl.float4_e2m1fn_x4 is a packed MX dtype"):
        _run_trn3(lambda a: nl.full((32, 4), 1.0, dtype=nl.float4_e2m1fn_x4, buffer=nl.sbuf), data)


def test_mx_operand_rules():
    x = np.ones((64, 32), ml_dtypes.bfloat16)

    def quantize_to(fmt, scale_rows, scale_dtype=nl.uint8, src_dtype=None):
        def body(a):
            t = nl.ndarray(a.shape, dtype=src_dtype or a.dtype, buffer=nl.sbuf)
            nisa.memset(dst=t, value=1)
            q = nl.ndarray((64, 8), dtype=fmt, buffer=nl.sbuf)
            s = nl.ndarray((scale_rows, 8), dtype=scale_dtype, buffer=nl.sbuf)
            nisa.quantize_mx(dst=q, src=t, dst_scale=s)
        return body

    with pytest.raises(nki.NKIError, match=r"\[mx-dtype\] nisa.quantize_mx: dst .* must be nl.float8_e5m2_x4 or "
                       r"nl.float8_e4m3fn_x4"):
        _run_trn3(quantize_to(nl.float4_e2m1fn_x4, 64), x)
    with pytest.raises(nki.NKIError, match=r"\[mx-layout\] nisa.quantize_mx: dst_scale .* does not fit src's "
                       r"scales.*a \(64, 8\) tile \(at least 36 partitions\)"):
        _run_trn3(quantize_to(nl.float8_e4m3fn_x4, 8), x)
    with pytest.raises(nki.NKIError, match=r"\[mx-dtype\] nisa.quantize_mx: dst_scale .* must be nl.uint8 or "
                       r"nl.float8_e8m0fnu"):
        _run_trn3(quantize_to(nl.float8_e4m3fn_x4, 64, nl.int8), x)
    with pytest.raises(nki.NKIError, match=r"\[mx-dtype\] nisa.quantize_mx: src .* must be nl.float16 or "
                       r"nl.bfloat16"):
        _run_trn3(quantize_to(nl.float8_e4m3fn_x4, 64, src_dtype=nl.float32), x)

    def moving_too_wide(a):
        q = nl.ndarray((32, 1024), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.memset(dst=q, value=0)
        s = nl.ndarray((4, 1024), dtype=nl.uint8, buffer=nl.sbuf)
        nisa.memset(dst=s, value=127)
        acc = nl.ndarray((32, 512), dtype=nl.float32, buffer=nl.psum)   # a bf16 result could be 1024 wide
        nisa.nc_matmul_mx(dst=acc, stationary=q[:, 0:32], moving=q, stationary_scale=s[:, 0:32], moving_scale=s)

    with pytest.raises(nki.NKIError, match=r"\[matmul-moving-fmax\] nisa.nc_matmul_mx: the moving free dimension "
                       r"must be at most 512 for a float32 dst, got 1024"):
        _run_trn3(moving_too_wide, x)

    def odd_partitions(a):
        q = nl.ndarray((48, 8), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.memset(dst=q, value=0)
        s = nl.ndarray((48, 8), dtype=nl.uint8, buffer=nl.sbuf)
        acc = nl.ndarray((8, 8), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(dst=acc, stationary=q, moving=q, stationary_scale=s, moving_scale=s)

    with pytest.raises(nki.NKIError, match=r"\[mx-layout\] nisa.nc_matmul_mx: the partition dimension of stationary "
                       r".* must be a multiple of 32"):
        _run_trn3(odd_partitions, x)


def test_a_packed_tile_is_cleared_copied_and_its_bytes_viewed():
    """memset 0 and nl.zeros clear a packed tile; tensor_copy moves it bit for bit; .view shows its bytes."""
    a = np.arange(32 * 16, dtype=np.uint32).astype(np.uint8).reshape(32, 16)

    @nki.jit(platform_target="trn3")
    def shuffle(src):
        t = nl.ndarray((32, 4), dtype=nl.float8_e5m2_x4, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src.view(nl.float8_e5m2_x4))
        u = nl.zeros((32, 4), dtype=nl.float8_e5m2_x4, buffer=nl.sbuf)
        nisa.tensor_copy(dst=u[:, 0:2], src=t[:, 2:4])
        out = nl.ndarray((32, 16), dtype=nl.uint8, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=u.view(nl.uint8))
        return out

    want = np.zeros_like(a)
    want[:, 0:8] = a[:, 8:16]
    np.testing.assert_array_equal(nki.simulate(shuffle)(a), want)


def test_the_mx_matmul_example_matches_its_quantized_reference():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "nki" / "mx_matmul.py"
    spec = importlib.util.spec_from_file_location("nki_example_mx_matmul", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rng = np.random.default_rng(9)
    k, m, n = 1024, 64, 128
    lhsT, rhs = (rng.normal(size=(k, f)).astype(ml_dtypes.bfloat16) for f in (m, n))
    want = 0
    for kt in range(k // 512):  # rows j * 128 + p of each 512-row tile go to partition p, value j
        parts = [a[kt * 512:(kt + 1) * 512].reshape(4, 128, -1).transpose(1, 2, 0).reshape(128, -1)
                 for a in (lhsT, rhs)]
        (ac, as_), (bc, bs) = (ref_quantize(p.astype(np.float32), "float8_e4m3fn_x4") for p in parts)
        want = want + ref_mx_matmul(ac, as_, "float8_e4m3fn_x4", bc, bs, "float8_e4m3fn_x4")
    lhsT_t, rhs_t = host_inputs("neuron", lhsT, rhs)
    for got in (example.mx_matmul_kernel(lhsT_t, rhs_t).cpu().numpy(),
                nki.simulate(example.mx_matmul_kernel)(lhsT, rhs)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_packed_tiles_travel_between_cores_unchanged():
    @nki.jit(platform_target="trn3")
    def swap(src):
        out = nl.ndarray(src.shape, dtype=nl.uint8, buffer=nl.shared_hbm)
        me = nl.program_id(0)
        mine = nl.ndarray((32, 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.dma_copy(dst=mine, src=src[me].view(nl.float8_e4m3fn_x4))
        theirs = nl.ndarray((32, 4), dtype=nl.float8_e4m3fn_x4, buffer=nl.sbuf)
        nisa.sendrecv(src=mine, dst=theirs, send_to_rank=1 - me, recv_from_rank=1 - me)
        nisa.dma_copy(dst=out[me], src=theirs.view(nl.uint8))
        return out

    a = np.random.default_rng(10).integers(0, 256, size=(2, 32, 16), dtype=np.uint8)
    np.testing.assert_array_equal(nki.simulate(swap)[2](a), a[::-1])
