"""``nki.isa`` virtual registers: ``register_alloc``, ``register_move``, ``register_load``,
``register_store``.

A register holds a 32-bit integer, here a Python int while the kernel runs. ``register_load``
reads it from a one-element tile when the instruction runs, so control flow on a register
(``nl.dynamic_range(reg)``, ``while reg:``) follows the data, in the check pass the check
pass's scratch data.
"""

import numpy as np

from torchneuron.nki import _context
from torchneuron.nki._batch import Affine, Unbatchable
from torchneuron.nki._errors import NKIError
from torchneuron.nki._tile import NkiTensor, psum

_RANGE = (-2 ** 31, 2 ** 32)  # int32 or uint32 values


class VirtualRegister:
    """A 32-bit engine sequencer register (``nisa.register_alloc``); a loop bound for
    ``nl.dynamic_range`` and a condition for ``while reg:``."""

    __slots__ = ("value",)

    def __init__(self, value=None):
        self.value = value

    def _read(self, what):
        if self.value is None:
            raise NKIError("register-uninitialised", f"{what}: the register is read before any value was allocated, "
                           "moved or loaded into it")
        return self.value

    def __index__(self):
        return self._read("a register used as an integer")

    __int__ = __index__

    def __bool__(self):
        return self._read("a register tested as a condition") != 0

    def __repr__(self):
        return f"VirtualRegister({self.value})"


def _register(r, what):
    if not isinstance(r, VirtualRegister):
        raise NKIError("operand", f"{what}: expected a register from nisa.register_alloc, got {type(r).__name__}")
    return r


def _constant(x, what):
    if not isinstance(x, (int, np.integer, Affine)) or isinstance(x, bool):
        raise NKIError("operand", f"{what}: a register holds an integer, got {x!r}")
    value = int(x)  # a loop variable of a batched loop has no single value: that loop runs sequentially
    if not _RANGE[0] <= value < _RANGE[1]:
        raise NKIError("operand", f"{what}: {value} does not fit a 32-bit register")
    return value


def _scalar_tile(t, what, role):
    """A one-element integer tensor in SBUF or HBM."""
    if not isinstance(t, NkiTensor) or int(np.prod(t.shape)) != 1 or t.dtype.is_floating_point or t.buffer is psum:
        raise NKIError("operand", f"{what}: {role} must be a one-element integer tensor ([1] or [1, 1]) in SBUF or "
                       f"HBM, got {t.describe() if isinstance(t, NkiTensor) else type(t).__name__}")


def register_alloc(x=None):
    """A new register, holding ``x`` (an int), or the value of a one-element tile, or nothing yet."""
    reg = VirtualRegister()
    if isinstance(x, NkiTensor):
        register_load(reg, x)
    elif x is not None:
        reg.value = _constant(x, "nisa.register_alloc")
    return reg


def register_move(dst, src):
    """``dst = src``: another register's value or an int constant."""
    what = "nisa.register_move"
    _register(dst, what).value = src._read(what) if isinstance(src, VirtualRegister) else _constant(src, what)


def register_load(dst, src):
    """Loads register ``dst`` from the one-element integer tensor ``src`` (SBUF or HBM)."""
    what = "nisa.register_load"
    _register(dst, what)
    _scalar_tile(src, what, "src")
    values = src.read(what=what)
    varying = [loop for i, loop in enumerate(_context.current().frame) if values.shape[i] != 1]
    if varying:
        raise Unbatchable(varying, "a register loaded with a value that differs between iterations of a batched loop")
    dst.value = int(values.reshape(-1)[0])


def register_store(dst, src):
    """Stores register ``src`` into the one-element integer tensor ``dst`` (SBUF or HBM)."""
    what = "nisa.register_store"
    _scalar_tile(dst, what, "dst")
    dst.write(_register(src, what)._read(what), what=what)
