"""``nki.isa`` (``nisa``): engine instructions, destination first (``dst`` is written in place),
as in NKI 0.3 (Neuron SDK 2.29) with the later optional keywords.

The instructions live in ``torchneuron/nki/isa/_*.py``, one module per engine or concern; this
package exports them with the enums of ``nki.isa.constants``. Engine state
that outlives an instruction (accumulation registers, random generators) is described in
``_state``.

The MX instructions ``quantize_mx`` and ``nc_matmul_mx`` (NeuronCore-v4) are in ``_mx``; their
tiles have the packed dtypes of ``_dtypes``. Which platform target has which instruction is
``_context.FIRST_GENERATION``.
"""

import inspect

from torchneuron.nki._errors import NKIError
from torchneuron.nki.isa._common import strict_call, get_nc_version
from torchneuron.nki.isa._dma import dma_compute, dma_copy, dma_transpose
from torchneuron.nki.isa._mx import nc_matmul_mx, quantize_mx
from torchneuron.nki.isa._gpsimd import (affine_select, iota, local_gather, nc_n_gather, nonzero_with_count,
                                         sequence_bounds, tensor_partition_reduce)
from torchneuron.nki.isa._random import dropout, rand2, rand_get_state, rand_set_state, rng, set_rng_seed
from torchneuron.nki.isa._reduce import exponential, range_select, select_reduce, tensor_scalar_reduce
from torchneuron.nki.isa._registers import (VirtualRegister, register_alloc, register_load, register_move,
                                            register_store)
from torchneuron.nki.isa._scalar import activate2, activation, activation_reduce
from torchneuron.nki.isa._scan import tensor_scalar_cumulative, tensor_tensor_scan
from torchneuron.nki.isa._tensor import check_matmul, nc_matmul, nc_transpose
from torchneuron.nki.isa._topk import max8, nc_find_index8, nc_match_replace8
from torchneuron.nki.isa._vector import (bn_aggr, bn_stats, memset, nc_stream_shuffle, reciprocal,
                                         scalar_tensor_tensor, tensor_copy, tensor_copy_predicated, tensor_reduce,
                                         tensor_scalar, tensor_tensor)
from torchneuron.nki._lnc import core_barrier, sendrecv
from torchneuron.nki.isa import constants
from torchneuron.nki.isa.constants import (dge_mode, dma_engine, engine, matmul_perf_mode, nc_version, oob_mode,
                                           reduce_cmd)

NkiValidationError = NKIError

# Deprecated aliases of the engine members.
tensor_engine, scalar_engine, gpsimd_engine, vector_engine, unknown_engine = (
    engine.tensor, engine.scalar, engine.gpsimd, engine.vector, engine.unknown)

__all__ = [
    "engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode", "dma_engine", "nc_version", "constants",
    "get_nc_version", "NkiValidationError", "VirtualRegister",
    "tensor_engine", "scalar_engine", "gpsimd_engine", "vector_engine", "unknown_engine",
    "dma_copy", "dma_transpose", "dma_compute",
    "nc_matmul", "nc_transpose", "nc_matmul_mx", "quantize_mx",
    "tensor_copy", "tensor_copy_predicated", "memset", "tensor_tensor", "tensor_scalar", "scalar_tensor_tensor",
    "tensor_reduce", "reciprocal", "bn_stats", "bn_aggr", "nc_stream_shuffle",
    "exponential", "tensor_scalar_reduce", "select_reduce", "range_select",
    "tensor_tensor_scan", "tensor_scalar_cumulative",
    "max8", "nc_find_index8", "nc_match_replace8",
    "activation", "activation_reduce", "activate2",
    "iota", "affine_select", "tensor_partition_reduce", "local_gather", "nc_n_gather", "sequence_bounds",
    "nonzero_with_count",
    "rng", "rand2", "dropout", "set_rng_seed", "rand_set_state", "rand_get_state",
    "register_alloc", "register_move", "register_load", "register_store",
    "core_barrier", "sendrecv",
]

# Every instruction refuses keywords it does not have and calls without dst (see _common.strict_call; the
# enums and VirtualRegister are classes).
for _name in __all__:
    if inspect.isfunction(globals()[_name]):
        globals()[_name] = strict_call(globals()[_name])
del _name
