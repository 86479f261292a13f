"""FlexAttention accepts neuron tensors (eager and compiled).

``torch.nn.attention.flex_attention`` checks the device against a fixed list
(cuda, cpu, xpu, hpu, mps) before doing anything; neuron joins the list here,
at import, by wrapping the module's checker (looked up at call time, also by
Dynamo when it traces the call). Eager calls then run the dense
implementation on the device; compiled calls are lowered by
``torchneuron.compile.flex_attention``. Autocast on neuron casts q, k, v to
the autocast dtype, as the CUDA and CPU autocast rules of the operator do.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.attention.flex_attention  # noqa: F401  (the module we extend)
from torch._C import DispatchKey

_api = sys.modules["torch.nn.attention.flex_attention"]
# `torch._higher_order_ops.flex_attention` the attribute is the operator; the module is in sys.modules.
_hop = sys.modules["torch._higher_order_ops.flex_attention"]
_DEVICE = "neuron"


def _validate_device(query, key, value):
    if query.device.type == _DEVICE and key.device == query.device and value.device == query.device:
        return
    _stock_validate_device(query, key, value)


def _autocast(query, key, value, score_mod, block_mask, scale, kernel_options,
              score_mod_other_buffers=(), mask_mod_other_buffers=()):
    dtype = torch.get_autocast_dtype(_DEVICE)
    query, key, value = (t.to(dtype) if t.is_floating_point() else t for t in (query, key, value))
    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(DispatchKey.AutocastPrivateUse1)):
        return _hop.flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options,
                                   score_mod_other_buffers, mask_mod_other_buffers)


_stock_validate_device = _api._validate_device
if _stock_validate_device.__module__ != __name__:
    _api._validate_device = _validate_device
    _hop.flex_attention.py_impl(DispatchKey.AutocastPrivateUse1)(_autocast)
    _hop.flex_attention_backward.fallthrough(DispatchKey.AutocastPrivateUse1)
