"""Sparse layouts on neuron: COO (the SparsePrivateUse1 key) and the
compressed layouts CSR, CSC, BSR and BSC (SparseCsrPrivateUse1).

A sparse tensor is a few dense tensors (indices, values) and a shape. Its
dense parts live in neuron memory and every op on them goes through the
launcher like any other. Two kinds of sparse op:

- ops that take a sparse tensor apart or put one together (`_values`,
  `crow_indices`, `_nnz`, construction, `copy_`, resizing): ATen's own
  kernels for these are device-generic (they only call other ops on the dense
  parts), so neuron runs the very kernels CPU registers, redispatched to them;
- every other op (`to_dense`, `coalesce`, `mm`, `sampled_addmm`, `sum`, ...):
  its result's size depends on the data (the number of non-zeros), so, like
  the launcher's synchronous ops (`nonzero`), it waits for the device, runs
  CPU's kernel on a host copy of its arguments, and uploads the results (and
  writes back the arguments it updates). `torchneuron.get_fallback_ops()`
  counts these round trips.

What upstream would need to make this unnecessary: device-generic sparse
kernels (most of ATen's COO and CSR kernels are written against CPU
accessors or CUDA), or a registration of the generic ones for every backend.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

from torchneuron import _C

aten = torch.ops.aten
_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)

# Device-generic kernels: the key of CPU's registration that neuron reuses.
_GENERIC = {
    "SparsePrivateUse1": ("SparseCPU", [
        "_sparse_coo_tensor_with_dims_and_tensors", "_sparse_coo_tensor_with_dims", "sparse_dim", "dense_dim",
        "_dimI", "_dimV", "_nnz", "_indices", "_values", "indices", "values", "is_coalesced", "_coalesced_",
        "sparse_resize_", "sparse_resize_and_clear_", "copy_sparse_to_sparse_", "copy_", "empty.memory_format",
        "zero_", "clone", "resize_as_sparse_",
    ]),
    "SparseCsrPrivateUse1": ("SparseCsrCPU", [
        "crow_indices", "col_indices", "ccol_indices", "row_indices", "values", "_nnz", "sparse_dim",
        "dense_dim", "copy_", "empty.memory_format", "resize_as_sparse_", "clone", "zero_",
    ]),
}


def _redispatch_to(key: str, op):
    keyset = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))

    def kernel(*args, **kwargs):
        return op.redispatch(keyset, *args, **kwargs)

    return kernel


# ---- the host round trip -----------------------------------------------------


def _to_host(t):
    if not isinstance(t, torch.Tensor) or t.device.type != "neuron":
        return t
    # Some CPU kernels look at requires_grad (sparse.mm's reductions keep the
    # indices their backward needs only then), so the copy keeps the flag.
    return _moved(t, "cpu").requires_grad_(t.requires_grad)


def _to_device(t, device):
    return _moved(t, device) if isinstance(t, torch.Tensor) and t.device.type == "cpu" else t


def _moved(t, device):
    """`t` with its parts copied to `device` (a sparse tensor is rebuilt from them)."""
    if t.layout == torch.sparse_coo:
        return torch.sparse_coo_tensor(t._indices().to(device), t._values().to(device), t.shape,
                                       is_coalesced=t.is_coalesced(), check_invariants=False)
    if t.layout in _COMPRESSED:
        compressed, plain = _compressed_parts(t)
        return torch.sparse_compressed_tensor(compressed.to(device), plain.to(device), t.values().to(device),
                                              t.shape, layout=t.layout, check_invariants=False)
    return t.to(device)


def _compressed_parts(t):
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return t.crow_indices(), t.col_indices()
    return t.ccol_indices(), t.row_indices()


def _device_of(args, kwargs):
    for a in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(a, torch.Tensor) and a.device.type == "neuron":
            return a.device
    return None


def _host_round_trip(op, *args, **kwargs):
    device = _device_of(args, kwargs)
    host_args, host_kwargs = tree_map(_to_host, (args, kwargs))
    _C._count_host_round_trip(op._schema.name)
    result = op(*host_args, **host_kwargs)
    # Arguments the op updates: their host copies now hold the result.
    written = {}
    for i, argument in enumerate(op._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            original = args[i] if i < len(args) else kwargs.get(argument.name)
            copy = host_args[i] if i < len(args) else host_kwargs.get(argument.name)
            if isinstance(original, torch.Tensor) and original.device.type == "neuron":
                original.copy_(_to_device(copy, device) if original.is_sparse or original.layout in _COMPRESSED
                               else copy)
                written[id(copy)] = original

    def back(r):
        if isinstance(r, torch.Tensor) and id(r) in written:
            return written[id(r)]
        return _to_device(r, device) if device is not None else r

    return tree_map(back, result)


# Dense neuron tensors in, sparse out: the round trip too (the launcher plans strided outputs).
_TO_SPARSE = ["_to_sparse", "_to_sparse.sparse_dim", "_to_sparse_csr", "_to_sparse_csc", "_to_sparse_bsr",
              "_to_sparse_bsc"]


def _round_trip_of(op):
    def kernel(*args, **kwargs):
        return _host_round_trip(op, *args, **kwargs)

    return kernel


def _register() -> None:
    library = torch.library.Library("_", "IMPL")
    aten_library = torch.library.Library("aten", "IMPL")
    for key, (cpu_key, names) in _GENERIC.items():
        for name in names:
            aten_library.impl(name, _redispatch_to(cpu_key, _overload(name)), key)
        library.fallback(lambda op, *a, **k: _host_round_trip(op, *a, **k), key)
        # An op with a composite kernel (a structured op's functional form, for
        # one) would take that instead of the fallback and plan strided outputs:
        # where CPU has a sparse kernel of its own, neuron takes the round trip.
        for name in torch._C._dispatch_get_all_op_names():
            if (name.startswith("aten::") and name[6:] not in names
                    and torch._C._dispatch_has_kernel_for_dispatch_key(name, cpu_key)
                    and any(torch._C._dispatch_has_kernel_for_dispatch_key(name, composite) for composite in
                            ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional"))):
                aten_library.impl(name[6:], _round_trip_of(_overload(name[6:])), key)
    for name in _TO_SPARSE:
        aten_library.impl(name, _round_trip_of(_overload(name)), "PrivateUse1")
    _libraries.extend([library, aten_library])


def _overload(name: str):
    packet, _, overload = name.partition(".")
    return getattr(getattr(aten, packet), overload or "default")


_libraries: list = []  # the registrations live as long as these objects
_register()
