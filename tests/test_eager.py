"""Eager ops on ``neuron`` tensors give what the same ops give on CPU.

Every check runs the computation twice, once on CPU tensors and once on
neuron copies of them, and compares outputs (and any inputs mutated in place)
with ``torch.testing.assert_close``. CPU is the independent reference.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F

DEV = "neuron"


# --------------------------------------------------------------------------- helpers


def _to_dev(obj, device=DEV):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_dev(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_dev(v, device) for k, v in obj.items()}
    return obj


def _clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    return obj


def assert_same(actual, expected, rtol=None, atol=None, check_stride=False):
    """``actual`` (from neuron) equals ``expected`` (from CPU)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual)}"
        assert actual.device.type == "neuron", f"result on {actual.device}, expected neuron"
        assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != CPU {expected.dtype}"
        assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != CPU {tuple(expected.shape)}"
        if check_stride:
            assert actual.stride() == expected.stride(), f"stride {actual.stride()} != CPU {expected.stride()}"
        torch.testing.assert_close(actual.cpu(), expected, rtol=rtol, atol=atol, equal_nan=True)
    elif isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e, rtol=rtol, atol=atol, check_stride=check_stride)
    elif isinstance(expected, dict):
        assert actual.keys() == expected.keys()
        for k in expected:
            assert_same(actual[k], expected[k], rtol=rtol, atol=atol, check_stride=check_stride)
    else:
        assert actual == expected


def check(fn, *args, rtol=None, atol=None, check_stride=False, **kwargs):
    """Runs ``fn`` on CPU tensors and on neuron copies; compares the results and
    the (possibly mutated in place) arguments."""
    cpu_args, cpu_kwargs = _clone(args), _clone(kwargs)
    dev_args, dev_kwargs = _to_dev(args), _to_dev(kwargs)
    expected = fn(*cpu_args, **cpu_kwargs)
    actual = fn(*dev_args, **dev_kwargs)
    assert_same(actual, expected, rtol=rtol, atol=atol, check_stride=check_stride)
    assert_same(dev_args, cpu_args, rtol=rtol, atol=atol)
    assert_same(dev_kwargs, cpu_kwargs, rtol=rtol, atol=atol)
    return actual


def rand(*shape, dtype=torch.float32, seed=0, low=-3, high=3):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype == torch.uint8:
        low = 0
    return torch.randint(low, high + 1, shape, generator=g, dtype=dtype)


def pos(*shape, seed=0):
    return rand(*shape, seed=seed).abs() + 0.1


# --------------------------------------------------------------------------- elementwise

UNARY = [
    torch.abs, torch.neg, torch.exp, torch.expm1, torch.sin, torch.cos, torch.tanh, torch.sigmoid,
    torch.relu, F.gelu, F.silu, torch.erf, torch.floor, torch.ceil, torch.round, torch.trunc,
    torch.sign, torch.square, torch.atan, torch.sinh, lambda x: F.leaky_relu(x, 0.1), F.softplus,
    lambda x: torch.clamp(x, -0.5, 0.7), lambda x: x.clamp(min=0.2), torch.isfinite,
]
UNARY_POSITIVE = [torch.log, torch.sqrt, torch.rsqrt, torch.reciprocal, torch.log1p, torch.log2, torch.lgamma]


@pytest.mark.parametrize("fn", UNARY, ids=lambda f: getattr(f, "__name__", "lambda"))
def test_unary(fn):
    check(fn, rand(5, 7))


@pytest.mark.parametrize("fn", UNARY_POSITIVE, ids=lambda f: f.__name__)
def test_unary_positive(fn):
    check(fn, pos(5, 7))


BINARY = [
    torch.add, torch.sub, torch.mul, torch.div, torch.maximum, torch.minimum, torch.atan2,
    torch.eq, torch.ne, torch.lt, torch.le, torch.gt, torch.ge, torch.fmod, torch.remainder,
    torch.hypot, torch.copysign,
    lambda a, b: torch.add(a, b, alpha=2.5), lambda a, b: torch.sub(a, b, alpha=-3),
    lambda a, b: torch.div(a, b, rounding_mode="floor"), lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    lambda a, b: torch.lerp(a, b, 0.3), lambda a, b: torch.pow(a.abs() + 0.1, b),
    lambda a, b: torch.where(a > b, a, b), F.mse_loss, F.smooth_l1_loss,
]


@pytest.mark.parametrize("fn", BINARY, ids=lambda f: getattr(f, "__name__", "lambda"))
def test_binary(fn):
    check(fn, rand(4, 6, seed=1), rand(4, 6, seed=2))


def test_ternary_and_scalar_ops():
    a, b, c = rand(3, 5, seed=1), rand(3, 5, seed=2), rand(3, 5, seed=3)
    check(lambda a, b, c: torch.addcmul(a, b, c, value=0.5), a, b, c)
    check(lambda a, b, c: torch.addcdiv(a, b, c.abs() + 1, value=-2), a, b, c)
    check(lambda a, b, c: torch.lerp(a, b, c.sigmoid()), a, b, c)
    check(lambda a: a * 3 + 1.5 - a / 7, a)
    check(lambda a: 2 ** a, a)
    check(lambda a: a ** 2, a)
    check(lambda a: 1 - a, a)


INT_TYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


