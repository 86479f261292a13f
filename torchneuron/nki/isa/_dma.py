"""``nki.isa`` DMA instructions: ``dma_copy``, ``dma_transpose``, ``dma_compute``.

DMA engines move data between HBM and SBUF (never PSUM) and cast through fp32 on the way.
Indirect transfers (a ``vector_select`` / ``.ap(vector_offset=...)`` view as source or destination)
gather and scatter; a read-modify-write (``dma_copy(dst_rmw_op=nl.add)``, ``dma_compute`` whose
sources include its indexed destination) adds to the destination, every repeat of an index adding
again when ``unique_indices=False`` (with ``True`` the kernel promises none, and a repeat is an
error: on hardware the repeats would race).
"""

import math

import numpy as np
import torch

import torchneuron.nki.isa.constants as C
from torchneuron.nki import _context
from torchneuron.nki._errors import NKIError
from torchneuron.nki.isa._common import engine_name, member, op_name, packed_move, require
from torchneuron.nki._ops import lead, record
from torchneuron.nki._tile import NkiTensor, borrowable, psum, sbuf


def _tensors(what, **tensors):
    for role, t in tensors.items():
        if not isinstance(t, NkiTensor):
            raise NKIError("operand", f"{what}: {role} must be a tensor or tile, got {type(t).__name__}")
        if t.buffer is psum:
            raise NKIError("dma-psum", f"{what}: {role} {t.describe()} is in PSUM, which DMA does not reach; copy "
                           "PSUM tiles to SBUF with nisa.tensor_copy first")


def _modes(what, priority, oob_mode, dge_mode):
    """The transfer's (oob_mode, dge_mode), checked with its QoS ``priority``."""
    oob = member(C.oob_mode, oob_mode, f"{what} oob_mode")
    dge = member(C.dge_mode, dge_mode, f"{what} dge_mode")
    if priority is not None:
        require("dma priority", f"{what} priority=")
        if not isinstance(priority, (int, np.integer)) or not 0 <= priority <= 3:
            raise NKIError("dma-priority", f"{what}: priority is a QoS level 0-3 (0 is the highest), got {priority!r}")
        if dge is C.dge_mode.none:
            raise NKIError("dma-priority", f"{what}: priority needs descriptor generation (dge_mode other than none)")
    return oob, dge


def dma_copy(dst, src, dst_rmw_op=None, priority=None, oob_mode=C.oob_mode.error, dge_mode=C.dge_mode.unknown,
             engine=C.engine.unknown, unique_indices=True, name=None, mask=None):
    """``dst = src`` between HBM and SBUF; element counts must match, values are cast through fp32.
    ``dst_rmw_op=nl.add``: ``dst = dst + src`` (a read-modify-write; see the module docstring)."""
    _tensors("nisa.dma_copy", dst=dst, src=src)
    oob, dge = _modes("nisa.dma_copy", priority, oob_mode, dge_mode)
    if dst_rmw_op is not None:
        if op_name(dst_rmw_op) != "add" or oob is not C.oob_mode.error or mask is not None:
            raise NKIError("dma-rmw", f"nisa.dma_copy: a read-modify-write takes dst_rmw_op=nl.add with "
                           f"oob_mode=error and no mask, got dst_rmw_op={dst_rmw_op!r}, oob_mode={oob.name}, "
                           f"mask={'given' if mask is not None else None}")
        values = src.read(what="nisa.dma_copy src").float()
        n = lead()
        if math.prod(values.shape[n:]) != math.prod(dst.shape):
            raise NKIError("shape-mismatch", f"nisa.dma_copy: src {src.describe()} and dst {dst.describe()} must "
                           "have the same number of elements")
        _read_modify_write("nisa.dma_copy", dst, values.reshape(list(values.shape[:n]) + list(dst.shape)),
                           unique_indices)
        return
    if engine_name(engine, "nisa.dma_copy", ("sync", "scalar"), None) is not None and dge is not C.dge_mode.hwdge:
        raise NKIError("dma-engine", "nisa.dma_copy: engine= picks the sequencer that generates hardware DGE "
                       "descriptors; it needs dge_mode=nisa.dge_mode.hwdge")
    if dge is C.dge_mode.hwdge and src.dtype != dst.dtype:
        raise NKIError("dma-dtype", f"nisa.dma_copy with hwdge copies bits: src {src.describe()} and dst "
                       f"{dst.describe()} must have the same dtype (reinterpret one with .view)")
    raw = packed_move("nisa.dma_copy", dst, src)  # packed MX bits are copied as they are
    values = src.read(mask, what="nisa.dma_copy", raw=raw)
    n = lead()
    count = math.prod(values.shape[n:])
    if count != math.prod(dst.shape):
        raise NKIError("shape-mismatch", f"nisa.dma_copy: src {src.describe()} has {count} elements, "
                       f"dst {dst.describe()} has {math.prod(dst.shape)}")
    record("dma", "dma_copy", dst.shape, dst.dtype, src=src.buffer.name, dst=dst.buffer.name)
    if _can_borrow(dst, src, values, mask):
        dst.borrow(values)
        return
    dst.write(values.reshape(list(values.shape[:n]) + list(dst.shape)), mask=mask,
              what=f"nisa.dma_copy to {dst.describe()}", raw=raw)


