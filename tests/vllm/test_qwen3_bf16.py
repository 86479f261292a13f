"""A second family and dtype: a tiny Qwen3 (per-head q/k RMSNorm, GQA) in bfloat16 on neuron,
against Hugging Face on CPU in bfloat16: eagerly (one engine), and in vLLM's compiled mode
(Inductor's bfloat16 neuron kernels; marked ``slow`` for its cold compile).

Teacher-forced, so that bfloat16 near-ties cannot make the sequences diverge:
the prompt log-probabilities of a fixed 48-token sequence, and each greedy
token vLLM picked, scored by CPU on vLLM's own sequence, is CPU's argmax up to
bfloat16's precision.
"""

from __future__ import annotations

import pytest
import torch

from tests.vllm import tiny_models
from tests.vllm.test_offline import _prompt_ids


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_models.build(str(tmp_path_factory.mktemp("tiny_qwen3")), family="qwen3")


@pytest.fixture(scope="module", params=["eager", pytest.param("compiled", marks=pytest.mark.slow)])
def llm(model_dir, request):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM
        from vllm.config import CompilationMode

        engine = LLM(model=model_dir, dtype="bfloat16", seed=0, max_model_len=128, max_num_seqs=4,
                     kv_cache_memory_bytes=2 << 20, enforce_eager=request.param == "eager")
        compiled = engine.llm_engine.vllm_config.compilation_config.mode == CompilationMode.VLLM_COMPILE
        assert compiled == (request.param == "compiled")
        yield engine
        engine.llm_engine.engine_core.shutdown()


def test_qwen3_bfloat16_weights_cache_and_logprobs(llm, model_dir):
    from transformers import AutoModelForCausalLM
    from vllm import SamplingParams

    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    assert {p.dtype for p in runner.get_model().parameters()} == {torch.bfloat16}
    assert all(c.dtype == torch.bfloat16 and c.device.type == "neuron" for c in runner.kv_caches)

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    ids = _prompt_ids((hf, None), 48, offset=17)
    out = llm.generate([{"prompt_token_ids": ids}],
                       SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, prompt_logprobs=0))[0]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    got = torch.tensor([out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))])
    want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    assert torch.allclose(got, want, atol=0.1), (got - want).abs().max()
    gen = list(out.outputs[0].token_ids)
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids + gen])).logits[0].float(), -1)
    for step, token in enumerate(gen):
        row = ref[len(ids) - 1 + step]
        assert row.max() - row[token] <= 0.1, f"step {step}: {token} is {row.max() - row[token]:.3f} below the argmax"
