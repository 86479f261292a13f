"""A mixture-of-experts model on neuron: a tiny Mixtral (4 experts, top 2) against Hugging Face on CPU.

vLLM builds no expert kernel for an out-of-tree platform; torchneuron's
(``torchneuron/vllm/moe.py``) and its ``_moe_C::topk_softmax`` router op are
what run here. One engine.
"""

from __future__ import annotations

import pytest
import torch

from tests.vllm import tiny_models
from tests.vllm.test_offline import _prompt_ids, greedy, token_prompts


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_models.build(str(tmp_path_factory.mktemp("tiny_mixtral")), family="mixtral")


@pytest.fixture(scope="module")
def llm(model_dir):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        engine = LLM(model=model_dir, dtype="float32", seed=0, max_model_len=128, max_num_seqs=4,
                     kv_cache_memory_bytes=2 << 20, enforce_eager=True)
        yield engine
        engine.llm_engine.engine_core.shutdown()


def test_mixtral_greedy_matches_hf_batched(llm, model_dir):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = [_prompt_ids((hf, None), n, offset=k) for k, n in enumerate([5, 40, 17])]
    outs = llm.generate(token_prompts(*prompts), greedy(10))
    for ids, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=10, eos_token_id=None,
                              pad_token_id=0)[0, len(ids):].tolist()
        assert list(out.outputs[0].token_ids) == ref, f"prompt of {len(ids)} tokens"


def test_router_op_matches_reference():
    from vllm.platforms import current_platform

    from torchneuron.vllm import ops

    current_platform.import_kernels()  # vLLM's kernels, then ours (ops.install)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 5, generator=g)
    dev = torch.device("neuron:0")
    w = torch.empty(7, 2, device=dev)
    ids = torch.empty(7, 2, dtype=torch.int32, device=dev)
    rows = torch.empty(7, 2, dtype=torch.int32, device=dev)
    torch.ops._moe_C.topk_softmax(w, ids, rows, logits.to(dev), True, None, None)
    probs = torch.softmax(logits, -1)
    top = probs.topk(2, -1)
    assert torch.equal(ids.cpu(), top.indices.to(torch.int32))
    torch.testing.assert_close(w.cpu(), top.values / top.values.sum(-1, keepdim=True))
    assert rows.cpu().tolist() == [[t, 7 + t] for t in range(7)]
    assert ops.topk_softmax.__module__ == "torchneuron.vllm.ops"
