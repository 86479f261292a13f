"""``nki.isa`` tensor engine instructions: ``nc_matmul`` and ``nc_transpose``."""

import itertools

import numpy as np
import torch

import torchneuron.nki.isa.constants as C
from torchneuron.nki import _context
from torchneuron.nki._batch import Affine, Unbatchable
from torchneuron.nki._errors import NKIError
from torchneuron.nki.isa._common import engine_name, has, member, tile
from torchneuron.nki._ops import dst_write, lead, record, tile_shape
from torchneuron.nki._tile import NkiTensor, psum, sbuf

_MATMUL_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float16, torch.float32)
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def check_matmul(what, stationary, moving, s_shape, m_shape):
    """The tensor engine's operand rules: SBUF inputs, contraction on partitions, free-size limits."""
    p = _context.current().platform
    for role, t in (("stationary", stationary), ("moving", moving)):
        if isinstance(t, NkiTensor) and t.buffer is not sbuf:
            raise NKIError("matmul-operands-in-sbuf", f"{what}: the {role} operand {t.describe()} must be in SBUF")
    if len(s_shape) != 2 or len(m_shape) != 2:
        raise NKIError("matmul-shape", f"{what}: operands must be 2-D tiles, got {s_shape} and {m_shape}")
    if s_shape[0] != m_shape[0]:
        raise NKIError("matmul-contraction", f"{what}: contraction dimension mismatch: stationary[0]={s_shape[0]} "
                       f"!= moving[0]={m_shape[0]}")
    if s_shape[0] > p.pmax:
        raise NKIError("partition-dim", f"{what}: contraction (partition) dimension {s_shape[0]} exceeds maximum "
                       f"{p.pmax}")
    if s_shape[1] > p.stationary_fmax:
        raise NKIError("matmul-stationary-fmax", f"{what}: stationary free dimension {s_shape[1]} exceeds maximum "
                       f"{p.stationary_fmax}")
    if m_shape[1] > p.moving_fmax:
        raise NKIError("matmul-moving-fmax", f"{what}: moving free dimension {m_shape[1]} exceeds maximum "
                       f"{p.moving_fmax}")
    dtypes = {t.dtype for t in (stationary, moving) if isinstance(t, NkiTensor)}
    if torch.float32 in dtypes and len(dtypes) > 1:
        raise NKIError("matmul-dtype", f"{what}: if one operand is fp32 the other must be too, got "
                       f"{sorted(str(d) for d in dtypes)}")
    record("tensor", "matmul", (s_shape[1], m_shape[1]), next(iter(dtypes)) if dtypes else torch.float32,
           matmul=(s_shape[0], s_shape[1], m_shape[1]))


def _region(t):
    """Where a view lies in its PSUM tile, independent of the tile's batch dims."""
    n = len(t.batch)
    return (t.data.storage_offset(), tuple(t.data.shape[n:]), tuple(t.data.stride()[n:]))


def _aligned(position, size):
    """Whether a tile position (an int or a loop-dependent value) is a multiple of ``size`` inside the array."""
    a = Affine.of(position)
    low, high = a.bounds(_context.current().loop_sizes)
    return a.const % size == 0 and all(c % size == 0 for c in a.coeffs.values()) and 0 <= low and high + size <= 128


def _check_tiling(what, tile_position, tile_size, k, m, double_row):
    """Tiling mode runs a matmul on a (row, column) part of the 128 x 128 PE array."""
    if not tile_position and not tile_size:
        return
    if not tile_position or not tile_size or len(tile_position) != 2 or len(tile_size) != 2:
        raise NKIError("matmul-tiling", f"{what}: tile_position and tile_size are both given, as (row, column) "
                       f"pairs, got {tile_position!r} and {tile_size!r}")
    for axis, size, start in zip(("row", "column"), tile_size, tile_position):
        if size not in (32, 64, 128):
            raise NKIError("matmul-tiling", f"{what}: the {axis} tile size must be 32, 64 or 128, got {size!r}")
        if not _aligned(start, size):
            raise NKIError("matmul-tiling", f"{what}: the start {axis} must be a multiple of the {axis} tile size "
                           f"{size} inside the 128 x 128 array, got {start!r}")
    rows, columns = tile_size
    if k > rows or m > columns:
        raise NKIError("matmul-tiling", f"{what}: a [{k}, {m}] stationary operand does not fit a tile of {rows} rows "
                       f"and {columns} columns")
    if double_row and columns != 128:
        raise NKIError("matmul-tiling", f"{what}: perf_mode=double_row cannot be combined with column tiling")


