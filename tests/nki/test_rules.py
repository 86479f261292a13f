"""Every hardware and language rule raises NKIError naming the rule and the kernel line; nothing is written."""

import inspect

import numpy as np
import pytest
import torch

import torchneuron
import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
import torchneuron.nki.typing as nt


def kernel_of(body):
    """A kernel ``k(a, b)`` running ``body(a, b, out)``, returning a [128, 512] output."""
    def k(a, b):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        body(a, b, out)
        return out
    return nki.jit(k)


def p_too_big(a, b, out):
    nl.load(a[0:256, 0:64])


def stationary_too_big(a, b, out):
    x = nl.load(a[0:128, 0:256])
    nl.matmul(x, nl.load(b[0:128, 0:64]), transpose_x=True)


def moving_too_big(a, b, out):
    y = nl.ndarray((128, 1024), nl.float32)
    y[...] = 0
    nl.matmul(nl.load(a[0:128, 0:128]), y, transpose_x=True)


def contraction_mismatch(a, b, out):
    nl.matmul(nl.load(a[0:128, 0:128]), nl.load(b[0:64, 0:64]), transpose_x=True)


def psum_bank(a, b, out):
    nl.zeros((128, 1024), nl.float32, buffer=nl.psum)


def psum_banks_exhausted(a, b, out):
    tiles = [nl.zeros((128, 512), nl.float32, buffer=nl.psum) for _ in range(9)]
    total = nl.copy(tiles[0])
    for t in tiles[1:]:                  # all nine are live until here: nine banks
        total = nl.add(total, t)


def sbuf_capacity(a, b, out):
    tiles = [nl.zeros((128, 16384), nl.float32) for _ in range(4)]  # 4 x 64 KiB per partition
    nl.store(out[:, 0:64], value=tiles[0][:, 0:64] + tiles[1][:, 0:64] + tiles[2][:, 0:64] + tiles[3][:, 0:64])


def load_from_sbuf(a, b, out):
    t = nl.load(a[0:128, 0:64])
    nl.load(t)


def compute_on_hbm(a, b, out):
    nl.exp(a)


def store_psum(a, b, out):
    nl.store(out[:, 0:64], value=nl.zeros((128, 64), nl.float32, buffer=nl.psum))


def undefined_tile(a, b, out):
    t = nl.ndarray((128, 64), nl.float32)
    nl.store(out[:, 0:64], value=t)


def shape_mismatch(a, b, out):
    nl.store(out[:, 0:256], value=nl.load(a[0:128, 0:64]))


def loop_bound_not_constant(a, b, out):
    for i in nl.affine_range(2.5):
        pass


def data_dependent_branch(a, b, out):
    if nl.load(a[0:128, 0:1]) > 0:
        pass


def reduce_partition_axis(a, b, out):
    nl.sum(nl.load(a[0:128, 0:64]), axis=0)


def out_of_bounds(a, b, out):
    nl.load(a[nl.arange(128)[:, None] + 200, nl.arange(64)[None, :]])


def dma_to_psum(a, b, out):
    p = nl.ndarray((128, 64), nl.float32, buffer=nl.psum)
    nisa.dma_copy(dst=p, src=a[0:128, 0:64])


def matmul_dst_in_sbuf(a, b, out):
    s = nl.ndarray((128, 64), nl.float32)
    nisa.nc_matmul(s, nl.load(a[0:128, 0:128]), nl.load(b[0:128, 0:64]))


def reshape_partitions(a, b, out):
    nl.load(a[0:128, 0:128]).reshape((256, 64))


def copy_across_partitions(a, b, out):
    d = nl.ndarray((64, 256), nl.float32)
    nisa.tensor_copy(d, nl.load(a[0:128, 0:128]))


def int_matmul_dst(a, b, out):
    p = nl.ndarray((128, 64), nl.int32, buffer=nl.psum)
    nisa.nc_matmul(p, nl.load(a[0:128, 0:128]), nl.load(b[0:128, 0:64]))


def two_psum_inputs(a, b, out):
    p = nl.zeros((128, 64), nl.float32, buffer=nl.psum)
    nl.add(p, p)