@pytest.mark.parametrize("dtype", INT_TYPES, ids=str)
def test_integer_ops(dtype):
    a, b = rand(4, 5, dtype=dtype, seed=1), rand(4, 5, dtype=dtype, seed=2, low=1)
    b = torch.where(b == 0, torch.ones_like(b), b)
    check(torch.add, a, b)
    check(torch.mul, a, b)
    check(lambda a, b: torch.div(a, b, rounding_mode="floor"), a, b)
    check(lambda a, b: a // b, a, b)
    check(lambda a, b: a % b, a, b)
    check(lambda a, b: a / b, a, b)  # true division promotes to float
    check(torch.bitwise_and, a, b)
    check(torch.bitwise_or, a, b)
    check(torch.bitwise_xor, a, b)
    check(torch.maximum, a, b)
    check(lambda a: a.sum(), a)
    check(lambda a: a.sum(dtype=dtype), a)
    check(lambda a, b: a == b, a, b)
    check(lambda a: a << 1, a)


def test_bool_ops():
    a, b = rand(6, 7, dtype=torch.bool, seed=1), rand(6, 7, dtype=torch.bool, seed=2)
    check(torch.logical_and, a, b)
    check(torch.logical_or, a, b)
    check(torch.logical_xor, a, b)
    check(torch.logical_not, a)
    check(lambda a, b: a & b, a, b)
    check(lambda a, b: a | ~b, a, b)
    check(lambda a: a.sum(), a)
    check(lambda a: a.any(), a)
    check(lambda a: a.all(dim=1), a)
    check(lambda a, b: a + b, a, b)  # bool + bool is logical or
    check(lambda a: a.float() * 2, a)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_low_precision_floats(dtype):
    a, b = rand(8, 16, dtype=dtype, seed=1), rand(16, 4, dtype=dtype, seed=2)
    check(lambda a: a * 2 + 1, a)
    check(lambda a: a.exp(), a)
    check(lambda a: a.sum(dim=1), a)
    check(lambda a: a.mean(), a)
    check(lambda a, b: a @ b, a, b)
    check(lambda a: torch.softmax(a, dim=-1), a)
    check(lambda a: a.float(), a)
    check(lambda a: a.to(torch.float64), a)


def test_float64_ops():
    a, b = rand(6, 6, dtype=torch.float64, seed=1), rand(6, 6, dtype=torch.float64, seed=2)
    out = check(lambda a, b: a @ b + a.sin(), a, b)
    assert out.dtype == torch.float64
    check(lambda a: a.sum(), a)
    check(lambda a: torch.cumsum(a, 0), a)
    check(lambda a: a.std(dim=0), a)


def test_complex64_ops():
    a, b = rand(4, 4, dtype=torch.complex64, seed=1), rand(4, 4, dtype=torch.complex64, seed=2)
    check(torch.add, a, b)
    check(torch.mul, a, b)
    check(lambda a, b: a @ b, a, b)
    check(torch.abs, a)
    check(torch.real, a)
    check(torch.imag, a)
    check(torch.conj_physical, a)
    check(lambda a: a.angle(), a)
    check(lambda a: a.exp(), a)
    check(lambda a: a.sum(dim=0), a)
    check(lambda a: torch.view_as_real(a) * 2, a)
    check(lambda x: torch.complex(x, x * 2), rand(3, 3))


# --------------------------------------------------------------------------- promotion

PROMOTION_CASES = [
    (torch.int32, torch.int64), (torch.int64, torch.float32), (torch.uint8, torch.int8),
    (torch.bool, torch.int32), (torch.bool, torch.float16), (torch.float16, torch.float32),
    (torch.bfloat16, torch.float16), (torch.float32, torch.float64), (torch.int16, torch.bfloat16),
    (torch.float32, torch.complex64), (torch.int64, torch.complex64),
]


@pytest.mark.parametrize("dt_a,dt_b", PROMOTION_CASES, ids=str)
def test_type_promotion(dt_a, dt_b):
    a, b = rand(3, 4, dtype=dt_a, seed=1), rand(3, 4, dtype=dt_b, seed=2)
    out = check(torch.add, a, b)
    assert out.dtype == torch.result_type(a, b)
    check(torch.mul, a, b)
    check(lambda a, b: a < b if not b.is_complex() else a == b, a, b)


def test_promotion_with_python_scalars_and_0dim():
    i = rand(3, 4, dtype=torch.int64)
    f = rand(3, 4)
    assert check(lambda i: i + 1.5, i).dtype == torch.float32
    assert check(lambda i: i * 2, i).dtype == torch.int64
    assert check(lambda i: i / 2, i).dtype == torch.float32
    assert check(lambda f: f + 2j, f).dtype == torch.complex64
    # a 0-dim tensor does not promote a dimensioned tensor of the same category
    assert check(lambda f, s: f + s, f, torch.tensor(2.0, dtype=torch.float64)).dtype == torch.float32
    # ... but a 0-dim tensor of a higher category does (int + 0-dim float64 -> float64)
    assert check(lambda i, s: i + s, i, torch.tensor(2.5, dtype=torch.float64)).dtype == torch.float64
    assert check(lambda i, s: i + s, i.int(), torch.tensor(2, dtype=torch.int64)).dtype == torch.int32
    assert check(lambda h, s: h * s, f.half(), torch.tensor(3.0)).dtype == torch.float16


def test_cpu_0dim_tensor_mixes_with_neuron_tensors():
    x = rand(3, 4)
    xd = x.to(DEV)
    s = torch.tensor(2.5)  # stays on CPU
    for fn in (torch.add, torch.mul, torch.sub, torch.div, torch.maximum):
        out = fn(xd, s)
        assert out.device.type == "neuron"
        torch.testing.assert_close(out.cpu(), fn(x, s))
    out = s * xd
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), s * x)
    out = torch.where(xd > 0, xd, torch.tensor(0.0))
    torch.testing.assert_close(out.cpu(), torch.where(x > 0, x, torch.tensor(0.0)))
    xd2 = xd.clone()
    xd2.add_(torch.tensor(1, dtype=torch.int64))
    torch.testing.assert_close(xd2.cpu(), x + 1)
    xd2.mul_(torch.tensor(3.0, dtype=torch.float64))
    torch.testing.assert_close(xd2.cpu(), (x + 1) * 3)


# --------------------------------------------------------------------------- broadcasting

