"""``nki.isa`` MX (OCP microscaling) instructions of NeuronCore-v4: ``quantize_mx`` on the vector
engine and ``nc_matmul_mx`` on the tensor engine, and the scale layout they share.

An MX operand is a data tile of a packed dtype (four fp8 or fp4 values per element, see
``_dtypes``) and a scale tile (uint8 or float8_e8m0fnu: the scale is ``2 ** (bits - 127)``, bits
255 is NaN). Values are grouped 8 partitions x 1 packed element, 32 values sharing one scale.
The groups of a quadrant (32 partitions) keep their scales in that quadrant: the scale of the
group of data partitions ``8g .. 8g + 7`` is in partition ``32 * (g // 4) + g % 4`` of the scale
tile (so a 32-partition tile needs 4 scale partitions; larger ones as many as the data, of which
the first 4 of each quadrant are used). ``nc_matmul_mx`` contracts over the partitions and the
four values of each packed element.
"""

import numpy as np
import torch

from torchneuron.nki import _context
from torchneuron.nki._batch import Unbatchable
from torchneuron.nki._dtypes import PACKED, decode, encode, float8_e4m3fn_x4, float8_e5m2_x4
from torchneuron.nki._errors import NKIError
from torchneuron.nki._ops import accumulate_over, compute, dst_write, lead, operand, record
from torchneuron.nki._tile import NkiTensor, psum, sbuf
from torchneuron.nki.isa._common import free_size, require
# the tensor engine's accumulation groups and tiling rules, shared with nc_matmul
from torchneuron.nki.isa._tensor import _check_tiling, _groups, _in_open_group, _region

GROUP_PARTITIONS = 8     # a scale group: 8 partitions ...
QUADRANT = 32            # ... and its scale stays in the quadrant of 32 partitions the group is in
_SCALE_DTYPES = (torch.uint8, torch.float8_e8m0fnu)
_QUANTIZED = (float8_e5m2_x4, float8_e4m3fn_x4)   # what quantize_mx writes


def _names(dtypes):
    return " or ".join(f"nl.{str(d).replace('torch.', '')}" for d in dtypes)


def _tensor_operand(what, role, t):
    if not isinstance(t, NkiTensor):
        raise NKIError("operand", f"{what}: {role} must be a tile, got {type(t).__name__}")
    return t


def _data_partitions(what, role, t):
    """A data tile's partitions: a multiple of a quadrant, at most pmax."""
    p = t.shape[0] if t.shape else 0
    if p % QUADRANT or not 0 < p <= _context.current().platform.pmax:
        raise NKIError("mx-layout", f"{what}: the partition dimension of {role} {t.describe()} must be a multiple of "
                       f"{QUADRANT}, at most {_context.current().platform.pmax}, got {p}")
    return p


