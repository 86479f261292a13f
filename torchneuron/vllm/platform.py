"""``NeuronPlatform``: what vLLM asks of a device, answered for ``neuron``.

See ``torchneuron/vllm/__init__.py`` for the seam as a whole. This class is
loaded by vLLM in every process it starts (front end, engine core, workers);
it imports no vLLM module at import time beyond ``vllm.platforms`` so that it
can be resolved while vLLM itself is still importing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
import torchneuron  # noqa: F401  (the neuron device)
from vllm.platforms.interface import Platform, PlatformEnum

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = logging.getLogger("torchneuron.vllm")

WORKER = "torchneuron.vllm.worker.NeuronWorker"
ATTENTION = "torchneuron.vllm.attention.NeuronAttentionBackend"
# FlexAttention's paged path needs block sizes it can tile; 16 is vLLM's usual default.
DEFAULT_BLOCK_SIZE = 16


class NeuronPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "neuron"
    device_type: str = "neuron"
    dispatch_key: str = "PrivateUse1"
    dist_backend: str = "neuron"
    device_control_env_var: str = "NEURON_RT_VISIBLE_CORES"
    # torch.compile of vLLM's small helper functions (logprob ranks, top-k/p):
    # Dynamo without Inductor, so serving does not pay a compile per shape.
    simple_compile_backend: str = "eager"
    supported_quantization: list[str] = []

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        # The first is vLLM's fallback for dtype="auto" on unsupported checkpoints.
        return [torch.bfloat16, torch.float16, torch.float32]

    # ---- the device ----------------------------------------------------------------

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.neuron.get_device_name(device_id)

    @classmethod
    def get_device_uuid(cls, device_id: int = 0) -> str:
        return f"neuron-{cls.visible_device_id_to_physical_device_id(device_id)}"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.neuron.mem_get_info(device_id)[1]

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        torch.neuron.reset_peak_memory_stats(device)
        return torch.neuron.max_memory_allocated(device)

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.neuron.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.neuron.manual_seed_all(seed)

    @classmethod
    def inference_mode(cls):
        return torch.inference_mode(mode=True)

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return True

    @classmethod
    def num_compute_units(cls, device_id: int = 0) -> int:
        return 1  # one NeuronCore per device

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype) -> None:
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"neuron: model dtype {dtype} is not supported (float32, bfloat16, float16 are)")

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return False

    @classmethod
    def opaque_attention_op(cls) -> bool:
        return True

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return "vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase"

    @classmethod
    def get_punica_wrapper(cls) -> str:
        raise NotImplementedError("LoRA is not supported on the neuron platform yet")

    # ---- kernels -------------------------------------------------------------------

    @classmethod
    def import_kernels(cls) -> None:
        # vLLM's compiled CPU kernels: layers reach them only through
        # CustomOp.forward_oot, which for this platform is forward_native (PyTorch).
        # Loaded so that any direct call finds the op, and refused below when the
        # op would read device memory on the host.
        from vllm.platforms.cpu import CpuPlatform

        CpuPlatform.import_kernels()
        from . import ops

        ops.install()

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        from vllm.triton_utils import HAS_TRITON
        from vllm.triton_utils.dispatcher import register_kernels

        if HAS_TRITON:  # a Triton that can target neuron does not exist
            logger.warning("Triton is usable in this process; neuron still uses its PyTorch kernels")
        from . import ops

        register_kernels(ops.triton_kernel_overrides())

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads: int | None = None) -> str:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        c = attn_selector_config
        if c.use_mla or c.use_sparse:
            raise NotImplementedError(
                "neuron: MLA and sparse attention (DeepSeek-style models) are not supported; "
                "the neuron platform serves through vLLM's FlexAttention backend, which has neither"
            )
        if c.kv_cache_dtype not in (None, "auto"):
            raise NotImplementedError(
                f"neuron: kv_cache_dtype={c.kv_cache_dtype!r} is not supported (FlexAttention keeps the "
                "KV cache in the model dtype); use kv_cache_dtype='auto'"
            )
        flex = AttentionBackendEnum.FLEX_ATTENTION
        if selected_backend is not None and selected_backend != flex:
            raise NotImplementedError(
                f"neuron: attention backend {selected_backend.name} is not available; "
                "only FLEX_ATTENTION (PyTorch code over the paged KV cache) runs on neuron"
            )
        # FlexAttention's cache layout and KV write, with paged per-request attention.
        return ATTENTION

    # ---- configuration ---------------------------------------------------------------

    @classmethod
    def check_and_update_config(cls, vllm_config: "VllmConfig") -> None:
        from vllm.config import CompilationMode
        from vllm.config.compilation import CUDAGraphMode
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        model_config = vllm_config.model_config
        parallel = vllm_config.parallel_config
        cache = vllm_config.cache_config
        compilation = vllm_config.compilation_config
        scheduler = vllm_config.scheduler_config

        if parallel.worker_cls == "auto":
            parallel.worker_cls = WORKER
        if parallel.world_size > 1:
            raise NotImplementedError(
                f"neuron: tensor/pipeline parallel (world size {parallel.world_size}) is not supported yet; "
                "serve with tensor_parallel_size=1 and pipeline_parallel_size=1"
            )
        if vllm_config.speculative_config is not None:
            raise NotImplementedError(
                "neuron: speculative decoding is not supported yet (its Triton kernels have no neuron "
                "implementation)"
            )
        if vllm_config.lora_config is not None:
            raise NotImplementedError("neuron: LoRA is not supported yet")
        selected = vllm_config.attention_config.backend
        if selected is not None and selected != AttentionBackendEnum.FLEX_ATTENTION:
            raise NotImplementedError(
                f"neuron: attention backend {selected.name} is not available; only FLEX_ATTENTION "
                "(PyTorch code over the paged KV cache) runs on neuron"
            )
        if cache.cache_dtype not in ("auto", None):
            raise NotImplementedError(
                f"neuron: kv_cache_dtype={cache.cache_dtype!r} is not supported; use 'auto'"
            )
        if model_config is not None:
            if model_config.use_mla:
                raise NotImplementedError("neuron: MLA models (DeepSeek-style attention) are not supported")
            if model_config.is_hybrid or getattr(model_config, "has_inner_state", False):
                raise NotImplementedError(
                    "neuron: hybrid and state-space models (Mamba, linear attention) are not supported"
                )
            if model_config.is_encoder_decoder:
                raise NotImplementedError("neuron: encoder-decoder models are not supported")

        if not cache.user_specified_block_size:
            cache.block_size = DEFAULT_BLOCK_SIZE

        # Async scheduling overlaps steps with a torch.cuda.Stream in GPUModelRunner.
        if scheduler.async_scheduling:
            logger.info("neuron: async scheduling is not supported yet; scheduling synchronously")
        scheduler.async_scheduling = False

        # Graph capture (CUDA graphs) and vLLM's compiled mode are not wired yet: run the
        # model eagerly on neuron (the same as enforce_eager=True), and say so. (Letting
        # VLLM_COMPILE through fails in vLLM's pass manager: its fusion passes are imported
        # only on CUDA platforms, but pass_config enables them by default.)
        if compilation.mode != CompilationMode.NONE:
            logger.warning(
                "neuron: vLLM's compiled mode (torch.compile of the model, CUDA graphs) is not supported "
                "yet; running the model eagerly (as with enforce_eager=True)"
            )
        compilation.mode = CompilationMode.NONE
        compilation.cudagraph_mode = CUDAGraphMode.NONE
        compilation.cudagraph_capture_sizes = []
        if model_config is not None:
            model_config.enforce_eager = True
