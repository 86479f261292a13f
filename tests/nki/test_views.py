"""Tensor views (slice, permute, broadcast, select, reshape family, view(dtype), patterns) and
host-side Python on tensor handles (None comparisons, truthiness), against NumPy references."""

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

from tests.nki.test_language import rand, run


@nki.jit
def hbm_views(a, idx):
    """a: (4, 32, 16) HBM, idx: (1, 1) int32."""
    out0 = nl.ndarray((4, 8, 16), dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out0, src=a.slice(1, 8, 24, 2))
    out1 = nl.ndarray((32, 4, 16), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((32, 4, 16), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a.permute((1, 0, 2)))
    nisa.dma_copy(dst=out1, src=t)
    out2 = nl.ndarray((2, 32, 16), dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out2[0], src=a.select(0, 2))
    i = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=i, src=idx)
    nisa.dma_copy(dst=out2[1], src=a.select(0, i))                 # a dynamic index: the tile's value
    out3 = nl.ndarray((4, 128, 16), dtype=a.dtype, buffer=nl.shared_hbm)
    for k, flat in enumerate([a.reshape((128, 16)), a.reshape([128, 16]), a.reshape(128, 16), a.reshape(-1, 16)]):
        nisa.dma_copy(dst=out3[k], src=flat)
    out4 = nl.ndarray((128, 16), dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out4.reshape_dim(0, (4, 32)), src=a.flatten_dims(0, 1).reshape_dim(0, (4, -1)))
    return out0, out1, out2, out3, out4


def test_hbm_views():
    a = rand(4, 32, 16)
    out0, out1, out2, out3, out4 = run(hbm_views, a, np.array([[3]], dtype=np.int32))
    np.testing.assert_array_equal(out0, a[:, 8:24:2])
    np.testing.assert_array_equal(out1, a.transpose(1, 0, 2))
    np.testing.assert_array_equal(out2[0], a[2])
    np.testing.assert_array_equal(out2[1], a[3])
    np.testing.assert_array_equal(out3, np.broadcast_to(a.reshape(128, 16), (4, 128, 16)))
    np.testing.assert_array_equal(out4, a.reshape(128, 16))


@nki.jit
def sbuf_views(a, b):
    """a: (32, 64), b: (32, 1)."""
    t = nl.ndarray((32, 64), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    col = nl.ndarray((32, 1), dtype=b.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=col, src=b)
    out = nl.ndarray((4, 32, 16, 4), dtype=a.dtype, buffer=nl.shared_hbm)
    u = nl.ndarray((32, 16, 4), dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=u, src=t.reshape_dim(1, (4, 16)).permute([0, 2, 1]))                # transposed free dims
    nisa.dma_copy(dst=out[0], src=u)
    nisa.tensor_tensor(dst=u.flatten_dims(1, 2), data1=t, data2=col.broadcast(1, 64), op=nl.add)
    nisa.dma_copy(dst=out[1], src=u)
    nisa.tensor_copy(dst=u.expand_dim(1).squeeze_dim(1), src=t.expand_dim(-1).reshape((32, 16, 4)))
    nisa.dma_copy(dst=out[2], src=u)
    bits = nl.ndarray((32, 16, 4), dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=bits, src=t.view(nl.int32).reshape((32, 16, 4)))
    nisa.dma_copy(dst=out[3].view(nl.int32), src=bits)
    return out


def test_sbuf_views():
    a, b = rand(32, 64), rand(32, 1)
    out = run(sbuf_views, a, b)
    np.testing.assert_array_equal(out[0], a.reshape(32, 4, 16).transpose(0, 2, 1))
    np.testing.assert_array_equal(out[1].reshape(32, 64), a + b)
    np.testing.assert_array_equal(out[2].reshape(32, 64), a)
    np.testing.assert_array_equal(out[3].reshape(32, 64), a)


@nki.jit
def reinterpreting_view(a):
    """a: (32, 16) float32; its bytes as bfloat16 (32, 32), read back as float32 halves."""
    t = nl.ndarray((32, 16), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    halves = t.view(nl.bfloat16)
    out = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.shared_hbm)
    hi = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=hi, src=halves.slice(1, 1, 32, 2))      # the high halves: a truncated to bf16
    nisa.dma_copy(dst=out, src=hi)
    return out


def test_view_dtype_rescales_the_last_dim():
    a = rand(32, 16)
    out = run(reinterpreting_view, a)
    truncated = (a.view(np.uint32) & 0xFFFF0000).view(np.float32)
    np.testing.assert_array_equal(out, truncated)


