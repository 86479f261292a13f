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
    (dict(tensor_parallel_size=2), "tensor/pipeline parallel"),
    (dict(kv_cache_dtype="fp8"), "kv_cache_dtype='fp8'"),
    (dict(attention_backend="TRITON_ATTN"), "TRITON_ATTN is not available"),
])
def test_unsupported_configurations_are_refused_clearly(model_dir, kwargs, message):
    from vllm.engine.arg_utils import EngineArgs

    with pytest.raises(NotImplementedError, match=message):
        EngineArgs(model=model_dir, dtype="float32", **kwargs).create_engine_config()


def test_default_configuration_runs_eagerly_on_the_neuron_worker(model_dir):
    from vllm.config import CompilationMode
    from vllm.engine.arg_utils import EngineArgs

    config = EngineArgs(model=model_dir, dtype="float32").create_engine_config()
    assert config.parallel_config.worker_cls == "torchneuron.vllm.worker.NeuronWorker"
    assert config.device_config.device.type == "neuron"
    assert config.compilation_config.mode == CompilationMode.NONE
    assert config.scheduler_config.async_scheduling is False
    assert config.cache_config.block_size == 16
    assert config.model_config.dtype == torch.float32