@pytest.mark.parametrize(
    "sa,sb", [((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((5, 1, 3), (1, 2, 1)), ((), (3, 3)), ((4, 1), ()), ((0, 3), (1, 3))],
    ids=str,
)
def test_broadcasting(sa, sb):
    a, b = rand(*sa, seed=1), rand(*sb, seed=2)
    check(torch.add, a, b)
    check(torch.mul, a, b)
    check(lambda a, b: torch.where(a > 0, a, b), a, b)


def test_broadcast_in_place_and_expand():
    check(lambda a, b: a.add_(b), rand(3, 4), rand(4))
    check(lambda a, b: a.mul_(b), rand(2, 3, 4), rand(3, 1))
    check(lambda a: a.expand(3, 4, 5) * 2, rand(4, 1))
    check(lambda a: a.expand(2, 3).contiguous(), rand(3))
    check(lambda a, b: torch.broadcast_tensors(a, b), rand(3, 1), rand(1, 4))


# --------------------------------------------------------------------------- reductions

REDUCTIONS = [
    lambda x: x.sum(), lambda x: x.sum(dim=1), lambda x: x.sum(dim=(0, 2), keepdim=True),
    lambda x: x.mean(dim=-1), lambda x: x.prod(dim=1), lambda x: x.amax(dim=0), lambda x: x.amin(dim=(1, 2)),
    lambda x: x.max(), lambda x: x.min(), lambda x: x.max(dim=1), lambda x: x.min(dim=2, keepdim=True),
    lambda x: x.argmax(), lambda x: x.argmax(dim=1), lambda x: x.argmin(dim=-1),
    lambda x: x.std(), lambda x: x.var(dim=1, unbiased=False), lambda x: torch.var_mean(x, dim=0),
    lambda x: x.norm(), lambda x: x.norm(p=1, dim=2), lambda x: torch.logsumexp(x, dim=1),
    lambda x: (x > 0).all(), lambda x: (x > 0).any(dim=1), lambda x: x.sum(dim=1, dtype=torch.float64),
    lambda x: x.count_nonzero(dim=0), lambda x: x.median(dim=1), lambda x: x.aminmax(dim=0),
]


@pytest.mark.parametrize("fn", REDUCTIONS, ids=[f"red{i}" for i in range(len(REDUCTIONS))])
def test_reductions(fn):
    check(fn, rand(4, 5, 6), rtol=1e-5, atol=1e-5)


def test_reductions_noncontiguous():
    check(lambda x: x.transpose(0, 2).sum(dim=0), rand(4, 5, 6), atol=1e-5, rtol=1e-5)
    check(lambda x: x[:, ::2].mean(dim=1), rand(4, 10), atol=1e-5, rtol=1e-5)
    check(lambda x: x.permute(2, 0, 1).max(dim=1), rand(3, 4, 5))


def test_int_reductions():
    x = rand(5, 6, dtype=torch.int32)
    out = check(lambda x: x.sum(), x)
    assert out.dtype == torch.int64  # integral sums promote to int64
    check(lambda x: x.prod(dim=0), x)
    check(lambda x: x.max(dim=1), x)
    check(lambda x: x.cumsum(dim=1), x)


# --------------------------------------------------------------------------- matmul

def test_matmul_family():
    check(torch.mm, rand(5, 7, seed=1), rand(7, 3, seed=2), rtol=1e-5, atol=1e-5)
    check(torch.bmm, rand(4, 5, 7, seed=1), rand(4, 7, 3, seed=2), rtol=1e-5, atol=1e-5)
    check(torch.matmul, rand(2, 4, 5, 7, seed=1), rand(7, 3, seed=2), rtol=1e-5, atol=1e-5)
    check(torch.matmul, rand(3, 1, 5, 7, seed=1), rand(4, 7, 2, seed=2), rtol=1e-5, atol=1e-5)
    check(torch.matmul, rand(7, seed=1), rand(7, seed=2), rtol=1e-5, atol=1e-5)
    check(torch.matmul, rand(5, 7, seed=1), rand(7, seed=2), rtol=1e-5, atol=1e-5)
    check(torch.mv, rand(5, 7, seed=1), rand(7, seed=2), rtol=1e-5, atol=1e-5)
    check(torch.outer, rand(5, seed=1), rand(7, seed=2))
    check(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0), rand(5, 3), rand(5, 7, seed=1), rand(7, 3, seed=2), rtol=1e-5, atol=1e-5)
    check(lambda c, a, b: torch.baddbmm(c, a, b), rand(2, 5, 3), rand(2, 5, 7, seed=1), rand(2, 7, 3, seed=2), rtol=1e-5, atol=1e-5)
    check(F.linear, rand(6, 8), rand(4, 8, seed=1), rand(4, seed=2), rtol=1e-5, atol=1e-5)
    check(lambda a, b: torch.einsum("bij,bjk->bik", a, b), rand(2, 3, 4), rand(2, 4, 5, seed=1), rtol=1e-5, atol=1e-5)
    check(torch.mm, rand(5, 7, dtype=torch.int64), rand(7, 3, dtype=torch.int64, seed=2))


def test_matmul_noncontiguous():
    check(lambda a, b: a.t() @ b, rand(7, 5, seed=1), rand(7, 3, seed=2), rtol=1e-5, atol=1e-5)
    check(lambda a, b: a @ b.t(), rand(5, 7, seed=1), rand(3, 7, seed=2), rtol=1e-5, atol=1e-5)
    check(lambda a, b: a[:, ::2] @ b[1:], rand(5, 14, seed=1), rand(8, 3, seed=2), rtol=1e-5, atol=1e-5)
    check(lambda a, b: torch.bmm(a.transpose(1, 2), b), rand(3, 7, 5, seed=1), rand(3, 7, 2, seed=2), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- indexing

def test_basic_indexing_views():
    x = rand(6, 7, 8)
    check(lambda x: x[1], x)
    check(lambda x: x[:, 2:5], x)
    check(lambda x: x[..., ::3], x)
    check(lambda x: x[None, 1:, :, -1], x)
    check(lambda x: x[-1, -2, -3], x)
    check(lambda x: x[1:4, ::2][:, 1] * 1, x)


def test_advanced_indexing():
    x = rand(6, 7, 8)
    idx = torch.tensor([0, 5, 2, 2])
    check(lambda x, i: x[i], x, idx)
    check(lambda x, i: x[:, i], x, idx)
    check(lambda x, i: x[i, i], x, idx)
    check(lambda x, i: x[i, 1:3, i], x, idx)
    check(lambda x, i: x[i.view(2, 2)], x, idx)
    check(lambda x: x[[1, -1], [0, 2]], x)
    check(lambda x, i: x[-i - 1], x, idx)


def test_cpu_index_tensors_on_neuron_tensor():
    """As on CUDA, advanced indexing accepts index tensors that live on the CPU."""
    x = rand(6, 5)
    xd = x.to(DEV)
    idx = torch.tensor([4, 0, 2])
    mask = x[:, 0] > 0
    out = xd[idx]
    assert out.device.type == "neuron"
    assert_same(out, x[idx])
    assert_same(xd[:, idx], x[:, idx])
    assert_same(xd[mask], x[mask])
    y, yd = x.clone(), xd.clone()
    y[idx] = 3.0
    yd[idx] = 3.0
    assert_same(yd, y)
    y.index_put_((idx,), torch.ones(3, 5), accumulate=True)
    yd.index_put_((idx,), torch.ones(3, 5, device=DEV), accumulate=True)
    assert_same(yd, y)


def test_index_ops():
    x = rand(6, 5)
    idx = torch.tensor([4, 0, 2])
    check(lambda x, i: x.index_select(0, i), x, idx)
    check(lambda x, i: x.index_select(1, i), x, idx)
    check(lambda x, i, s: x.index_add_(0, i, s), x, idx, rand(3, 5, seed=1))
    check(lambda x, i, s: x.index_add(1, i, s, alpha=2), x, idx, rand(6, 3, seed=1))
    check(lambda x, i, s: x.index_copy_(0, i, s), x, idx, rand(3, 5, seed=1))
    check(lambda x, i: x.index_fill_(1, i, -1.0), x, idx)
    check(lambda x, i: torch.take(x, i), x, torch.tensor([0, 29, 7]))
    check(lambda x, i, v: x.put_(i, v), x, torch.tensor([0, 29, 7]), torch.tensor([1.0, 2.0, 3.0]))
    check(lambda x, i, v: x.put_(i, v, accumulate=True), x, torch.tensor([1, 1, 3]), torch.tensor([1.0, 2.0, 3.0]))


def test_index_put():
    x = rand(6, 5)
    idx = torch.tensor([4, 0, 2])
    check(lambda x, i: x.index_put_((i,), torch.tensor(7.0)), x, idx)
    check(lambda x, i, v: x.index_put_((i,), v), x, idx, rand(3, 5, seed=1))
    check(lambda x, i, v: x.index_put_((i,), v, accumulate=True), x, torch.tensor([1, 1, 3]), rand(3, 5, seed=1))
    check(lambda x, i: x.__setitem__((i, slice(1, 3)), 0.5) or x, x, idx)
    check(lambda x: x.__setitem__(x > 0, 0.0) or x, x)


def test_masked_ops():
    x = rand(5, 6)
    m = x > 0.3
    check(lambda x, m: x.masked_fill(m, -9.0), x, m)
    check(lambda x, m: x.masked_fill_(m, torch.tensor(2.0)), x, m)
    check(lambda x, m, s: x.masked_scatter_(m, s), x, m, rand(30, seed=3))
    check(lambda x, m: x.masked_fill(m[0], 1.0), x, m)  # broadcast mask


def test_gather_scatter():
    x = rand(4, 6)
    gi = torch.tensor([[0, 1, 5], [2, 2, 0], [5, 4, 3], [1, 1, 1]])
    check(lambda x, i: torch.gather(x, 1, i), x, gi)
    check(lambda x, i: torch.gather(x, 0, i.clamp(max=3)), x, gi)
    src = rand(4, 3, seed=7)
    si = torch.tensor([[0, 1, 5], [2, 3, 0], [5, 4, 3], [1, 2, 0]])  # unique per row
    check(lambda x, i, s: x.scatter_(1, i, s), x, si, src)
    check(lambda x, i: x.scatter(1, i, 3.5), x, si)
    check(lambda x, i, s: x.scatter_add_(1, i, s), x, gi, src)
    check(lambda x, i, s: x.scatter_reduce(1, i, s, reduce="amax"), x, gi, src)
    check(lambda x, i, s: x.scatter_reduce(1, i, s, reduce="mean", include_self=False), x, gi, src)
    check(lambda x, i, s: x.scatter_(1, i, s, reduce="multiply"), x, si, src)


# --------------------------------------------------------------------------- shape ops

def test_cat_stack_split():
    a, b, c = rand(2, 3, seed=1), rand(4, 3, seed=2), rand(2, 3, seed=3)
    check(lambda a, b: torch.cat([a, b]), a, b)
    check(lambda a, c: torch.cat([a, c], dim=1), a, c)
    check(lambda a, c: torch.cat([a.t(), c.t()], dim=0), a, c)
    check(lambda a, c: torch.cat([a, c.to(torch.float64)]), a, c)  # promotes
    check(lambda a, e: torch.cat([a, e]), a, torch.empty(0))  # legacy empty 1-d is skipped
    check(lambda a, c: torch.stack([a, c]), a, c)
    check(lambda a, c: torch.stack([a, c], dim=2), a, c)
    check(lambda b: torch.split(b, [1, 3]), b)
    check(lambda b: torch.chunk(b, 3, dim=0), b)
    check(lambda b: b.unbind(1), b)
    check(lambda a, b: torch.hstack([a.t(), b.t()]), a, b)
    check(lambda a: a.flip(0).roll(1, dims=1), a)
    check(lambda a: a.repeat(2, 3), a)
    check(lambda a: torch.tril(a.repeat(2, 2)), a)
    check(lambda a: F.pad(a, (1, 2, 0, 1), value=-1.0), a)


def test_cat_out_noncontiguous():
    a, b = rand(2, 3, seed=1), rand(2, 3, seed=2)
    check(lambda a, b, o: torch.cat([a, b], dim=0, out=o.t()), a, b, torch.zeros(3, 4))


def test_where():
    x, y = rand(4, 5, seed=1), rand(4, 5, seed=2)
    check(lambda x, y: torch.where(x > y, x, y), x, y)
    check(lambda x: torch.where(x > 0, x, 0.0), x)
    check(lambda x: torch.where(x > 0, 1, 0), x)
    check(lambda x, y: torch.where(x > 0, x, y.double()), x, y)
    check(lambda x, y: torch.where((x > 0)[:, :1], x, y[0]), x, y)


def test_sort_topk():
    x = torch.randperm(60, generator=torch.Generator().manual_seed(0)).float().view(6, 10)
    check(lambda x: torch.sort(x, dim=1), x)
    check(lambda x: torch.sort(x, dim=0, descending=True), x)
    check(lambda x: torch.argsort(x, dim=-1), x)
    check(lambda x: torch.topk(x, 3, dim=1), x)
    check(lambda x: torch.topk(x, 2, dim=0, largest=False), x)
    check(lambda x: torch.kthvalue(x, 4, dim=1), x)
    d = torch.tensor([3, 1, 2, 1, 3, 3, 0, 2])  # duplicates: stable sort pins the indices
    check(lambda d: torch.sort(d, stable=True), d)
    check(lambda d: torch.sort(d, stable=True, descending=True), d)
    check(lambda x: torch.sort(x.t(), dim=1), x)
    check(lambda e: torch.sort(e), torch.empty(0))


def test_cumulative():
    x = rand(4, 7)
    check(lambda x: torch.cumsum(x, dim=1), x, rtol=1e-5, atol=1e-5)
    check(lambda x: torch.cumsum(x, dim=0, dtype=torch.float64), x)
    check(lambda x: torch.cumprod(x, dim=1), x, rtol=1e-5, atol=1e-5)
    check(lambda x: torch.cummax(x, dim=1), x)
    check(lambda x: torch.logcumsumexp(x, dim=0), x, rtol=1e-5, atol=1e-5)
    check(lambda x: x.cumsum_(dim=1), x, rtol=1e-5, atol=1e-5)
    check(lambda x: torch.cumsum(x.t(), dim=1), x, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- nn functional

def test_softmax_family():
    x = rand(4, 9)
    check(lambda x: torch.softmax(x, dim=-1), x)
    check(lambda x: torch.softmax(x, dim=0), x)
    check(lambda x: F.log_softmax(x, dim=1), x)
    check(lambda x: F.softmax(x, dim=1, dtype=torch.float64), x)
    check(lambda x: torch.softmax(x.t(), dim=1), x)
    check(lambda x, t: F.cross_entropy(x, t), x, torch.tensor([0, 8, 3, 3]))
    check(lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1, reduction="none"), x, torch.tensor([0, 8, 3, 3]))
    check(lambda x, t: F.nll_loss(F.log_softmax(x, 1), t, ignore_index=3), x, torch.tensor([0, 8, 3, 3]))


def test_conv2d():
    x, w, b = rand(2, 4, 9, 9), rand(6, 4, 3, 3, seed=1), rand(6, seed=2)
    tol = dict(rtol=1e-4, atol=1e-4)
    check(F.conv2d, x, w, b, **tol)
    check(lambda x, w: F.conv2d(x, w, stride=2, padding=1), x, w, **tol)
    check(lambda x, w: F.conv2d(x, w, padding="same", dilation=2), x, w, **tol)
    check(lambda x, w: F.conv2d(x, w, groups=2), x, rand(6, 2, 3, 3, seed=3), **tol)
    check(lambda x, w: F.conv2d(x.permute(0, 1, 3, 2), w), x, w, **tol)
    check(lambda x, w: F.conv2d(x.contiguous(memory_format=torch.channels_last), w), x, w, **tol)
    check(lambda x, w: F.conv_transpose2d(x, w, stride=2), x, rand(4, 3, 3, 3, seed=4), **tol)
    check(lambda x, w: F.conv1d(x, w, padding=1), rand(2, 4, 11), rand(5, 4, 3, seed=1), **tol)


def test_pooling():
    x = rand(2, 3, 8, 8)
    check(lambda x: F.max_pool2d(x, 2), x)
    check(lambda x: F.max_pool2d(x, 3, stride=2, padding=1, return_indices=True), x)
    check(lambda x: F.max_pool2d(x, 2, ceil_mode=True), rand(1, 2, 7, 7))
    check(lambda x: F.avg_pool2d(x, 3, stride=1, padding=1), x)
    check(lambda x: F.adaptive_avg_pool2d(x, (3, 5)), x)
    check(lambda x: F.adaptive_max_pool2d(x, 1), x)
    check(lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), x)
    check(lambda x: F.interpolate(x, size=(5, 11), mode="bilinear", align_corners=False), x, rtol=1e-5, atol=1e-5)


def test_embedding():
    w = rand(10, 4)
    idx = torch.tensor([[0, 9, 3], [3, 3, 1]])
    check(F.embedding, idx, w)
    check(lambda i, w: F.embedding(i, w, padding_idx=3), idx, w)
    check(lambda i, w: F.embedding_bag(i, w, mode="mean"), idx, w)
    check(lambda i, w: torch.nn.functional.one_hot(i, 10), idx, w)


def test_layer_norm_group_norm():
    x = rand(3, 5, 8)
    check(lambda x: F.layer_norm(x, (8,)), x, rtol=1e-5, atol=1e-5)
    check(lambda x, w, b: F.layer_norm(x, (5, 8), w, b), x, rand(5, 8, seed=1), rand(5, 8, seed=2), rtol=1e-5, atol=1e-5)
    check(lambda x: F.layer_norm(x.transpose(1, 2), (5,)), x, rtol=1e-5, atol=1e-5)
    check(lambda x: F.rms_norm(x, (8,), eps=1e-6), x, rtol=1e-5, atol=1e-5)
    check(lambda x, w, b: F.group_norm(x, 2, w, b), rand(2, 6, 4, 4), rand(6, seed=1), rand(6, seed=2), rtol=1e-5, atol=1e-5)


def test_batch_norm_training_updates_running_stats():
    x = rand(4, 3, 5, 5)
    rm, rv = rand(3, seed=1), pos(3, seed=2)
    w, b = rand(3, seed=3), rand(3, seed=4)

    def bn_train(x, rm, rv, w, b):
        return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.2)

    check(bn_train, x, rm, rv, w, b, rtol=1e-5, atol=1e-5)  # also compares the updated rm, rv
    check(lambda x, rm, rv: F.batch_norm(x, rm, rv, training=False), x, rm, rv, rtol=1e-5, atol=1e-5)
    check(lambda x: F.batch_norm(x, None, None, training=True), rand(6, 4), rtol=1e-5, atol=1e-5)