CASES = {
    "partition-dim": p_too_big, "matmul-stationary-fmax": stationary_too_big,
    "matmul-moving-fmax": moving_too_big, "matmul-contraction": contraction_mismatch, "psum-bank": psum_bank,
    "psum-capacity": psum_banks_exhausted, "sbuf-capacity": sbuf_capacity, "load-from-hbm": load_from_sbuf,
    "compute-on-chip": compute_on_hbm, "store-from-psum": store_psum,
    "undefined-tile": undefined_tile, "shape-mismatch": shape_mismatch, "loop-bounds": loop_bound_not_constant,
    "data-dependent-control-flow": data_dependent_branch, "reduce-partition": reduce_partition_axis,
    "out-of-bounds": out_of_bounds, "dma-psum": dma_to_psum, "matmul-dst-in-psum": matmul_dst_in_sbuf,
    "reshape": reshape_partitions, "matmul-dtype": int_matmul_dst, "two-psum-inputs": two_psum_inputs,
}


@pytest.mark.parametrize("rule", sorted(CASES))
@pytest.mark.parametrize("where", ["simulator", "neuron"])
def test_rule_violation_names_rule_and_line_and_writes_nothing(rule, where):
    body = CASES[rule]
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    if where == "neuron":
        a, b = a.to("neuron"), b.to("neuron")
    a_before = a.cpu().clone()
    with pytest.raises(nki.NKIError) as info:
        kernel_of(body)(a, b)
    err = info.value
    assert err.rule == rule
    lines, start = inspect.getsourcelines(body)
    filename, lineno, text = err.line
    assert filename == __file__ and start < lineno < start + len(lines), str(err)
    assert f"{__file__}:{lineno}" in str(err) and text in str(err)
    torch.testing.assert_close(a.cpu(), a_before)
    if where == "neuron":  # the device and its stream stay usable
        torch.testing.assert_close((a + 1).cpu(), a_before + 1)


def big_tile(a):
    t = nl.ndarray((128, 60 * 1024), nl.float32)   # 240 KiB per partition: over trn2's 224, under trn3's 256
    t[...] = 0
    out = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=t[:, 0:8])
    return out


def test_sbuf_capacity_follows_the_platform_target():
    a = np.zeros((128, 8), np.float32)
    with pytest.raises(nki.NKIError, match="sbuf-capacity.*224 KiB"):
        nki.estimate(big_tile, a, target="trn2")
    assert nki.estimate(big_tile, a, target="trn3").estimated_seconds > 0
    with pytest.raises(nki.NKIError, match="sbuf-capacity"):   # the kernel's own target option
        nki.jit(big_tile, platform_target="trn2")(a)
    np.testing.assert_array_equal(nki.jit(big_tile, platform_target="trn3")(a), 0)


def test_kernels_write_their_arguments_in_place_and_operators_declare_it():
    def double(x):
        nl.store(x, value=nl.load(x) * 2)

    x = np.ones((4, 4), np.float32)
    nki.simulate(nki.jit(double))(x)                    # as NKI: an output passed in is written
    np.testing.assert_array_equal(x, 2)
    t = torch.ones(4, 4, device="neuron")
    nki.jit(double)(t)
    torch.testing.assert_close(t.cpu(), torch.full((4, 4), 2.0))
    # An operator must declare what it writes (torch.library's rule), or annotate it.
    with pytest.raises(nki.NKIError, match="immutable-input"):
        torchneuron.nki_op("nki_rules_test::double_undeclared")(double)(torch.ones(4, 4))
    op = torchneuron.nki_op("nki_rules_test::double_declared", mutates_args=("x",))(double)
    t = torch.ones(4, 4, device="neuron")
    op(t)
    torch.testing.assert_close(t.cpu(), torch.full((4, 4), 2.0))

    def double_annotated(x: nt.mutable_tensor):
        nl.store(x, value=nl.load(x) * 2)

    assert nki.jit(double_annotated).mutates_args == ("x",)
    with pytest.raises(ValueError, match="not parameters"):
        nki.jit(double, mutates_args=("y",))
    # An operator made from a kernel shares its plans, but not a plan that let it write freely.
    kernel = nki.jit(double)
    kernel(torch.ones(4, 4, device="neuron"))
    with pytest.raises(nki.NKIError, match="immutable-input"):  # at the call, before any data moves
        torchneuron.nki_op("nki_rules_test::double_shared_plans")(kernel)(torch.ones(4, 4, device="neuron"))
    torch.neuron.synchronize()


