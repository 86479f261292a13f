"""``nki.isa`` random numbers: ``rng``, ``rand2``, ``dropout``, ``set_rng_seed``,
``rand_set_state``, ``rand_get_state``.

The Vector and GpSimd Engines each keep a generator state per partition (lane): 24 32-bit
words on Vector, 6 on GpSimd, as the hardware's XORWOW generators do. The numbers are not the
hardware's: a lane's i-th number is a hash of its state words and of a counter (the last word)
plus i, and the counter then advances by the numbers drawn. A stream is thus reproducible from
a seed or a saved state and is drawn with whole-tile operations. The states start from a fixed
value at every kernel call (see _state), so the check and run passes draw the same numbers.
"""

import numpy as np
import torch

import torchneuron.nki.isa.constants as C
from torchneuron.nki import _context
from torchneuron.nki._batch import Unbatchable
from torchneuron.nki._errors import NKIError
from torchneuron.nki.isa._common import (check_dtype, column, engine_name, free_size, in_sbuf,
                                         not_in_psum, require, same_layout, tile)
from torchneuron.nki.isa._state import engine_state
from torchneuron.nki._ops import dst_write, record
from torchneuron.nki._tile import NkiTensor

WORDS = {"vector": 24, "gpsimd": 6}  # state words per lane
_SALT = {"vector": 0x5EED0001, "gpsimd": 0x5EED0002}
_MASK = 0xFFFFFFFF
_INTEGERS = (torch.int8, torch.int16, torch.int32, torch.uint8, torch.uint16, torch.uint32)


def _mix(h):
    """A 32-bit hash (murmur3's finaliser) of int64 tensors holding 32-bit values (products wrap
    modulo 2**64, which keeps their low 32 bits right)."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _MASK
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _MASK
    return h ^ (h >> 16)


def _fresh(engine, seed=0):
    """Every lane's state words derived from ``seed``."""
    pmax = _context.current().platform.pmax
    words = torch.arange(pmax * WORDS[engine], dtype=torch.int64).reshape(pmax, -1) + _SALT[engine]
    return _mix(_mix(words) ^ (seed & _MASK))


def _words(engine):
    states = engine_state().rng
    if engine not in states:
        states[engine] = _fresh(engine)
    return states[engine]


def _sequential(what):
    """Draws depend on the draws before them: a batched loop runs iteration by iteration."""
    frame = _context.current().frame
    if frame:
        raise Unbatchable(frame, f"{what} advances an engine's random state from one iteration to the next")


def _draw(engine, partitions, count):
    """``count`` 32-bit random values for each of the first ``partitions`` lanes: [P, count] int64."""
    words = _words(engine)
    key = torch.zeros(partitions, dtype=torch.int64)
    for k in range(words.shape[1] - 1):
        key = _mix(key ^ words[:partitions, k])
    counter = words[:partitions, -1:]
    values = _mix(_mix((counter + torch.arange(count)) & _MASK) ^ key[:, None])
    words[:partitions, -1] = (counter[:, 0] + count) & _MASK
    return values


def _uniform(engine, t):
    """Uniform fp32 values in [0, 1), one per element of tile ``t``, laid out per partition."""
    return (_draw(engine, t.shape[0], free_size(t)).double() / 2.0 ** 32).float()


def rng(dst, engine=C.engine.unknown, name=None):
    """Fills the integer tile ``dst`` with random bits (the low bits of 32 random bits each)."""
    what = "nisa.rng"
    eng = engine_name(engine, what, ("vector", "gpsimd"), "vector")
    if eng == "gpsimd":
        not_in_psum(what, dst=dst)
    check_dtype(what, "dst", dst, _INTEGERS, "an 8-, 16- or 32-bit integer type")
    _sequential(what)
    record(eng, "rng", dst.shape, dst.dtype)
    dst_write(dst, _draw(eng, dst.shape[0], free_size(dst)), what)


def rand2(dst, min, max, name=None):  # noqa: A002 - NKI's parameter names
    """Uniform random fp32 values in [min, max] (numbers or (P, 1) tiles) cast to ``dst.dtype``,
    from the NeuronCore-v4 vector engine's generator."""
    what = "nisa.rand2"
    require("nisa.rand2", what)
    low, high = column(min, f"{what} min", dst), column(max, f"{what} max", dst)
    if not isinstance(low, torch.Tensor) and not isinstance(high, torch.Tensor) and not low < high:
        raise NKIError("operands", f"{what}: min must be below max, got {min!r} and {max!r}")
    _sequential(what)
    u = _uniform("vector", dst)
    record("vector", "rand2", dst.shape, dst.dtype)
    dst_write(dst, low + (high - low) * u.reshape(dst.shape), what)