def test_batch_norm_module_matches_cpu():
    torch.manual_seed(0)
    ref = torch.nn.BatchNorm2d(3)
    dev = torch.nn.BatchNorm2d(3).to(DEV)
    for i in range(3):
        x = rand(4, 3, 6, 6, seed=i)
        assert_same(dev(x.to(DEV)), ref(x), rtol=1e-5, atol=1e-5)
    assert_same(dev.running_mean, ref.running_mean, rtol=1e-5, atol=1e-6)
    assert_same(dev.running_var, ref.running_var, rtol=1e-5, atol=1e-6)
    assert_same(dev.num_batches_tracked, ref.num_batches_tracked)


def test_dropout_p0_and_eval_is_identity():
    x = rand(5, 6)
    check(lambda x: F.dropout(x, p=0.0, training=True), x)
    check(lambda x: F.dropout(x, p=0.7, training=False), x)
    check(lambda x: torch.nn.Dropout(0.0)(x), x)


def test_misc_nn_ops():
    x = rand(3, 4, 5)
    check(lambda x: F.scaled_dot_product_attention(x, x, x, is_causal=True), x, rtol=1e-5, atol=1e-5)
    check(lambda x: F.normalize(x, dim=-1), x, rtol=1e-5, atol=1e-5)
    check(lambda x: F.cosine_similarity(x[0], x[1], dim=-1), x, rtol=1e-5, atol=1e-5)
    check(lambda x: torch.cdist(x, x), x, rtol=1e-4, atol=1e-4)
    check(lambda x, t: F.binary_cross_entropy_with_logits(x, t), x, rand(3, 4, 5, seed=1).sigmoid())