def scale_rows(partitions):
    """The scale-tile partition of each 8-partition group of a data tile with ``partitions`` partitions."""
    g = np.arange(partitions // GROUP_PARTITIONS)
    return QUADRANT * (g // 4) + g % 4


def _check_scale(what, role, scale, data_role, partitions, free):
    """A scale tile for ``partitions`` data partitions of ``free`` packed elements each: its rows
    (as a boolean mask over its partitions) in group order."""
    _tensor_operand(what, role, scale)
    if scale.dtype not in _SCALE_DTYPES:
        raise NKIError("mx-dtype", f"{what}: {role} {scale.describe()} must be {_names(_SCALE_DTYPES)}")
    rows = scale_rows(partitions)
    need = int(rows[-1]) + 1
    have = scale.shape[0] if scale.shape else 0
    if have < need or free_size(scale) != free:
        layout = f"a ({need}, {free}) tile" if partitions <= QUADRANT else \
            f"a ({partitions}, {free}) tile (at least {need} partitions)"
        raise NKIError("mx-layout", f"{what}: {role} {scale.describe()} does not fit {data_role}'s scales: "
                       f"{partitions} data partitions of {free} packed elements need one scale per 8 partitions "
                       f"and element, kept in the first 4 partitions of each 32-partition quadrant: {layout}")
    mask = np.zeros((have, free), dtype=bool)
    mask[rows] = True
    return rows, mask.reshape(scale.shape)


def _read_scales(what, role, scale, rows, mask):
    """[..., groups, free] scale factors (float32) of the groups, in group order."""
    v = scale.read(mask=mask, what=f"{what} {role}")
    n = lead()
    v = v.reshape(list(v.shape[:n]) + [v.shape[n], -1])[..., torch.from_numpy(rows), :]
    bits = v if v.dtype == torch.uint8 else v.view(torch.uint8)
    return bits.view(torch.float8_e8m0fnu).float()   # 2 ** (bits - 127); 255 is NaN


def quantize_mx(dst, src, dst_scale, name=None):
    """MX quantisation of a float16/bfloat16 ``src`` [P, 4F] into ``dst`` [P, F] (fp8 x4 packed:
    element f holds src[:, 4f .. 4f + 3]) and ``dst_scale`` (one scale per 8 partitions x 4 values).

    As the NKI reference specifies, the scale is twice the OCP sample algorithm's: for a group
    whose largest magnitude is ``amax``, ``2 ** (floor(log2(amax)) - emax + 1)`` (emax: 15 for
    e5m2, 8 for e4m3fn), so every value divided by it is below ``2 ** emax`` and rounds (to
    nearest even) without saturating. All-zero groups get the smallest scale (bits 0); groups
    holding Inf or NaN the NaN scale (bits 255).
    """
    what = "nisa.quantize_mx"
    require("nisa.quantize_mx", what)
    for role, t in (("dst", dst), ("src", src), ("dst_scale", dst_scale)):
        _tensor_operand(what, role, t)
        if t.buffer is not sbuf:
            raise NKIError("mx-sbuf", f"{what}: {role} {t.describe()} must be in SBUF")
    if src.dtype not in (torch.float16, torch.bfloat16):
        raise NKIError("mx-dtype", f"{what}: src {src.describe()} must be nl.float16 or nl.bfloat16")
    if dst.dtype not in _QUANTIZED:
        raise NKIError("mx-dtype", f"{what}: dst {dst.describe()} must be {_names(_QUANTIZED)} (quantize_mx writes "
                       "fp8; fp4 operands of nc_matmul_mx are quantized elsewhere)")
    partitions = _data_partitions(what, "src", src)
    values = free_size(src)
    if values % 4:
        raise NKIError("mx-layout", f"{what}: the elements per partition of src {src.describe()} must be a multiple "
                       f"of 4 (four values per packed element), got {values}")
    free = values // 4
    if dst.shape[:1] != (partitions,) or free_size(dst) != free:
        raise NKIError("shape-mismatch", f"{what}: dst {dst.describe()} must have the {partitions} partitions of src "
                       f"and a quarter of its elements per partition ({free} packed elements)")
    rows, mask = _check_scale(what, "dst_scale", dst_scale, "src", partitions, free)
    fmt = dst.packed
    v = compute(operand(src, f"{what} src")).float()
    n = lead()
    batch = list(v.shape[:n])
    groups = v.reshape(batch + [partitions // GROUP_PARTITIONS, GROUP_PARTITIONS, free, 4])
    amax = groups.abs().amax(dim=(n + 1, n + 3))                   # [..., groups, free]
    _, e = torch.frexp(amax)                                         # amax = m * 2**e, m in [0.5, 1)
    bits = (e.to(torch.int32) - fmt.emax + 127).clamp(0, 254)        # floor(log2 amax) - emax + 1, biased
    bits = torch.where(amax == 0, 0, bits)
    bits = torch.where(torch.isfinite(amax), bits, 255)
    scale = torch.ldexp(torch.ones((), dtype=torch.float32), (bits - 127).clamp(max=127).float())
    quantized = groups / scale.unsqueeze(n + 1).unsqueeze(-1)       # exact: a power of two
    packed = encode(quantized.reshape(batch + [partitions, free, 4]), fmt)
    record("vector", "quantize_mx", src.shape, src.dtype)
    dst_write(dst, packed, what, raw=True)
    scale_bits = bits.to(torch.uint8)
    full = torch.zeros(batch + [mask.shape[0], free], dtype=torch.uint8)
    full[..., torch.from_numpy(rows), :] = scale_bits
    if dst_scale.dtype == torch.float8_e8m0fnu:
        full = full.view(torch.float8_e8m0fnu)
    dst_scale.write(full.reshape(batch + list(dst_scale.shape)), mask=mask, what=f"{what} dst_scale")


def _mx_operand(what, role, t):
    _tensor_operand(what, role, t)
    if t.buffer is not sbuf:
        raise NKIError("matmul-operands-in-sbuf", f"{what}: the {role} operand {t.describe()} must be in SBUF")
    if t.packed is None:
        raise NKIError("mx-dtype", f"{what}: {role} {t.describe()} must have a packed MX dtype "
                       f"({_names(PACKED.values())}); quantize it with nisa.quantize_mx, or view packed bytes as "
                       "one with .view(dtype) or .ap(..., dtype=)")
    if len(t.shape) != 2:
        raise NKIError("matmul-shape", f"{what}: {role} {t.describe()} must be a 2-D tile")
    return t


def _dequantized(what, role, t, scale, rows, mask):
    """[..., K * 4, F] float32: the values of an MX operand times their scales, the four values of
    each packed element next to each other along the contraction."""
    v = decode(t.read(what=f"{what} {role}", raw=True), t.packed)                      # [..., K, F, 4]
    s = _read_scales(what, f"{role}_scale", scale, rows, mask)                          # [..., K / 8, F]
    v = v * s.repeat_interleave(GROUP_PARTITIONS, dim=-2).unsqueeze(-1)
    n = lead()
    k, f = t.shape
    return v.transpose(-1, -2).reshape(list(v.shape[:n]) + [k * 4, f])


def nc_matmul_mx(dst, stationary, moving, stationary_scale, moving_scale, tile_position=None, tile_size=None,
                 accumulate=None, name=None):
    """``dst[M, N] (+)= sum over k, j of S[k, m, j] * s_S * V[k, n, j] * s_V``: the product of two
    MX operands (``stationary`` [K, M] and ``moving`` [K, N], packed fp8 or fp4, each with its
    scale tile) on the tensor engine, in fp32 into a PSUM tile (fp32 or bf16). The contraction runs
    over the K partitions and the four values of each element. ``accumulate`` as in ``nc_matmul``;
    tiling mode is row tiling only (``tile_size=(rows, 128)``, ``tile_position=(row, 0)``).
    """
    what = "nisa.nc_matmul_mx"
    require("nisa.nc_matmul_mx", what)
    platform = _context.current().platform
    _mx_operand(what, "stationary", stationary)
    _mx_operand(what, "moving", moving)
    for role, t in (("stationary_scale", stationary_scale), ("moving_scale", moving_scale)):
        _tensor_operand(what, role, t)
        if t.buffer is not sbuf:
            raise NKIError("matmul-operands-in-sbuf", f"{what}: {role} {t.describe()} must be in SBUF")
    if not isinstance(dst, NkiTensor) or dst.buffer is not psum:
        raise NKIError("matmul-dst-in-psum", f"{what}: dst must be a PSUM tile, got "
                       f"{dst.describe() if isinstance(dst, NkiTensor) else type(dst).__name__}")
    if dst.dtype not in (torch.float32, torch.bfloat16):
        raise NKIError("matmul-dtype", f"{what}: dst {dst.describe()} must be nl.float32 or nl.bfloat16")
    (k, m), (k2, n_free) = stationary.shape, moving.shape
    if k != k2:
        raise NKIError("matmul-contraction", f"{what}: contraction dimension mismatch: stationary[0]={k} != "
                       f"moving[0]={k2}")
    _data_partitions(what, "stationary", stationary)
    if m % 2 or m > platform.stationary_fmax:
        raise NKIError("matmul-stationary-fmax", f"{what}: the stationary free dimension must be even and at most "
                       f"{platform.stationary_fmax}, got {m}")
    moving_fmax = platform.psum_bank_bytes // dst.itemsize   # 512 for fp32 results, 1024 for bf16
    if n_free > moving_fmax:
        raise NKIError("matmul-moving-fmax", f"{what}: the moving free dimension must be at most {moving_fmax} for a "
                       f"{str(dst.dtype).replace('torch.', '')} dst, got {n_free}")
    if tile_position or tile_size:
        if not tile_position or not tile_size or len(tile_size) != 2 or len(tile_position) != 2 or \
                tile_size[1] != 128 or tile_position[1] != 0:
            raise NKIError("matmul-tiling", f"{what} tiles rows only: tile_size=(rows, 128) and tile_position="
                           f"(start_row, 0), both given, got {tile_position!r} and {tile_size!r}")
        _check_tiling(what, tile_position, tile_size, k, m, False)
    if dst.shape != (m, n_free):
        raise NKIError("shape-mismatch", f"{what}: the product has shape {(m, n_free)} but dst is {dst.describe()}")
    s_rows, s_mask = _check_scale(what, "stationary_scale", stationary_scale, "stationary", k, m)
    m_rows, m_mask = _check_scale(what, "moving_scale", moving_scale, "moving", k, n_free)
    s = _dequantized(what, "stationary", stationary, stationary_scale, s_rows, s_mask)
    v = _dequantized(what, "moving", moving, moving_scale, m_rows, m_mask)
    record("tensor", "matmul_mx", (m, n_free), stationary.packed, matmul=(k * 4, m, n_free))
    product = torch.matmul(s.transpose(-1, -2), v)                # fp32, like nc_matmul
    groups = _groups(dst)
    region = _region(dst)
    add = accumulate if accumulate is not None else _in_open_group(dst, region, groups)
    ctx = _context.current()
    if isinstance(add, torch.Tensor):  # the region partly overlaps an open group: add there, overwrite elsewhere
        if ctx.frame or dst.batch or dst.key is not None:
            raise Unbatchable(ctx.frame or set(dst.batch), "a matmul partly overlapping an accumulation group")
        dst.write(torch.where(add, dst.data.float() + product, product), what=what, accumulating=True)
        groups.add(region)
        return
    summed = {loop for loop in ctx.frame if loop not in dst.batch}
    if summed and accumulate is False:
        raise Unbatchable(summed, "matmuls of a batched loop overwrite one PSUM tile")
    product = accumulate_over(product, dst)
    if add:
        product = dst.read(what=f"{what} accumulate", accumulating=True) + product
    dst.write(product, what=what, fresh=True, accumulating=True)
    groups.add(region)

