"""The compiled path: ``torch.compile(backend="neuron")`` and Inductor for neuron.

Nothing here is imported by ``import torchneuron`` (Inductor is slow to import);
the ``torch_dynamo_backends`` entry point, the device module's Inductor hooks
and ``torchneuron.get_dynamo_metrics`` import it on demand.
"""

from __future__ import annotations

_registered = False


def register() -> None:
    """Registers neuron with Dynamo, Inductor and FlexAttention (idempotent)."""
    global _registered
    if _registered:
        return
    _registered = True
    from . import device_interface, inductor

    device_interface.register()
    inductor.register()



def inductor_classes() -> dict:
    """What ``torch.neuron.<name>`` answers to Inductor's backend discovery."""
    register()
    from . import inductor

    return {
        "Scheduling": inductor.NeuronScheduling,
        "PythonWrapperCodegen": inductor.NeuronWrapperCodegen,
        "CppWrapperCodegen": inductor.NeuronCppWrapperUnsupported,
        "WrapperFxCodegen": None,
    }
