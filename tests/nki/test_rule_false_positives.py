"""Kernels that run on hardware pass the rules, and the kernels that break them are still caught.

Each kernel here is a pattern from NKI's public tutorials (aws-neuron/nki-samples, the Neuron docs)
written small: the capacity rules count a tile from its first write to its last use, as the Neuron
compiler allocates it, and undefined-tile follows every kind of write (scatters through index
expressions, strided slices, access patterns, masks, views) element by element.
"""

import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import _tile

KIB = 1024
P = 8  # partitions: the capacity rules count bytes per partition, so few partitions keep tests fast


def fp32_columns(kib):
    return kib * KIB // 4


def raises(rule, kernel, *args):
    with pytest.raises(nki.NKIError) as info:
        nki.simulate(kernel)(*args)
    assert info.value.rule == rule, str(info.value)
    return info.value


# -- SBUF: live ranges, not Python references ---------------------------------------------------
@pytest.mark.parametrize("loop", ["affine_range", "sequential_range", "static_range"])
def test_tiles_of_one_iteration_are_free_in_the_next(loop):
    """Two 96 KiB tiles per iteration fit (192 of 224 KiB); when iteration 2 loads, the variables
    still hold iteration 1's tiles, but nothing uses them again, so the compiler reuses them."""
    cols = fp32_columns(96)

    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for i in getattr(nl, loop)(x.shape[0] // P):
            t = nl.load(x[i * P:(i + 1) * P, :])
            u = nl.exp(t)
            nl.store(out[i * P:(i + 1) * P, :], value=u)
        return out

    x = np.random.default_rng(0).standard_normal((3 * P, cols)).astype(np.float32)
    np.testing.assert_allclose(nki.simulate(kernel)(x), np.exp(x), rtol=1e-6)


def test_operands_and_result_of_one_instruction_are_live_together():
    """120 KiB in, 120 KiB out: the exp needs both at once, even though t is not used after it."""
    cols = fp32_columns(120)

    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        u = nl.exp(t)
        nl.store(out, value=u)
        return out

    err = raises("sbuf-capacity", kernel, np.zeros((P, cols), np.float32))
    assert "u = nl.exp(t)" in str(err) and f"{2 * 120 * KIB} bytes per partition" in str(err)


def test_a_tile_used_again_later_was_live_all_along():
    """Four 64 KiB tiles, each written and then left alone while the others are written: only the
    final read shows that all four were live at once; the error names that read."""
    cols = fp32_columns(64)

    @nki.jit
    def kernel(x):
        out = nl.ndarray((P, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        tiles = [nl.load(x[:, i * cols:(i + 1) * cols]) for i in range(4)]
        total = tiles[0][:, 0:8]
        for t in tiles[1:]:
            total = nl.add(total, t[:, 0:8])            # the last iteration proves 256 KiB were live
        nl.store(out, value=total)
        return out

    x = np.zeros((P, 4 * cols), np.float32)
    err = raises("sbuf-capacity", kernel, x)
    assert "total = nl.add(total, t[:, 0:8])" in str(err) and "used again here" in str(err)
    assert "4 x result of nl.load" in str(err)

    @nki.jit
    def three(x):  # 192 KiB: fits
        out = nl.ndarray((P, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        tiles = [nl.load(x[:, i * cols:(i + 1) * cols]) for i in range(3)]
        nl.store(out, value=nl.add(nl.add(tiles[0][:, 0:8], tiles[1][:, 0:8]), tiles[2][:, 0:8]))
        return out

    np.testing.assert_array_equal(nki.simulate(three)(x), 0)


def test_a_tile_larger_than_sbuf_is_refused_where_it_is_allocated():
    @nki.jit
    def kernel(x):
        out = nl.ndarray((128, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        big = nl.ndarray((128, fp32_columns(240)), dtype=nl.float32)   # 240 KiB per partition
        big[...] = 0.0
        nl.store(out, value=big[:, 0:8])
        return out

    err = raises("sbuf-capacity", kernel, np.zeros((128, 8), np.float32))
    assert "big = nl.ndarray" in str(err)


def test_a_tile_held_but_never_written_takes_no_memory():
    """The compiler gives a tile memory at its first write; one that is never used has none."""
    @nki.jit
    def kernel(x):
        out = nl.ndarray((128, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        spare = [nl.ndarray((128, fp32_columns(100)), dtype=nl.float32) for _ in range(3)]
        nl.store(out, value=nl.load(x))
        return out

    x = np.ones((128, 8), np.float32)
    np.testing.assert_array_equal(nki.simulate(kernel)(x), x)


def test_an_instruction_result_assigned_into_a_tile_takes_no_memory_of_its_own():
    """`t[...] = op(...)` is one instruction writing t through the assignment's access pattern (the
    transpose2d tutorial's copy): 96 KiB in and 96 KiB out, no third tile in between."""
    cols = fp32_columns(96)

    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        src = nl.load(x)
        dst = nl.ndarray((P, cols), dtype=x.dtype)
        i_p, i_f = nl.mgrid[0:P, 0:cols]
        dst[i_p, i_f] = nl.exp(src[i_p, i_f])
        nl.store(out, value=dst)
        return out

    x = np.random.default_rng(1).standard_normal((P, cols)).astype(np.float32)
    np.testing.assert_allclose(nki.simulate(kernel)(x), np.exp(x), rtol=1e-6)

    def kept(x, keep_source):
        """The result is used again: a tile of its own (src and t at the exp, t and dst at the copy)."""
        out = nl.ndarray((3, P, cols), dtype=x.dtype, buffer=nl.shared_hbm)
        src = nl.load(x)
        dst = nl.ndarray((P, cols), dtype=x.dtype)
        t = nl.exp(src)
        dst[...] = t
        nl.store(out[0], value=t)
        nl.store(out[1], value=dst)
        if keep_source:  # src, t and dst all live at the copy
            nl.store(out[2], value=src)
        return out

    got = nki.simulate(nki.jit(kept))(x, False)
    np.testing.assert_allclose(got[0], np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(got[1], np.exp(x), rtol=1e-6)
    err = raises("sbuf-capacity", nki.jit(kept), x, True)
    assert "nl.store(out[2], value=src)" in str(err) and f"{3 * 96 * KIB} bytes per partition" in str(err)


# -- PSUM ----------------------------------------------------------------------------------------
def test_psum_accumulators_made_in_each_iteration():
    """Five banks per iteration (a list made anew each time); eight banks in all."""
    @nki.jit
    def kernel(a, b):
        out = nl.ndarray((2, 128, 5 * 512), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(2):
            x = nl.load(a[i])
            accs = [nl.zeros((128, 512), nl.float32, buffer=nl.psum) for _ in range(5)]
            for j in nl.static_range(5):
                accs[j] += nl.matmul(x, nl.load(b[:, j * 512:(j + 1) * 512]), transpose_x=True)
            for j in nl.static_range(5):
                nl.store(out[i, :, j * 512:(j + 1) * 512], value=nl.copy(accs[j]))
        return out

    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 128, 128)).astype(np.float32), rng.standard_normal((128, 2560)).astype(np.float32)
    np.testing.assert_allclose(nki.simulate(kernel)(a, b), np.einsum("ikm,kn->imn", a, b), rtol=1e-4, atol=1e-3)


def test_psum_scores_then_transposes_in_each_query_tile():
    """The attention tutorial (v4-v7): per query tile, fresh PSUM score tiles (six here) used up by
    the softmax, then a PSUM tile per transpose and a PSUM accumulator. The score tiles are dead by
    the transposes, though the list still holds them: at most seven banks at a time."""
    n_kv, d = 6, 32

    @nki.jit
    def kernel(q, k, v):
        sq = q.shape[1]
        out = nl.ndarray((sq, d), dtype=nl.float32, buffer=nl.shared_hbm)
        q_sb, k_sb = nl.load(q), nl.load(k)
        for i in nl.affine_range(sq // 128):
            scores = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(n_kv)]
            for j in range(n_kv):
                nisa.nc_matmul(dst=scores[j], stationary=q_sb[:, nl.ds(i * 128, 128)],
                               moving=k_sb[:, nl.ds(j * 512, 512)])
            row_max = nl.ndarray((128, n_kv), nl.float32)
            for j in range(n_kv):
                nisa.tensor_reduce(dst=row_max[:, nl.ds(j, 1)], op=nl.maximum, data=scores[j], axis=(1,))
            neg_max = nl.ndarray((128, 1), nl.float32)
            nisa.tensor_reduce(dst=neg_max, op=nl.maximum, data=row_max, axis=(1,), negate=True)
            e = nl.ndarray((128, n_kv * 512), nl.float32)
            for j in range(n_kv):
                nisa.activation(dst=e[:, nl.ds(j * 512, 512)], op=nl.exp, data=scores[j], bias=neg_max)
            acc = nl.zeros((128, d), nl.float32, buffer=nl.psum)
            for t in nl.affine_range(n_kv * 4):
                e_t = nl.ndarray((128, 128), nl.float32, buffer=nl.psum)
                nisa.nc_transpose(dst=e_t, data=e[:, nl.ds(t * 128, 128)])
                e_t_sb = nl.ndarray((128, 128), nl.float32)
                nisa.tensor_copy(dst=e_t_sb, src=e_t)
                nisa.nc_matmul(dst=acc, stationary=e_t_sb, moving=nl.load(v[nl.ds(t * 128, 128), :]))
            res = nl.ndarray((128, d), nl.float32)
            nisa.tensor_copy(dst=res, src=acc)
            nl.store(out[nl.ds(i * 128, 128), :], value=res)
        return out

    rng = np.random.default_rng(7)
    q = rng.standard_normal((d, 256)).astype(np.float32) / 4
    k = rng.standard_normal((d, n_kv * 512)).astype(np.float32) / 4
    v = rng.standard_normal((n_kv * 512, d)).astype(np.float32)
    s = q.T @ k
    want = np.exp(s - s.max(1, keepdims=True)) @ v
    np.testing.assert_allclose(nki.simulate(kernel)(q, k, v), want, rtol=1e-4, atol=1e-3)


def test_nine_psum_tiles_live_at_once_are_reported():
    @nki.jit
    def kernel(a, b):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x, y = nl.load(a), nl.load(b)
        accs = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(9)]
        for p in accs:
            nisa.nc_matmul(p, x, y)
        total = nl.copy(accs[0])
        for p in accs[1:]:
            total = nl.add(total, p)
        nl.store(out, value=total)
        return out

    err = raises("psum-capacity", kernel, np.ones((128, 128), np.float32), np.ones((128, 512), np.float32))
    assert "9 banks" in str(err)


# -- block dimensions (nl.par_dim not first) -----------------------------------------------------
def block_tile(blocks, partitions, cols, dtype=nl.float32):
    """A (blocks, par_dim(partitions), cols) SBUF tensor, as ``nl.ndarray`` makes one from a shape
    marked with ``nl.par_dim`` (see test_par_dim_marks_block_dimensions)."""
    return _tile.new_tile((blocks, _tile.ParDim(partitions), cols), dtype, _tile.sbuf)


def test_block_dimensions_count_per_block():
    """The fused Mamba tutorial's accumulator: (n_tiles, par_dim(128), seq_len); each block is a
    [128, seq_len] tile (16 KiB per partition for two of 2048 fp32), not 2 partitions of 1 MiB."""
    @nki.jit
    def kernel(x):
        nb, p, f = x.shape
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        acc = block_tile(nb, p, f)
        acc[...] = 0.0
        for s in nl.affine_range(3):
            for b in nl.affine_range(nb):
                acc[b, 0:p, 0:f] += nl.load(x[b])
        for b in nl.affine_range(nb):
            nl.store(out[b], value=acc[b, 0:p, 0:f])
        return out

    x = np.random.default_rng(3).standard_normal((2, 128, 2048)).astype(np.float32)
    np.testing.assert_allclose(nki.simulate(kernel)(x), 3 * x, rtol=1e-6)


def test_blocks_used_one_at_a_time_share_memory():
    """8 blocks of 32 KiB (256 KiB in all), each written and stored before the next: one live
    block at a time, as the block-dimension migration guide describes. Keeping them all is not."""
    def kernel(x, keep_all):
        nb, p, f = x.shape
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        buf = block_tile(nb, p, f)
        for b in nl.affine_range(nb):
            buf[b] = nl.load(x[b])
            if not keep_all:
                nl.store(out[b], value=buf[b])
        if keep_all:
            for b in nl.affine_range(nb):
                nl.store(out[b], value=buf[b])
        return out

    x = np.random.default_rng(4).standard_normal((8, P, fp32_columns(32))).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate(nki.jit(kernel))(x, False), x)
    err = raises("sbuf-capacity", nki.jit(kernel), x, True)
    assert "nl.store(out[b], value=buf[b])" in str(err)


def test_block_dimensions_are_not_partitions():
    @nki.jit
    def kernel(x):
        out = nl.ndarray((128, 4), dtype=x.dtype, buffer=nl.shared_hbm)
        buf = block_tile(256, 128, 4)
        buf[...] = 1.0
        nl.store(out, value=buf[255])
        return out

    np.testing.assert_array_equal(nki.simulate(kernel)(np.zeros((128, 4), np.float32)), 1)

    @nki.jit
    def wide(x):
        out = nl.ndarray((128, 4), dtype=x.dtype, buffer=nl.shared_hbm)
        buf = _tile.new_tile((2, _tile.ParDim(256), 4), nl.float32, _tile.sbuf)
        return out

    raises("partition-dim", wide, np.zeros((128, 4), np.float32))


def test_par_dim_marks_block_dimensions():
    @nki.jit
    def kernel(x):
        nb, p, f = x.shape
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros((nb, nl.par_dim(p), f), dtype=x.dtype)
        for b in nl.affine_range(nb):
            acc[b, 0:p, 0:f] += nl.load(x[b])
        for b in nl.affine_range(nb):
            nl.store(out[b], value=acc[b, 0:p, 0:f])
        return out

    x = np.ones((2, 128, 2048), np.float32)
    np.testing.assert_array_equal(nki.simulate(kernel)(x), x)


# -- index expressions from a larger grid ---------------------------------------------------------
def test_a_grid_axis_the_access_does_not_use_is_not_a_dim_of_it():
    """`i_p, i_1, i_f = nl.mgrid[0:128, 0:1, 0:F]` as in the RMSNorm and LayerNorm tutorials:
    x[rows, i_f] is a [128, F] tile and w[i_1, i_f] a [1, F] one, as on hardware. NumPy would
    broadcast all three grid axes ([128, 1, F]), and the row sum over axis 1 would be refused
    (reduce-axes). Masks made on the grid fit the tiles too."""
    @nki.jit
    def kernel(x, w):
        n, f = x.shape
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        i_p, i_1, i_f = nl.mgrid[0:128, 0:1, 0:f]
        w_row = nl.load(w.reshape((1, f))[i_1, i_f])
        assert w_row.shape == (1, f)
        for i in nl.affine_range((n + 127) // 128):
            rows = i * 128 + i_p
            t = nl.load(x[rows, i_f], mask=(rows < n))
            assert t.shape == (128, f)
            total = nl.sum(nl.square(t), axis=[1], keepdims=True, mask=(rows < n))
            y = nl.multiply(nl.multiply(t, nl.rsqrt(total / f)), w_row.broadcast_to((128, f)), mask=(rows < n))
            nl.store(out[rows, i_f], value=y, mask=(rows < n))
        return out

    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((200, 96)).astype(np.float32), rng.standard_normal(96).astype(np.float32)
    want = x / np.sqrt((x * x).mean(1, keepdims=True)) * w
    np.testing.assert_allclose(nki.simulate(kernel)(x, w), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kernel(torch.from_numpy(x).to("neuron"), torch.from_numpy(w).to("neuron")).cpu(),
                               torch.from_numpy(want), rtol=1e-5, atol=1e-5)


def test_a_row_mask_made_for_the_input_of_a_reduction():
    """The softmax tutorial masks `nl.max(tile, axis=[1], keepdims=True, mask=rows < n)` with the
    [128, F] row mask of its loads: the mask does not vary along the reduced axis, so it fits the
    [128, 1] result."""
    @nki.jit
    def kernel(x):
        n, f = x.shape
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:128, 0:f]
        for i in nl.affine_range((n + 127) // 128):
            rows = i * 128 + i_p
            t = nl.load(x[rows, i_f], mask=(rows < n))
            top = nl.max(t, axis=[1], keepdims=True, mask=(rows < n))
            e = nl.exp(nl.subtract(t, top, mask=(rows < n)))
            total = nl.sum(e, axis=[1], keepdims=True, mask=(rows < n))
            nl.store(out[rows, i_f], value=e / total, mask=(rows < n))
        return out

    x = np.random.default_rng(6).standard_normal((200, 72)).astype(np.float32)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(nki.simulate(kernel)(x), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_arange_positions_keep_their_size_one_dims():
    """`nl.arange(F)[None, :]` puts the index on the free dim: w[i_f] of a 1-D w is a [1, F] tile."""
    @nki.jit
    def kernel(w):
        out = nl.ndarray((1, w.shape[0]), dtype=w.dtype, buffer=nl.shared_hbm)
        i_f = nl.arange(w.shape[0])[None, :]
        row = nl.load(w[i_f])
        assert row.shape == (1, w.shape[0])
        nl.store(out, value=row)
        return out

    w = np.arange(300, dtype=np.float32)
    np.testing.assert_array_equal(nki.simulate(kernel)(w), w[None, :])


# -- undefined-tile: every kind of write defines what it writes ----------------------------------
DTYPES = [nl.int8, nl.uint8, nl.float16, nl.bfloat16, nl.float32]


def transposed(x, rows, cols, mask_rows=None):
    """Each partition's row-major rows x cols block transposed into a new tile by one copy whose
    destination is addressed by an index expression (the transpose2d tutorial's pattern)."""
    p_size = x.shape[0]
    src = nl.load(x)
    dst = nl.ndarray((p_size, rows * cols), dtype=x.dtype)
    i_p, i_r, i_c = nl.mgrid[0:p_size, 0:rows, 0:cols]
    if mask_rows is None:
        dst[i_p, i_c * rows + i_r] = nl.copy(src[i_p, i_r * cols + i_c])
    else:
        nisa.tensor_copy(dst=dst[i_p, i_c * rows + i_r], src=src[i_p, i_r * cols + i_c], mask=(i_r < mask_rows))
    return dst


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_transposing_scatter_defines_every_element(dtype):
    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=transposed(x, 3, 5))
        return out

    x = torch.arange(7 * 15).reshape(7, 15).to(dtype)
    want = x.reshape(7, 3, 5).transpose(1, 2).reshape(7, 15)
    torch.testing.assert_close(nki.simulate(kernel)(x), want)
    torch.testing.assert_close(kernel(x.to("neuron")).cpu(), want)


def test_a_scatter_that_misses_elements_leaves_them_undefined():
    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=transposed(x, 3, 5, mask_rows=2))   # row 2 of each block is never copied
        return out

    err = raises("undefined-tile", kernel, np.zeros((7, 15), np.int8))
    assert "35 of 105 elements" in str(err)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pieces_that_together_cover_a_tile_define_it(dtype):
    """Strided halves, loop columns through nl.ds, an access pattern, a reinterpreting view and
    complementary masks each cover the tile exactly once."""
    P, F = 16, 24

    @nki.jit
    def kernel(x):
        out = nl.ndarray((5, P, F), dtype=x.dtype, buffer=nl.shared_hbm)
        src = nl.load(x)
        halves = nl.ndarray((P, F), dtype=x.dtype)
        halves[:, 0:F:2] = nl.copy(src[:, 0:F // 2])
        halves[:, 1:F:2] = nl.copy(src[:, F // 2:F])
        columns = nl.ndarray((P, F), dtype=x.dtype)
        for j in nl.affine_range(F):
            nisa.tensor_copy(dst=columns[:, nl.ds(j, 1)], src=src[:, nl.ds(F - 1 - j, 1)])
        pattern = nl.ndarray((P, F), dtype=x.dtype)
        nisa.tensor_copy(dst=pattern.ap([[F, P], [1, 6], [6, 4]]), src=src.reshape((P, 6, 4)))
        wide = nl.ndarray((P, F), dtype=x.dtype)
        wide.view(nl.uint8)[...] = nl.copy(src.view(nl.uint8))
        masked = nl.ndarray((P, F), dtype=x.dtype)
        i_p, i_f = nl.mgrid[0:P, 0:F]
        nisa.tensor_copy(dst=masked[i_p, i_f], src=src[i_p, i_f], mask=(i_f < 10))
        nisa.tensor_copy(dst=masked[i_p, i_f], src=src[i_p, i_f], mask=(i_f >= 10))
        for k, t in enumerate([halves, columns, pattern, wide, masked]):
            nl.store(out[k], value=t)
        return out

    x = torch.arange(P * F).reshape(P, F).to(dtype)
    got = nki.simulate(kernel)(x)
    torch.testing.assert_close(got[0], torch.stack([x[:, :F // 2], x[:, F // 2:]], -1).reshape(P, F))
    torch.testing.assert_close(got[1], x.flip(1))
    torch.testing.assert_close(got[2], x.reshape(P, 6, 4).transpose(1, 2).reshape(P, F))
    torch.testing.assert_close(got[3], x)
    torch.testing.assert_close(got[4], x)


def test_a_genuinely_undefined_read_is_still_reported():
    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(x.shape, dtype=x.dtype)
        t[:, 0:x.shape[1]:2] = nl.load(x[:, 0:x.shape[1] // 2])   # the odd columns are never written
        nl.store(out, value=t)
        return out

    err = raises("undefined-tile", kernel, np.zeros((8, 12), np.int8))
    assert "48 of 96 elements" in str(err) and "nl.store(out, value=t)" in str(err)
