"""Access patterns: ``tensor.ap(pattern, offset, ...)`` addresses a tensor's memory directly.

A pattern is a list of ``[step, count]`` pairs, outermost first, in elements of the memory of the
whole allocation flattened row-major, whichever view ``.ap`` is called on. On SBUF and PSUM the
first pair is the partition dimension. The result is a zero-copy strided view when the memory is
row-major and no step is negative (this covers batched loops: a loop-dependent offset becomes a
batch dimension, as in ``_tile._basic_view``). Otherwise, and for ``vector_offset`` gathers and
scatters, it is an indexed access resolved when it is read or written (``NkiTensor.key``), so an
index that points outside the tensor is reported when the access is used.

Dynamic offsets (``scalar_offset``, ``vector_offset``, ``select`` with a tile) take the index
tile's values when the view is made, which is when NKI code makes them: just before the
instruction that uses them.
"""

import math
import operator

import numpy as np
import torch

from torchneuron.nki import _context
from torchneuron.nki._batch import Affine, RuntimeInt, Unbatchable
from torchneuron.nki._dtypes import as_dtype, packed_of, storage_of
from torchneuron.nki._errors import NKIError
from torchneuron.nki._tile import NkiTensor


def storage_as(t, dtype):
    """A 1-D tensor of ``dtype`` over all of ``t``'s memory (a reinterpretation; no copy)."""
    storage = t.untyped_storage()
    return torch.empty(0, dtype=dtype, device=t.device).set_(storage, 0, (storage.nbytes() // dtype.itemsize,), (1,))


def _count(nbytes, size, what, thing, rule="access-pattern"):
    """``nbytes`` as a number of ``size``-byte elements."""
    n, rest = divmod(nbytes, size)
    if rest:
        raise NKIError(rule, f"{what}: {thing} ({nbytes} bytes) is not a whole number of {size}-byte elements")
    return n


def row_major(shape, strides):
    """Whether elements with these strides are consecutive, in row-major order (size-1 dims aside)."""
    expected = 1
    for n, st in zip(reversed(shape), reversed(strides)):
        if n != 1 and st != expected:
            return False
        expected *= n
    return True


def _row_major_strides(shape):
    out, step = [], 1
    for n in reversed(shape):
        out.insert(0, step)
        step *= n
    return out


def _logical(delta, shape, strides):
    """The row-major element number of the element ``delta`` storage elements past the first of a
    tile with these storage strides; None if no element lies there."""
    index = [0] * len(shape)
    for d in sorted(range(len(shape)), key=lambda d: -strides[d]):
        if shape[d] > 1 and strides[d] > 0:
            index[d], delta = divmod(delta, strides[d])
    if delta or any(not 0 <= i < n for i, n in zip(index, shape)):
        return None
    return sum(i * st for i, st in zip(index, _row_major_strides(shape)))


def layout(t):
    """Where view ``t`` lies in its allocation's memory flattened row-major: the offset and the
    strides of its tile dims, in bytes (of the first iteration of its batch dims)."""
    if t.key is not None:
        raise NKIError("index", f"{t.describe()} is an indexed access (a gather); it has no access pattern")
    root, nbr = t.alloc.root, len(t.alloc.root_batch)
    d, e, s = t.data, t.data.element_size(), t.alloc.root.element_size()
    shape, strides = tuple(root.shape[nbr:]), root.stride()[nbr:]
    own = d.stride()[len(t.batch):]
    if row_major(shape, strides):
        return d.storage_offset() * e - root.storage_offset() * s, [st * e for st in own]
    # an argument whose memory is not row-major (e.g. a transposed torch tensor): decompose addresses
    if e != s:
        raise NKIError("access-pattern", f"{t.describe()}: a reinterpreting view of memory that is not row-major")
    first = d.storage_offset() - root.storage_offset()
    start = _logical(first, shape, strides)
    out = []
    for n, st in zip(d.shape[len(t.batch):], own):
        step = _logical(first + st, shape, strides) if n > 1 else None
        out.append(0 if step is None else step - start)
    return start * s, [st * s for st in out]


def reinterpret(data, nb, dtype, what):
    """``data`` (``nb`` leading batch dims) read as ``dtype``: its last dim rescales by the ratio
    of the element sizes."""
    e, s = dtype.itemsize, data.element_size()
    if e == s:
        return data.view(dtype)
    if data.dim() == nb:
        raise NKIError("view", f"{what}: a single element cannot be reinterpreted as a type of another size")
    shape, strides = list(data.shape), list(data.stride())
    if shape[-1] > 1 and strides[-1] != 1:
        raise NKIError("view", f"{what}: the last dimension is not contiguous, so its bytes cannot be regrouped")
    sizes = shape[:-1] + [_count(shape[-1] * s, e, what, "the last dimension", "view")]
    steps = [_count(st * s, e, what, "a stride", "view") for st in strides[:-1]] + [1]
    return storage_as(data, dtype).as_strided(sizes, steps, _count(data.storage_offset() * s, e, what, "the offset",
                                                                    "view"))


def _same_in_every_iteration(values, what):
    """A dynamic offset's values (aligned to the loop frame): one set for all batched iterations."""
    frame = _context.current().frame
    varying = {frame[i] for i in range(len(frame)) if values.shape[i] > 1}
    if varying:
        raise Unbatchable(varying, f"{what}: a dynamic offset that differs between iterations of a batched loop")
    return values[(0,) * len(frame)]


def _integer_tile(x, what):
    if not isinstance(x, NkiTensor):
        raise NKIError("access-pattern", f"{what}: expected an integer tile, got {type(x).__name__}")
    if x.dtype.is_floating_point or x.dtype == torch.bool:
        raise NKIError("access-pattern", f"{what}: the index tile {x.describe()} must hold integers")
    return _same_in_every_iteration(x.read(what=what), what)


def _from_data(x):
    """Whether a dynamic offset is read from data when the kernel runs (a tile, a register, a
    ``dynamic_range`` variable over register bounds): scratch data in the check and trial passes."""
    return isinstance(x, RuntimeInt) or not isinstance(x, (type(None), int, np.integer, Affine))


def scalar_value(x, what):
    """The integer a dynamic offset holds: a one-element integer tile (read now), a register (its
    ``value``), an int, or a batched loop variable."""
    if isinstance(x, NkiTensor):
        if math.prod(x.shape) != 1:
            raise NKIError("access-pattern", f"{what}: expected a one-element (1x1) tile, got {x.describe()}")
        return int(_integer_tile(x, what).reshape(-1)[0])
    if isinstance(x, Affine):
        return x
    if not hasattr(type(x), "__index__"):
        x = getattr(x, "value", x)
    if isinstance(x, Affine):
        return x
    if isinstance(x, torch.Tensor) and x.numel() == 1 and not x.is_floating_point():
        return int(x)
    try:
        return operator.index(x)  # a register reports its own errors (e.g. read before it was loaded)
    except TypeError:
        raise NKIError("access-pattern", f"{what}: expected a 1x1 integer tile, a register or an int, got "
                       f"{type(x).__name__}") from None


def _rows(x, count, what):
    """A (count, 1) index tile's values, as row numbers."""
    if isinstance(x, NkiTensor) and (not x.shape or x.shape[0] != count or math.prod(x.shape) != count):
        raise NKIError("access-pattern", f"{what}: expected a ({count}, 1) index tile (one row per partition of "
                       f"the pattern), got {x.describe()}")
    return _integer_tile(x, what).reshape(-1).numpy().astype(np.int64)


def _pairs(pattern, what):
    try:
        pairs = [(operator.index(step), operator.index(num)) for step, num in pattern]
    except (TypeError, ValueError):
        raise NKIError("access-pattern", f"{what}: the pattern is a list of [step, count] pairs of integers, got "
                       f"{pattern!r}") from None
    if not pairs or any(n < 1 for _, n in pairs):
        raise NKIError("access-pattern", f"{what}: the pattern needs at least one [step, count] pair and positive "
                       f"counts, got {pattern!r}")
    return pairs


def _extent(pairs):
    """The lowest and highest address the pairs add to a start."""
    return (sum(min(0, st * (n - 1)) for st, n in pairs), sum(max(0, st * (n - 1)) for st, n in pairs))


def _start(t, offset, e, what):
    """The pattern's first address (in ``e``-byte elements) and how much it moves per iteration of
    each batched loop."""
    if offset is not None:
        if isinstance(offset, Affine):
            return offset.const, dict(offset.coeffs)
        return operator.index(offset), {}
    first, _ = layout(t)  # offset=None: the view's own
    root, root_batch = t.alloc.root, t.alloc.root_batch
    moves = {}
    for i, loop in enumerate(t.batch):
        if t.data.shape[i] == 1:
            continue
        step = t.data.stride()[i] * t.data.element_size()
        if loop in root_batch and root.shape[root_batch.index(loop)] > 1:  # the tile's own copy per iteration
            step -= root.stride()[root_batch.index(loop)] * root.element_size()
        if step:
            moves[loop] = _count(step, e, what, "a loop-dependent offset")
    return _count(first, e, what, "the view's offset"), moves


def _bounds_problem(t, pairs, starts, rows, shape, total, what):
    """Why the addresses leave the tensor (or, on chip, a partition), as NKIError arguments; None
    if they do not. Rows of a vector_offset are checked when the access is used."""
    if t.buffer.on_chip:
        partitions = shape[0]
        per_partition = total // partitions
        step, count = pairs[0]
        if rows is None and step != per_partition:
            return "access-pattern", (f"{what}: on {t.buffer.name} the first [step, count] pair is the partition "
                                      f"dimension and its step must be the tile's {per_partition} elements per "
                                      f"partition, got {step}")
        low, high = _extent(pairs[1:])
        first, within = np.divmod(starts, per_partition)
        if (within + low < 0).any() or (within + high >= per_partition).any():
            return "out-of-bounds", (f"{what}: the pattern {[list(p) for p in pairs]} reaches outside a partition's "
                                     f"{per_partition} elements")
        if rows is None and ((first < 0).any() or (first + count > partitions).any()):
            return "out-of-bounds", (f"{what}: the pattern {[list(p) for p in pairs]} reaches partitions "
                                     f"{int(first.min())} to {int(first.max()) + count - 1}; the tile has {partitions}")
    elif rows is None:
        low, high = _extent(pairs)
        if starts.min() + low < 0 or starts.max() + high >= total:
            return "out-of-bounds", (f"{what}: the pattern {[list(p) for p in pairs]} from element "
                                     f"{int(starts.min())} reaches outside the tensor's {total} elements")
    return None


def _starts(start, moves):
    """The first address in every iteration of the batched loops the offset moves with."""
    sizes = _context.current().loop_sizes
    starts = np.array([start], dtype=np.int64)
    for loop, c in moves.items():
        starts = (starts[:, None] + c * np.arange(sizes[loop])[None, :]).reshape(-1)
    return starts


def _moved(start, moves, shift):
    moves = dict(moves)
    for loop, c in shift.coeffs.items():
        moves[loop] = moves.get(loop, 0) + c
    return start + shift.const, {loop: c for loop, c in moves.items() if c}


def access_pattern(t, pattern, offset=0, scalar_offset=None, vector_offset=None, indirect_dim=0, dtype=None):
    """``t.ap(...)``: see the module docstring."""
    what = f"{t.describe()}: .ap"
    if t.key is not None:
        raise NKIError("index", f"{what}: an indexed access (a gather) cannot take an access pattern; call .ap on "
                       "the tensor")
    if scalar_offset is not None and vector_offset is not None:
        raise NKIError("access-pattern", f"{what}: give scalar_offset or vector_offset, not both")
    pairs = _pairs(pattern, what)
    logical = as_dtype(dtype, packed=True, what=what) or t.dtype  # a packed MX dtype: its bits, in its storage dtype
    packed, dtype = packed_of(logical), storage_of(logical)
    t._materialise_batch()
    t.alloc.viewed = True
    root, root_batch = t.alloc.root, t.alloc.root_batch
    shape = tuple(root.shape[len(root_batch):])
    e = dtype.itemsize
    total = _count(math.prod(shape) * root.element_size(), e, what, "the tensor")
    if t.buffer.on_chip:
        _count(math.prod(shape[1:]) * root.element_size(), e, what, "a partition")
    start, moves = _start(t, offset, e, what)
    rows, shift = None, Affine(0)
    if scalar_offset is not None or vector_offset is not None:
        if not 0 <= indirect_dim < max(t.ndim, 1):
            raise NKIError("access-pattern", f"{what}: indirect_dim {indirect_dim} is not a dimension of the tensor")
        # rows of the tensor .ap is called on: its stride along indirect_dim
        row = _count(layout(t)[1][indirect_dim], e, what, "a row") if t.ndim else 1
        if scalar_offset is not None:
            shift = Affine.of(Affine.of(scalar_value(scalar_offset, f"{what} scalar_offset")) * row)
        else:
            if indirect_dim != 0:
                raise NKIError("access-pattern", f"{what}: vector_offset indexes dimension 0 (indirect_dim=0)")
            rows = _rows(vector_offset, pairs[0][1], f"{what} vector_offset") * row
    ctx = _context.current()
    problem = _bounds_problem(t, pairs, _starts(*_moved(start, moves, shift)), rows, shape, total, what)
    if ctx.checking or ctx.trial:
        # Offsets read from tiles hold scratch data in these passes: where they leave the tensor they
        # count as 0 here, and the run pass checks the real ones.
        if problem and (_from_data(scalar_offset) or isinstance(offset, RuntimeInt)):
            shift = Affine(0)
            if isinstance(offset, RuntimeInt):
                start = 0
            problem = _bounds_problem(t, pairs, _starts(start, moves), rows, shape, total, what)
        if rows is not None:
            low, high = _extent(pairs[1:])
            rows = np.where((start + rows + low >= 0) & (start + rows + high < total), rows, 0)
    if problem:
        raise NKIError(*problem)
    start, moves = _moved(start, moves, shift)
    steps, counts = [st for st, _ in pairs], [n for _, n in pairs]
    in_order = row_major(shape, root.stride()[len(root_batch):])
    if rows is None and in_order and min(steps) >= 0:
        view = _strided(t, dtype, start, moves, steps, counts, what)
    else:
        if not in_order and e != root.element_size():
            raise NKIError("access-pattern", f"{what}: a reinterpreting access pattern over memory that is not "
                           "row-major")
        view = _gathered(t, dtype, start, moves, rows, pairs, total, in_order, what)
    view.packed = packed
    return view


def _strided(t, dtype, start, moves, steps, counts, what):
    """The access as a strided view of the allocation's memory (batch dims: the allocation's own,
    then one per loop the offset moves with)."""
    root, root_batch = t.alloc.root, t.alloc.root_batch
    e, s = dtype.itemsize, root.element_size()
    base = root if dtype == root.dtype else storage_as(root, dtype)
    sizes, strides = {}, {}
    for i, loop in enumerate(root_batch):
        sizes[loop], strides[loop] = root.shape[i], _count(root.stride()[i] * s, e, what, "a batch stride")
    loop_sizes = _context.current().loop_sizes
    for loop, c in moves.items():
        if sizes.get(loop, 1) == 1:  # the same data in every iteration, read at moving offsets
            sizes[loop], strides[loop] = loop_sizes[loop], c
        else:
            strides[loop] += c
    loops = sorted(sizes)
    origin = _count(root.storage_offset() * s, e, what, "the tensor's offset")
    data = base.as_strided([sizes[b] for b in loops] + counts, [strides[b] for b in loops] + steps, origin + start)
    return NkiTensor(data, t.buffer, t.alloc, batch=tuple(loops))


def _gathered(t, dtype, start, moves, rows, pairs, total, in_order, what):
    """The access as an indexed access (a gather when read, a scatter when written)."""
    root, root_batch = t.alloc.root, t.alloc.root_batch
    loops = set(moves) | {loop for i, loop in enumerate(root_batch) if root.shape[i] > 1}
    if loops:
        raise Unbatchable(loops, "an access pattern that gathers (vector_offset, a negative step, or memory that "
                          "is not row-major) in a batched loop")
    n = len(pairs)
    addresses = np.full([1] * n, start, dtype=np.int64)
    for i, (step, count) in enumerate(pairs):
        along = rows if i == 0 and rows is not None else np.arange(count, dtype=np.int64) * step
        addresses = addresses + along.reshape([-1 if j == i else 1 for j in range(n)])
    root = root[(0,) * len(root_batch)]  # batch dims of size 1
    if in_order:
        e, s = dtype.itemsize, root.element_size()
        base = root if dtype == root.dtype else storage_as(root, dtype)
        flat = base.as_strided([total], [1], _count(root.storage_offset() * s, e, what, "the tensor's offset"))
        return NkiTensor(flat, t.buffer, t.alloc, key=(addresses,), shape=addresses.shape)
    shape = tuple(root.shape)
    inside = (addresses >= 0) & (addresses < total)
    index = np.unravel_index(np.clip(addresses, 0, total - 1), shape)
    index = (np.where(inside, index[0], shape[0]),) + tuple(index[1:])  # outside: reported when used
    return NkiTensor(root, t.buffer, t.alloc, key=tuple(np.broadcast_to(a, addresses.shape) for a in index),
                     shape=addresses.shape)


# -- the methods of NkiTensor that address memory --------------------------------------------------

def _select(self, dim, index):
    """``t[..., index, ...]`` along ``dim``, which the result drops. ``index`` is an int, a loop
    variable, or a 1x1 integer tile or register (its value now)."""
    dim = self._dim(dim, "select")
    if _from_data(index):
        index = scalar_value(index, f"select({dim}) of {self.describe()}")
        ctx = _context.current()
        if (ctx.checking or ctx.trial) and isinstance(index, int):  # scratch data: the run pass checks it
            index = min(max(index, 0), self.shape[dim] - 1)
    return self[(slice(None),) * dim + (index,)]


def _view_as(self, dtype):
    """The same bytes read as ``dtype``; the last dimension rescales by the ratio of the sizes. A
    packed MX dtype views the bytes as its packed elements (and a plain dtype views those as bits)."""
    logical = as_dtype(dtype, packed=True, what=f"{self.describe()}: view")
    dtype = storage_of(logical)
    what = f"view({str(logical).replace('torch.', '')})"
    out = self._view(what, "view", lambda d, nb: reinterpret(d, nb, dtype, f"{what} of {self.describe()}"))
    if self.buffer.on_chip and out.shape[:1] != self.shape[:1]:
        raise NKIError("view", f"{what} of {self.describe()} would change its partition dimension")
    out.packed = packed_of(logical)
    return out


def _ap(self, pattern, offset=0, scalar_offset=None, vector_offset=None, indirect_dim=0, dtype=None):
    """A raw access pattern over the memory of the whole tensor (see _access)."""
    return access_pattern(self, pattern, offset, scalar_offset, vector_offset, indirect_dim, dtype)


def _rearrange_names(pattern, what, side):
    """A rearrange pattern as a list of groups of names (a lone name is a group of one)."""
    if isinstance(pattern, str) or not isinstance(pattern, (tuple, list)):
        raise NKIError("view", f"{what}: the {side} pattern is a tuple of dimension names (str) or tuples of "
                       f"names, got {pattern!r}")
    groups = []
    for item in pattern:
        group = (item,) if isinstance(item, str) else item
        if not isinstance(group, (tuple, list)) or not group or not all(isinstance(n, str) for n in group):
            raise NKIError("view", f"{what}: each entry of the {side} pattern is a dimension name (str) or a "
                           f"non-empty tuple of names, got {item!r}")
        groups.append(tuple(group))
    names = [n for g in groups for n in g]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise NKIError("view", f"{what}: the {side} pattern names {repeated} more than once")
    return groups, names


def _rearrange(self, src_pattern, dst_pattern, fixed_sizes=None):
    """einops-style ``rearrange``: split the ``src_pattern`` groups, reorder the names into
    ``dst_pattern``'s order, merge its groups; a view of the same memory (no copy)."""
    what = f"rearrange({src_pattern!r}, {dst_pattern!r}) of {self.describe()}"
    src, src_names = _rearrange_names(src_pattern, what, "source")
    dst, dst_names = _rearrange_names(dst_pattern, what, "destination")
    if len(src) != self.ndim:
        raise NKIError("view", f"{what}: the source pattern has {len(src)} entries for the tensor's {self.ndim} "
                       "dimensions")
    if sorted(src_names) != sorted(dst_names):
        raise NKIError("view", f"{what}: the destination pattern must use the source's names exactly once each; "
                       f"source {sorted(src_names)}, destination {sorted(dst_names)}")
    fixed = dict(fixed_sizes or {})
    unknown = sorted(set(fixed) - set(src_names))
    if unknown:
        raise NKIError("view", f"{what}: fixed_sizes names {unknown}, which the patterns do not use")
    sizes = {}
    for d, group in enumerate(src):  # the size of every name
        n = self.shape[d]
        known = {name: fixed[name] for name in group if name in fixed}
        for name, k in known.items():
            if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
                raise NKIError("view", f"{what}: fixed_sizes[{name!r}] must be a positive int, got {k!r}")
        free = [name for name in group if name not in fixed]
        if len(group) == 1:
            if known and known[group[0]] != n:
                raise NKIError("view", f"{what}: fixed_sizes gives {group[0]!r} size {known[group[0]]}, but "
                               f"dimension {d} has {n} elements")
            sizes[group[0]] = n
            continue
        if len(free) > 1:
            raise NKIError("view", f"{what}: splitting dimension {d} ({n} elements) into {group} needs the sizes "
                           f"of all names but one in fixed_sizes; {free} are unknown")
        product = math.prod(known.values())
        if (free and n % product) or (not free and product != n):
            raise NKIError("view", f"{what}: dimension {d} has {n} elements, which the sizes "
                           f"{ {name: known[name] for name in group if name in known} } of {group} do not split")
        sizes.update(known)
        if free:
            sizes[free[0]] = n // product
    if self.buffer.on_chip and (sizes[src[0][0]] != self.shape[0] or dst[0][:1] != src[0][:1]
                                or math.prod(sizes[name] for name in dst[0]) != self.shape[0]):
        raise NKIError("access-pattern", f"{what}: the partition dimension of an on-chip tile stays first and is "
                       "neither split nor merged")
    split = self.reshape([sizes[name] for name in src_names])
    order = [src_names.index(name) for name in dst_names]
    moved = split.permute(order) if order != list(range(len(order))) else split
    shape, steps = moved.shape, moved.data.stride()[len(moved.batch):]
    d = 0
    for group in dst if moved.key is None else ():  # a merged group: consecutive in memory, in order
        dims = [(shape[i], steps[i]) for i in range(d, d + len(group)) if shape[i] != 1]
        if any(outer[1] != inner[1] * inner[0] for outer, inner in zip(dims, dims[1:])):
            raise NKIError("view", f"{what}: the merged dimensions {group} are not contiguous in memory in that "
                           "order (merge dimensions that are adjacent and in order, or copy the data)")
        d += len(group)
    return moved.reshape([math.prod(sizes[name] for name in group) for group in dst])


def _vector_select(self, dim, vector_offset):
    """Dimension 0 of an HBM tensor addressed per partition: partition p of the result is row
    ``vector_offset[p, 0]`` (a gather when read, a scatter when written)."""
    what = f"vector_select({dim}) of {self.describe()}"
    if dim != 0:
        raise NKIError("access-pattern", f"{what}: vector_select addresses dimension 0 only (dim must be 0)")
    if self.buffer.on_chip:
        raise NKIError("access-pattern", f"{what}: vector_select addresses HBM tensors only (an on-chip tile has "
                       "its partitions in dimension 0)")
    if self.key is not None:
        raise NKIError("index", f"{what}: the tensor is already an indexed access (one dynamic select per tensor)")
    if not isinstance(vector_offset, NkiTensor) or vector_offset.ndim != 2 or vector_offset.shape[1] != 1 \
            or vector_offset.buffer.name != "sbuf":
        got = vector_offset.describe() if isinstance(vector_offset, NkiTensor) else type(vector_offset).__name__
        raise NKIError("access-pattern", f"{what}: vector_offset must be a (num_partitions, 1) integer tile in SBUF, "
                       f"got {got}")
    partitions = vector_offset.shape[0]
    if partitions > 128:
        raise NKIError("partition-dim", f"{what}: vector_offset gives {partitions} partitions; at most 128")
    pattern = [[0, partitions]] + [[st, n] for st, n in zip(self.strides[1:], self.shape[1:])]
    return access_pattern(self, pattern, offset=None, vector_offset=vector_offset, indirect_dim=0)


def _layout(self):
    """(offset, strides) of this view in the tensor's memory flattened row-major, in elements."""
    offset, strides = layout(self)
    return offset // self.itemsize, [st // self.itemsize for st in strides]


def _is_contiguous(self):
    """Whether the view's elements are consecutive in memory, in order."""
    return row_major(self.shape, self.strides)


def _indirect(self, *args, **kwargs):
    """Tensor Indirection (NeuronCore-v4): refused, see the message."""
    raise NKIError("not-emulated", f"indirect() of {self.describe()}: Tensor Indirection views are not emulated. The "
                   "offsets' layout in the index tile depends on the engine of the instruction that consumes the "
                   "view (groups of 16 partitions on the vector, scalar and GpSimd engines, 32 on the tensor "
                   "engine), which a view does not know when it is made, and the reference does not specify how "
                   "the partition groups read their offsets. Gather or scatter HBM rows with vector_select or "
                   ".ap(vector_offset=...), on-chip elements with nisa.nc_n_gather or nisa.local_gather")


NkiTensor.indirect = NkiTensor.is_indirect = _indirect
NkiTensor.select = _select
NkiTensor.view = _view_as
NkiTensor.ap = _ap
NkiTensor.rearrange = _rearrange
NkiTensor.vector_select = _vector_select
NkiTensor._layout = _layout
NkiTensor.offset = property(lambda self: self._layout()[0])
NkiTensor.strides = property(lambda self: tuple(self._layout()[1]))
NkiTensor.is_contiguous = _is_contiguous
