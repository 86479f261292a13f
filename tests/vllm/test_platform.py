"""Selecting the neuron platform, and the configurations it refuses (no engine is started)."""

from __future__ import annotations

import pytest
import torch

import torchneuron.vllm


def test_plugin_selects_neuron_and_can_be_declined(monkeypatch):
    assert torchneuron.vllm.register() == "torchneuron.vllm.platform.NeuronPlatform"
    monkeypatch.setenv("TORCHNEURON_VLLM", "0")
    assert torchneuron.vllm.register() is None


@pytest.mark.parametrize("env, expected", [
    ({}, "torchneuron.vllm.platform.NeuronPlatform"),
    ({"TORCHNEURON_VLLM": "0"}, "vllm.platforms.cpu.CpuPlatform"),
    ({"VLLM_PLUGINS": ""}, "vllm.platforms.cpu.CpuPlatform"),  # vLLM's own plugin selection
])
def test_vllm_resolves_the_platform_through_the_entry_point(monkeypatch, env, expected):
    """What an unmodified script gets: vLLM finds the plugin in the package metadata."""
    import vllm.envs
    from vllm.platforms import resolve_current_platform_cls_qualname

    vllm.envs.disable_envs_cache()  # an engine started earlier in this process froze them
    for name in ("TORCHNEURON_VLLM", "VLLM_PLUGINS", "VLLM_TARGET_DEVICE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert resolve_current_platform_cls_qualname() == expected


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.vllm import tiny_models

    return tiny_models.build(str(tmp_path_factory.mktemp("tiny_llama")))


@pytest.mark.parametrize("kwargs, message", [
    (dict(pipeline_parallel_size=2), "pipeline parallel"),
    (dict(kv_cache_dtype="fp8"), "kv_cache_dtype='fp8'"),
    (dict(attention_backend="TRITON_ATTN"), "TRITON_ATTN is not available"),
])
def test_unsupported_configurations_are_refused_clearly(model_dir, kwargs, message):
    from vllm.engine.arg_utils import EngineArgs

    with pytest.raises(NotImplementedError, match=message):
        EngineArgs(model=model_dir, dtype="float32", **kwargs).create_engine_config()


def test_tensor_parallel_needs_as_many_devices(model_dir):
    from vllm.engine.arg_utils import EngineArgs

    count = torch.neuron.device_count()
    assert count < 4, "needs fewer than 4 devices (NEURON_RT_NUM_CORES, default 2)"
    with pytest.raises(ValueError, match=f"tensor_parallel_size=4 needs as many neuron devices, "
                                         f"{count} are visible; set NEURON_RT_NUM_CORES"):
        EngineArgs(model=model_dir, dtype="float32", tensor_parallel_size=4).create_engine_config()


def test_default_configuration_is_compiled_on_the_neuron_worker(model_dir):
    from vllm.config import CompilationMode
    from vllm.config.compilation import CUDAGraphMode
    from vllm.engine.arg_utils import EngineArgs

    from torchneuron.compile.build_id import build_id

    config = EngineArgs(model=model_dir, dtype="float32").create_engine_config()
    assert config.parallel_config.worker_cls == "torchneuron.vllm.worker.NeuronWorker"
    assert config.device_config.device.type == "neuron"
    assert config.scheduler_config.async_scheduling is True  # vLLM's default: steps overlap
    assert config.cache_config.block_size == 16
    assert config.model_config.dtype == torch.float32
    compilation = config.compilation_config
    assert compilation.mode == CompilationMode.VLLM_COMPILE and compilation.backend == "inductor"
    assert compilation.custom_ops == ["none"]  # layers as PyTorch code, for Inductor to fuse
    assert compilation.cudagraph_mode == CUDAGraphMode.NONE and compilation.compile_sizes == []
    assert compilation.inductor_compile_config["combo_kernels"] is False
    # torchneuron's code generator is part of vLLM's compile-cache key.
    assert config.additional_config["torchneuron_build"] == build_id()
    key = config.compute_hash()
    config.additional_config["torchneuron_build"] = "another build"
    assert config.compute_hash() != key


def test_cuda_fusion_passes_and_graph_capture_are_turned_off(model_dir):
    """Asked for explicitly, vLLM's CUDA fusion passes would fail in its pass manager (NameError:
    they are imported only on CUDA); graph capture needs torch.cuda graphs and streams."""
    from vllm.config.compilation import CUDAGraphMode
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(model=model_dir, dtype="float32", compilation_config={
        "cudagraph_mode": "PIECEWISE", "pass_config": {"fuse_norm_quant": True, "fuse_act_quant": True},
    }).create_engine_config()
    passes = config.compilation_config.pass_config
    assert passes.fuse_norm_quant is False and passes.fuse_act_quant is False
    assert passes.eliminate_noops is True  # a generic pass: kept
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.NONE


def test_enforce_eager_runs_eagerly(model_dir):
    from vllm.config import CompilationMode
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(model=model_dir, dtype="float32", enforce_eager=True).create_engine_config()
    assert config.compilation_config.mode == CompilationMode.NONE
    assert config.model_config.enforce_eager is True


def test_compiled_mode_refuses_backends_other_than_inductor(model_dir):
    from vllm.engine.arg_utils import EngineArgs

    with pytest.raises(NotImplementedError, match="compilation backend 'neuron' is not supported"):
        EngineArgs(model=model_dir, dtype="float32", compilation_config={"backend": "neuron"}).create_engine_config()
