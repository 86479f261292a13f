"""How nisa instructions take their arguments: an unknown keyword, a parameter the emulator does not
implement, or the older call without dst is an error naming the instruction and the kernel line,
raised before anything is written (a keyword dropped silently would leave its effect out)."""

import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


def _load(a):
    t = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    return t


@nki.jit
def stt_with_reduce(a, acc):
    t = _load(a)
    r = _load(acc)
    o = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=o, data=t, op0=nl.multiply, operand0=2.0, op1=nl.add, operand1=t,
                              reduce_op=nl.add, reduce_res=r)
    nisa.dma_copy(dst=acc, src=r)


@nki.jit
def misspelt_keyword(a):
    t = _load(a)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0, revers0=True)
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def returning_form(a):
    t = _load(a)
    e = nisa.activation(op=nl.exp, data=t)
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=e)
    return out


@nki.jit
def positional_dst(a):
    """dst given positionally is a dst: not the older form."""
    t = _load(a)
    e = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.activation(e, nl.exp, t)
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(out, e)
    return out


def test_scalar_tensor_tensor_reduce_parameters_are_refused_and_nothing_is_written():
    a = np.ones((4, 8), np.float32)
    acc = np.full((4, 1), 7.0, np.float32)
    with pytest.raises(nki.NKIError) as e:
        nki.simulate(stt_with_reduce)(a, acc)
    assert e.value.rule == "not-emulated"
    assert "nisa.scalar_tensor_tensor" in str(e.value) and "reduce_op, reduce_res" in str(e.value)
    assert "nisa.scalar_tensor_tensor(dst=o" in e.value.line[2]
    np.testing.assert_array_equal(acc, 7.0)  # the check pass raised before the run wrote anything


@pytest.mark.parametrize("where", ["numpy", "neuron"])
def test_an_unknown_keyword_is_an_error_naming_it(where):
    a = np.ones((4, 8), np.float32)
    with pytest.raises(nki.NKIError) as e:
        if where == "numpy":
            nki.simulate(misspelt_keyword)(a)
        else:
            misspelt_keyword(torch.from_numpy(a).to("neuron"))
    assert e.value.rule == "operands"
    assert "nisa.tensor_scalar has no parameter 'revers0'" in str(e.value) and "reverse0" in str(e.value)
    assert "revers0=True" in e.value.line[2]


def test_the_older_returning_form_is_an_error_saying_how_to_write_it():
    with pytest.raises(nki.NKIError) as e:
        nki.simulate(returning_form)(np.ones((4, 8), np.float32))
    assert "nisa.activation: dst is missing" in str(e.value) and "dst=" in str(e.value)
    assert "nisa.activation(op=nl.exp" in e.value.line[2]


def test_dst_given_positionally_is_accepted():
    a = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(nki.simulate(positional_dst)(a), np.exp(a), rtol=1e-6)


@nki.jit
def uses_indirect(a, idx):
    t = _load(a)
    i = _load(idx)
    o = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o, src=t.indirect(i))


def test_tensor_indirection_views_are_refused_saying_why():
    with pytest.raises(nki.NKIError) as e:
        nki.simulate(uses_indirect)(np.ones((16, 8), np.float32), np.zeros((16, 4), np.uint16))
    assert e.value.rule == "not-emulated"
    assert "indirect()" in str(e.value) and "vector_select" in str(e.value)
    assert "t.indirect(i)" in e.value.line[2]