def _can_borrow(dst, src, values, mask):
    """A whole fresh SBUF tile loaded from an input the kernel never writes may use its memory."""
    return (mask is None and borrowable(src) and
            dst.buffer is sbuf and dst.key is None and not dst.alloc.written and not dst.alloc.viewed and
            dst.batch == _context.current().frame and dst.data.dtype == values.dtype and dst.packed is src.packed and
            tuple(values.shape[lead():]) == dst.shape)


# The permutation dma_transpose applies to a source of each rank.
_PERMUTATIONS = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def dma_transpose(dst, src, axes=None, priority=None, dge_mode=C.dge_mode.unknown, oob_mode=C.oob_mode.error,
                  name=None):
    """``dst = src.transpose(axes)`` by a DMA into SBUF: (1, 0) for 2-D sources, (2, 1, 0) for 3-D,
    (3, 1, 2, 0) for 4-D (the only permutations the hardware has)."""
    what = "nisa.dma_transpose"
    _tensors(what, dst=dst, src=src)
    oob, dge = _modes(what, priority, oob_mode, dge_mode)
    if dst.buffer is not sbuf:
        raise NKIError("dma-transpose", f"{what}: dst {dst.describe()} must be in SBUF")
    for role, t in (("src", src), ("dst", dst)):
        if t.key is not None:
            raise NKIError("not-emulated", f"{what}: {role} {t.describe()} is an indexed access (vector_select or "
                           ".ap(vector_offset=...)); indirect transposes are not emulated (the reference does not "
                           "specify their layout): gather with nisa.dma_copy, then transpose")
    if src.dtype != dst.dtype:
        raise NKIError("dtype", f"{what}: dst {dst.describe()} must have src's dtype {src.dtype}")
    perm = _PERMUTATIONS.get(len(src.shape))
    if perm is None:
        raise NKIError("dma-transpose", f"{what} transposes 2-D to 4-D sources, got {src.describe()}")
    if axes is not None and tuple(int(a) for a in axes) != perm:
        raise NKIError("dma-transpose", f"{what}: a {len(src.shape)}-D source is transposed with axes={perm}, "
                       f"got {tuple(axes)}")
    if dge not in (C.dge_mode.unknown, C.dge_mode.hwdge) or oob is not C.oob_mode.error:
        raise NKIError("dge-mode", f"{what}: a direct transpose runs with dge_mode unknown or hwdge and "
                       "oob_mode=error (indirect transposes through .ap(vector_offset=...) are not emulated)")
    if dge is C.dge_mode.hwdge and (src.shape[0] != 16 or src.shape[-1] % 128 or src.dtype.itemsize != 2):
        raise NKIError("dma-transpose", f"{what} with hwdge needs a 2-byte source with 16 rows and a last "
                       f"dimension that is a multiple of 128, got {src.describe()}")
    expected = tuple(src.shape[a] for a in perm)
    if dst.shape != expected:
        raise NKIError("shape-mismatch", f"{what}: the transposed source has shape {expected} but dst is "
                       f"{dst.describe()}")
    values = src.read(what=what)
    n = lead()
    record("dma", "dma_transpose", dst.shape, dst.dtype, src=src.buffer.name, dst=dst.buffer.name)
    dst.write(values.permute(list(range(n)) + [n + a for a in perm]), what=what)