# --------------------------------------------------------------------------- in place and views

def test_in_place_on_views():
    x = rand(4, 5)
    check(lambda x: x[:, 1].add_(1), x)
    check(lambda x: x.t().mul_(2), x)
    check(lambda x: x[1:3, ::2].zero_(), x)
    check(lambda x: x.diagonal().fill_(7.0), x)
    check(lambda x: x.view(20)[3:9].sub_(1.5), x)
    check(lambda x: x.unsqueeze(0).transpose(1, 2)[0, 2].neg_(), x)
    check(lambda x: x.narrow(1, 2, 2).copy_(torch.ones(4, 2)), x)
    check(lambda x: x.as_strided((2, 2), (5, 2), 1).add_(10), x)
    check(lambda x: x.flatten()[::3].clamp_(min=0), x)
    check(lambda x: x[..., -1:].exp_(), x)


def test_view_aliasing_is_live():
    """A view of a neuron tensor sees later in-place writes to its base and vice versa."""
    x = rand(4, 6)
    xd = x.to(DEV)
    v, vd = x[1:, ::2], xd[1:, ::2]
    t, td = x.t(), xd.t()
    assert vd._base is xd and vd.storage_offset() == v.storage_offset()
    xd.mul_(3); x.mul_(3)
    vd.add_(1); v.add_(1)
    td[0].zero_(); t[0].zero_()
    assert_same(xd, x)
    assert_same(vd, v)
    assert_same(td, t)
    assert vd.untyped_storage().data_ptr() == xd.untyped_storage().data_ptr()


def test_view_ops_metadata():
    x = rand(2, 3, 4)
    check(lambda x: x.view(6, 4), x, check_stride=True)
    check(lambda x: x.permute(2, 0, 1), x, check_stride=True)
    check(lambda x: x.transpose(0, 2), x, check_stride=True)
    check(lambda x: x[:, 1:, ::2], x, check_stride=True)
    check(lambda x: x.unflatten(2, (2, 2)), x, check_stride=True)
    check(lambda x: x.expand(5, 2, 3, 4), x, check_stride=True)
    check(lambda x: x.unfold(2, 2, 1), x, check_stride=True)
    check(lambda x: x.permute(2, 0, 1).reshape(4, 6), x)  # copies
    check(lambda x: x.permute(2, 0, 1).contiguous(), x, check_stride=True)
    check(lambda x: x.movedim(0, -1).flatten(), x)
    check(lambda x: x.squeeze().unsqueeze(1), rand(1, 3, 1, 2))
    check(lambda x: x.view(torch.int32), x)  # dtype reinterpretation view
    check(lambda x: x.view(torch.complex64).imag, rand(2, 4))


def test_in_place_ops_and_dtypes():
    x = rand(3, 4)
    check(lambda x: x.add_(x), x)  # aliasing input and output
    check(lambda x: x.mul_(x.t().t()), x)
    check(lambda x: x.sigmoid_().pow_(2), x)
    check(lambda x, y: x.copy_(y), x, rand(3, 4, dtype=torch.float64))
    check(lambda x, y: x.add_(y), x, rand(3, 4, dtype=torch.int64))
    check(lambda i: i.add_(2).mul_(3), rand(3, 4, dtype=torch.int32))
    # in-place that would need to promote the result type is an error, same as CPU
    i = rand(3, 4, dtype=torch.int64)
    with pytest.raises(RuntimeError):
        i.add_(1.5)
    with pytest.raises(RuntimeError):
        i.to(DEV).add_(1.5)
        torch.neuron.synchronize()


def test_noncontiguous_inputs():
    x = rand(6, 8)
    check(lambda x: x.t().exp(), x, check_stride=True)
    check(lambda x: x[::2, 1::3] * x[1::2, ::3], x)
    check(lambda x: x.t() + x[:, :6].t().t().t()[:, :6], rand(6, 6))
    check(lambda x: torch.sin(x.expand(4, 6, 8)), x)
    check(lambda x: x.unsqueeze(1).expand(6, 3, 8).sum(1), x)


def test_zero_dim_and_empty_tensors():
    s = torch.tensor(3.5)
    check(lambda s: s * 2, s)
    check(lambda s: s.exp(), s)
    check(lambda s, x: s + x, s, rand(3))
    check(lambda s: s.view(1, 1), s)
    check(lambda s: s.sum(), s)
    e = torch.empty(0, 4)
    check(lambda e: e + 1, e)
    check(lambda e: e.sum(dim=0), e)
    check(lambda e: e.sum(), e)
    check(lambda e: e.prod(), e)
    check(lambda e: e.mean(dim=1), e)
    check(lambda e, x: torch.cat([e, x]), e, rand(2, 4))
    check(lambda e, w: e @ w, e, rand(4, 3))
    check(lambda a, b: a @ b, rand(3, 0), rand(0, 2))  # sum over empty: zeros
    check(lambda e: e.t().contiguous(), e)
    check(lambda e: e.max(dim=1), e)
    check(lambda e: e.reshape(0, 2, 2), e)
    with pytest.raises(RuntimeError):
        e.max()
    with pytest.raises(RuntimeError):
        e.to(DEV).max()
        torch.neuron.synchronize()


# --------------------------------------------------------------------------- out=

def test_out_variants():
    a, b = rand(3, 4, seed=1), rand(3, 4, seed=2)
    check(lambda a, b, o: torch.add(a, b, out=o), a, b, torch.empty(3, 4))
    check(lambda a, b, o: torch.mul(a, b, out=o.t()), a, b, torch.empty(4, 3))  # non-contiguous out
    check(lambda a, o: torch.sum(a, dim=1, out=o), a, torch.empty(3))
    check(lambda a, b, o: torch.mm(a, b.t(), out=o), a, b, torch.empty(3, 3))
    check(lambda a, o: torch.exp(a, out=o), a, torch.empty(3, 4, dtype=torch.float64))  # out dtype wider
    check(lambda a, v, i: torch.max(a, dim=1, out=(v, i)), a, torch.empty(3), torch.empty(3, dtype=torch.long))
    check(lambda a, v, i: torch.sort(a, dim=1, out=(v, i)), a, torch.empty(3, 4), torch.empty(3, 4, dtype=torch.long))


@pytest.mark.parametrize("out_shape", [(0,), (2,), (5, 5), (12,)], ids=str)
def test_out_wrong_size_is_resized(out_shape):
    a, b = rand(3, 4, seed=1), rand(3, 4, seed=2)
    o_cpu, o_dev = torch.full(out_shape, 9.0), torch.full(out_shape, 9.0, device=DEV)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # non-empty outs that get resized warn, as on CPU
        r_cpu = torch.add(a, b, out=o_cpu)
        r_dev = torch.add(a.to(DEV), b.to(DEV), out=o_dev)
    assert r_dev is o_dev
    assert o_dev.shape == o_cpu.shape == (3, 4)
    assert_same(o_dev, o_cpu)
    # and for an op with a planner-computed shape
    m_cpu, m_dev = torch.empty(out_shape), torch.empty(out_shape, device=DEV)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.matmul(a, b.t(), out=m_cpu)
        torch.matmul(a.to(DEV), b.to(DEV).t(), out=m_dev)
    assert_same(m_dev, m_cpu, rtol=1e-5, atol=1e-5)


def test_out_resize_warns_like_cpu():
    a = rand(3, 4)
    for dev in ("cpu", DEV):
        with pytest.warns(UserWarning, match="resized"):
            torch.neg(a.to(dev), out=torch.empty(5, device=dev))


