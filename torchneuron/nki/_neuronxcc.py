"""The ``neuronxcc`` package name of the older NKI SDK, as served by ``install_alias()``:
only its ``nki`` subpackage exists here."""

from torchneuron import nki  # noqa: F401 - neuronxcc.nki
