"""An RMSNorm kernel written for the current NKI SDK, as its users write them: it imports `nki`,
shards rows over the cores of a logical NeuronCore, takes a configuration object, an optional
weight and an output it writes in place. Nothing in this file knows about torchneuron: the tests
run it through `python -m torchneuron.nki run` and `torchneuron.nki.install_alias()`."""

import numpy as np

import nki
import nki.isa as nisa
import nki.language as nl
import nki.typing as nt
from nki.language import NKIObject

P_MAX = 128


class NormConfig(NKIObject):
    eps: float = 1e-6
    scale_output: float = 1.0


def _sharding():
    """(programs, this program): one program when launched without a grid."""
    if nl.program_ndim() == 0:
        return 1, 0
    return nl.num_programs(axes=0), nl.program_id(axis=0)


def _normalise_tile(x_tile, rows, hidden, weight_tile, config):
    squares = nl.ndarray((P_MAX, hidden), dtype=nl.float32, buffer=nl.sbuf)
    sums = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=squares[0:rows, :], op=nl.square, data=x_tile[0:rows, :],
                    reduce_op=nl.add, reduce_res=sums[0:rows, :])
    inv = nl.ndarray((P_MAX, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=inv[0:rows, :], data=sums[0:rows, :], op0=nl.multiply, operand0=1.0 / hidden,
                       op1=nl.add, operand1=config.eps)
    nisa.activation(dst=inv[0:rows, :], op=nl.rsqrt, data=inv[0:rows, :])
    out = nl.ndarray((P_MAX, hidden), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=out[0:rows, :], data=x_tile[0:rows, :], op0=nl.multiply, operand0=inv[0:rows, :],
                       op1=nl.multiply, operand1=config.scale_output)
    if weight_tile is not None:
        nisa.tensor_tensor(dst=out[0:rows, :], data1=out[0:rows, :], data2=weight_tile[0:rows, :], op=nl.multiply)
    return out


@nki.jit(platform_target="trn2")
def rmsnorm(x, out: nt.mutable_tensor, weight=None, config=NormConfig()):
    """out[r] = x[r] / rms(x[r]) * weight, rows split between the programs."""
    n_rows, hidden = x.shape
    assert out.shape == x.shape, f"out {out.shape} != x {x.shape}"
    programs, me = _sharding()
    share = (n_rows + programs - 1) // programs
    first, last = me * share, min(n_rows, (me + 1) * share)
    weight_tile = None
    if weight != None:  # noqa: E711 - a plain host check, as kernels write it
        weight_tile = nl.ndarray((P_MAX, hidden), dtype=nl.float32, buffer=nl.sbuf)
        for p in range(P_MAX):
            nisa.dma_copy(dst=weight_tile[p:p + 1, :], src=weight.reshape((1, hidden)))
    for start in range(first, last, P_MAX):
        rows = min(P_MAX, last - start)
        x_tile = nl.ndarray((P_MAX, hidden), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=x_tile[0:rows, :], src=x[start:start + rows, :])
        y = _normalise_tile(x_tile, rows, hidden, weight_tile, config)
        nisa.dma_copy(dst=out[start:start + rows, :], src=y[0:rows, :])
    return out


def reference(x, weight=None, eps=1e-6, scale_output=1.0):
    y = x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + eps) * scale_output
    return (y * weight if weight is not None else y).astype(np.float32)


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 64)).astype(np.float32)
    w = rng.standard_normal((64,)).astype(np.float32)
    out = np.zeros_like(x)
    result = nki.simulate(rmsnorm)[2](x=x, out=out, weight=w, config=NormConfig(eps=1e-5, scale_output=2.0))
    np.testing.assert_allclose(out, reference(x, w, 1e-5, 2.0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(result), out)
    print("rmsnorm ok")