def test_out_wrong_dtype_raises_like_cpu():
    a = rand(3, 4)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.add(a, a, out=torch.empty(3, 4, dtype=torch.long))
    ad = a.to(DEV)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.add(ad, ad, out=torch.empty(3, 4, dtype=torch.long, device=DEV))
        torch.neuron.synchronize()
    assert_same(ad * 2, a * 2)


# --------------------------------------------------------------------------- data-dependent ops

def test_data_dependent_ops():
    x = rand(5, 6)
    x[x.abs() < 0.5] = 0
    check(torch.nonzero, x)
    check(lambda x: torch.nonzero(x, as_tuple=True), x)
    check(lambda x: torch.argwhere(x), x)
    check(lambda x: x.masked_select(x > 0.2), x)
    check(lambda x: x[x > 0.2], x)
    check(lambda x: x[x[:, 0] > 0], x)
    check(lambda x: x[:, x[0] >= 0] * 2, x)
    i = torch.tensor([3, 1, 3, 3, 0, 1, 7])
    check(torch.unique, i)
    check(lambda i: torch.unique(i, return_inverse=True, return_counts=True), i)
    check(lambda i: torch.unique(i, sorted=True, return_counts=True), i)
    check(lambda i: torch.unique_consecutive(i, return_counts=True), i)
    check(lambda x: torch.unique(x.round(), dim=0), x)
    check(lambda a, r: torch.repeat_interleave(a, r), torch.arange(4), torch.tensor([2, 0, 1, 3]))
    check(lambda x, r: torch.repeat_interleave(x[:4], r, dim=0), x, torch.tensor([2, 0, 1, 3]))
    check(lambda r: torch.repeat_interleave(r), torch.tensor([2, 0, 1, 3]))
    check(lambda x: torch.bincount(x), torch.tensor([0, 4, 4, 1, 0, 4]))
    check(lambda e: torch.nonzero(e), torch.zeros(3, 0))
    check(lambda x: x[x > 100], x)  # empty result


def test_item_and_tolist():
    x = rand(3, 4)
    xd = x.to(DEV)
    assert xd.sum().item() == pytest.approx(x.sum().item(), rel=1e-6)
    assert xd[1, 2].item() == x[1, 2].item()
    assert xd.tolist() == x.tolist()
    assert xd.t().tolist() == x.t().tolist()
    assert xd[:, ::2].tolist() == x[:, ::2].tolist()
    i = rand(5, dtype=torch.int64)
    assert i.to(DEV).tolist() == i.tolist()
    assert isinstance(i.to(DEV)[0].item(), int)
    assert torch.tensor(True, device=DEV).item() is True
    assert torch.tensor(2.5, dtype=torch.bfloat16, device=DEV).item() == 2.5
    assert torch.tensor(1 + 2j, device=DEV).item() == 1 + 2j
    assert torch.tensor(7, device=DEV).tolist() == 7
    assert int(xd.argmax()) == int(x.argmax())
    assert float(xd[0, 0]) == float(x[0, 0])
    assert bool(xd[0, 0] > 0) == bool(x[0, 0] > 0)
    # .item() observes the result of every preceding asynchronous op
    acc = torch.zeros((), device=DEV)
    for k in range(50):
        acc.add_(k)
    assert acc.item() == sum(range(50))


def test_factories_on_device():
    for fn in (
        lambda d: torch.zeros(3, 4, device=d), lambda d: torch.ones(2, dtype=torch.int8, device=d),
        lambda d: torch.full((2, 3), 1.5, device=d), lambda d: torch.arange(10, device=d),
        lambda d: torch.arange(1, 4, 0.5, device=d), lambda d: torch.linspace(0, 1, 7, device=d),
        lambda d: torch.eye(3, 5, device=d), lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
        lambda d: torch.zeros_like(torch.ones(2, 2, device=d)), lambda d: torch.empty(2, 3, device=d).fill_(2),
        lambda d: torch.triu(torch.ones(4, 4, device=d), 1), lambda d: torch.tensor(5.0, device=d),
    ):
        assert_same(fn(DEV), fn("cpu"))


# --------------------------------------------------------------------------- device mismatch

def test_device_mismatch_neuron_vs_cpu():
    xd = torch.ones(3, 4, device=DEV)
    c = torch.ones(3, 4)
    with pytest.raises(RuntimeError, match="same device") as ei:
        torch.add(xd, c)
    assert "add" in str(ei.value), f"error does not name the op: {ei.value}"
    with pytest.raises(RuntimeError, match="same device") as ei:
        torch.mm(xd, c.t())
    assert "mm" in str(ei.value), f"error does not name the op: {ei.value}"
    with pytest.raises(RuntimeError, match="same device"):
        c + xd
    with pytest.raises(RuntimeError, match="same device"):
        xd.index_select(0, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="same device"):
        torch.cat([xd, c])
    # the device tensor is intact
    assert xd.sum().item() == 12


def test_device_mismatch_between_neuron_devices():
    if torch.neuron.device_count() < 2:
        pytest.fail("these tests expect at least two neuron devices (NEURON_RT_NUM_CORES default 2)")
    a = torch.ones(3, 4, device="neuron:0")
    b = torch.ones(3, 4, device="neuron:1")
    with pytest.raises(RuntimeError, match="same device") as ei:
        torch.mul(a, b)
    assert "mul" in str(ei.value), f"error does not name the op: {ei.value}"
    with pytest.raises(RuntimeError, match="same device"):
        torch.mm(a, b.t())
    with pytest.raises(RuntimeError, match="same device"):
        a.add_(b)
    with pytest.raises(RuntimeError, match="same device"):
        torch.add(a, a, out=torch.empty(3, 4, device="neuron:1"))
    assert a.sum().item() == 12 and b.sum().item() == 12


def test_ops_on_second_device_stay_there():
    if torch.neuron.device_count() < 2:
        pytest.fail("these tests expect at least two neuron devices")
    x, y = rand(4, 5, seed=1), rand(5, 3, seed=2)
    xd, yd = x.to("neuron:1"), y.to("neuron:1")
    out = torch.relu(xd @ yd).sum(dim=0)
    assert out.device == torch.device("neuron", 1)
    torch.testing.assert_close(out.cpu(), torch.relu(x @ y).sum(dim=0))
    assert torch.neuron.current_device() == 0


# --------------------------------------------------------------------------- bad input

def _raises_like_cpu(fn, *args):
    """``fn`` raises on CPU; on neuron it raises the same exception type (at the
    call or at the next synchronisation), and the device keeps working."""
    dev_args = _to_dev(args)
    with pytest.raises(Exception) as cpu_err:
        fn(*args)
    keep = rand(7, 3, seed=11)
    keep_d = keep.to(DEV)
    with pytest.raises(cpu_err.type):
        fn(*dev_args)
        torch.neuron.synchronize()
    # afterwards: the device works, and existing tensors (including the failed op's inputs) are intact
    torch.neuron.synchronize()
    assert_same(keep_d, keep)
    assert_same(dev_args, args)
    assert_same(keep_d * 2 + 1, keep * 2 + 1)
    return cpu_err.type


def test_bad_input_shape_mismatch():
    assert _raises_like_cpu(torch.add, rand(3, 4), rand(5)) is RuntimeError
    assert _raises_like_cpu(torch.mm, rand(3, 4), rand(3, 4)) is RuntimeError
    assert _raises_like_cpu(lambda a, b: torch.cat([a, b], dim=0), rand(3, 4), rand(3, 5)) is RuntimeError
    assert _raises_like_cpu(lambda a: a.view(5, 3), rand(3, 4)) is RuntimeError
    assert _raises_like_cpu(lambda a, b: a.add_(b), rand(3, 1), rand(3, 4)) is RuntimeError


def test_bad_input_index_out_of_range():
    x = rand(3, 4)
    assert _raises_like_cpu(lambda x, i: x.index_select(0, i), x, torch.tensor([0, 5])) is IndexError
    assert _raises_like_cpu(lambda x, i: torch.gather(x, 0, i), x, torch.tensor([[0, 5]])) is RuntimeError
    assert _raises_like_cpu(F.embedding, torch.tensor([1, 9]), x) is IndexError
    assert _raises_like_cpu(lambda x, i: x[i], x, torch.tensor([7])) is IndexError
    assert _raises_like_cpu(lambda x, i: x.scatter(1, i, 1.0), x, torch.tensor([[9]])) is RuntimeError