@nki.jit
def patterns_round_trip(a):
    """Views report their pattern over the tensor's memory; .ap of that pattern is the same view."""
    v = a[1:3, 4:8]
    assert v.get_pattern() == [[512, 2], [16, 4], [1, 16]] and v.offset == 512 + 64
    assert v.strides == (512, 16, 1) and v.size == 128 and not v.is_contiguous()
    assert a[1].is_contiguous() and a.permute(2, 0, 1).strides == (1, 512, 16)
    t = nl.ndarray((32, 16), dtype=a.dtype, buffer=nl.sbuf)
    assert t.get_pattern() == [[16, 32], [1, 16]] and t[:, 4:8].offset == 4
    out = nl.ndarray((2, 4, 16), dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=a.ap(v.get_pattern(), offset=v.offset))
    return out


def test_get_pattern_round_trips_through_ap():
    a = rand(4, 32, 16)
    np.testing.assert_array_equal(run(patterns_round_trip, a), a[1:3, 4:8])


@nki.jit
def handles(a, bias=None):
    assert a != None and not (a == None) and bias == None   # noqa: E711 - as NKI kernels write it
    t = nl.ndarray((32, 16), dtype=a.dtype, buffer=nl.sbuf)
    assert a and t and t[0:4] and t.reshape((32, 4, 4)) and t != None
    nisa.dma_copy(dst=t, src=a)
    x = nl.add(t, 1.0)
    assert x != None and not x == None
    out = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=nl.copy(x == t, dtype=nl.float32) + nl.copy(t != t, dtype=nl.float32))  # per element
    return out


def test_handles_compare_with_none_and_are_true():
    a = rand(32, 16)
    np.testing.assert_array_equal(run(handles, a), np.zeros((32, 16)))


@pytest.mark.parametrize("test", [lambda x: bool(x), lambda x: bool(x[0:1]), lambda x: bool(x > 0),
                                  lambda x: bool(nl.equal(x, x))])
def test_computed_tiles_have_no_truth_value(test):
    @nki.jit
    def kernel(a):
        x = nl.load(a)
        if test(x):
            pass
        return a

    with pytest.raises(nki.NKIError) as info:
        kernel(rand(32, 16))
    assert info.value.rule == "data-dependent-control-flow"


def view_errors(case):
    @nki.jit
    def kernel(a):
        t = nl.ndarray((32, 16), dtype=a.dtype, buffer=nl.sbuf)
        if case == "permute-partitions":
            t.permute(1, 0)
        elif case == "broadcast-non-unit":
            a.broadcast(0, 4)
        elif case == "broadcast-partitions":
            t[0:1, :].broadcast(0, 32)
        elif case == "reshape-partitions":
            t.flatten_dims(0, 1)
        elif case == "flatten-non-contiguous":
            a.permute(1, 0).flatten_dims(0, 1)
        elif case == "squeeze-non-unit":
            t.squeeze_dim(1)
        elif case == "view-partition-dim":
            t[:, 0].view(nl.bfloat16)
        return a
    return kernel


@pytest.mark.parametrize("case, rule", [
    ("permute-partitions", "access-pattern"), ("broadcast-non-unit", "shape-mismatch"),
    ("broadcast-partitions", "access-pattern"), ("reshape-partitions", "reshape"),
    ("flatten-non-contiguous", "reshape"), ("squeeze-non-unit", "reshape"), ("view-partition-dim", "view")])
def test_view_rules(case, rule):
    with pytest.raises(nki.NKIError) as info:
        view_errors(case)(rand(32, 16))
    assert info.value.rule == rule


@nki.jit
def looped_views(a):
    """a: (4, 32, 16); every iteration works on its own block through views."""
    out = nl.ndarray((4, 16, 32), dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(4):
        t = nl.ndarray((32, 16), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a.select(0, i))
        u = nl.ndarray((32, 2, 8), dtype=a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=u.permute(0, 2, 1), src=t.reshape_dim(1, (8, 2)))
        bits = nl.ndarray((32, 16), dtype=nl.int32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=bits, src=u.flatten_dims(1, 2).view(nl.int32))
        nisa.dma_copy(dst=out.select(0, i).permute(1, 0).view(nl.int32), src=bits)
    return out


def test_views_in_a_batched_loop():
    a = rand(4, 32, 16)
    out = run(looped_views, a)
    expected = a.reshape(4, 32, 8, 2).transpose(0, 1, 3, 2).reshape(4, 32, 16).transpose(0, 2, 1)
    np.testing.assert_array_equal(out, expected)
    (plan,) = looped_views._plans.values()
    assert plan.unbatchable == frozenset()