def dropout(dst, data, prob, name=None):
    """``dst = data``, each element replaced by 0 with probability ``prob`` (a number or a (P, 1)
    tile; no rescaling of the kept elements), from the vector engine's generator."""
    what = "nisa.dropout"
    values = tile(data, f"{what} data")
    if dst.dtype != data.dtype:
        raise NKIError("dtype", f"{what}: dst {dst.describe()} must have data's dtype {data.dtype}")
    same_layout(what, "data", data, dst=dst)
    if isinstance(prob, NkiTensor):
        if not data.dtype.is_floating_point and prob.dtype != torch.float32:
            raise NKIError("dtype", f"{what}: prob {prob.describe()} must be float32 for integer data")
    elif not isinstance(prob, (int, float, np.number)) or not 0 <= prob <= 1:
        raise NKIError("operands", f"{what}: prob is a probability in [0, 1] or a (P, 1) tile, got {prob!r}")
    p = column(prob, f"{what} prob", data)
    _sequential(what)
    keep = _uniform("vector", data).reshape(data.shape) >= p
    record("vector", "dropout", dst.shape, dst.dtype)
    dst_write(dst, torch.where(keep, values, torch.zeros((), dtype=values.dtype)), what)


def _seed_bits(t, what):
    """The 32-bit pattern of a one-element tile's value."""
    v = tile(t, what).reshape(-1)
    return int((v.view(torch.int32) if v.is_floating_point() else v).to(torch.int64)[0]) & _MASK


def set_rng_seed(src_seeds, name=None):
    """Seeds every lane of the vector engine's generator from the 32-bit value of a (1, 1) tile."""
    what = "nisa.set_rng_seed"
    if not isinstance(src_seeds, NkiTensor) or src_seeds.shape != (1, 1) or src_seeds.dtype.itemsize != 4:
        raise NKIError("operand", f"{what}: src_seeds must be a (1, 1) tile of a 32-bit dtype")
    _sequential(what)
    engine_state().rng["vector"] = _fresh("vector", _seed_bits(src_seeds, what))
    record("vector", "set_rng_seed", (1, 1), src_seeds.dtype)


def _state_engine(engine, what):
    """rand_set_state / rand_get_state: GpSimd, or on NeuronCore-v4 also Vector."""
    eng = engine_name(engine, what, ("gpsimd", "vector"), "gpsimd")
    if eng == "vector":
        require("random state on the vector engine", f"{what} on the vector engine")
    return eng


def _state_tile(t, eng, what, role):
    if not isinstance(t, NkiTensor) or len(t.shape) != 2 or t.shape[1] != WORDS[eng] or t.dtype != torch.uint32:
        raise NKIError("operand", f"{what}: {role} must be a 2-D uint32 tile of {WORDS[eng]} state words per "
                       f"partition for the {eng} engine")


def rand_set_state(src_seeds, engine=C.engine.unknown, name=None):
    """Sets each lane's generator state from the matching partition of ``src_seeds`` (uint32 in
    SBUF: 6 words per partition for GpSimd, 24 for Vector)."""
    what = "nisa.rand_set_state"
    eng = _state_engine(engine, what)
    _state_tile(src_seeds, eng, what, "src_seeds")
    in_sbuf(what, src_seeds=src_seeds)
    _sequential(what)
    values = tile(src_seeds, what).to(torch.int64)
    _words(eng)[:src_seeds.shape[0]] = values
    record(eng, "rand_set_state", src_seeds.shape, src_seeds.dtype)


def rand_get_state(dst, engine=C.engine.unknown, name=None):
    """Writes each lane's generator state to the matching partition of ``dst`` (uint32: 6 words
    per partition for GpSimd, 24 for Vector; SBUF, or PSUM from the NeuronCore-v4 vector engine)."""
    what = "nisa.rand_get_state"
    eng = _state_engine(engine, what)
    _state_tile(dst, eng, what, "dst")
    if eng == "gpsimd":  # (the vector engine, NeuronCore-v4 only, also reaches PSUM)
        in_sbuf(what, dst=dst)
    _sequential(what)
    record(eng, "rand_get_state", dst.shape, dst.dtype)
    dst_write(dst, _words(eng)[:dst.shape[0]].clone(), what)
