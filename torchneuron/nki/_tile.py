"""Tensors and tiles of a kernel, and the index expressions that address them.

An ``NkiTensor`` is a named allocation in one memory (HBM, SBUF, PSUM) or a view of one. Basic
accesses (ints, slices, ``nl.ds``, and ``nl.arange`` expressions that are unit-step lines along
their own axis) are zero-copy torch views; other index expressions, and any masked access, are
resolved when the access is read or written (a gather or scatter), so masked-off positions may
lie outside the tensor.
"""

import itertools
import math

import numpy as np
import torch

from torchneuron.nki import _context
from torchneuron.nki._batch import Additive, Affine, RuntimeInt, Unbatchable, affine_values, simplify
from torchneuron.nki._dtypes import PackedDtype, as_dtype, packed_error  # noqa: F401 - as_dtype re-exported
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


class ParDim(int):
    """A shape entry marking the partition dimension of an on-chip tensor (``nl.par_dim(n)``). The
    dimensions before it are block dimensions (NKI's (B, P, F) tensors): each block is a (P, F) tile
    with a live range of its own, and only the partition dimension is limited to ``pmax``."""

    __slots__ = ()


class Allocation:
    """What all views of one tensor share: its name, where it was made, whether it holds data."""

    __slots__ = ("name", "line", "written", "is_input", "mutable", "modified", "groups", "viewed", "borrowed",
                 "shadow", "root", "root_batch", "computed", "live", "__weakref__")

    def __init__(self, name, written=False, is_input=False, mutable=False):
        self.name, self.written, self.is_input, self.mutable = name, written, is_input, mutable
        self.modified = False  # an input the kernel wrote
        self.groups = None  # PSUM regions in an open matmul accumulation group (see nisa.nc_matmul)
        self.viewed = False  # a view of the tile exists (its batch dims can no longer grow)
        self.borrowed = False  # the tile's data is still its source input's memory (see NkiTensor.borrow)
        # Check pass, on-chip tiles: which elements hold data (laid out like the tile's data).
        self.shadow = None
        # The whole tensor's data and batch loops (set by its first NkiTensor): what access patterns address.
        self.root, self.root_batch = None, ()
        self.computed = False  # the result of a computation (a value, not a handle: no truth value)
        self.live = None  # check pass, on-chip tiles: its live range (_context.Live)
        self.line = None if is_input else kernel_position()

    def describe(self):
        if self.line is None:
            return self.name
        return f"{self.name} (allocated at line {self.line[1]})"


class IndexExpr(Additive):
    """Integer (or, after a comparison, boolean) indices built from ``nl.arange``: a NumPy array plus
    an offset that is an int or, in a batched loop, an ``Affine`` loop-dependent value."""

    __slots__ = ("values", "offset")
    __array_priority__ = 100

    def __init__(self, values, offset=0):
        self.values = np.asarray(values)
        self.offset = offset

    @property
    def shape(self):
        return self.values.shape

    def concrete(self):
        """The indices as an array (a loop-dependent offset cannot be one)."""
        if isinstance(self.offset, Affine):
            raise Unbatchable(self.offset.coeffs, "an index expression that moves with a batched loop is used "
                              "as a mask or an array")
        return self.values + self.offset if self.offset else self.values

    def __getitem__(self, key):
        return IndexExpr(self.values[key], self.offset)

    def __repr__(self):
        return f"IndexExpr(shape={self.values.shape})"

    def __bool__(self):
        raise NKIError("index-expression", "an index expression has no truth value; use it as a mask= argument")

    def __add__(self, other):
        if isinstance(other, IndexExpr):
            return IndexExpr(self.values + other.values, simplify(Affine.of(self.offset) + other.offset))
        if isinstance(other, Affine):
            return IndexExpr(self.values, simplify(Affine.of(self.offset) + other))
        return IndexExpr(self.values + other, self.offset)

    def __neg__(self):
        return IndexExpr(-self.values, simplify(-Affine.of(self.offset)))

    def __mul__(self, other):
        if isinstance(other, int):
            return IndexExpr(self.values * other, simplify(Affine.of(self.offset) * other))
        return IndexExpr(self.concrete() * _values(other))


def _values(x):
    return x.concrete() if isinstance(x, IndexExpr) else x


def _moves(x):
    return isinstance(x, (LoopMask, Affine)) or (isinstance(x, IndexExpr) and isinstance(x.offset, Affine))


def _index_op(fn, torch_fn):
    def op(self, other):
        if _moves(self) or _moves(other):
            return LoopMask(torch_fn(LoopMask.tensor(self), LoopMask.tensor(other)))
        return IndexExpr(fn(self.concrete(), _values(other)))
    return op


def _rindex_op(fn, torch_fn):
    def op(self, other):
        if _moves(self) or _moves(other):
            return LoopMask(torch_fn(LoopMask.tensor(other), LoopMask.tensor(self)))
        return IndexExpr(fn(_values(other), self.concrete()))
    return op


class LoopMask:
    """A mask that moves with batched loops: a bool tensor aligned to the loop frame it was made in
    (leading dims: the frame's loops), then the mask's own dims."""

    __slots__ = ("keep", "frame")

    def __init__(self, keep):
        self.keep, self.frame = keep, _context.current().frame

    @staticmethod
    def tensor(x):
        """``x`` (index expression, loop variable, mask or number) as a frame-aligned tensor."""
        n = len(_context.current().frame)
        if isinstance(x, LoopMask):
            return x.keep
        if isinstance(x, IndexExpr):
            base = torch.from_numpy(np.array(x.values))
            if isinstance(x.offset, Affine):
                offset = affine_values(x.offset)
                return base.reshape([1] * n + list(base.shape)) + offset.reshape(list(offset.shape) + [1] * base.dim())
            return (base + x.offset).reshape([1] * n + list(base.shape))
        if isinstance(x, Affine):
            return affine_values(x)
        return x

    def __and__(self, other):
        return LoopMask(torch.logical_and(self.keep, LoopMask.tensor(other)))

    def __or__(self, other):
        return LoopMask(torch.logical_or(self.keep, LoopMask.tensor(other)))

    __rand__, __ror__ = __and__, __or__

    def __invert__(self):
        return LoopMask(torch.logical_not(self.keep))

    def __bool__(self):
        raise NKIError("index-expression", "a mask has no truth value; use it as a mask= argument")