def dma_compute(dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=C.oob_mode.error, name=None):
    """``dst = srcs[0] * scales[0] + srcs[1] * scales[1] + ...`` in fp32 by the DMA engines' compute
    logic (only ``nl.add`` with unit scales exists). With an indexed HBM ``dst`` that is also one
    of the two sources it is a scatter read-modify-write (see the module docstring); an indexed
    source is a gather."""
    what = "nisa.dma_compute"
    member(C.oob_mode, oob_mode, f"{what} oob_mode")
    if not isinstance(srcs, (list, tuple)) or not 1 <= len(srcs) <= 16:
        raise NKIError("operands", f"{what}: srcs is a list of 1 to 16 tensors, got {srcs!r}")
    _tensors(what, dst=dst, **{f"srcs[{i}]": s for i, s in enumerate(srcs)})
    if op_name(reduce_op) != "add":
        raise NKIError("reduce-op", f"{what}: reduce_op must be nl.add, got {reduce_op!r}")
    if scales is not None and (len(scales) != len(srcs) or any(float(s) != 1.0 for s in scales)):
        raise NKIError("dma-compute-scales", f"{what}: scales must be 1.0 for each source (or None), got {scales!r}")
    n = lead()
    # A source that is dst's own indexed access (a scatter into HBM) makes it a read-modify-write.
    rmw = dst.key is not None and [i for i, s in enumerate(srcs) if _same_access(s, dst)]
    if rmw and (len(rmw) != 1 or len(srcs) != 2 or dst.buffer.on_chip):
        raise NKIError("dma-rmw", f"{what}: a scatter read-modify-write has two sources, dst's own indexed access "
                       f"of an HBM tensor and the data to add, got {len(srcs)} sources with dst {dst.describe()}")
    total = None
    for i, s in enumerate(srcs):
        if math.prod(s.shape) != math.prod(dst.shape):
            raise NKIError("shape-mismatch", f"{what}: srcs[{i}] {s.describe()} and dst {dst.describe()} must have "
                           "the same number of elements")
        v = s.read(what=f"{what} srcs[{i}]").float()
        if rmw and i in rmw:
            continue  # dst's values: added to in place, once per index
        v = v.reshape(list(v.shape[:n]) + list(dst.shape))
        total = v if total is None else total + v
    record("dma", "dma_compute", dst.shape, dst.dtype, src=srcs[0].buffer.name, dst=dst.buffer.name)
    if rmw:
        _read_modify_write(what, dst, total, unique_indices)
    else:
        dst.write(total, what=what)


def _same_access(a, b):
    """Whether ``a`` and ``b`` are the same indexed access (the same elements of one tensor)."""
    if a is b:
        return True
    if not isinstance(a, NkiTensor) or a.alloc is not b.alloc or a.key is None or a.shape != b.shape or \
            a.data.shape != b.data.shape or len(a.key) != len(b.key):
        return False
    return all(np.array_equal(np.broadcast_to(np.asarray(x), a.shape), np.broadcast_to(np.asarray(y), a.shape))
               for x, y in zip(a.key, b.key))


def _read_modify_write(what, dst, values, unique_indices):
    """``dst = dst + values`` in fp32; an indexed ``dst`` reaching an element several times adds
    every value to it (all of its positions are written the same sum), which
    ``unique_indices=True`` promises does not happen: a repeat is then an error of the run (the
    indices are data)."""
    current = dst.read(what=f"{what} dst (read-modify-write)").float()
    if dst.key is not None:
        flat = torch.from_numpy(np.ravel_multi_index(
            [np.broadcast_to(np.clip(np.asarray(k), 0, n - 1), dst.shape) for k, n in zip(dst.key, dst.data.shape)],
            dst.data.shape).reshape(-1))
        ctx = _context.current()
        if unique_indices and not (ctx.checking or ctx.trial):  # (those passes' indices are scratch data)
            order = torch.argsort(flat, stable=True)
            same = (flat[order[1:]] == flat[order[:-1]]).nonzero()
            if len(same):
                a, b = (tuple(int(i) for i in np.unravel_index(int(order[j]), dst.shape)) for j in
                        (int(same[0, 0]), int(same[0, 0]) + 1))
                raise NKIError("dma-rmw", f"{what}: unique_indices=True, but positions {a} and {b} of the indexed "
                               f"dst {dst.describe()} are the same element (on hardware the repeats race); pass "
                               "unique_indices=False to add every one")
        sums = torch.zeros(math.prod(dst.data.shape)).index_add_(0, flat, values.reshape(-1).float())
        values = sums[flat].reshape(dst.shape)
    dst.write(current + values, what=what)
