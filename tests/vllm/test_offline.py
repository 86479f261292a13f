"""Offline generation with vLLM on neuron, against Hugging Face on CPU.

One engine for the whole module (an engine costs 20-30 s here): a tiny random
Llama with GQA and head_dim 64, float32, built in the test. vLLM runs in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the tests can look at where
the weights and the KV cache live. Every expected value comes from
``transformers`` on CPU, never from vLLM.
"""

from __future__ import annotations

import pytest
import torch

from tests.vllm import tiny_models

MAX_MODEL_LEN = 128
KV_CACHE_BYTES = 4 << 20  # 2048 tokens of this model's cache
BATCHED_TOKENS = 64  # < the longest prompt: chunked prefill happens


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_models.build(str(tmp_path_factory.mktemp("tiny_llama")))


@pytest.fixture(scope="module")
def hf(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def llm(model_dir):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        engine = LLM(
            model=model_dir,
            enforce_eager=True,
            dtype="float32",
            seed=0,
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=8,
            max_num_batched_tokens=BATCHED_TOKENS,
            kv_cache_memory_bytes=KV_CACHE_BYTES,
            enable_prefix_caching=True,
            disable_log_stats=False,
        )
        yield engine
        engine.llm_engine.engine_core.shutdown()


def _worker(llm):
    return llm.llm_engine.model_executor.driver_worker.worker


def hf_greedy(hf, prompt_ids: list[int], n: int) -> list[int]:
    model, _ = hf
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=n, min_new_tokens=0,
            eos_token_id=None, pad_token_id=0,
        )
    return out[0, len(prompt_ids):].tolist()


def hf_log_softmax(hf, ids: list[int]) -> torch.Tensor:
    model, _ = hf
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)


def greedy(n: int, **kw):
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)


def token_prompts(*ids_lists):
    return [{"prompt_token_ids": ids} for ids in ids_lists]


def _prompt_ids(hf, length: int, offset: int = 0) -> list[int]:
    """`length` distinct-looking tokens of the tiny vocabulary (no special ids)."""
    vocab = hf[0].config.vocab_size
    return [3 + (offset + 7 * i * i + 13 * i) % (vocab - 3) for i in range(length)]


# ---- the platform ------------------------------------------------------------------

def test_platform_is_neuron_without_code_change():
    from vllm.platforms import current_platform

    assert current_platform.device_type == "neuron"
    assert current_platform.dispatch_key == "PrivateUse1"
    assert current_platform.dist_backend == "neuron"
    assert current_platform.get_device_total_memory(0) == torch.neuron.get_device_properties(0).total_memory


def test_model_and_kv_cache_live_on_neuron(llm):
    worker = _worker(llm)
    runner = worker.model_runner
    assert worker.device == torch.device("neuron:0")
    devices = {p.device for p in runner.get_model().parameters()}
    assert devices == {torch.device("neuron:0")}
    caches = runner.kv_caches
    assert caches and all(c.device == torch.device("neuron:0") for c in caches)
    # kv_cache_memory_bytes is honoured exactly: whole blocks within the budget.
    total = sum(c.numel() * c.element_size() for c in caches)
    assert KV_CACHE_BYTES - total < caches[0][0].numel() * caches[0].element_size() * len(caches)
    assert total <= KV_CACHE_BYTES


def test_async_scheduling_copies_tokens_on_a_neuron_side_stream(llm):
    """vLLM's default async scheduling: the runner copies each step's sampled tokens to the
    host on a side stream of the neuron device (the tokens of every test here come through it);
    the process's own torch.cuda is untouched."""
    from vllm.v1.worker import gpu_model_runner

    runner = _worker(llm).model_runner
    assert runner.use_async_scheduling
    stream = runner.async_output_copy_stream
    assert isinstance(stream, torch.Stream) and stream.device == torch.device("neuron:0")
    assert stream != torch.neuron.current_stream()
    assert gpu_model_runner.torch.cuda.Stream is torch.neuron.Stream
    assert torch.cuda.Stream is not torch.neuron.Stream


def test_memory_profiling_sizes_kv_cache_from_device_capacity(llm):
    """vLLM's own profiling (gpu_memory_utilization x emulated capacity - weights - peak activations)."""
    worker = _worker(llm)
    cache_config = worker.cache_config
    saved = cache_config.kv_cache_memory_bytes
    cache_config.kv_cache_memory_bytes = None
    try:
        available = worker.determine_available_memory()
    finally:
        cache_config.kv_cache_memory_bytes = saved
    capacity = torch.neuron.mem_get_info(0)[1]
    weights = sum(p.numel() * p.element_size() for p in worker.model_runner.get_model().parameters())
    budget = cache_config.gpu_memory_utilization * capacity
    assert 0 < available <= budget - weights
    # What is not KV cache (weights, the 4 MiB cache already allocated, activations of a
    # 64-token step, the sampler's buffers) is small for this model.
    assert available > budget - weights - KV_CACHE_BYTES - (64 << 20)


# ---- generation --------------------------------------------------------------------

def test_greedy_matches_hf(llm, hf):
    _, tok = hf
    prompt = "the quick brown fox jumps"
    ids = tok(prompt).input_ids
    out = llm.generate([prompt], greedy(16))[0].outputs[0]
    assert list(out.token_ids) == hf_greedy(hf, ids, 16)


