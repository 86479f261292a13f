"""The import name ``torch_neuronx``, by which Hugging Face accelerate and
transformers detect the TorchNeuron backend.

Both libraries first ask ``importlib.util.find_spec("torch_neuronx")``, and
only then use ``torch.neuron`` (which torchneuron provides) to choose the
device, the ``neuron`` process group and the compile backend. Without an
answer, ``Trainer`` and ``Accelerator`` silently train on the CPU. A module in
``sys.modules`` answers for this process: nothing is installed under that
name, and an installed ``torch_neuronx`` takes precedence.

Upstream, detecting the accelerator with ``torch.accelerator`` instead of by a
package name would make this unnecessary.
"""

import importlib.machinery
import importlib.util
import sys
import types

NAME = "torch_neuronx"


class _Alias(types.ModuleType):
    def __getattr__(self, attr):
        raise AttributeError(
            f"module '{NAME}' is torchneuron's stand-in for the Hugging Face libraries' backend detection "
            f"and has no attribute '{attr}'; use torch.neuron or torchneuron instead")


def provide() -> None:
    if NAME in sys.modules:
        return
    try:
        if importlib.util.find_spec(NAME) is not None:
            return
    except (ImportError, ValueError):
        pass
    alias = _Alias(NAME, __doc__)
    alias.__spec__ = importlib.machinery.ModuleSpec(NAME, loader=None, origin="torchneuron")
    sys.modules[NAME] = alias
