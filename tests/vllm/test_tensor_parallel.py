"""Tensor parallel 2 on two neuron devices, against tensor parallel 1 and Hugging Face on CPU.

vLLM starts one worker process per device (its multiprocessing executor); their
collectives go through the ``neuron`` c10d backend (vLLM's ``DeviceCommunicatorBase``
calls ``torch.distributed`` on the tensor-parallel group). The tiny Llama's 4 query and
2 key-value heads split evenly, one KV head per device. Marked ``distributed``
(several processes) and kept out of the default serving tier: ``make test-vllm-slow``.
TP=1 and TP=2 run eagerly; a third engine runs TP=2 in vLLM's compiled mode (Dynamo traces
the all-reduce into the compiled graph as a functional collective on the same group).
"""

from __future__ import annotations

import pytest
import torch

from tests.vllm import tiny_models
from tests.vllm.test_offline import _prompt_ids, greedy, hf_greedy, token_prompts

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

LENGTHS = [3, 110, 17, 64, 1, 33]  # 64 batched tokens: chunked prefill and mixed steps
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_models.build(str(tmp_path_factory.mktemp("tiny_llama")))


@pytest.fixture(scope="module")
def hf(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def _placement(worker):
    """Runs in each worker process: where its shard lives and what carries its collectives."""
    import torch.distributed as dist
    from vllm.distributed import get_tp_group

    model = worker.model_runner.get_model()
    qkv = model.model.layers[0].self_attn.qkv_proj.weight
    return dict(device=str(worker.device), params={str(p.device) for p in model.parameters()},
                qkv_rows=qkv.shape[0], backend=dist.get_backend(get_tp_group().device_group))


def _generate(model_dir, prompts, tp: int, logprob_prompt, cache_root: str, compiled: bool = False):
    import vllm.envs
    from vllm import LLM

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        mp.setenv("NEURON_RT_NUM_CORES", "2")
        mp.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)  # the platform sets it: restored on exit
        mp.setenv("VLLM_CACHE_ROOT", cache_root)  # a fresh compile cache: the compile really happens
        vllm.envs.disable_envs_cache()  # an engine earlier in this process froze the environment
        engine = LLM(model=model_dir, tensor_parallel_size=tp, enforce_eager=not compiled, dtype="float32", seed=0,
                     max_model_len=128, max_num_seqs=8, max_num_batched_tokens=64, kv_cache_memory_bytes=4 << 20)
        try:
            placement = engine.collective_rpc(_placement)
            outs = engine.generate(token_prompts(*prompts), greedy(NEW_TOKENS))
            out = engine.generate(token_prompts(logprob_prompt), greedy(1, prompt_logprobs=0))[0]
        finally:
            engine.llm_engine.engine_core.shutdown()
    logprobs = [next(iter(d.values())).logprob for d in out.prompt_logprobs[1:]]
    return [list(o.outputs[0].token_ids) for o in outs], logprobs, placement


@pytest.fixture(scope="module")
def runs(model_dir, hf, tmp_path_factory):
    prompts = [_prompt_ids(hf, n, offset=k) for k, n in enumerate(LENGTHS)]
    logprob_prompt = _prompt_ids(hf, 40, offset=3)
    cache_root = str(tmp_path_factory.mktemp("vllm_cache"))
    results = {tp: _generate(model_dir, prompts, tp, logprob_prompt, cache_root) for tp in (1, 2)}
    results["2 compiled"] = _generate(model_dir, prompts, 2, logprob_prompt, cache_root, compiled=True)
    return prompts, results


def test_tp2_shards_over_two_neuron_devices(runs):
    _, results = runs
    one = results[1][2]
    assert one[0]["qkv_rows"] == 512  # q (4 heads) + k + v (2 heads each) of 64, whole
    for two in (results[2][2], results["2 compiled"][2]):
        assert [p["device"] for p in two] == ["neuron:0", "neuron:1"]
        assert [p["params"] for p in two] == [{"neuron:0"}, {"neuron:1"}]
        assert all(p["backend"] == "neuron" for p in two)
        assert [p["qkv_rows"] for p in two] == [256, 256]  # half on each device


def test_tp2_greedy_tokens_equal_tp1_and_hf(runs, hf):
    prompts, results = runs
    for k, ids in enumerate(prompts):
        ref = hf_greedy(hf, ids, NEW_TOKENS)
        assert results[1][0][k] == ref, f"TP=1, prompt of {len(ids)} tokens"
        assert results[2][0][k] == results[1][0][k], f"TP=2 vs TP=1, prompt of {len(ids)} tokens"
        assert results["2 compiled"][0][k] == results[1][0][k], f"TP=2 compiled vs TP=1, prompt of {len(ids)} tokens"


def test_tp2_prompt_logprobs_match_tp1(runs):
    _, results = runs
    # The row-parallel layers sum partial products across devices: a different float32
    # summation order than TP=1, so close, not bitwise equal.
    assert results[2][1] == pytest.approx(results[1][1], abs=1e-4)
    assert results["2 compiled"][1] == pytest.approx(results[1][1], abs=1e-4)
