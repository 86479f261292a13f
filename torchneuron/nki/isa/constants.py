"""``nki.isa.constants``: the enums of ``nki.isa`` (the same objects ``nki.isa`` exports).

Members are given by name (``nisa.engine.vector``). The integer enums also accept the matching
integer, as older kernels pass them (``dge_mode=3``).
"""

import enum


class engine(enum.IntEnum):
    """The NeuronCore engine an instruction runs on; ``unknown`` lets the compiler choose."""

    unknown = 0
    tensor = 1
    scalar = 2
    gpsimd = 3
    dma = 4
    vector = 5
    sync = 6


class reduce_cmd(enum.IntEnum):
    """What an instruction does with its engine's per-partition accumulation registers."""

    idle = 0          # leave them alone
    reset = 1         # reset them only
    reduce = 2        # accumulate on top of their current values
    reset_reduce = 3  # reset, then accumulate this instruction's result
    load_reduce = 4   # load an initial value, then accumulate this instruction's result


class dge_mode(enum.IntEnum):
    """Who generates a DMA's descriptors: the compiler's choice, GpSimd (software), the DGE block
    of the Sync/Scalar sequencers (hardware, NeuronCore-v3+), or the runtime before execution."""

    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.IntEnum):
    """What a DMA with dynamic addresses does with an out-of-bounds access: fail, or skip it."""

    error = 0
    skip = 1


class matmul_perf_mode(str, enum.Enum):
    """Tensor engine performance mode: ``double_row`` contracts two FP8 rows per PE (v3+)."""

    none = "none"
    double_row = "double_row"


class dma_engine(enum.IntEnum):
    """The DMA that ``sendrecv`` uses: the shared DMA, or GpSimd's own (low latency, SBUF to SBUF)."""

    dma = 1
    gpsimd_dma = 2


class nc_version(enum.IntEnum):
    """NeuronCore generation of the compile target; ordered, so ``>= nc_version.gen3`` works."""

    gen2 = 2  # Trn1 / Inf2
    gen3 = 3  # Trn2
    gen4 = 4  # Trn3


__all__ = ["engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode", "dma_engine", "nc_version"]
