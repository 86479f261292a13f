"""``NeuronPlatform``: what vLLM asks of a device, answered for ``neuron``.

See ``torchneuron/vllm/__init__.py`` for the seam as a whole. This class is
loaded by vLLM in every process it starts (front end, engine core, workers);
it imports no vLLM module at import time beyond ``vllm.platforms`` so that it
can be resolved while vLLM itself is still importing.
"""

from __future__ import annotations

import dataclasses
import logging
import os
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
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        model_config = vllm_config.model_config
        parallel = vllm_config.parallel_config
        cache = vllm_config.cache_config

        if parallel.worker_cls == "auto":
            parallel.worker_cls = WORKER
        # Tensor parallel: one worker process per neuron device, vLLM's collectives on the
        # neuron c10d backend (DeviceCommunicatorBase calls torch.distributed on the group).
        if parallel.pipeline_parallel_size > 1 or parallel.data_parallel_size > 1:
            raise NotImplementedError(
                f"neuron: pipeline parallel ({parallel.pipeline_parallel_size}) and data parallel "
                f"({parallel.data_parallel_size}) are not supported yet; tensor_parallel_size is"
            )
        devices = torch.neuron.device_count()
        if parallel.tensor_parallel_size > devices:
            raise ValueError(
                f"neuron: tensor_parallel_size={parallel.tensor_parallel_size} needs as many neuron devices, "
                f"{devices} are visible; set NEURON_RT_NUM_CORES (or NEURON_RT_VISIBLE_CORES)"
            )
        if parallel.world_size > 1 and "VLLM_WORKER_MULTIPROC_METHOD" not in os.environ:
            # Each worker opens its neuron device, which a child forked from a process that has
            # used neuron cannot do (as with CUDA, which vLLM detects by itself; neuron it does not).
            logger.info("neuron: starting the %d workers with 'spawn'", parallel.world_size)
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
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

        cls._configure_compilation(vllm_config)

    @classmethod
    def get_compile_backend(cls) -> str:
        # vLLM's default for compilation_config.backend. Inductor generates neuron
        # kernels for neuron tensors (torchneuron.compile registers the device with it),
        # so vLLM's own Inductor path (VllmBackend, piecewise, its caches) is the one.
        return "inductor"

    @classmethod
    def _configure_compilation(cls, vllm_config: "VllmConfig") -> None:
        """Compiled mode: vLLM's VllmBackend with Inductor for neuron, no graph capture."""
        from vllm.config import CompilationMode
        from vllm.config.compilation import CUDAGraphMode

        compilation = vllm_config.compilation_config
        if compilation.mode == CompilationMode.VLLM_COMPILE and compilation.backend not in ("inductor", "eager"):
            raise NotImplementedError(
                f"neuron: compilation backend {compilation.backend!r} is not supported with vLLM's compiled mode; "
                "use 'inductor' (the default: Inductor generates neuron kernels) or 'eager' (Dynamo only)"
            )
        # Graph capture: vLLM's capture (CUDAGraphWrapper, the runner's capture loop) is written
        # against torch.cuda.CUDAGraph and torch.cuda.Stream; vLLM already turns it off for a
        # platform without static graph mode, this makes it explicit (docs/serving.md says more).
        if compilation.cudagraph_mode not in (None, CUDAGraphMode.NONE):
            logger.info("neuron: graph capture (cudagraph_mode=%s) is not supported; compiled pieces run "
                        "without it", compilation.cudagraph_mode.name)
        compilation.cudagraph_mode = CUDAGraphMode.NONE
        compilation.cudagraph_capture_sizes = []
        compilation.max_cudagraph_capture_size = 0
        if compilation.mode == CompilationMode.NONE:
            return
        # vLLM's fusion passes match CUDA/ROCm kernels (quantization, FlashInfer all-reduce,
        # AITER) and are imported only on those platforms: enabled here they fail with a
        # NameError in the pass manager. Inductor fuses the PyTorch layers by itself.
        passes = compilation.pass_config
        for name in (field.name for field in dataclasses.fields(passes)):
            if (name.startswith("fuse_") or name.endswith("_fusion")) and getattr(passes, name):
                logger.info("neuron: vLLM fusion pass %s is for CUDA kernels; turned off", name)
                setattr(passes, name, False)
        # Combo kernels are Triton's horizontal fusion (benchmarking them imports Triton).
        compilation.inductor_compile_config.update(combo_kernels=False, benchmark_combo_kernel=False)
        # Without graph capture vLLM never sets compile_sizes; the piecewise backend needs a list.
        compilation.post_init_cudagraph_sizes()
        # vLLM's compile cache is keyed on vLLM, the model and the configs, not on the code
        # generator: torchneuron's build joins the key (a stale program would run silently).
        from torchneuron.compile.build_id import build_id

        if isinstance(vllm_config.additional_config, dict):
            vllm_config.additional_config["torchneuron_build"] = build_id()
