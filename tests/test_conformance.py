"""The fast tier of the operator conformance harness (tests/conformance/):
every OpInfo of PyTorch's op database at one dtype with its first samples,
every op's error inputs, and every torch.nn module of module_db at float32.
`make conformance` runs the whole harness (every dtype, every sample) and
writes docs/op_coverage.md.
"""

from __future__ import annotations

import copy
import gc

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_modules import module_db

from tests.conformance import known
from tests.conformance.error_checks import check_errors
from tests.conformance.module_checks import check_module
from tests.conformance.op_checks import OpCheck, op_name, summarize

PREFERRED = (torch.float32, torch.int64, torch.bool, torch.complex64, torch.float16, torch.bfloat16, torch.uint8)
FAST_SAMPLES = 3

# Deprecation and beta notes of the ops under test are not what is tested here.
pytestmark = pytest.mark.filterwarnings("ignore")


OPS = list(op_db)  # names (name.variant) are unique


@pytest.fixture(scope="module", autouse=True)
def _freeze_what_earlier_tests_left():
    """The error checks collect garbage twice per op. Objects earlier tests
    left for good (transformers' lazily imported modules, for one) are frozen
    once here, so that those collections do not scan them every time."""
    gc.collect()
    gc.freeze()


def _fast_dtype(op):
    supported = op.supported_dtypes("cpu")
    return next((d for d in PREFERRED if d in supported), None)


@pytest.mark.parametrize("op", [op for op in OPS if _fast_dtype(op)], ids=op_name)
def test_op_matches_cpu(op):
    dtype = _fast_dtype(op)
    reason = known.impossible(op_name(op), dtype)
    if reason:
        pytest.skip(f"known impossible: {reason}")
    result = summarize(OpCheck(op, dtype, max_samples=FAST_SAMPLES).run())
    assert result.status in ("pass", "skipped"), f"{op_name(op)} at {dtype}: {result.status}: {result.detail}"


@pytest.mark.parametrize("op", [op for op in OPS if op.error_inputs_func is not None], ids=op_name)
def test_error_inputs_raise_like_cpu(op):
    result, _ = check_errors(op)
    assert result.status in ("pass", "skipped"), f"{op_name(op)}: {result.detail}"


@pytest.mark.parametrize("info", [m for m in module_db if torch.float32 in m.dtypes], ids=lambda m: m.name)
def test_module_matches_cpu(info):
    result = check_module(info, torch.float32, max_inputs=2)
    assert result.status == "pass", f"{info.name}: {result.status}: {result.detail}"


# --- the harness itself: it must be able to fail -------------------------------------------------

def _op(name):
    return next(op for op in OPS if op_name(op) == name)


def _tampered(name, **changes):
    op = copy.copy(_op(name))
    for attr, value in changes.items():
        setattr(op, attr, value)
    return op


def test_harness_catches_wrong_forward_values():
    op = _tampered("abs", op=lambda x, **kw: x.abs() + (x.device.type == "neuron"))
    assert OpCheck(op, torch.float32, max_samples=2).forward()["forward"].status == "fail"


def test_harness_catches_wrong_gradients():
    class WrongGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.abs()

        @staticmethod
        def backward(ctx, g):
            return g * (2.0 if g.device.type == "neuron" else 1.0)

    op = _tampered("abs", op=lambda x, **kw: WrongGrad.apply(x))
    assert OpCheck(op, torch.float32, max_samples=2).grad().status == "fail"


def test_harness_catches_writes_outside_an_in_place_view():
    def leaky_abs_(x):
        if x.device.type == "neuron" and x._base is not None:
            x._base.zero_()  # touches the elements between the view's
        return x.abs_()

    op = _tampered("abs", inplace_variant=leaky_abs_)
    result = OpCheck(op, torch.float32, max_samples=2).inplace()
    assert result.status == "fail", result


def test_harness_catches_wrong_out_results():
    def bad_out(x, *, out=None):
        result = torch.abs(x, out=out)
        if out is not None and out.device.type == "neuron":
            out.add_(1)
        return result

    op = _tampered("abs", op=bad_out)
    assert OpCheck(op, torch.float32, max_samples=2).out().status == "fail"


def test_harness_catches_another_exception_type():
    index_select = _op("index_select")

    def raises_value_error_on_neuron(x, *args, **kwargs):
        if x.device.type == "neuron":
            raise ValueError("wrong type on purpose")
        return index_select.op(x, *args, **kwargs)

    result, count = check_errors(_tampered("index_select", op=raises_value_error_on_neuron))
    assert count > 0 and result.status == "fail", result


def test_known_lists_name_real_ops_and_modules():
    names = {op_name(op) for op in op_db}
    listed = known.RANDOM | known.STORAGE_OPS | {
        n for n, _ in known.IMPOSSIBLE} | {n for n, _ in known.DEVICE_DEPENDENT}
    assert listed <= names, f"not OpInfo names: {sorted(listed - names)}"
    assert known.RANDOM_MODULES <= {m.name for m in module_db}


def test_harness_catches_an_op_writing_its_input():
    def abs_then_scribble(x, **kw):
        result = x.abs()
        if x.device.type == "neuron":
            x.add_(1)
        return result

    parts = OpCheck(_tampered("abs", op=abs_then_scribble), torch.float32, max_samples=2).forward()
    assert parts["forward"].status == "pass" and parts["inputs_intact"].status == "fail", parts


def test_harness_catches_a_wrong_module():
    class OffByOneOnNeuron(torch.nn.Linear):
        def forward(self, input):  # noqa: A002 - module_db passes it by this name
            return super().forward(input) + (input.device.type == "neuron")

    info = copy.copy(next(m for m in module_db if m.name == "nn.Linear"))
    info.module_cls = OffByOneOnNeuron
    result = check_module(info, torch.float32, max_inputs=1)
    assert result.status == "fail", result