def test_error_surfaces_at_item_and_cpu_and_device_recovers():
    x = rand(3, 4)
    xd = x.to(DEV)
    bad = torch.tensor([0, 5], device=DEV)
    with pytest.raises(IndexError):
        xd.index_select(0, bad).cpu()
    with pytest.raises(IndexError):
        xd.index_select(0, bad).sum().item()
    # the failing op did not corrupt its input, and later work runs normally
    assert_same(xd, x)
    y = (xd @ xd.t()).relu()
    assert_same(y, (x @ x.t()).relu(), rtol=1e-5, atol=1e-5)
    # an error is reported once: the next synchronisation is clean
    torch.neuron.synchronize()


def test_error_on_second_device_does_not_affect_first():
    if torch.neuron.device_count() < 2:
        pytest.fail("these tests expect at least two neuron devices")
    x = rand(3, 4)
    x0, x1 = x.to("neuron:0"), x.to("neuron:1")
    with pytest.raises(IndexError):
        x1.index_select(0, torch.tensor([8], device="neuron:1"))
        torch.neuron.synchronize(1)
    assert_same(x0 + 1, x + 1)
    assert_same(x1 + 1, x + 1)


# ---- regressions found in review -------------------------------------------------


def test_conjugate_and_negative_views_copy_and_compute():
    z = torch.randn(3, dtype=torch.complex64)
    zn = z.to("neuron")
    torch.testing.assert_close(zn.conj().cpu(), z.conj())
    torch.testing.assert_close((zn.conj() * 2).cpu(), z.conj() * 2)
    y = torch.empty(3, dtype=torch.complex64, device="neuron")
    y.copy_(zn.conj())
    torch.testing.assert_close(y.cpu(), z.conj())
    r = torch.randn(3)
    torch.testing.assert_close(torch._neg_view(r.to("neuron")).cpu(), -r)


def test_cpu_scalar_cannot_be_written_by_a_neuron_op():
    c = torch.tensor(1.0)
    with pytest.raises(RuntimeError, match="same device"):
        c.add_(torch.tensor(2.0, device="neuron"))
    assert c.item() == 1.0


def test_out_argument_resized_by_a_synchronous_op():
    x = torch.tensor([0.0, 1, 0, 2])
    out = torch.empty(0, dtype=torch.long, device="neuron")
    torch.nonzero(x.to("neuron"), out=out)
    assert torch.equal(out.cpu(), torch.nonzero(x))


@pytest.mark.parametrize("op", ["copy_", "add_"])
def test_partial_overlap_between_written_and_read_arguments_raises(op):
    x = torch.arange(8.0)
    with pytest.raises(RuntimeError, match="unsupported operation") as cpu_error:
        getattr(x[1:], op)(x[:-1])
    xd = torch.arange(8.0, device="neuron")
    with pytest.raises(type(cpu_error.value), match="unsupported operation"):
        getattr(xd[1:], op)(xd[:-1])
    torch.testing.assert_close(xd.cpu(), torch.arange(8.0))


def test_binary_cross_entropy_reduction():
    # The CPU out= kernel uses its output as scratch and returns a wrong
    # reduction; the device must give the functional kernel's answer.
    x, t = torch.rand(5), torch.rand(5)
    for reduction in ("mean", "sum", "none"):
        expected = F.binary_cross_entropy(x, t, reduction=reduction)
        got = F.binary_cross_entropy(x.to("neuron"), t.to("neuron"), reduction=reduction)
        torch.testing.assert_close(got.cpu(), expected)


def test_native_batch_norm_inference_outputs():
    x, w, b = torch.randn(4, 3, 5), torch.randn(3), torch.randn(3)
    mean, var = torch.randn(3), torch.rand(3) + 0.5
    expected = torch.native_batch_norm(x, w, b, mean, var, False, 0.1, 1e-5)
    got = torch.native_batch_norm(*(a.to("neuron") for a in (x, w, b, mean, var)), False, 0.1, 1e-5)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g.cpu(), e)


def test_lstsq_strided_solution_layout():
    # The solution's planned layout has a padded leading dimension: the
    # device output must get the storage that layout needs.
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    expected = torch.linalg.lstsq(a, b, driver="gels").solution
    got = torch.linalg.lstsq(a.to("neuron"), b.to("neuron"), driver="gels").solution
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-4)


def test_out_aliasing_an_input_is_rejected_like_cpu():
    # gather's out= may not alias its input at all (a full alias too), and
    # an out= resized onto the index's memory overlaps it partially.
    src, ind = torch.rand(6), torch.tensor([2, 1, 0])
    for device in ("cpu", DEV):
        s, i = src.to(device), ind.to(device)
        with pytest.raises(RuntimeError, match="unsupported operation"):
            torch.gather(s, 0, i, out=s)
            torch.neuron.synchronize()
        idx = ind.to(device).clone()
        with pytest.raises(RuntimeError, match="unsupported operation"):
            torch.gather(idx.clone(), 0, idx[1:], out=idx[:1])
            torch.neuron.synchronize()
    assert_same(torch.gather(src.to(DEV), 0, ind.to(DEV)), torch.gather(src, 0, ind))


def test_kernel_flipping_the_conjugate_bit_of_its_output():
    # linalg_lu_solve(left=False) on complex input leaves a conjugated view
    # in its output; the device tensor must hold the conjugated values.
    a, b = torch.randn(3, 3, dtype=torch.complex64), torch.randn(4, 3, dtype=torch.complex64)
    lu, pivots = torch.linalg.lu_factor(a)
    for adjoint in (False, True):
        expected = torch.linalg.lu_solve(lu, pivots, b, left=False, adjoint=adjoint)
        got = torch.linalg.lu_solve(lu.to(DEV), pivots.to(DEV), b.to(DEV), left=False, adjoint=adjoint)
        torch.testing.assert_close(got.cpu(), expected)
        out = torch.empty(4, 3, dtype=torch.complex64, device=DEV)
        torch.linalg.lu_solve(lu.to(DEV), pivots.to(DEV), b.to(DEV), left=False, adjoint=adjoint, out=out)
        torch.testing.assert_close(out.cpu(), expected)


def test_attention_uses_the_fused_kernel_cpu_would():
    import torchneuron

    q = torch.randn(2, 4, 8, 16, dtype=torch.bfloat16, requires_grad=True)
    qd = q.detach().to(DEV).requires_grad_()
    torchneuron.clear_op_tracking()
    out = F.scaled_dot_product_attention(qd, qd, qd, is_causal=True)
    out.sum().backward()
    ops = torchneuron.get_executed_ops()
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops, ops
    assert "aten::bmm" not in ops  # not the unfused math path
    expected = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    expected.sum().backward()
    torch.testing.assert_close(out.cpu(), expected)
    torch.testing.assert_close(qd.grad.cpu(), q.grad)


def test_meta_kernel_disagreeing_with_cpu_is_right_from_the_first_call():
    # Their Meta kernels plan other output shapes than the CPU kernels give
    # (a 0-dim loss for a 1-d input; embedding_bag's offset2bag): the first
    # call of the signature finds out and already returns CPU's results.
    x, y = torch.randn(4), torch.tensor([3, 0, -1, 1])
    expected = F.multilabel_margin_loss(x, y, reduction="none")
    got = F.multilabel_margin_loss(x.to(DEV), y.to(DEV), reduction="none")
    assert got.shape == expected.shape
    torch.testing.assert_close(got.cpu(), expected)
    weight, idx, offsets = torch.randn(10, 3), torch.tensor([1, 2, 4, 5, 4, 3]), torch.tensor([0, 2])
    for mode in ("sum", "max"):
        expected = torch.ops.aten._embedding_bag(weight, idx, offsets, False, {"sum": 0, "max": 2}[mode])
        got = torch.ops.aten._embedding_bag(weight.to(DEV), idx.to(DEV), offsets.to(DEV), False,
                                            {"sum": 0, "max": 2}[mode])
        for e, g in zip(expected, got):
            assert g.shape == e.shape, mode
            torch.testing.assert_close(g.cpu(), e)


