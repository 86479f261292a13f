"""Checks of one OpInfo at one dtype on neuron against CPU.

Samples are generated on neuron (as PyTorch's device tests do; an op's
sample generator knows which arguments must stay on CPU) and copied to CPU
with their storage, so both devices see the same values and layouts. Parts:

  forward        every sample, and its noncontiguous twin
  inplace        the in-place variant, on a copy and on a strided view of a
                 larger tensor whose other elements must stay untouched
  out            out= with outputs of the right shape, and with empty ones
                 the op must resize
  grad           float32/float64: gradients of all differentiable inputs for
                 the same random output gradients
  inputs_intact  a forward call leaves its inputs as CPU leaves them

A part is "skipped" when no sample runs on CPU. The first mismatch of a part
is its result.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride
from torch.testing._internal.opinfo.core import DecorateInfo

from . import known
from .tensors import assert_same, copy_tensor, tensors, to_device

GRAD_DTYPES = (torch.float32, torch.float64)


@dataclasses.dataclass
class Result:
    status: str  # pass | fail | error | skipped
    detail: str = ""


def op_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def tolerance(op, dtype) -> tuple[float | None, float | None]:
    """The OpInfo's own tolerance for comparing a device with CPU, if any:
    its tolerance and precision overrides that apply to that test."""
    atol = rtol = None

    def widen(a, r):
        nonlocal atol, rtol
        atol, rtol = max(a, atol or 0), max(r, rtol or 0)

    for info in op.decorators:
        if isinstance(info, DecorateInfo):
            active = any(info.is_active("TestCommon", "test_compare_cpu", device, dtype, {})
                         for device in ("privateuse1", "cpu"))
            decorators = info.decorators if active else ()
        else:
            decorators = (info,)
        for decorator in decorators:
            if isinstance(decorator, toleranceOverride) and dtype in decorator.d:
                widen(decorator.d[dtype].atol, decorator.d[dtype].rtol)
            elif isinstance(decorator, precisionOverride) and dtype in decorator.d:
                widen(decorator.d[dtype], 0)
    if atol is not None:  # an override widens the default, never narrows it
        default_rtol, default_atol = torch.testing._comparison.default_tolerances(dtype)
        atol, rtol = max(atol, default_atol), max(rtol, default_rtol)
    return atol, rtol


def _message(e: BaseException) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first[:200]}"


class OpCheck:
    def __init__(self, op, dtype, *, max_samples: int | None = None):
        self.op, self.dtype, self.max_samples = op, dtype, max_samples
        self.name = op_name(op)
        self.atol, self.rtol = tolerance(op, dtype)

    # -- helpers ----------------------------------------------------------------------------------
    def samples(self, requires_grad=False):
        torch.manual_seed(0)
        it = self.op.sample_inputs("neuron", self.dtype, requires_grad=requires_grad)
        for i, s in enumerate(it):
            if self.max_samples is not None and i >= self.max_samples:
                return
            yield s

    def shapes_only(self, sample) -> bool:
        return known.values_not_compared(self.name, self.dtype) or known.random_sample(self.name, sample)

    def compare(self, actual, expected, sample) -> None:
        assert_same(actual, expected, atol=self.atol, rtol=self.rtol, exact_dtype=True,
                    shapes_only=self.shapes_only(sample))

    @staticmethod
    def call(fn, s, **extra):
        return fn(s.input, *s.args, **s.kwargs, **extra)

    # -- parts ------------------------------------------------------------------------------------
    def forward(self) -> dict[str, Result]:
        results = {"forward": Result("skipped"), "inputs_intact": Result("skipped")}
        for s in self.samples():
            # Sparse samples have no noncontiguous twin (nor has CPU: no strides).
            strided = all(t.layout == torch.strided for t in tensors(s))
            twins = [s] if self.name in known.STORAGE_OPS or not strided else [s, s.noncontiguous()]
            # Each twin is compared with CPU on the same layout: CPU kernels
            # may pick another algorithm (and rounding) for another layout.
            cpu_twins = [to_device(t, "cpu") for t in twins]
            ran_as_given = False
            for twin, cpu in zip(twins, cpu_twins):
                try:
                    torch.manual_seed(0)
                    expected = self.call(self.op, cpu)
                except Exception:  # noqa: BLE001 - not a valid input on CPU either
                    continue
                try:
                    torch.manual_seed(0)
                    actual = self.call(self.op, twin)
                    torch.neuron.synchronize()
                except Exception as e:  # noqa: BLE001
                    return {**results, "forward": Result("error", _message(e))}
                try:
                    self.compare(actual, expected, s)
                except AssertionError as e:
                    return {**results, "forward": Result("fail", _message(e))}
                results["forward"] = Result("pass")
                ran_as_given = ran_as_given or twin is s
            if not ran_as_given or self.shapes_only(s):
                continue  # a random op writing its input (normal_, uniform_) leaves other values
            try:
                assert_same(tensors(s), tensors(cpu_twins[0]), exact_dtype=True)
                results["inputs_intact"] = Result("pass")
            except AssertionError as e:
                return {**results, "inputs_intact": Result("fail", _message(e))}
        return results

    def inplace(self) -> Result:
        fn = self.op.inplace_variant
        if fn is None:
            return Result("skipped", "no in-place variant")
        result = Result("skipped")
        for s in self.samples():
            if not isinstance(s.input, torch.Tensor) or s.broadcasts_input:
                continue  # an in-place op cannot broadcast its input (CPU resizes it, with a warning)
            cpu = to_device(s, "cpu")
            try:
                torch.manual_seed(0)
                expected = self.call(fn, cpu)
            except Exception:  # noqa: BLE001
                continue
            # On a copy of the input and on a strided view into a larger
            # tensor (the elements between must not change).
            direct = s.transform(lambda t: t)
            direct.input = copy_tensor(s.input, "neuron")
            targets = [direct]
            if s.input.dim() > 0 and s.input.numel() > 0 and self.name not in known.STORAGE_OPS:
                base = torch.full((*s.input.shape[:-1], 2 * s.input.shape[-1]), 7, dtype=s.input.dtype,
                                  device="neuron")
                view = s.transform(lambda t: t)
                view.input = base[..., ::2]
                view.input.copy_(s.input)
                gaps_before = base[..., 1::2].cpu()
                targets.append(view)
            for target in targets:
                try:
                    torch.manual_seed(0)
                    actual = self.call(fn, target)
                    torch.neuron.synchronize()
                except Exception as e:  # noqa: BLE001
                    return Result("error", _message(e))
                try:
                    assert actual is target.input, "the in-place variant did not return its input"
                    self.compare(actual, expected, s)
                    if target is not direct:
                        assert torch.equal(base[..., 1::2].cpu(), gaps_before), "elements outside the view changed"
                except AssertionError as e:
                    return Result("fail", _message(e))
            result = Result("pass")
        return result

    def out(self) -> Result:
        """out= on neuron against out= on CPU, with outputs shaped like the
        functional results and with empty ones the op must resize."""
        if not self.op.supports_out:
            return Result("skipped", "no out= variant")
        result = Result("skipped")
        for s in self.samples():
            cpu = to_device(s, "cpu")
            try:
                torch.manual_seed(0)
                reference = self.call(self.op, cpu)
            except Exception:  # noqa: BLE001
                continue
            if not tensors(reference) or (not isinstance(reference, torch.Tensor) and
                                          not all(isinstance(e, torch.Tensor) for e in reference)):
                continue
            for resize in (False, True):
                def make(device):
                    def empty(e):
                        return torch.empty(0 if resize else e.shape, dtype=e.dtype, device=device)

                    if isinstance(reference, torch.Tensor):
                        return empty(reference)
                    return type(reference)(empty(e) for e in reference) if isinstance(reference, list) else \
                        tuple(empty(e) for e in reference)

                expected_out = make("cpu")
                try:
                    torch.manual_seed(0)
                    expected_returned = self.call(self.op, cpu, out=expected_out)
                except Exception:  # noqa: BLE001 - this out= form is not accepted on CPU either
                    continue
                try:  # CPU's out= must agree with its functional form to be a reference
                    self.compare(expected_out, reference, s)
                except AssertionError:
                    continue  # e.g. fft.ihfft2(dim=0, out=) leaves uninitialised values on CPU
                out = make("neuron")
                try:
                    torch.manual_seed(0)
                    returned = self.call(self.op, s, out=out)
                    torch.neuron.synchronize()
                except Exception as e:  # noqa: BLE001
                    return Result("error", _message(e))
                try:
                    self.compare(out, expected_out, s)
                    if expected_returned is not None:
                        got = [returned] if isinstance(returned, torch.Tensor) else list(returned)
                        want = [out] if isinstance(out, torch.Tensor) else list(out)
                        assert len(got) == len(want) and all(g is w for g, w in zip(got, want)), \
                        "out= call did not return its out tensors"
                except AssertionError as e:
                    return Result("fail", _message(e))
                result = Result("pass")
        return result

    def grad(self) -> Result:
        if not self.op.supports_autograd or self.dtype not in GRAD_DTYPES:
            return Result("skipped", "not differentiable at this dtype")
        if self.dtype not in self.op.supported_backward_dtypes("cpu"):
            return Result("skipped", "no CPU backward at this dtype")
        if known.values_not_compared(self.name, self.dtype):
            return Result("skipped", "values not compared")
        result = Result("skipped")
        for s in self.samples(requires_grad=True):
            if self.shapes_only(s):
                continue
            cpu = to_device(s, "cpu")
            cpu_inputs = [t for t in tensors(cpu) if t.requires_grad]
            try:
                expected_out = self._differentiable_outputs(self.call(self.op, cpu), s)
                if not expected_out or not cpu_inputs:
                    continue
                torch.manual_seed(1)
                grad_outputs = [torch.randn_like(o) for o in expected_out]
                expected = torch.autograd.grad(expected_out, cpu_inputs, grad_outputs, allow_unused=True)
            except Exception:  # noqa: BLE001
                continue
            inputs = [t for t in tensors(s) if t.requires_grad]
            try:
                out = self._differentiable_outputs(self.call(self.op, s), s)
                actual = torch.autograd.grad(out, inputs, [g.to("neuron") for g in grad_outputs], allow_unused=True)
                torch.neuron.synchronize()
            except Exception as e:  # noqa: BLE001
                return Result("error", _message(e))
            try:
                assert_same(list(actual), list(expected), atol=self.atol, rtol=self.rtol)
            except AssertionError as e:
                return Result("fail", _message(e))
            result = Result("pass")
        return result

    @staticmethod
    def _differentiable_outputs(out, sample):
        out = sample.output_process_fn_grad(out)
        return [o for o in tensors(out) if o.requires_grad]

    def run(self) -> dict[str, Result]:
        try:
            results = self.forward()
        except Exception as e:  # noqa: BLE001 - the sample generator failed on neuron
            return {"forward": Result("error", "generating samples: " + _message(e))}
        for part, check in (("inplace", self.inplace), ("out", self.out), ("grad", self.grad)):
            try:
                results[part] = check()
            except Exception as e:  # noqa: BLE001
                results[part] = Result("error", "generating samples: " + _message(e))
        return results


def summarize(results: dict[str, Result]) -> Result:
    """One status for an (op, dtype): the worst part."""
    for status in ("error", "fail"):
        bad = [f"{part}: {r.detail}" for part, r in results.items() if r.status == status]
        if bad:
            return Result(status, "; ".join(bad))
    if all(r.status == "skipped" for r in results.values()):
        return Result("skipped", "no sample runs on CPU")
    return Result("pass")
