"""The neuron worker and model runner: vLLM's GPU worker and V1 runner on ``neuron:N``.

vLLM's ``Worker`` and ``GPUModelRunner`` drive the device through
``torch.accelerator`` (memory info and statistics, synchronize, empty_cache),
``torch.Event`` and device tensors, all of which the neuron backend provides.
What is CUDA-specific is the device choice in ``Worker.init_device`` (it
accepts only ``cuda``) and ``torch.cuda.Stream`` uses for async scheduling and
speculative decoding, which the platform turns off. So ``init_device`` below
is the CUDA branch of vLLM's, for ``neuron``; the rest is inherited.

KV-cache sizing is vLLM's own: a profiling run of the model on dummy inputs,
then ``gpu_memory_utilization`` x device capacity minus weights and peak
activations (``torch.accelerator.memory_stats`` of the emulated device), or
exactly ``kv_cache_memory_bytes`` when given.
"""

from __future__ import annotations

import gc
import types
from contextlib import nullcontext

import torch
from vllm.model_executor.model_loader import get_model_loader
from vllm.platforms import current_platform
from vllm.utils.mem_utils import MemorySnapshot
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker import gpu_model_runner
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes
from vllm.v1.worker.utils import request_memory

from . import moe, ops

class _TorchWithNeuronStreams(types.ModuleType):
    """``torch``, except that ``torch.cuda``'s streams and events are neuron's.

    The GPU runner module makes its side streams and events through ``torch.cuda``
    (async scheduling copies each step's sampled tokens to the host on a side stream,
    behind an event, while the host schedules the next step). Only that module sees
    this ``torch``: the process's ``torch.cuda`` is not touched.
    """

    class _Cuda(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch.cuda, name)

    def __init__(self):
        super().__init__("torch")
        cuda = self._Cuda("torch.cuda")
        for name in ("Stream", "Event", "current_stream", "default_stream", "stream", "set_stream"):
            setattr(cuda, name, getattr(torch.neuron, name))
        self.cuda = cuda

    def __getattr__(self, name):
        return getattr(torch, name)


gpu_model_runner.torch = _TorchWithNeuronStreams()


class NeuronModelRunner(GPUModelRunner):
    """vLLM's V1 GPU model runner; its buffers and KV cache live on ``neuron``."""

    def __init__(self, vllm_config, device: torch.device):
        if device.type != "neuron":
            raise ValueError(f"NeuronModelRunner needs a neuron device, got {device}")
        super().__init__(vllm_config, device)


class NeuronWorker(Worker):
    def init_device(self) -> None:
        if self.use_v2_model_runner:
            raise NotImplementedError(
                "neuron: vLLM's V2 model runner is not supported yet (unset VLLM_USE_V2_MODEL_RUNNER)"
            )
        ops.install()
        moe.register()
        count = torch.neuron.device_count()
        if self.local_rank >= count:
            raise RuntimeError(
                f"neuron: worker local rank {self.local_rank} needs device neuron:{self.local_rank}, "
                f"but {count} neuron device(s) are visible (NEURON_RT_NUM_CORES / NEURON_RT_VISIBLE_CORES)"
            )
        index = current_platform.logical_device_id_to_visible_device_id(self.local_rank)
        self.device = torch.device(f"neuron:{index}")
        torch.accelerator.set_device_index(self.device)
        current_platform.check_if_supports_dtype(self.model_config.dtype)

        init_worker_distributed_environment(
            self.vllm_config,
            self.rank,
            self.distributed_init_method,
            self.local_rank,
            current_platform.dist_backend,
        )
        set_random_seed(self.model_config.seed)

        gc.collect()
        torch.accelerator.empty_cache()
        external = get_model_loader(self.load_config).get_external_weight_memory(self.vllm_config)
        self.init_snapshot = MemorySnapshot(device=self.device)
        self.requested_memory = request_memory(self.init_snapshot, self.cache_config, external)
        self._init_workspace_and_model_runner()

    def _make_model_runner(self) -> GPUModelRunner:
        return NeuronModelRunner(self.vllm_config, self.device)

    def compile_or_warm_up_model(self) -> CompilationTimes:
        # Nothing to capture (no graph capture on neuron); in compiled mode the model was
        # compiled by the first dummy run (vLLM's profiling run) or is by the one below,
        # over one dynamic range (compile_sizes is empty). vLLM's kernel warm-up is for CUDA
        # kernels (DeepGEMM, FlashInfer, ...; it imports torchvision-only modules on the way).
        # Keep the GPU worker's sampler warm-up, which sizes the logits buffers, and its seed reset.
        from vllm.config.compilation import CUDAGraphMode

        if self.model_runner.is_pooling_model:
            raise NotImplementedError("neuron: pooling (embedding) models are not supported yet")
        max_num_reqs = min(self.scheduler_config.max_num_seqs, self.scheduler_config.max_num_batched_tokens)
        _, last_hidden_states = self.model_runner._dummy_run(
            num_tokens=max_num_reqs, skip_eplb=True, cudagraph_runtime_mode=CUDAGraphMode.NONE
        )
        self.model_runner._dummy_sampler_run(hidden_states=last_hidden_states)
        set_random_seed(self.model_config.seed, self.parallel_config.data_parallel_index)
        return CompilationTimes(
            language_model=self.compilation_config.compilation_time,
            encoder=self.compilation_config.encoder_compilation_time,
        )

    def _maybe_get_memory_pool_context(self, tag: str):
        # vLLM's base worker assumes every platform other than cuda/xpu/cpu has the
        # sleep-mode (cumem) allocator; neuron memory comes from its own caching allocator.
        return nullcontext()

    def sleep(self, level: int = 1) -> None:
        raise NotImplementedError("neuron: sleep mode is not supported")

    def wake_up(self, tags: list[str] | None = None) -> None:
        raise NotImplementedError("neuron: sleep mode is not supported")