def test_nonzero_lays_out_indices_by_column_as_devices_and_fake_tensors_do():
    x = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 4.0]])
    out = torch.nonzero(x.to("neuron"))
    assert out.stride() == (1, 4)  # what torch.compile's fake tensors plan (CUDA's layout)
    assert out.cpu().tolist() == torch.nonzero(x).tolist()


def test_new_scalar_values_reuse_the_output_plan_of_pointwise_and_foreach_ops():
    """An optimizer passes new scalars every step (bias corrections): for ops
    whose output shapes cannot depend on them, a new value must not plan the
    op again. A new plan shows as a wait in the profiler: the first run of a
    plan is checked against the CPU kernel before the launch returns."""
    from torch.profiler import ProfilerActivity, profile

    from torchneuron import _C

    xs = [torch.randn(8, 8) for _ in range(3)]
    ds = [x.to("neuron") for x in xs]
    torch._foreach_mul(ds, [1.0, 1.0, 1.0])
    ds[0].add(ds[1], alpha=1.0).clamp(min=0.0)
    results = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]):
        for step in range(1, 4):
            scalars = [1.0 + step / 10, 2.0 - step / 7, 0.5 * step]
            results.append((scalars, torch._foreach_mul(ds, scalars),
                            ds[0].add(ds[1], alpha=step / 3).clamp(min=step / 10)))
        torch.neuron.synchronize()
    syncs = _C._profiler_last_trace()["syncs"]["what"]
    assert "first call of an op (checks its output plan)" not in syncs, syncs
    for scalars, products, clamped in results:
        for p, x, c in zip(products, xs, scalars):
            torch.testing.assert_close(p.cpu(), x * c)
        step = round(scalars[2] * 2)
        torch.testing.assert_close(clamped.cpu(), xs[0].add(xs[1], alpha=step / 3).clamp(min=step / 10))
    # A value that does change the shape is still planned per value.
    assert torch.arange(0.0, 2.5, 0.5, device="neuron").shape == (5,)
    assert torch.arange(0.0, 2.5, 0.25, device="neuron").shape == (10,)


def test_module_to_keeps_parameters_and_weight_tying():
    """``Module.to`` keeps each Parameter object (``param.data = moved``), as
    it does for CUDA: shared weights stay shared, on the way there and back."""
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, head)
    param = emb.weight
    model.to(DEV)
    assert emb.weight is param and head.weight is emb.weight and param.device.type == DEV
    model(torch.tensor([[1, 2]], device=DEV)).sum().backward()
    ref = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    ref[0].weight = torch.nn.Parameter(param.detach().cpu())
    ref[1].weight = ref[0].weight
    ref(torch.tensor([[1, 2]])).sum().backward()
    torch.testing.assert_close(param.grad.cpu(), ref[0].weight.grad)
    model.cpu()
    assert emb.weight is param and head.weight is param and param.device.type == "cpu"
    assert param.grad.device.type == "cpu"
    param.data = param.data.to(DEV)               # what fully_shard does to host parameters
    assert param.device.type == DEV and head.weight is param


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.float32])
def test_histc_of_integers_counts_like_cuda(dtype):
    """CUDA's histc takes integers (MoE routers count tokens per expert with
    it) and returns the input's dtype; the CPU kernel rejects them."""
    values = torch.tensor([0, 1, 1, 3, 7, 3, 3, 9], dtype=dtype)
    got = torch.histc(values.to(DEV), bins=4, min=0, max=4)
    assert got.dtype == dtype
    torch.testing.assert_close(got.cpu(), torch.histc(values.double(), bins=4, min=0, max=4).to(dtype))


@pytest.mark.parametrize("expr", [
    lambda u, i, f: u + 5.5,                # a Python float with an integer tensor
    lambda u, i, f: i / i,                  # true division of integers
    lambda u, i, f: 1j * f,                 # a Python complex
    lambda u, i, f: torch.arange(3, device=f.device) * 0.5,
])
def test_output_dtypes_follow_the_default_dtype_of_each_call(expr):
    """The cached output plan of an op must not keep the default dtype of its first call."""
    u = torch.tensor([0, 0, 1], dtype=torch.uint8)
    i = torch.tensor([1, 2, 3])
    f = torch.ones(3)
    previous = torch.get_default_dtype()
    try:
        for default in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(default)
            want = expr(u, i, f.to(default))
            got = expr(u.to("neuron"), i.to("neuron"), f.to(default).to("neuron"))
            assert got.dtype == want.dtype, f"default {default}: {got.dtype} != {want.dtype}"
            torch.testing.assert_close(got.cpu(), want)
    finally:
        torch.set_default_dtype(previous)


# The other global state a Meta kernel or the launch path may read, each
# flipped between two calls of the same op (issue 27 part 1). CPU is the
# reference for what each call returns.
def _flip_grad_mode(device):
    x = torch.ones(3, device=device, requires_grad=True)
    seen = []
    for enabled in (False, True, False):
        with torch.set_grad_enabled(enabled):
            y = x * 2
        seen.append((y.requires_grad, y.grad_fn is not None))
    y.sum().backward() if y.requires_grad else (x * 2).sum().backward()
    return seen, x.grad.cpu()


def _flip_inference_mode(device):
    x = torch.ones(3, device=device)
    seen = []
    for inference in (True, False, True):
        with torch.inference_mode(inference):
            y = x + 1
        seen.append(y.is_inference())
    return seen, y.cpu()


def _flip_deterministic(device):
    previous = torch.are_deterministic_algorithms_enabled()
    seen = []
    try:
        for on in (False, True, False, True):
            torch.use_deterministic_algorithms(on)
            e = torch.empty(4, device=device)  # filled with NaN when deterministic
            if on:
                seen.append(bool(e.isnan().all().cpu()))
            i = torch.tensor([0, 0, 1], device=device)
            t = torch.zeros(2, device=device).index_put_((i,), torch.ones(3, device=device), accumulate=True)
            seen.append(t.cpu().tolist())
    finally:
        torch.use_deterministic_algorithms(previous)
    return seen


@pytest.mark.parametrize("flip", [_flip_grad_mode, _flip_inference_mode, _flip_deterministic],
                         ids=["grad mode", "inference mode", "deterministic algorithms"])
def test_global_state_flipped_between_calls_of_one_op_matches_cpu(flip):
    want, got = flip("cpu"), flip(DEV)
    assert str(got) == str(want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("make", [lambda: torch.nn.LayerNorm(8), lambda: torch.nn.BatchNorm1d(3)],
                         ids=["LayerNorm", "BatchNorm1d"])
def test_half_precision_normalisation_trains_like_cpu_and_stays_asynchronous(make, dtype):
    """The statistics of bf16/fp16 normalisation keep CPU's dtype (the Meta
    kernels say float32), so the CPU backward kernels accept them and the
    ops need no synchronous fallback."""
    import torchneuron
    torch.manual_seed(0)
    cpu = make().to(dtype)
    dev = make().to(dtype).to(DEV)
    dev.load_state_dict(cpu.state_dict())
    x = torch.randn(4, 3, 8, dtype=dtype)
    before = dict(torchneuron.get_fallback_ops())
    for _ in range(2):
        xc, xd = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
        cpu(xc).float().pow(2).sum().backward()
        dev(xd).float().pow(2).sum().backward()
        torch.testing.assert_close(xd.grad.cpu(), xc.grad)
    for (pc, pd) in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(pd.grad.cpu(), pc.grad)
    for (bc, bd) in zip(cpu.buffers(), dev.buffers()):
        torch.testing.assert_close(bd.cpu(), bc)
    assert dict(torchneuron.get_fallback_ops()) == before