for _name, _fn, _tfn in [("floordiv", np.floor_divide, torch.floor_divide), ("mod", np.mod, torch.remainder),
                         ("and", np.logical_and, torch.logical_and), ("or", np.logical_or, torch.logical_or),
                         ("xor", np.logical_xor, torch.logical_xor)]:
    setattr(IndexExpr, f"__{_name}__", _index_op(_fn, _tfn))
    setattr(IndexExpr, f"__r{_name}__", _rindex_op(_fn, _tfn))
for _name, _fn, _tfn in [("lt", np.less, torch.lt), ("le", np.less_equal, torch.le), ("gt", np.greater, torch.gt),
                         ("ge", np.greater_equal, torch.ge), ("eq", np.equal, torch.eq), ("ne", np.not_equal, torch.ne)]:
    setattr(IndexExpr, f"__{_name}__", _index_op(_fn, _tfn))
IndexExpr.__invert__ = lambda self: IndexExpr(~self.concrete().astype(bool))
IndexExpr.__hash__ = object.__hash__


class ds:
    """``nl.ds(start, size)``: a dynamic slice of ``size`` elements from ``start``."""

    __slots__ = ("start", "size")

    def __init__(self, start, size):
        self.start, self.size = (start if isinstance(start, Affine) else int(start)), int(size)


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
            k = _Shifted(k.values, k.offset) if isinstance(k.offset, Affine) else k.concrete()
        elif isinstance(k, (int, np.integer)):
            k = int(k)
        elif isinstance(k, Affine):
            pass
        elif isinstance(k, slice):
            pass
        elif isinstance(k, NkiTensor):
            raise NKIError("dynamic-index", f"{what} is indexed with a tile; indices must be integers, slices or "
                           "nl.arange expressions known when the kernel is traced")
        else:
            raise NKIError("index", f"{what} cannot be indexed with {type(k).__name__}")
        out.append(k)
    return tuple(out)


def _scratch_key(key, shape):
    """In the check and trial passes, indices that are ``RuntimeInt`` (``dynamic_range`` variables
    over register bounds) hold scratch data: moved inside the tensor, keeping the access's size (the
    run pass checks the real ones)."""
    entries = key if isinstance(key, tuple) else (key,)

    def runtime(x):
        return isinstance(x, RuntimeInt)

    if not any(runtime(k) or isinstance(k, slice) and (runtime(k.start) or runtime(k.stop))
               or isinstance(k, ds) and runtime(k.start) for k in entries):
        return key
    out = []
    for k, n in zip(entries, shape):
        if runtime(k):
            k = min(max(int(k), 0), n - 1)
        elif isinstance(k, ds) and runtime(k.start):
            k = ds(min(max(int(k.start), 0), max(n - k.size, 0)), k.size)
        elif isinstance(k, slice) and (runtime(k.start) or runtime(k.stop)) and k.start is not None \
                and k.stop is not None:
            size = max(int(k.stop) - int(k.start), 0)
            start = min(max(int(k.start), 0), max(n - size, 0))
            k = slice(start, start + size, k.step)
        out.append(k)
    return tuple(out) + tuple(entries[len(out):])


class _Shifted:
    """Index values plus a loop-dependent offset (only usable where it becomes a slice)."""

    __slots__ = ("values", "offset")

    def __init__(self, values, offset):
        self.values, self.offset = values, offset


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


def _varies(a, axis):
    """Whether ``a`` (a NumPy array or torch tensor) takes more than one value along ``axis``."""
    if a.shape[axis] < 2:
        return False
    head = tuple(slice(1, None) if d == axis else slice(None) for d in range(a.ndim))
    tail = tuple(slice(None, -1) if d == axis else slice(None) for d in range(a.ndim))
    return bool((a[head] != a[tail]).any())


def _grid_key(key):
    """Index arrays from a dense grid with more axes than the access has array subscripts, as in
    ``i_p, i_1, i_f = nl.mgrid[0:128, 0:1, 0:F]`` and then ``t[i_p, i_f]`` or ``w[i_1, i_f]``: NKI
    gives the access one dim per grid axis its subscripts use (in subscript order; a subscript
    that uses none, a size-1 dim), not NumPy's broadcast of all the grid's axes. Other keys
    (``nl.arange`` expressions, whose size-1 dims are ``None`` positions the kernel wrote, and
    grids the access uses every axis of) are returned as they are."""
    pos = [i for i, k in enumerate(key) if isinstance(k, (np.ndarray, _Shifted))]
    values = [key[i].values if isinstance(key[i], _Shifted) else key[i] for i in pos]
    try:
        shape = np.broadcast_shapes(*(v.shape for v in values))
    except ValueError:
        return key
    if len(shape) <= len(pos) or not any(v.shape[d] > 1 and not _varies(v, d) for v in values for d in range(v.ndim)):
        return key  # (a dense grid repeats each index along the axes it does not vary along)
    full = [np.broadcast_to(v, shape) for v in values]
    order = []  # per dim of the access: a grid axis, or None (a subscript that uses no axis)
    for v in full:
        mine = [d for d in range(len(shape)) if d not in order and _varies(v, d)]
        order += mine or [None]
    used = sorted(d for d in order if d is not None)
    pick = tuple(slice(None) if d in used else 0 for d in range(len(shape)))
    perm = [used.index(d) for d in order if d is not None]
    ones = [i for i, d in enumerate(order) if d is None]
    out = list(key)
    for i, v in zip(pos, full):
        v = np.expand_dims(v[pick].transpose(perm), ones) if ones else v[pick].transpose(perm)
        out[i] = _Shifted(v, key[i].offset) if isinstance(key[i], _Shifted) else v
    return tuple(out)