def test_a_load_from_an_input_the_kernel_later_writes_keeps_the_old_values():
    """Loads may share an input's memory only when the kernel writes no input (found by the check
    pass, declared or not)."""

    @nki.jit
    def snapshot_then_clear(x):
        old = nl.load(x)
        nl.store(x, value=nl.zeros(x.shape, nl.float32))
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, value=old)
        return out

    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    want = x.copy()
    np.testing.assert_array_equal(nki.simulate(snapshot_then_clear)(x), want)
    np.testing.assert_array_equal(x, 0)
    t = torch.from_numpy(want).to("neuron")
    torch.testing.assert_close(snapshot_then_clear(t).cpu(), torch.from_numpy(want))
    torch.testing.assert_close(t.cpu(), torch.zeros(4, 4))


def test_argument_errors():
    @nki.jit
    def kernel(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(a) + nl.load(b))
        return out

    with pytest.raises(TypeError, match="kernel: missing a required argument"):
        kernel(np.zeros((2, 2), np.float32))
    with pytest.raises(RuntimeError, match="one device.*a on neuron:0, b on cpu"):
        kernel(torch.zeros(2, 2, device="neuron"), torch.zeros(2, 2))
    with pytest.raises(nki.NKIError, match="shape-mismatch|operands"):
        kernel(np.zeros((128, 4), np.float32), np.zeros((128, 8), np.float32))
    with pytest.raises(nki.NKIError, match="kernel-return"):
        nki.simulate(lambda a: nl.load(a))(np.zeros((2, 2), np.float32))


def test_tile_assignment_with_an_index_expression_key():
    @nki.jit
    def kernel(a):
        out = nl.ndarray((128, 4), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.zeros((128, 4), nl.float32)
        t[nl.arange(128)[:, None], nl.arange(2)[None, :]] = nl.load(a[:, 0:2])
        nl.store(out, value=t)
        return out

    a = np.ones((128, 4), np.float32)
    np.testing.assert_array_equal(nki.simulate(kernel)(a), np.concatenate([a[:, :2], 0 * a[:, 2:]], axis=1))


def test_returning_part_of_an_input_is_an_error():
    with pytest.raises(nki.NKIError, match="kernel-return"):
        nki.simulate(lambda a: a[0:64])(np.zeros((128, 4), np.float32))


def test_isa_destinations_keep_the_partition_layout():
    with pytest.raises(nki.NKIError, match="shape-mismatch"):
        kernel_of(copy_across_partitions)(torch.randn(256, 256), torch.randn(256, 256))


def test_reading_the_unwritten_part_of_a_tile_is_an_error():
    def half_written(a, b, out):
        t = nl.ndarray((128, 128), nl.float32)
        t[:, 0:64] = nl.load(a[0:128, 0:64])
        nl.store(out[:, 0:64], value=t[:, 0:64])     # fine: written
        nl.exp(t)                                     # reads columns 64..127, never written

    with pytest.raises(nki.NKIError, match="undefined-tile.*64 of 128|undefined-tile.*8192 of 16384"):
        kernel_of(half_written)(torch.randn(256, 256), torch.randn(256, 256))

    def masked_then_whole(a, b, out):
        t = nl.ndarray((128, 64), nl.float32)
        i_p, i_f = nl.mgrid[0:128, 0:64]
        t[...] = 0.0                                  # defined everywhere, then partly overwritten
        nl.store(out[:, 0:64], value=nl.load(a[i_p, i_f], mask=(i_p < 100)) + t)

    kernel_of(masked_then_whole)(torch.randn(256, 256), torch.randn(256, 256))
