"""``nki.typing`` (``nt``): annotations of kernel parameters.

``nt.tensor[128, 512]`` (or the older ``nt.tensor[[128, 512], nl.float32]``) documents a tensor
parameter's shape; ``nt.mutable_tensor`` marks an input the kernel writes in place, which
``nki.jit`` then treats as declared in ``mutates_args``.
"""

from __future__ import annotations


class _TensorType:
    """A tensor annotation, optionally with a shape and dtype (documentation only)."""

    def __init__(self, mutable: bool, shape=None, dtype=None):
        self.mutable, self.shape, self.dtype = mutable, shape, dtype

    def __getitem__(self, spec):
        if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], (list, tuple)):
            return _TensorType(self.mutable, tuple(spec[0]), spec[1])  # nt.tensor[[K, M], dtype]
        return _TensorType(self.mutable, spec if isinstance(spec, tuple) else (spec,))

    def __repr__(self):
        name = "nt.mutable_tensor" if self.mutable else "nt.tensor"
        return name if self.shape is None else f"{name}[{', '.join(map(str, self.shape))}]"


tensor = _TensorType(mutable=False)
mutable_tensor = _TensorType(mutable=True)


def is_mutable(annotation) -> bool:
    """Whether a parameter annotation marks an input the kernel writes."""
    if isinstance(annotation, str):  # `from __future__ import annotations` in the kernel's file
        return "mutable_tensor" in annotation
    return isinstance(annotation, _TensorType) and annotation.mutable