def _fit_dims(m, shape, lead=0):
    """A mask ``m`` (an array, or a tensor with ``lead`` loop-frame dims) made for more or larger
    dims than the tile of ``shape`` it applies to: made on a larger grid (see _grid_key), or for a
    reduction's input and applied to its result (size 1 along the reduced dims). Dims it does not
    vary along are dropped (size-1 ones first) or taken once, so it fits; other masks are returned
    as they are."""
    extra = m.ndim - lead - len(shape)
    if extra > 0:
        dims = range(lead, m.ndim)
        spare = [d for d in dims if m.shape[d] == 1] + [d for d in dims if m.shape[d] > 1 and not _varies(m, d)]
        for drop in itertools.combinations(spare, extra):
            if all(k in (1, n) for k, n in zip([m.shape[d] for d in dims if d not in drop], shape)):
                m = m[tuple(0 if d in drop else slice(None) for d in range(m.ndim))]
                break
        else:
            return m
    once = [d for d, n in zip(range(lead, m.ndim), shape) if n == 1 and m.shape[d] > 1 and not _varies(m, d)]
    if once:
        m = m[tuple(slice(0, 1) if d in once else slice(None) for d in range(m.ndim))]
    return m


def _as_basic(key):
    """The key with every array index turned into a slice, or None if some cannot be."""
    arrays = [i for i, k in enumerate(key) if isinstance(k, (np.ndarray, _Shifted))]
    if not arrays:
        return key
    if arrays != list(range(arrays[0], arrays[-1] + 1)):
        return None
    out = list(key)
    for j, i in enumerate(arrays):
        k = key[i]
        s = _line_slice(k.values if isinstance(k, _Shifted) else k, j, len(arrays))
        if s is None:
            return None
        if isinstance(k, _Shifted):
            s = slice(k.offset + s.start, k.offset + s.stop)
        out[i] = s
    return tuple(out)


def _affine_loops(key):
    loops = set()
    for k in key:
        for part in ((k.start, k.stop) if isinstance(k, slice) else (k.offset,) if isinstance(k, _Shifted) else (k,)):
            if isinstance(part, Affine):
                loops |= part.coeffs.keys()
    return loops