def test_continuous_batching_and_chunked_prefill_match_solo(llm, hf):
    # Lengths 3 .. 110: the longest are prefilled in chunks of BATCHED_TOKENS,
    # while the short ones already decode in the same steps.
    lengths = [3, 110, 17, 64, 1, 90, 33, 8]
    prompts = [_prompt_ids(hf, n, offset=k) for k, n in enumerate(lengths)]
    n_new = 10
    outs = llm.generate(token_prompts(*prompts), greedy(n_new))
    for ids, out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == hf_greedy(hf, ids, n_new), f"prompt of {len(ids)} tokens"


def _prefix_cache_hits(llm) -> float:
    return sum(m.value for m in llm.get_metrics() if m.name == "vllm:prefix_cache_hits")


def test_prefix_caching_hits_give_the_same_tokens(llm, hf):
    shared = _prompt_ids(hf, 48, offset=100)  # three full blocks of 16
    a, b = shared + _prompt_ids(hf, 5, offset=7), shared + _prompt_ids(hf, 9, offset=11)
    llm.reset_prefix_cache()
    first = llm.generate(token_prompts(a), greedy(8))[0].outputs[0].token_ids
    hits = _prefix_cache_hits(llm)
    second = llm.generate(token_prompts(a, b), greedy(8))
    assert _prefix_cache_hits(llm) - hits >= 2 * 48  # both reuse the shared blocks
    assert list(first) == list(second[0].outputs[0].token_ids) == hf_greedy(hf, a, 8)
    assert list(second[1].outputs[0].token_ids) == hf_greedy(hf, b, 8)


def test_logprobs_match_cpu_log_softmax(llm, hf):
    ids = _prompt_ids(hf, 20, offset=3)
    out = llm.generate(token_prompts(ids), greedy(6, logprobs=3, prompt_logprobs=2))[0]
    gen = list(out.outputs[0].token_ids)
    ref = hf_log_softmax(hf, ids + gen)
    for step, (token, top) in enumerate(zip(gen, out.outputs[0].logprobs)):
        row = ref[len(ids) - 1 + step]
        assert top[token].logprob == pytest.approx(row[token].item(), abs=1e-4)
        ref_top = row.topk(3).indices.tolist()
        assert {t for t, lp in top.items() if lp.rank <= 3} == set(ref_top)
        for t in ref_top:
            assert top[t].logprob == pytest.approx(row[t].item(), abs=1e-4)
    # prompt_logprobs[i] is the log-probability of prompt token i given tokens < i.
    for i in range(1, len(ids)):
        assert out.prompt_logprobs[i][ids[i]].logprob == pytest.approx(ref[i - 1, ids[i]].item(), abs=1e-4)


def test_seeded_sampling_repeats_and_stays_in_the_nucleus(llm, hf):
    from vllm import SamplingParams

    ids = _prompt_ids(hf, 12, offset=5)
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=1234, max_tokens=12, ignore_eos=True)
    other = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=99, max_tokens=12, ignore_eos=True)
    # Alone, then batched with an unseeded request: a seed fixes the request's tokens.
    alone = llm.generate(token_prompts(ids), params)[0].outputs[0].token_ids
    batched = llm.generate(
        token_prompts(ids, _prompt_ids(hf, 30), ids),
        [params, SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True), other],
    )
    assert list(batched[0].outputs[0].token_ids) == list(alone)
    assert list(batched[2].outputs[0].token_ids) != list(alone)
    # Every sampled token is inside CPU's top-k / top-p set of its step.
    ref = hf_log_softmax(hf, ids + list(alone))
    for step, token in enumerate(alone):
        logits = ref[len(ids) - 1 + step] / 0.8
        probs = torch.softmax(logits, -1)
        top = probs.topk(20)
        keep = top.indices[(top.values.cumsum(0) - top.values) < 0.9].tolist()
        assert token in keep, f"step {step}: token {token} not in the top-k/top-p set"


def test_overlong_prompt_is_rejected_and_engine_keeps_serving(llm, hf):
    from vllm.exceptions import VLLMValidationError

    too_long = _prompt_ids(hf, MAX_MODEL_LEN + 5)
    with pytest.raises(VLLMValidationError, match="maximum context length is 128 tokens"):
        llm.generate(token_prompts(too_long), greedy(4))
    ids = _prompt_ids(hf, 9, offset=42)
    assert list(llm.generate(token_prompts(ids), greedy(6))[0].outputs[0].token_ids) == hf_greedy(hf, ids, 6)


def test_the_path_stays_on_device_kernels(llm, hf):
    """In the engine's process every vLLM host kernel refuses neuron tensors (so none ran:
    generation would have failed), and the KV write, paged attention gather and slot mapping
    ran as device ops with no host round trip."""
    import torchneuron

    has = torch._C._dispatch_has_kernel_for_dispatch_key
    host = [n for n in torch._C._dispatch_get_all_op_names()
            if n.startswith("_C::") and has(n, "CompositeImplicitAutograd")]
    assert host and all(has(n, "PrivateUse1") for n in host)
    torchneuron.clear_op_tracking()
    ids = _prompt_ids(hf, 20, offset=9)
    assert list(llm.generate(token_prompts(ids), greedy(4))[0].outputs[0].token_ids) == hf_greedy(hf, ids, 4)
    ran = torchneuron.get_executed_ops()
    for op in ("aten::_index_put_impl_", "aten::index_select", "aten::searchsorted.Tensor"):
        assert op in ran, op
    assert not torchneuron.get_fallback_ops()
