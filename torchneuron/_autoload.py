"""Target of the ``torch.backends`` entry point, run by ``import torch``.

Kept apart from ``torchneuron/__init__.py`` so that ``import torchneuron``
(which imports torch first, which runs this) is not a circular import:
when torchneuron is already being imported, registration finishes there.
"""


def autoload() -> None:
    import torchneuron  # noqa: F401  (registration happens on import)
