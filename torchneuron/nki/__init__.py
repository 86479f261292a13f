"""``torchneuron.nki``: the NKI kernel language on the neuron device.

Kernels written for NKI run here unmodified once ``install_alias()`` (or
``python -m torchneuron.nki run file.py``) serves the SDK's import names, or with their imports
changed to::

    import torchneuron.nki as nki
    import torchneuron.nki.language as nl
    import torchneuron.nki.isa as nisa

A call on neuron tensors is one asynchronous task on the current stream; on NumPy arrays or CPU
tensors it runs in the simulator. Rules of the language and the hardware are checked before
anything runs (``NKIError`` names the rule and the kernel line). See docs/nki.md.
"""

from torchneuron.nki import _access  # noqa: F401 - binds the tensor methods that address memory (.ap, .view, ...)
from torchneuron.nki import collectives, isa, language, typing
from torchneuron.nki._alias import install_alias, uninstall_alias
from torchneuron.nki._cost import CostReport
from torchneuron.nki._errors import NKIError
from torchneuron.nki._kernel import Kernel, jit

__all__ = ["jit", "simulate", "simulate_kernel", "benchmark", "baremetal", "profile", "estimate", "language", "isa",
           "typing", "collectives", "NKIError", "CostReport", "Kernel", "install_alias", "uninstall_alias"]


def _as_kernel(kernel):
    return kernel if isinstance(kernel, Kernel) else jit(kernel)


class _Simulated:
    """``nki.simulate(kernel)``: runs on the host whatever the inputs' device (CPU copies of device
    tensors). ``nki.simulate(kernel)[2](...)`` and ``nki.simulate(kernel[2])(...)`` both launch a
    grid; NumPy arrays the kernel writes are updated in place, as NKI's simulator does."""

    def __init__(self, kernel):
        self.kernel = _as_kernel(kernel)

    def __getitem__(self, grid):
        return _Simulated(self.kernel[grid])

    def __call__(self, *args, **kwargs):
        import torch
        host = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
        host_kw = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        return self.kernel(*host, **host_kw)


def simulate(kernel):
    """Runs ``kernel`` (an ``nki.jit`` kernel or a plain function) on the host."""
    return _Simulated(kernel)


def simulate_kernel(kernel, *args, **kwargs):
    """The older form: ``nki.simulate_kernel(kernel[grid], *arrays)``."""
    return simulate(kernel)(*args, **kwargs)


def estimate(kernel, *args, target=None, **kwargs) -> CostReport:
    """The cost model's estimate for a call (no data is touched; labelled as an estimate)."""
    k = _as_kernel(kernel)
    _, recorder = k.check(k._bind(args, kwargs), target=target, cost=True)
    return recorder.report(k.fn.__name__, k.grid)


class _Benchmarked:
    """``nki.benchmark(kernel)``: runs the kernel and sets ``benchmark_result`` to the cost estimate."""

    def __init__(self, kernel, target):
        self.kernel, self.target, self.benchmark_result = _as_kernel(kernel), target, None

    def __getitem__(self, grid):
        return _Benchmarked(self.kernel[grid], self.target)

    def __call__(self, *args, **kwargs):
        self.benchmark_result = estimate(self.kernel, *args, target=self.target, **kwargs)
        return self.kernel(*args, **kwargs)


def baremetal(kernel=None, **options):
    """The older ``nki.baremetal(kernel)``: the kernel itself (it runs where its tensors are)."""
    return (lambda k: _as_kernel(k)) if kernel is None else _as_kernel(kernel)


def profile(kernel=None, **options):
    """The older ``nki.profile(kernel)``: runs the kernel; use torch.profiler for device traces."""
    return baremetal(kernel, **options)


def benchmark(kernel=None, *, target=None, warmup=None, iters=None, **options):
    """``@nki.benchmark(target="trn3")`` or ``nki.benchmark(kernel)``; warmup/iters are accepted, not needed."""
    if kernel is None:
        return lambda k: _Benchmarked(k, target)
    return _Benchmarked(kernel, target)
