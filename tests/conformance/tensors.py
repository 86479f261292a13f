"""Moving test inputs between CPU and neuron, and comparing results.

Copies keep a tensor's whole storage, strides and offset, so views (a
`partial_views` sample, a noncontiguous slice) stay the same views of the
same data on the other device.
"""

from __future__ import annotations

import torch
from torch.testing._internal.opinfo.core import SampleInput
from torch.utils._pytree import tree_flatten, tree_map


def copy_tensor(t: torch.Tensor, device, memo: dict | None = None) -> torch.Tensor:
    """t's storage, sizes, strides and offset on `device`; a leaf that requires
    grad if t does. Tensors copied with the same memo that share a storage
    share the copy too (an out= argument aliasing an input stays aliased)."""
    if t.device.type not in ("cpu", "neuron"):
        return t  # meta tensors in error inputs stay meta
    if t.layout != torch.strided:
        return t.detach().to(device).requires_grad_(t.requires_grad)
    if memo is not None and id(t) in memo:
        return memo[id(t)]  # the same tensor passed twice (cat([x, y], out=x)) stays one tensor
    storage = t.untyped_storage()
    key = (storage.data_ptr(), t.dtype)
    with torch.no_grad():
        flat = memo.get(key) if memo is not None and storage.data_ptr() else None
        if flat is None:
            n = storage.nbytes() // t.element_size()
            flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, 0, (n,), (1,)).to(device, copy=True)
            if memo is not None:
                memo[key] = flat
        out = flat.as_strided(t.shape, t.stride(), t.storage_offset())
        # The storage holds the raw data: lazy conjugation/negation bits go on top.
        if t.is_conj():
            out = out.conj()
        if t.is_neg():
            out = out._neg_view()
    out = out.detach().requires_grad_(t.requires_grad)
    if memo is not None:
        memo[id(t)] = out
    return out


def to_device(tree, device):
    """A copy of a pytree's tensors, or of a SampleInput's, on device."""
    memo = {}

    def move(x):
        return copy_tensor(x, device, memo) if isinstance(x, torch.Tensor) else x

    if not isinstance(tree, SampleInput):
        return tree_map(move, tree)
    moved = tree.transform(move)
    # Factory samples (zeros, arange, *_like) name the device they create on.
    target = moved.kwargs.get("device")
    if isinstance(target, (str, torch.device)) and torch.device(target).type == "neuron":
        moved.kwargs["device"] = torch.device(device)
    return moved


def to_cpu(tree):
    return tree_map(lambda x: x.detach().cpu() if isinstance(x, torch.Tensor) else x, tree)


def tensors(tree) -> list[torch.Tensor]:
    if isinstance(tree, SampleInput):
        tree = (tree.input, tree.args, tree.kwargs)
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def assert_same(actual, expected, *, atol=None, rtol=None, exact_dtype=True, shapes_only=False) -> None:
    """actual (any device) matches expected (CPU): structure, shapes, dtypes
    and, unless shapes_only, values within tolerance."""
    act, act_spec = tree_flatten(to_cpu(actual))
    exp, exp_spec = tree_flatten(expected)
    if shapes_only:
        assert act_spec == exp_spec, f"output structure {act_spec} != {exp_spec}"
        for a, e in zip(act, exp):
            if isinstance(e, torch.Tensor):
                assert isinstance(a, torch.Tensor), f"expected a tensor, got {type(a).__name__}"
                assert a.shape == e.shape and a.dtype == e.dtype, f"{a.shape}/{a.dtype} != {e.shape}/{e.dtype}"
        return
    if atol is None or rtol is None:
        atol = rtol = None
    torch.testing.assert_close(act, exp, atol=atol, rtol=rtol, equal_nan=True, check_device=False,
                               check_dtype=exact_dtype)