def _basic_view(t, key):
    """``t[key]`` for ints, slices and loop-dependent (Affine) offsets, as a strided view with a
    batch dimension per loop; None if the access reaches outside ``t``."""
    ctx = _context.current()
    nb = len(t.batch)
    sizes, strides = t.data.shape, t.data.stride()
    offset = t.data.storage_offset()
    batch_strides = dict(zip(t.batch, strides[:nb]))
    batch_sizes = dict(zip(t.batch, sizes[:nb]))
    tile_sizes, tile_strides = [], []
    for d, k in enumerate(key):
        n, stride = sizes[nb + d], strides[nb + d]
        if isinstance(k, slice):
            step = 1 if k.step is None else k.step
            start = 0 if k.start is None else k.start
            stop = n if k.stop is None else k.stop
            if isinstance(start, int) and isinstance(stop, int):
                if not (-n <= start <= n and -n <= stop <= n) or step <= 0:
                    return None
                start, stop, _ = slice(start, stop).indices(n)
            length = simplify(Affine.of(stop) - start)
            if isinstance(length, Affine):
                raise Unbatchable(length.coeffs, "a slice whose length moves with a batched loop")
            count = max(0, -(-length // step))
            low, high = Affine.of(start).bounds(ctx.loop_sizes)
            if count and (low < 0 or high + (count - 1) * step >= n):
                return None
            tile_sizes.append(count)
            tile_strides.append(step * stride)
            k = start
        else:
            if isinstance(k, int) and -n <= k < 0:
                k += n
            low, high = Affine.of(k).bounds(ctx.loop_sizes)
            if low < 0 or high >= n:
                return None
        k = Affine.of(k)
        offset += k.const * stride
        for loop, c in k.coeffs.items():
            if batch_sizes.get(loop, 1) == 1:  # the same data in every iteration, read at moving offsets
                batch_sizes[loop], batch_strides[loop] = ctx.loop_sizes[loop], c * stride
            else:
                batch_strides[loop] += c * stride
    loops = sorted(batch_strides)
    data = t.data.as_strided([batch_sizes[b] for b in loops] + tile_sizes,
                             [batch_strides[b] for b in loops] + tile_strides, offset)
    return NkiTensor(data, t.buffer, t.alloc, batch=tuple(loops), packed=t.packed)


def mask_array(mask, shape):
    """A mask as a boolean array of ``shape`` (a LoopMask: its frame-aligned tensor); None when it
    keeps everything."""
    if mask is None:
        return None
    if isinstance(mask, LoopMask):
        m = _fit_dims(mask.keep, shape, lead=len(mask.frame))
    else:
        m = np.broadcast_to(_fit_dims(np.asarray(_values(mask)), shape), shape)
    return None if bool(m.all()) else m


def keep_only(values, m):
    """``values`` with the elements outside ``m`` (from mask_array) set to zero."""
    if m is None:
        return values
    keep = m if isinstance(m, torch.Tensor) else torch.from_numpy(np.array(m))
    return torch.where(keep, values, torch.zeros((), dtype=values.dtype))


def align(data, batch, frame):
    """``data`` (leading dims: ``batch`` loops) seen from ``frame``: one leading dim per active loop
    (size 1 where it does not vary); loops that have ended contribute their last iteration."""
    if batch == frame:
        return data
    if any(b not in frame for b in batch):
        data = data[tuple(slice(None) if b in frame else -1 for b in batch)]
        batch = tuple(b for b in batch if b in frame)
    nb = len(batch)
    shape = [data.shape[batch.index(f)] if f in batch else 1 for f in frame] + list(data.shape[nb:])
    return data.reshape(shape)


def _in_bounds(key, shape):
    for k, n in zip(key, shape):
        if isinstance(k, (Affine, _Shifted)):
            return False
        if isinstance(k, int):
            if not -n <= k < n:
                return False
        elif isinstance(k, slice):
            start, stop, step = k.start, k.stop, k.step
            if isinstance(start, Affine) or isinstance(stop, Affine):
                return False
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
    if any(key[i].step is not None and key[i].step <= 0 for i in slices):
        raise NKIError("index", f"{what}: slice steps must be positive")
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

    __slots__ = ("data", "buffer", "alloc", "key", "shape", "batch", "packed", "__weakref__")

    def __init__(self, data: torch.Tensor, buffer: Buffer, alloc: Allocation, key=None, shape=None, batch=(),
                 packed=None):
        self.data, self.buffer, self.alloc, self.key, self.batch = data, buffer, alloc, key, batch
        self.shape = tuple(data.shape[len(batch):]) if key is None else shape
        # a packed MX dtype (see _dtypes): ``data`` holds its bits; views of this view keep it
        self.packed = packed
        if alloc.root is None:
            alloc.root, alloc.root_batch = data, batch

    # the dtype the kernel sees: a torch dtype, or the packed MX dtype whose bits ``data`` holds
    dtype = property(lambda self: self.packed or self.data.dtype)
    ndim = property(lambda self: len(self.shape))
    name = property(lambda self: self.alloc.name)

    def describe(self):
        return f"{self.alloc.describe()} of shape {self.shape} {str(self.dtype).replace('torch.', '')} in " \
               f"{self.buffer.name}"

    def _plain(self, what, raw):
        """Values of a packed MX tile are bits only the MX instructions read or write (``raw``)."""
        if self.packed is not None and not raw:
            raise packed_error(self.packed, f"{what} of {self.describe()}")

    def __repr__(self):
        return f"NkiTensor({self.describe()})"

    def __len__(self):
        return self.shape[0]

    def __hash__(self):
        return id(self)

    def __bool__(self):
        """A handle (an argument, an allocation or a view of one) is true, as Python objects are
        (``if bias:``); a computed tile's truth would depend on its data."""
        if self.alloc.computed:
            raise NKIError("data-dependent-control-flow", f"{self.describe()} has no truth value while the kernel "
                           "is traced: control flow cannot depend on tile data (use nl.where or masks)")
        return True

    # -- access ---------------------------------------------------------------------------
    def __getitem__(self, key):
        if self.key is not None:
            raise NKIError("index", f"{self.describe()} is already an indexed access; index the tensor once")
        self._materialise_batch()
        self.alloc.viewed = True
        ctx = getattr(_context._local, "ctx", None)
        if ctx is not None and (ctx.checking or ctx.trial):
            key = _scratch_key(key, self.shape)
        if not self.batch and type(key) is tuple and all(type(k) is slice or type(k) is int for k in key) \
                and len(key) <= self.ndim and _in_bounds(key, self.shape):
            return NkiTensor(self.data[key], self.buffer, self.alloc, packed=self.packed)  # the common case, kept fast
        key = _grid_key(_normalise(key, self.ndim, self.describe()))
        basic = _as_basic(key)
        if basic is not None:
            view = _basic_view(self, basic)
            if view is not None:
                return view
        loops = _affine_loops(key) | set(self.batch)
        if loops:
            raise Unbatchable(loops, "a gather, or an access reaching outside a tensor, in a batched loop")
        arrays = _to_arrays(key, self.shape, self.describe())
        try:
            shape = _shape_of(tuple(np.clip(a, 0, n - 1) if isinstance(a, np.ndarray) else a
                                    for a, n in zip(arrays, self.shape)), self.shape)
        except IndexError as e:
            raise NKIError("index", f"{self.describe()}: {e}") from None
        return NkiTensor(self.data, self.buffer, self.alloc, tuple(arrays), shape, packed=self.packed)

    def _mask(self, mask):
        """The mask as an array of this access's shape (a frame-aligned tensor for a LoopMask);
        None when it keeps everything."""
        if isinstance(mask, LoopMask):
            if mask.frame != _context.current().frame or self.key is not None:
                raise Unbatchable(set(mask.frame) | set(_context.current().frame), "a loop-dependent mask used "
                                  "outside its loop, or on a gather")
            return mask_array(mask, self.shape)
        m = np.broadcast_to(_fit_dims(np.asarray(_values(mask)), self.shape), self.shape) \
            if mask is not None else None
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
        return mask_array(m, self.shape)  # a mask that keeps everything (a full tile) costs nothing

    def _torch_key(self):
        return tuple(torch.from_numpy(np.clip(a, 0, n - 1)) if isinstance(a, np.ndarray) else a
                     for a, n in zip(self.key, self.data.shape))

    def read(self, mask=None, what="read", accumulating=False, touch=True, raw=False):
        """The values of this access as a torch tensor (a view for basic accesses).

        Reading a PSUM tile (other than a matmul accumulating into it) ends its accumulation groups.
        A packed MX tile's bits are read only by instructions that know the format (``raw``).
        """
        self._plain(what, raw)
        if self.buffer is psum and self.alloc.groups and not accumulating:
            self.alloc.groups.clear()
        if not self.alloc.written:
            raise NKIError("undefined-tile", f"{what}: {self.describe()} is read before anything was written to it")
        _observe_cores(self, False, what)
        m = self._mask(mask)
        if self.alloc.shadow is not None:
            defined = self._defined()
            defined = defined[torch.from_numpy(np.array(np.broadcast_to(m, self.shape)))] if m is not None else defined
            if not bool(defined.all()):
                raise NKIError("undefined-tile", f"{what}: {self.describe()} is read where nothing was written "
                               f"({int((~defined).sum())} of {defined.numel()} elements read are undefined)")
        if self.alloc.live is not None and touch:  # an accumulation reads and writes: it ends its instruction
            self._touch(accumulating)
        value = self.data if self.key is None else self.data[self._torch_key()]
        frame = _context.current().frame
        if self.batch or frame:
            value = align(value, self.batch, frame)
        return keep_only(value, m)

    def write(self, value, mask=None, what="write", fresh=False, accumulating=False, raw=False):
        """Stores ``value`` (a torch tensor aligned to the current loop frame, or a Python scalar).

        ``fresh``: the caller made ``value`` and holds no other reference to its memory, so a
        whole-tile write may adopt it instead of copying. Writing a PSUM tile (other than a matmul
        accumulating into it) ends its accumulation groups. ``raw``: ``value`` is the bits of a
        packed MX tile, written by an instruction that knows the format.
        """
        self._plain(what, raw)
        if self.buffer is psum and self.alloc.groups and not accumulating:
            self.alloc.groups.clear()
        self._own(keep_values=mask is not None or self.key is not None)
        if self.alloc.is_input:
            if not self.alloc.mutable:
                raise NKIError("immutable-input", f"{what}: the operator writes to its input {self.alloc.name!r}, which "
                               "it does not declare (nki_op(mutates_args=...), or annotate it nt.mutable_tensor)")
            self.alloc.modified = True
        _observe_cores(self, True, what)
        if self.key is None and self.data is not self.alloc.root and any(
                st == 0 and n > 1 for n, st in zip(self.shape, self.data.stride()[len(self.batch):])):
            raise NKIError("access-pattern", f"{what}: {self.describe()} is a broadcast view (step 0), which can "
                           "be read but not written")
        m = self._mask(mask)
        frame = _context.current().frame
        if isinstance(value, Affine):  # a loop-dependent integer: its value in each iteration
            value = affine_values(value)
            value = value.reshape(list(value.shape) + [1] * len(self.shape))
        if isinstance(value, torch.Tensor) and frame:
            self._grow(value, frame)
            value = self._fit_frame(value, frame)
        target = self.data
        if self.batch and any(b not in frame for b in self.batch):  # a tile of a loop that has ended
            target = target[tuple(slice(None) if b in frame else -1 for b in self.batch)]
        lead = sum(1 for b in self.batch if b in frame)
        if isinstance(value, torch.Tensor):
            try:
                value = value.to(self.data.dtype)
                want = list(target.shape[:lead]) + list(self.shape)
                if list(value.shape) != want:
                    value = value.expand(want)
            except RuntimeError:
                raise NKIError("shape-mismatch", f"{what}: a value of shape {tuple(value.shape[lead:])} cannot be "
                               f"written to {self.describe()}") from None
        if m is not None and self.key is not None:  # scatter only the kept positions
            keep = np.array(m)
            index = tuple(torch.from_numpy(np.broadcast_to(a, self.shape)[keep]) if isinstance(a, np.ndarray) else a
                          for a in self.key)
            if isinstance(value, torch.Tensor):
                value = value[torch.from_numpy(keep)]
            target[index] = value
        elif m is not None:
            if not isinstance(value, torch.Tensor):
                value = torch.full(self.shape, value, dtype=self.data.dtype)
            keep = self._fit_frame(m, frame) if isinstance(m, torch.Tensor) else torch.from_numpy(np.array(m))
            target.copy_(torch.where(keep, value, target))
        elif self.key is None:
            if fresh and target is self.data and not self.alloc.viewed and self.buffer.on_chip and \
                    value.shape == target.shape and value._base is None and value.is_contiguous():
                self._replace_data(value)  # adopt: the value becomes the tile
                self.alloc.shadow = None
            elif isinstance(value, torch.Tensor):
                target.copy_(value)
            else:
                target.fill_(value)
        else:
            target[self._torch_key()] = value
        self.alloc.written = True
        self._mark_defined(m)

    def _plain_shadow(self):
        """Whether this access's part of the shadow has the geometry of its part of the data."""
        return self.key is None and self.data.element_size() == self.alloc.root.element_size()

    def _shadow_region(self):
        """This access's part of the tile's shadow, as a view (see _plain_shadow)."""
        return self.alloc.shadow.as_strided(self.data.size(), self.data.stride(), self.data.storage_offset())

    def _shadow_index(self):
        """Indices into the flat shadow of the tile elements this access covers: its shape, plus a
        trailing dim when one of its elements spans several of the tile's (a reinterpreting view)."""
        d = self.data
        pos = torch.full((), d.storage_offset(), dtype=torch.int64)
        for i, (n, st) in enumerate(zip(d.shape, d.stride())):
            pos = pos + torch.arange(n).reshape([-1 if j == i else 1 for j in range(d.dim())]) * st
        pos = pos.expand(d.shape)
        if self.key is not None:
            pos = pos[self._torch_key()]
        root = self.alloc.root
        e, s = d.element_size(), root.element_size()
        first = pos * e - root.storage_offset() * s  # bytes into the tile
        if e > s:
            return (first // s).unsqueeze(-1) + torch.arange(e // s)
        return first // s

    def _defined(self):
        """Check pass: which elements of this access hold data."""
        if self._plain_shadow():
            return self._shadow_region()
        defined = self.alloc.shadow.view(-1)[self._shadow_index()]
        return defined.all(-1) if self.data.element_size() > self.alloc.root.element_size() else defined

    def _touch(self, write):
        """Check pass: this access is used by the current instruction (see _context.Ledger); a write
        ends the instruction."""
        live = self.alloc.live
        if live is not None:
            live.ledger.touch(live, write, self._blocks() if live.blocks > 1 else None)
        elif write and not self.buffer.on_chip and _context.current().checking:
            _context.current().ledger().tick((self.alloc.name, self.alloc.line))

    def _blocks(self):
        """The blocks (of a tensor with block dims) this access covers, as an index array; None: all."""
        root, live = self.alloc.root, self.alloc.live
        if self.data.untyped_storage().data_ptr() != root.untyped_storage().data_ptr() or \
                root.storage_offset() or not root.is_contiguous():
            return None  # (memory borrowed from an input)
        per_block = root.numel() // live.blocks
        d = self.data
        if self.key is None and d.element_size() == root.element_size():
            if d.numel() == 0:
                return np.zeros(0, np.int64)
            low = d.storage_offset()
            high = low + sum((n - 1) * st for n, st in zip(d.shape, d.stride()))
            if low // per_block == high // per_block:
                return np.array([low // per_block])
        return np.unique(self._shadow_index().reshape(-1).numpy() // per_block)

    def _mark_defined(self, mask=None):
        """Check pass: records that this access was written (its live range, and which elements
        of the tile this write defined)."""
        self._touch(True)
        shadow = self.alloc.shadow
        if shadow is None:
            return
        keep = None if mask is None else torch.from_numpy(np.array(np.broadcast_to(mask, self.shape)))
        if self._plain_shadow():
            region = self._shadow_region()
            if keep is None:
                region.fill_(True)
            else:
                region |= keep
        else:  # a scatter or a reinterpreting view: a partly written element counts as written
            index = self._shadow_index()
            shadow.view(-1)[index if keep is None else index[keep]] = True
        if bool(shadow.all()):
            self.alloc.shadow = None  # wholly defined: nothing left to check

    def borrow(self, values):  # callers check borrowable(source) first
        """Loads a fresh SBUF tile from an input the kernel cannot write, without copying: the tile
        keeps the input's memory until something is about to write it or view it (then it copies)."""
        loading = not self.alloc.written  # (nl.load's result was written when it was made)
        self._replace_data(values)
        self.alloc.borrowed = self.alloc.written = True
        self.alloc.shadow = None
        if loading:
            self._touch(True)

    def _own(self, keep_values=True):
        if self.alloc.borrowed:  # row-major, as the memory access patterns address
            self._replace_data(self.data.clone(memory_format=torch.contiguous_format) if keep_values else
                               torch.empty_like(self.data, memory_format=torch.contiguous_format))
            self.alloc.borrowed = False

    def _replace_data(self, data):
        """Gives this root tensor (nothing views it) new memory."""
        self.data = self.alloc.root = data

    def _materialise_batch(self):
        """Views fix the layout: give a tile all its batch dims before the first view is made."""
        self._own()
        if not self.alloc.viewed and self.batch and self.key is None:
            sizes = _context.current().loop_sizes
            self._resize([sizes[b] for b in self.batch])

    def _grow(self, value, frame):
        """A tile made in a batched loop starts with size-1 batch dims (one copy for all iterations);
        its first write gives it the dims along which the written values differ."""
        if self.key is not None or self.alloc.viewed or not self.batch or any(b not in frame for b in self.batch):
            return
        self._resize([max(self.data.shape[i], value.shape[frame.index(b)]) for i, b in enumerate(self.batch)])

    def _resize(self, batch_sizes):
        """Gives this (root, unviewed) tile batch dims of the given sizes, keeping its values."""
        if batch_sizes == list(self.data.shape[:len(self.batch)]):
            return
        if self.alloc.written:
            self._replace_data(self.data.expand(batch_sizes + list(self.shape)).clone(
                memory_format=torch.contiguous_format))
            self.alloc.borrowed = False
        else:
            self._replace_data(torch.empty(batch_sizes + list(self.shape), dtype=self.data.dtype))

    def _fit_frame(self, value, frame):
        """Drops the frame dims this tile does not have; iterations must agree on what they write."""
        drop = [i for i, f in enumerate(frame) if f not in self.batch or self.key is not None]
        varying = {frame[i] for i in drop if value.shape[i] != 1}
        if varying:
            raise Unbatchable(varying, "iterations of a batched loop write different values to one place "
                              "(a loop-carried dependency)")
        if not drop:
            return value
        kept = [i for i, f in enumerate(frame) if i not in drop]
        for i in kept:
            b = self.batch.index(frame[i])
            if value.shape[i] != 1 and self.data.shape[b] == 1:
                raise Unbatchable({frame[i]}, "a tile that was the same in every iteration is overwritten with "
                                  "values that differ")
        return value.reshape([value.shape[i] for i in kept] + list(value.shape[len(frame):]))

    def __setitem__(self, key, value):
        whole = key is Ellipsis or (type(key) is slice and key == slice(None))
        target = self if whole else self[key]
        direct = None
        if isinstance(value, NkiTensor):
            value._check_on_chip("tile assignment")
            # `t[...] = op(...)`: the instruction writes its result into t itself, no tile in between
            live = value.alloc.live
            if live is not None and value.alloc.computed and value.key is None and value.data is value.alloc.root \
                    and live.ledger.elide(live):
                direct = live
            value = value.read(what="tile assignment", touch=direct is None)
        target._check_on_chip("tile assignment")
        target.write(value, what="tile assignment")
        into = target.alloc.live
        if direct is not None and into is not None and into.ledger is direct.ledger:
            direct.ledger.into(direct, into, target._blocks() if into.blocks > 1 else None)

    def _check_on_chip(self, what):
        if not self.buffer.on_chip:
            raise NKIError("compute-on-chip", f"{what}: {self.describe()} is in {self.buffer.name}; compute reads "
                           "and writes SBUF or PSUM tiles only (move data with nl.load / nl.store)")

    # Arithmetic operators, in place or not, astype, broadcast_to and T are the language's (bound
    # in language.py); the methods that address memory (ap, view, select, ...) are _access's.

    itemsize = property(lambda self: self.data.element_size())

    # -- views: the same memory seen another way ----------------------------------------------
    def _view(self, what, rule, make):
        """A view whose data is ``make(data, nb)`` (``nb``: the data's leading batch dims)."""
        if self.key is not None:
            return self._view_of_gather(what, rule, make)
        self._materialise_batch()
        try:
            data = make(self.data, len(self.batch))
        except NKIError:
            raise
        except RuntimeError as e:
            raise NKIError(rule, f"{what} of {self.describe()}: {e}") from None
        self.alloc.viewed = True
        return NkiTensor(data, self.buffer, self.alloc, batch=self.batch, packed=self.packed)

    def _view_of_gather(self, what, rule, make):
        """A view (reshape, permute, broadcast, ...) of an indexed access that keeps every element in
        its row of dimension 0 (NKI allows those after ``vector_select``): the same gather, its
        indices rearranged. Reinterpreting its bytes (``view(dtype)``) is not possible."""
        if rule == "view" or not self.shape:
            raise NKIError(rule, f"{what}: {self.describe()} is an indexed access (a gather); view the tensor")
        positions = torch.arange(math.prod(self.shape)).reshape(self.shape)
        try:
            moved = make(positions, 0)
        except RuntimeError as e:
            raise NKIError(rule, f"{what} of {self.describe()}: {e}") from None
        idx = moved.numpy()
        rows = np.arange(self.shape[0]).reshape([-1] + [1] * (idx.ndim - 1))
        if not idx.ndim or idx.shape[0] != self.shape[0] or (idx // max(math.prod(self.shape[1:]), 1) != rows).any():
            raise NKIError(rule, f"{what}: {self.describe()} is an indexed access (a gather); a view of it keeps "
                           "dimension 0 (each row stays in its partition)")
        key = tuple(np.broadcast_to(np.asarray(k), self.shape).reshape(-1)[idx] for k in self.key)
        return NkiTensor(self.data, self.buffer, self.alloc, key=key, shape=tuple(idx.shape), packed=self.packed)

    def _dim(self, dim, what, extra=0):
        """``dim`` (negative: from the end) as an index among ``ndim + extra`` dims."""
        n = self.ndim + extra
        if not isinstance(dim, (int, np.integer)) or not -n <= dim < n:
            raise NKIError("index", f"{what}: {self.describe()} has no dimension {dim}")
        return int(dim) % n

    def reshape(self, *dims, new_shape=None, shape=None):
        """A view with another shape (same elements, same memory): ``t.reshape((a, b))``,
        ``t.reshape([a, b])``, ``t.reshape(a, b)`` or ``t.reshape(new_shape=...)``; one size may
        be -1. HBM tensors reshape freely; an on-chip tile keeps its partition dimension."""
        given = new_shape if new_shape is not None else shape
        if given is not None:
            dims = (given,)
        if len(dims) == 1 and isinstance(dims[0], (tuple, list, torch.Size)):
            dims = dims[0]
        shape = [int(n) for n in dims]
        if shape.count(-1) == 1:
            known = math.prod(n for n in shape if n != -1)
            shape[shape.index(-1)] = math.prod(self.shape) // known if known else 0
        shape = tuple(shape)
        if self.buffer.on_chip and shape[:1] != self.shape[:1]:
            raise NKIError("reshape", f"{self.describe()}: reshaping to {shape} would move data across partitions; "
                           "an on-chip tile keeps its partition dimension")
        return self._view(f"reshape to {shape}", "reshape", lambda d, nb: d.view(list(d.shape[:nb]) + list(shape)))

    def expand_dim(self, dim):
        """A view with a new dimension of size 1 at ``dim``."""
        shape = list(self.shape)
        shape.insert(self._dim(dim, "expand_dim", extra=1), 1)
        return self.reshape(shape)

    expand_dims = expand_dim

    def squeeze_dim(self, dim):
        """A view without dimension ``dim``, which has size 1."""
        dim = self._dim(dim, "squeeze_dim")
        if self.shape[dim] != 1:
            raise NKIError("reshape", f"squeeze_dim({dim}): dimension {dim} of {self.describe()} is not of size 1")
        return self.reshape(self.shape[:dim] + self.shape[dim + 1:])

    def flatten_dims(self, start_dim, end_dim):
        """A view with dimensions ``start_dim`` to ``end_dim`` (inclusive) merged into one."""
        start, end = self._dim(start_dim, "flatten_dims"), self._dim(end_dim, "flatten_dims")
        if start > end:
            raise NKIError("index", f"flatten_dims({start_dim}, {end_dim}): the start comes after the end")
        return self.reshape(self.shape[:start] + (math.prod(self.shape[start:end + 1]),) + self.shape[end + 1:])

    def reshape_dim(self, dim, shape):
        """A view with dimension ``dim`` split into ``shape`` (one size may be -1)."""
        dim = self._dim(dim, "reshape_dim")
        shape = [int(n) for n in shape]
        if shape.count(-1) == 1:
            known = math.prod(n for n in shape if n != -1)
            shape[shape.index(-1)] = self.shape[dim] // known if known else 0
        if math.prod(shape) != self.shape[dim]:
            raise NKIError("reshape", f"reshape_dim({dim}, {shape}): dimension {dim} of {self.describe()} has "
                           f"{self.shape[dim]} elements")
        return self.reshape(self.shape[:dim] + tuple(shape) + self.shape[dim + 1:])

    def permute(self, *dims):
        """A view with the dimensions in the order ``dims`` (a tuple, a list, or arguments). On chip
        the partition dimension stays first."""
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = dims[0]
        dims = [self._dim(d, "permute") for d in dims]
        if sorted(dims) != list(range(self.ndim)):
            raise NKIError("index", f"permute({dims}): not an order of the {self.ndim} dimensions of {self.describe()}")
        if self.buffer.on_chip and dims[0] != 0:
            raise NKIError("access-pattern", f"permute({dims}) of {self.describe()}: the partition dimension of an "
                           "on-chip tile stays first")
        return self._view(f"permute({dims})", "access-pattern",
                          lambda d, nb: d.permute(list(range(nb)) + [nb + i for i in dims]))

    def broadcast(self, dim, size):
        """A view repeating dimension ``dim`` (of size 1) ``size`` times (step 0: read-only)."""
        dim = self._dim(dim, "broadcast")
        if self.shape[dim] != 1:
            raise NKIError("shape-mismatch", f"broadcast({dim}, {size}): dimension {dim} of {self.describe()} is not "
                           "of size 1")
        if self.buffer.on_chip and dim == 0:
            raise NKIError("access-pattern", f"broadcast({dim}, {size}) of {self.describe()}: the partitions of an "
                           "on-chip tile cannot be broadcast by a view (copy the data to each partition)")
        return self._view(f"broadcast({dim}, {size})", "shape-mismatch",
                          lambda d, nb: d.expand(list(d.shape[:nb + dim]) + [int(size)] + list(d.shape[nb + dim + 1:])))

    def slice(self, dim, start, end, step=1):
        """``t[..., start:end:step, ...]`` along ``dim`` (``start`` may be a loop variable)."""
        dim = self._dim(dim, "slice")
        return self[(slice(None),) * dim + (slice(start, end, step),)]

    size = property(lambda self: math.prod(self.shape))

    def get_pattern(self):
        """This view as ``[[step, count], ...]`` (outermost first) for ``.ap`` (with ``offset=t.offset``)."""
        return [[st, n] for st, n in zip(self.strides, self.shape)]




def _observe_cores(t, write, what):
    """Check pass of a multi-program launch: HBM accesses are checked for races between programs."""
    ctx = _context.current()
    if ctx.lnc is not None and ctx.checking and not t.buffer.on_chip and not t.batch:
        ctx.lnc.observe(t, write, what)


def borrowable(src):
    """Whether a load from ``src`` may share its memory: an input, unwritten by a kernel that
    writes no input at all (an input it writes could alias this one)."""
    return src.key is None and src.alloc.is_input and _context.current().borrowing


def new_tile(shape, dtype, buffer, name="tile", data=None, written=False, transient=False):
    """Allocates a tile (or, for HBM buffers, a kernel-local tensor) in the current call.

    Inside batched loops a tile has one leading dim per loop (``data`` given: already aligned to
    the frame). shared_hbm tensors are never batched: all iterations and programs share them.
    Capacity is accounted in the check pass (the run pass repeats the same allocations); a
    ``transient`` tile (``nl.matmul``'s product, which NKI accumulates in place) is not.
    """
    ctx = _context.current()
    packed = dtype if isinstance(dtype, PackedDtype) else None  # its bits are stored in an integer dtype
    dtype = packed.storage if packed is not None else dtype
    part = next((i for i, n in enumerate(shape) if isinstance(n, ParDim)), 0)
    shape = tuple(int(n) for n in shape)
    alloc = Allocation(name, written=written)
    if buffer.on_chip:
        if not shape:
            raise NKIError("tile-shape", f"a tile in {buffer.name} needs at least one dimension (the partition "
                           "dimension)")
        if shape[part] > ctx.platform.pmax:
            raise NKIError("partition-dim", f"a tile of shape {shape} in {buffer.name} has partition dimension "
                           f"{shape[part]}, but a tile has at most {ctx.platform.pmax} partitions")
        if ctx.checking and not transient:
            alloc.live = ctx.allocate((alloc.name, alloc.line, shape, str(packed or dtype).replace("torch.", "")),
                                      buffer.name, shape, dtype.itemsize, part)
    batch = () if buffer is shared_hbm else ctx.frame
    if data is None:  # batch dims of size 1 until the first write (see NkiTensor._grow)
        full = [1] * len(batch) + list(shape)
        if buffer is shared_hbm and ctx.checking:  # outputs start as the batching trial's do
            data = torch.full(full, float("nan") if dtype.is_floating_point else 4, dtype=dtype)
        elif ctx.checking:
            data = _context.scratch(full, dtype)
        else:
            data = torch.empty(full, dtype=dtype)
        if ctx.checking and buffer.on_chip and not written:  # per-element undefined reads
            alloc.shadow = torch.zeros_like(data, dtype=torch.bool)
    tile = NkiTensor(data, buffer, alloc, batch=batch, packed=packed)
    if written and alloc.live is not None:  # a result: written by the instruction that made it
        tile._touch(True)
    return tile
