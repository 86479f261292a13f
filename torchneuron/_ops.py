"""Op tracking: which ATen ops ran on neuron and which needed a host round trip."""

from torchneuron import _C


def get_executed_ops() -> dict[str, int]:
    """Every ATen op launched on a neuron device since the last clear, with counts."""
    return dict(_C._executed_ops())


def get_fallback_ops() -> dict[str, int]:
    """Ops whose results were computed on the host and uploaded (data-dependent
    output shapes such as ``nonzero``), with counts."""
    return dict(_C._fallback_ops())


def clear_op_tracking() -> None:
    _C._clear_op_tracking()