def nc_matmul(dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, is_transpose=False,
              accumulate=None, tile_position=(), tile_size=(), perf_mode=C.matmul_perf_mode.none, name=None):
    """``dst[M, N] (+)= stationary[K, M].T @ moving[K, N]`` on the tensor engine.

    accumulate=None: the first matmul into a PSUM region overwrites it and later ones add to it,
    until the region is read by another instruction or overwritten. perf_mode=double_row
    contracts FP8 operands of shape [K, 2, M] and [K, 2, N] over both K and the 2.
    """
    what = "nisa.nc_matmul"
    s = tile(stationary, f"{what} stationary")
    m = tile(moving, f"{what} moving")
    double_row = member(C.matmul_perf_mode, perf_mode or "none", f"{what} perf_mode") is \
        C.matmul_perf_mode.double_row
    for role, t in (("stationary", stationary), ("moving", moving)):
        if t.dtype not in (_FP8 if double_row else _MATMUL_DTYPES):
            raise NKIError("matmul-dtype", f"{what}: the {role} operand {t.describe()} must be "
                           f"{'fp8' if double_row else 'fp8, bf16, fp16 or fp32'}")
    if double_row:
        s, m = _double_row(what, s), _double_row(what, m)
    rows = 2 if double_row else 1  # contracted elements per partition
    s_shape, m_shape = tile_shape(s), tile_shape(m)
    check_matmul(what, stationary, moving, (s_shape[0] // rows,) + s_shape[1:], (m_shape[0] // rows,) + m_shape[1:])
    _check_tiling(what, tile_position, tile_size, s_shape[0] // rows, s_shape[1], double_row)
    if not isinstance(dst, NkiTensor) or dst.buffer is not psum:
        raise NKIError("matmul-dst-in-psum", f"{what}: dst must be a PSUM tile, got "
                       f"{dst.describe() if isinstance(dst, NkiTensor) else type(dst).__name__}")
    allowed = (torch.float32, torch.bfloat16) if has("bf16 matmul results") else (torch.float32,)
    if dst.dtype not in allowed:
        raise NKIError("matmul-dtype", f"{what}: dst {dst.describe()} must be "
                       f"{' or '.join(str(d).replace('torch.', '') for d in allowed)} (PSUM accumulates in fp32)")
    kk, mm = tile_shape(s)
    expected = (mm, kk) if is_transpose else (mm, tile_shape(m)[1])
    if expected != dst.shape:
        raise NKIError("shape-mismatch", f"{what}: the product has shape {expected} but dst is {dst.describe()}")
    groups = _groups(dst)
    region = _region(dst)
    add = accumulate if accumulate is not None else _in_open_group(dst, region, groups)
    frame = _context.current().frame
    if isinstance(add, torch.Tensor):  # the region partly overlaps an open group: add there, overwrite elsewhere
        if frame or dst.batch or dst.key is not None:
            raise Unbatchable(frame or set(dst.batch), "a matmul partly overlapping an accumulation group")
        product = _batched_product(s, m, dst, is_transpose, accumulate)
        dst.write(torch.where(add, dst.data.float() + product, product), what=what, accumulating=True)
        groups.add(region)
        return
    if not frame and not dst.batch and not is_transpose and dst.key is None and dst.dtype == torch.float32:
        if add:  # accumulate in place, as PSUM does
            dst.read(what=f"{what} accumulate", accumulating=True)
            dst.data.addmm_(s.t().float(), m.float())
        else:
            torch.mm(s.t().float(), m.float(), out=dst.data)
            dst.alloc.written = True
            dst._mark_defined()
    else:
        product = _batched_product(s, m, dst, is_transpose, accumulate)
        if add:
            product = dst.read(what=f"{what} accumulate", accumulating=True) + product
        dst.write(product, what=what, fresh=True, accumulating=True)
    groups.add(region)


def _double_row(what, values):
    """A [K, 2, F] double-row operand as [2K, F]: both K and the 2 are contracted."""
    n = lead()
    shape = tile_shape(values)
    if len(shape) != 3 or shape[1] != 2:
        raise NKIError("matmul-perf-mode", f"{what}: perf_mode=double_row operands are [K, 2, F] tiles, got {shape}")
    return values.reshape(list(values.shape[:n]) + [2 * shape[0], shape[2]])


def _batched_product(s, m, dst, is_transpose, accumulate):
    """stationary.T @ moving for every iteration of the batched loops, summed over the loops that
    ``dst`` does not have (accumulation across those iterations) in one contraction."""
    ctx = _context.current()
    n = len(ctx.frame)
    summed = [i for i, f in enumerate(ctx.frame) if f not in dst.batch]
    if summed and dst.dtype != torch.float32:
        raise Unbatchable({ctx.frame[i] for i in summed}, "accumulating into a low-precision tile rounds at every "
                          "iteration")
    if summed and accumulate is False:
        raise Unbatchable({ctx.frame[i] for i in summed}, "matmuls of a batched loop overwrite one PSUM tile")
    if is_transpose:  # `moving` is an identity: the instruction transposes the stationary operand
        product = s.float().transpose(-1, -2).clone()
        for i in reversed(summed):
            product = product.sum(dim=i, keepdim=True)
        return product
    return contract(s.float(), m.float(), summed, [ctx.loop_sizes[f] for f in ctx.frame[:n]])


def contract(s, m, summed, sizes):
    """``out[..., x, y] = sum over k and the loop dims `summed` of s[..., k, x] * m[..., k, y]``.

    ``s`` and ``m`` have the same leading loop dims (size 1 where the operand is the same in every
    iteration; ``sizes`` are the loops' sizes); the result keeps them, with size 1 where summed.
    The loops summed over both operands join k in one contraction, and an operand shared by all
    iterations makes one large GEMM of the other's, the dims ordered so that the larger operand
    is used in place: torch.matmul and einsum would broadcast and reshape by copying it (a
    batched token-generation matmul spent most of its time copying weights).
    """
    n = s.dim() - 2
    scale = 1
    both = []
    for i in summed:
        if s.shape[i] == 1 and m.shape[i] == 1:  # the same product in every iteration
            scale *= sizes[i]
        elif s.shape[i] == 1:  # sum over i of s * m_i = s * (sum over i of m_i)
            m = m.sum(i, keepdim=True)
        elif m.shape[i] == 1:
            s = s.sum(i, keepdim=True)
        else:
            both.append(i)
    # The summed loops now of size 1 in both operands go; the ones left join k in one contraction,
    # merged in the order that lets the larger operand merge them without a copy.
    gone = tuple(0 if i in summed and i not in both else slice(None) for i in range(n))
    s, m = s[gone], m[gone]
    pos = [i for i in range(n) if gone[i] != 0]  # loop dims left, in order
    kept = [j for j, i in enumerate(pos) if i not in both]
    n = len(pos)
    k_dims = [j for j, i in enumerate(pos) if i in both] + [n]
    big = m if m.numel() >= s.numel() else s
    order = next((o for o in itertools.permutations(k_dims) if _mergeable(big, o)), k_dims)
    a = s.permute(kept + [n + 1] + list(order))  # [kept..., x, K...]
    b = m.permute(kept + list(order) + [n + 1])  # [kept..., K..., y]
    nk = len(order)
    a = a.reshape(list(a.shape[:-nk]) + [-1])
    b = b.reshape(list(b.shape[:len(kept)]) + [-1, b.shape[-1]])
    batch_a, batch_b = a.shape[:-2], b.shape[:-2]
    if all(d == 1 for d in batch_b) and _mergeable(a, range(a.dim() - 1)):
        out = torch.matmul(a, b.reshape(b.shape[-2:]))  # moving shared: one GEMM over every row of the stationary
    elif all(d == 1 for d in batch_a) and _mergeable(b, list(range(len(kept))) + [b.dim() - 1]):
        out = torch.matmul(a.reshape(a.shape[-2:]), b)  # stationary shared: one GEMM over every moving column
    else:  # a GEMM per iteration; a shared operand is expanded in place (stride 0)
        batch = list(np.broadcast_shapes(tuple(batch_a), tuple(batch_b)))
        out = torch.empty(batch + [a.shape[-2], b.shape[-1]])
        _gemms(a.expand(batch + list(a.shape[-2:])), b.expand(batch + list(b.shape[-2:])), out)
    for i in summed:
        out = out.unsqueeze(i)
    return out * scale if scale != 1 else out


def _gemms(a, b, out):
    """``out = a @ b`` for [batch..., x, K] and [batch..., K, y] operands: batched GEMMs over the
    batch dims that merge into one strided dim in both operands, a loop over the outer ones that
    do not (torch.matmul would copy the operand into contiguous batches first)."""
    nb = a.dim() - 2
    if nb and not any(b.stride()[:nb]) and _mergeable(a, range(nb + 1)):  # b shared: one GEMM, a's rows in place
        torch.mm(a.reshape(-1, a.shape[-1]), b[(0,) * nb], out=out.view(-1, out.shape[-1]))
        return
    if nb <= 1 or (_mergeable(a, range(nb)) and _mergeable(b, range(nb))) or a.shape[0] > 64:
        torch.matmul(a, b, out=out)
        return
    for i in range(a.shape[0]):
        _gemms(a[i], b[i], out[i])


def _mergeable(t, dims):
    """Whether ``t``'s dims ``dims`` (in that order) are one strided dim of its memory (a view)."""
    dims = [d for d in dims if t.shape[d] != 1]
    return all(t.stride(d) == t.shape[e] * t.stride(e) for d, e in zip(dims, dims[1:]))


def _in_open_group(dst, region, groups):
    """Whether the elements of ``dst`` are in an open accumulation group: True, False, or (when
    the region overlaps the groups' elements in part) a bool tensor of dst's shape."""
    if region in groups:
        return True
    if not groups:
        return False
    flat = torch.zeros(dst.data.untyped_storage().nbytes() // dst.data.element_size(), dtype=torch.bool)
    for offset, shape, stride in groups:
        flat.as_strided(shape, stride, offset).fill_(True)
    mine = flat.as_strided(region[1], region[2], region[0])
    if bool(mine.all()):
        return True
    return mine.clone() if bool(mine.any()) else False


def _groups(t):
    if t.alloc.groups is None:
        t.alloc.groups = set()
    return t.alloc.groups


def nc_transpose(dst, data, engine=C.engine.unknown, name=None):
    """``dst[F, P] = data[P, F]`` (free dims flattened): on the tensor engine (SBUF to PSUM, up to
    128 x 128) or the vector engine (up to 32 x 32, any buffers), by default the one that fits."""
    values = tile(data, "nisa.nc_transpose")
    n = lead()
    v2 = values.reshape(list(values.shape[:n]) + [values.shape[n], -1])
    shape2 = tile_shape(v2)
    tensor_route = isinstance(dst, NkiTensor) and dst.buffer is psum and data.buffer is sbuf
    eng = engine_name(engine, "nisa.nc_transpose", ("tensor", "vector"),
                      "vector" if max(shape2) <= 32 and not tensor_route else "tensor")
    limit = 32 if eng == "vector" else _context.current().platform.pmax
    if max(shape2) > limit:
        raise NKIError("transpose-size", f"nisa.nc_transpose on the {eng} engine handles up to [{limit}, {limit}], "
                       f"got {shape2}")
    if eng == "tensor" and (dst.buffer is not psum or data.buffer is not sbuf):
        raise NKIError("transpose-buffers", "nisa.nc_transpose on the tensor engine reads SBUF and writes PSUM")
    if dst.dtype != data.dtype:
        raise NKIError("dtype", f"nisa.nc_transpose: dst dtype {dst.dtype} must equal data dtype {data.dtype}")
    record(eng, "transpose", shape2, data.dtype, matmul=(shape2[0], shape2[0], shape2[1])
           if eng == "tensor" else None)
    dst_write(dst, v2.transpose(-1, -2), "nisa.nc_transpose")
