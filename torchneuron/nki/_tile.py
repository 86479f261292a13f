"""Tensors and tiles of a kernel, and the index expressions that address them.

An ``NkiTensor`` is a named allocation in one memory (HBM, SBUF, PSUM) or a view of one. Basic
accesses (ints, slices, ``nl.ds``, and ``nl.arange`` expressions that are unit-step lines along
their own axis) are zero-copy torch views; other index expressions, and any masked access, are
resolved when the access is read or written (a gather or scatter), so masked-off positions may
lie outside the tensor.
"""

import numpy as np
import torch

from torchneuron.nki import _context
from torchneuron.nki._errors import NKIError, kernel_position


class Buffer:
    def __init__(self, name: str, on_chip: bool):
        self.name, self.on_chip = name, on_chip

    def __repr__(self):
        return f"nl.{self.name}"


sbuf = Buffer("sbuf", True)
psum = Buffer("psum", True)
hbm = Buffer("hbm", False)
shared_hbm = Buffer("shared_hbm", False)
private_hbm = Buffer("private_hbm", False)


class Allocation:
    """What all views of one tensor share: its name, where it was made, whether it holds data."""

    __slots__ = ("name", "line", "written", "is_input", "mutable", "groups", "__weakref__")

    def __init__(self, name, written=False, is_input=False, mutable=False):
        self.name, self.written, self.is_input, self.mutable = name, written, is_input, mutable
        self.groups = None  # PSUM regions in an open matmul accumulation group (see nisa.nc_matmul)
        self.line = None if is_input else kernel_position()

    def describe(self):
        if self.line is None:
            return self.name
        return f"{self.name} (allocated at line {self.line[1]})"


class IndexExpr:
    """An integer (or, after a comparison, boolean) array of indices built from ``nl.arange``."""

    __slots__ = ("values",)
    __array_priority__ = 100

    def __init__(self, values):
        self.values = np.asarray(values)

    @property
    def shape(self):
        return self.values.shape

    def __getitem__(self, key):
        return IndexExpr(self.values[key])

    def __repr__(self):
        return f"IndexExpr(shape={self.values.shape})"

    def __bool__(self):
        raise NKIError("index-expression", "an index expression has no truth value; use it as a mask= argument")


def _values(x):
    return x.values if isinstance(x, IndexExpr) else x


def _index_op(fn):
    return lambda self, other: IndexExpr(fn(self.values, _values(other)))


def _rindex_op(fn):
    return lambda self, other: IndexExpr(fn(_values(other), self.values))


