"""Batched execution of ``affine_range`` loops and SPMD grids.

``affine_range`` promises that iterations do not depend on each other (apart from accumulation
into a tile), so the run pass may execute all iterations of such a loop at once: the loop body
runs a single time with the loop variable as an ``Affine`` value (``const + coeff * index``), and
every tile made inside the loop carries one leading *batch* dimension per batched loop. A tile
of 128 x 512 allocated in a batched loop of 16 iterations is held as a 16 x 128 x 512 tensor, a
load whose offset depends on the loop variable is a strided view, and a matmul accumulated
across a batched loop becomes one contraction (one large GEMM instead of 16 small ones).

Whatever the batched form cannot express raises ``Unbatchable`` naming the loops involved:
Python control flow on a loop variable (``if j == i``, ``range(i + 1)``), a write that would
make iterations overwrite each other (a loop-carried dependency), a gather or mask that moves
with the loop. Those loops then run iteration by iteration. Which loops batch is decided per
kernel signature by a trial run on scratch data, whose outputs must match the sequential run's.
"""

import torch

from torchneuron.nki import _context


class Unbatchable(Exception):
    """The batched form cannot express an operation of these loops (ids)."""

    def __init__(self, loops, why):
        super().__init__(why)
        self.loops = frozenset(loops)


class Additive:
    """``+``, ``-`` and ``*`` from the right, and ``-``, derived from a class's ``__add__``,
    ``__neg__`` and ``__mul__`` (both operand orders commute)."""

    __slots__ = ()

    def __radd__(self, other):
        return self + other

    def __sub__(self, other):
        return self + (-other)

    def __rsub__(self, other):
        return (-self) + other

    def __rmul__(self, other):
        return self * other


class RuntimeInt(int):
    """An integer the hardware reads from data when the kernel runs: the induction variable of an
    ``nl.dynamic_range`` loop whose bounds are registers, and integer arithmetic on one. It is an
    ``int`` (the run pass has the real value), but in the check and trial passes it comes from
    scratch data, so the access patterns it offsets (``.ap(offset=, scalar_offset=)``, ``select``)
    are bounds-checked with the real values only, in the run pass."""

    __slots__ = ()

    def __neg__(self):
        return RuntimeInt(-int(self))

    def __repr__(self):
        return f"RuntimeInt({int(self)})"


def _keeping_runtime(name):
    """``int``'s operator `name`, returning a RuntimeInt where int returns an int."""
    op = getattr(int, name)

    def method(self, other):
        value = op(self, other)
        return RuntimeInt(value) if type(value) is int else value

    method.__name__ = name
    return method


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__floordiv__", "__mod__"):
    setattr(RuntimeInt, _name, _keeping_runtime(_name))


class Affine(Additive):
    """An integer that depends on batched loop indices: ``const + sum(coeff[L] * index_L)``."""

    __slots__ = ("const", "coeffs")

    def __init__(self, const=0, coeffs=None):
        self.const = const
        self.coeffs = coeffs or {}

    @staticmethod
    def of(x):
        return x if isinstance(x, Affine) else Affine(int(x))

    def _unbatchable(self, what):
        raise Unbatchable(self.coeffs, f"{what} of a loop variable needs its value (the loop runs sequentially)")

    def __add__(self, other):  # an index expression plus a loop variable: IndexExpr.__radd__
        if isinstance(other, Affine):
            coeffs = dict(self.coeffs)
            for loop, c in other.coeffs.items():
                coeffs[loop] = coeffs.get(loop, 0) + c
            return simplify(Affine(self.const + other.const, {k: v for k, v in coeffs.items() if v}))
        if isinstance(other, int):
            return Affine(self.const + other, self.coeffs)
        return NotImplemented

    def __neg__(self):
        return Affine(-self.const, {k: -v for k, v in self.coeffs.items()})

    def __mul__(self, other):
        if isinstance(other, int):
            return simplify(Affine(self.const * other, {k: v * other for k, v in self.coeffs.items() if v * other}))
        if isinstance(other, Affine):
            self._unbatchable("a product")
        return NotImplemented

    def __floordiv__(self, other):
        self._unbatchable("integer division")

    def __mod__(self, other):
        self._unbatchable("a remainder")

    def __index__(self):
        self._unbatchable("Python use")

    def __int__(self):
        self._unbatchable("Python use")

    def __bool__(self):
        self._unbatchable("a truth test")

    def __eq__(self, other):
        self._unbatchable("a comparison")

    __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__
    __hash__ = object.__hash__

    def bounds(self, sizes):
        """(min, max) over the loops' index ranges (``sizes``: loop id -> iteration count)."""
        low = high = self.const
        for loop, c in self.coeffs.items():
            span = c * (sizes[loop] - 1)
            low, high = low + min(0, span), high + max(0, span)
        return low, high

    def __repr__(self):
        return f"Affine({self.const} + {self.coeffs})"


def simplify(x):
    return x.const if isinstance(x, Affine) and not x.coeffs else x


def affine_values(a):
    """A loop-dependent integer as a tensor aligned to the loop frame."""
    ctx = _context.current()
    if any(loop not in ctx.frame for loop in a.coeffs):
        raise Unbatchable(a.coeffs, "a loop variable used after its batched loop ended")
    out = torch.full([1] * len(ctx.frame), a.const, dtype=torch.int64)
    for i, loop in enumerate(ctx.frame):
        if loop in a.coeffs:
            shape = [1] * len(ctx.frame)
            shape[i] = ctx.loop_sizes[loop]
            out = out + a.coeffs[loop] * torch.arange(ctx.loop_sizes[loop]).reshape(shape)
    return out