for _name, _fn in {"add": np.add, "sub": np.subtract, "mul": np.multiply, "floordiv": np.floor_divide,
                   "mod": np.mod, "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}.items():
    setattr(IndexExpr, f"__{_name}__", _index_op(_fn))
    setattr(IndexExpr, f"__r{_name}__", _rindex_op(_fn))
for _name, _fn in {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
                   "eq": np.equal, "ne": np.not_equal}.items():
    setattr(IndexExpr, f"__{_name}__", _index_op(_fn))
IndexExpr.__neg__ = lambda self: IndexExpr(-self.values)
IndexExpr.__invert__ = lambda self: IndexExpr(~self.values.astype(bool))
IndexExpr.__hash__ = object.__hash__


class ds:
    """``nl.ds(start, size)``: a dynamic slice of ``size`` elements from ``start``."""

    __slots__ = ("start", "size")

    def __init__(self, start, size):
        self.start, self.size = int(start), int(size)


def _normalise(key, ndim, what):
    """The key as a tuple of one entry per dimension: int, slice or integer ndarray."""
    if not isinstance(key, tuple):
        key = (key,)
    if any(k is Ellipsis for k in key):
        i = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (ndim - len(key) + 1) + key[i + 1:]
    if len(key) > ndim:
        raise NKIError("index", f"{what} has {ndim} dimensions but is indexed with {len(key)} indices")
    out = []
    for k in key + (slice(None),) * (ndim - len(key)):
        if isinstance(k, ds):
            k = slice(k.start, k.start + k.size)
        elif isinstance(k, IndexExpr):
            if k.values.dtype == bool:
                raise NKIError("index", f"{what} is indexed with a boolean expression; pass it as mask= instead")
            k = k.values
        elif isinstance(k, (int, np.integer)):
            k = int(k)
        elif isinstance(k, slice):
            pass
        elif isinstance(k, NkiTensor):
            raise NKIError("dynamic-index", f"{what} is indexed with a tile; indices must be integers, slices or "
                           "nl.arange expressions known when the kernel is traced")
        else:
            raise NKIError("index", f"{what} cannot be indexed with {type(k).__name__}")
        out.append(k)
    return tuple(out)


def _line_slice(arr, axis, n_axes):
    """``arr`` as slice(start, stop) if it is a unit-step line along output ``axis`` of ``n_axes``."""
    if arr.ndim != n_axes or arr.size == 0:
        return None
    for a, n in enumerate(arr.shape):
        if a != axis and n != 1:
            line = arr[tuple(slice(None) if b == axis else 0 for b in range(n_axes))]
            if not np.array_equal(np.broadcast_to(line.reshape([-1 if b == axis else 1 for b in range(n_axes)]),
                                                  arr.shape), arr):
                return None
            break
    line = arr.reshape(-1) if all(n == 1 for a, n in enumerate(arr.shape) if a != axis) else \
        arr[tuple(slice(None) if b == axis else 0 for b in range(n_axes))]
    start = int(line[0])
    if not np.array_equal(line, np.arange(start, start + line.size)):
        return None
    return slice(start, start + line.size)


def _as_basic(key):
    """The key with every array index turned into a slice, or None if some cannot be."""
    arrays = [i for i, k in enumerate(key) if isinstance(k, np.ndarray)]
    if not arrays:
        return key
    if arrays != list(range(arrays[0], arrays[-1] + 1)):
        return None
    out = list(key)
    for j, i in enumerate(arrays):
        s = _line_slice(key[i], j, len(arrays))
        if s is None:
            return None
        out[i] = s
    return tuple(out)


def _in_bounds(key, shape):
    for k, n in zip(key, shape):
        if isinstance(k, int):
            if not -n <= k < n:
                return False
        elif isinstance(k, slice):
            start, stop, step = k.start, k.stop, k.step
            if (step is not None and step <= 0) or (start is not None and not 0 <= start <= n) or \
                    (stop is not None and not 0 <= stop <= n):
                return False
        elif k.size and (k.min() < 0 or k.max() >= n):
            return False
    return True


def _to_arrays(key, shape, what):
    """An all-advanced key equivalent to ``key`` (ints kept), for gathers and scatters."""
    has_arrays = any(isinstance(k, np.ndarray) for k in key)
    slices = [i for i, k in enumerate(key) if isinstance(k, slice)]
    if has_arrays and slices:
        raise NKIError("index", f"{what}: a subscript mixes slices with nl.arange index expressions in a way that "
                       "is not a plain tile access; NKI does not mix basic and advanced indexing (use index "
                       "expressions for every dimension)")
    out = list(key)
    for j, i in enumerate(slices):  # only slices: their outer product, as basic indexing would give
        k, n = key[i], shape[i]
        start = 0 if k.start is None else k.start
        stop = n if k.stop is None else k.stop
        out[i] = np.arange(start, stop, k.step or 1).reshape([-1 if b == j else 1 for b in range(len(slices))])
    return out


def _shape_of(key, shape):
    """The shape an access produces, computed on a zero-size stand-in (no data)."""
    stand_in = np.lib.stride_tricks.as_strided(np.zeros(1, dtype=bool), shape, [0] * len(shape))
    return tuple(stand_in[key].shape)


class NkiTensor:
    """A tensor in HBM or a tile in SBUF/PSUM, or a view of one (see the module docstring)."""

    __slots__ = ("data", "buffer", "alloc", "key", "shape", "__weakref__")

    def __init__(self, data: torch.Tensor, buffer: Buffer, alloc: Allocation, key=None, shape=None):
        self.data, self.buffer, self.alloc, self.key = data, buffer, alloc, key
        self.shape = tuple(data.shape) if key is None else shape

    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: len(self.shape))
    name = property(lambda self: self.alloc.name)

    def describe(self):
        return f"{self.alloc.describe()} of shape {self.shape} {str(self.data.dtype).replace('torch.', '')} in " \
               f"{self.buffer.name}"

    def __repr__(self):
        return f"NkiTensor({self.describe()})"

    def __len__(self):
        return self.shape[0]

    def __hash__(self):
        return id(self)

    def __bool__(self):
        raise NKIError("data-dependent-control-flow", f"{self.describe()} has no truth value while the kernel is "
                       "traced: control flow cannot depend on tile data (use nl.where or masks)")

    # -- access ---------------------------------------------------------------------------
    def __getitem__(self, key):
        if self.key is not None:
            raise NKIError("index", f"{self.describe()} is already an indexed access; index the tensor once")
        if type(key) is tuple and all(type(k) is slice or type(k) is int for k in key) and len(key) <= self.ndim \
                and _in_bounds(key, self.shape):
            return NkiTensor(self.data[key], self.buffer, self.alloc)  # the common case, kept fast
        key = _normalise(key, self.ndim, self.describe())
        basic = _as_basic(key)
        if basic is not None and _in_bounds(basic, self.shape):
            return NkiTensor(self.data[basic], self.buffer, self.alloc)
        arrays = _to_arrays(key, self.shape, self.describe())
        try:
            shape = _shape_of(tuple(np.clip(a, 0, n - 1) if isinstance(a, np.ndarray) else a
                                    for a, n in zip(arrays, self.shape)), self.shape)
        except IndexError as e:
            raise NKIError("index", f"{self.describe()}: {e}") from None
        return NkiTensor(self.data, self.buffer, self.alloc, tuple(arrays), shape)

    def _mask(self, mask):
        m = np.broadcast_to(_values(mask), self.shape) if mask is not None else None
        if self.key is not None:
            inside = np.ones(self.shape, dtype=bool)
            for a, n in zip(self.key, self.data.shape):
                if isinstance(a, np.ndarray):
                    inside &= np.broadcast_to((a >= 0) & (a < n), self.shape) if a.ndim else bool(0 <= a < n)
            if m is None and not inside.all():
                raise NKIError("out-of-bounds", f"an access to {self.describe()} reaches outside it; "
                               "mask the out-of-range positions with mask=")
            if m is not None and not inside[m].all():
                raise NKIError("out-of-bounds", f"an access to {self.describe()} reaches outside it at positions "
                               "the mask keeps")
        return m

    def _torch_key(self):
        return tuple(torch.from_numpy(np.clip(a, 0, n - 1)) if isinstance(a, np.ndarray) else a
                     for a, n in zip(self.key, self.data.shape))

    def read(self, mask=None, what="read"):
        """The values of this access as a torch tensor (a view for basic accesses)."""
        if not self.alloc.written:
            raise NKIError("undefined-tile", f"{what}: {self.describe()} is read before anything was written to it")
        m = self._mask(mask)
        value = self.data if self.key is None else self.data[self._torch_key()]
        if m is not None:
            value = torch.where(torch.from_numpy(np.array(m)).to(value.device), value,
                                torch.zeros((), dtype=value.dtype, device=value.device))
        return value

    def write(self, value, mask=None, what="write"):
        """Stores ``value`` (a torch tensor or a Python scalar) into this access."""
        if self.alloc.is_input and not self.alloc.mutable:
            raise NKIError("immutable-input", f"{what}: the kernel writes to its input {self.alloc.name!r}, which it "
                           "does not declare mutable (nki.jit(mutates_args=...) or nki_op(mutates_args=...))")
        m = self._mask(mask)
        if isinstance(value, torch.Tensor):
            try:
                value = value.to(self.data.dtype).expand(self.shape)
            except RuntimeError:
                raise NKIError("shape-mismatch", f"{what}: a value of shape {tuple(value.shape)} cannot be written "
                               f"to {self.describe()}") from None
        if m is not None and self.key is not None:  # scatter only the kept positions
            keep = np.array(m)
            index = tuple(torch.from_numpy(np.broadcast_to(a, self.shape)[keep]) if isinstance(a, np.ndarray) else a
                          for a in self.key)
            if isinstance(value, torch.Tensor):
                value = value[torch.from_numpy(keep)]
            self.data[index] = value
        elif m is not None:
            if not isinstance(value, torch.Tensor):
                value = torch.full(self.shape, value, dtype=self.data.dtype)
            self.data.copy_(torch.where(torch.from_numpy(np.array(m)), value, self.data))
        elif self.key is None:
            if isinstance(value, torch.Tensor):
                self.data.copy_(value)
            else:
                self.data.fill_(value)
        else:
            self.data[self._torch_key()] = value
        self.alloc.written = True

    def __setitem__(self, key, value):
        target = self[key]
        if isinstance(value, NkiTensor):
            _check_compute_operand(value, "tile assignment")
            value = value.read(what="tile assignment")
        target._check_on_chip("tile assignment")
        target.write(value, what="tile assignment")

    def _check_on_chip(self, what):
        if not self.buffer.on_chip:
            raise NKIError("compute-on-chip", f"{what}: {self.describe()} is in {self.buffer.name}; compute reads "
                           "and writes SBUF or PSUM tiles only (move data with nl.load / nl.store)")

    # -- arithmetic operators delegate to the language (bound in language.py) ----------------
    def __iadd__(self, other):
        return _inplace(self, other, "add")

    def __isub__(self, other):
        return _inplace(self, other, "subtract")

    def __imul__(self, other):
        return _inplace(self, other, "multiply")

    def __itruediv__(self, other):
        return _inplace(self, other, "divide")

    itemsize = property(lambda self: self.data.element_size())

    def reshape(self, shape):
        """A view with another shape (same elements, same memory), as NKI's ``tensor.reshape``."""
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        if self.key is not None:
            raise NKIError("reshape", f"{self.describe()}: an indexed access cannot be reshaped; reshape the tensor")
        try:
            return NkiTensor(self.data.view(shape), self.buffer, self.alloc)
        except RuntimeError as e:
            raise NKIError("reshape", f"cannot reshape {self.describe()} to {shape}: {e}") from None

    def expand_dims(self, axis):
        shape = list(self.shape)
        shape.insert(axis if axis >= 0 else len(shape) + 1 + axis, 1)
        return self.reshape(shape)

    def astype(self, dtype):
        from torchneuron.nki import language
        return language.copy(self, dtype=dtype)

    def broadcast_to(self, shape):
        from torchneuron.nki import language
        return language.broadcast_to(self, shape=shape)

    @property
    def T(self):
        from torchneuron.nki import language
        return language.transpose(self)


def _inplace(tile, other, op):
    from torchneuron.nki import language
    result = getattr(language, op)(tile, other)
    tile._check_on_chip(f"in-place {op}")
    tile.write(result.read(), what=f"in-place {op}")
    return tile


def _check_compute_operand(t, what):
    t._check_on_chip(what)


def new_tile(shape, dtype, buffer, name="tile", data=None, written=False):
    """Allocates a tile (or, for HBM buffers, a kernel-local tensor) in the current call."""
    ctx = _context.current()
    shape = tuple(int(n) for n in shape)
    alloc = Allocation(name, written=written)
    if buffer.on_chip:
        if not shape:
            raise NKIError("tile-shape", f"a tile in {buffer.name} needs at least one dimension (the partition "
                           "dimension)")
        if shape[0] > ctx.platform.pmax:
            raise NKIError("partition-dim", f"a tile of shape {shape} in {buffer.name} has partition dimension "
                           f"{shape[0]}, but a tile has at most {ctx.platform.pmax} partitions")
        ctx.allocate(alloc, buffer.name, shape, dtype.itemsize)
    if data is None:
        data = _context.scratch(shape, dtype) if ctx.checking else torch.empty(shape, dtype=dtype)
    return NkiTensor(data, buffer, alloc)
