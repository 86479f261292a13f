"""vLLM's compiled mode on neuron, against Hugging Face on CPU and against eager.

vLLM's default mode (``VLLM_COMPILE``: Dynamo, its piecewise ``VllmBackend`` split at the
attention op, Inductor generating neuron kernels for the pieces) on the tiny Llama of
``test_offline.py``. The engines compile into a fresh vLLM cache directory, so the compile
really happens; a second engine then loads the program from that cache. Marked ``slow``:
the cold compile takes 25-40 s on the shared 2-core machine (``make test-vllm-slow``).
"""

from __future__ import annotations

import pytest
import torch

from tests.vllm import tiny_models
from tests.vllm.test_offline import _prompt_ids, greedy, hf_greedy, hf_log_softmax, token_prompts

pytestmark = pytest.mark.slow

LENGTHS = [3, 110, 17, 64, 1, 90, 33, 8]  # with 64 batched tokens: prefill chunks and mixed steps
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_models.build(str(tmp_path_factory.mktemp("tiny_llama")))


@pytest.fixture(scope="module")
def hf(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def prompts(hf):
    return [_prompt_ids(hf, n, offset=k) for k, n in enumerate(LENGTHS)]


def _run(model_dir, cache_root, prompts, *, enforce_eager: bool, logprob_prompt=None):
    """One in-process engine: its tokens for `prompts`, the compilation counters, the ops it ran."""
    import vllm.envs
    from vllm import LLM
    from vllm.compilation.counter import compilation_counter

    import torchneuron

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        mp.setenv("VLLM_CACHE_ROOT", cache_root)
        vllm.envs.disable_envs_cache()  # an engine earlier in this process froze the environment
        before = dict(vars(compilation_counter))
        engine = LLM(model=model_dir, enforce_eager=enforce_eager, dtype="float32", seed=0, max_model_len=128,
                     max_num_seqs=8, max_num_batched_tokens=64, kv_cache_memory_bytes=4 << 20)
        try:
            counted = {k: v - before[k] for k, v in vars(compilation_counter).items()}
            torchneuron.clear_op_tracking()
            outs = engine.generate(token_prompts(*prompts), greedy(NEW_TOKENS))
            ran = torchneuron.get_executed_ops()
            logprobs = None
            if logprob_prompt is not None:
                out = engine.generate(token_prompts(logprob_prompt), greedy(1, prompt_logprobs=0))[0]
                logprobs = [next(iter(d.values())).logprob for d in out.prompt_logprobs[1:]]
            mode = engine.llm_engine.vllm_config.compilation_config.mode
        finally:
            engine.llm_engine.engine_core.shutdown()
    return [list(o.outputs[0].token_ids) for o in outs], counted, ran, logprobs, mode


@pytest.fixture(scope="module")
def runs(model_dir, prompts, hf, tmp_path_factory):
    from vllm.config import CompilationMode

    cache_root = str(tmp_path_factory.mktemp("vllm_cache"))
    logprob_prompt = _prompt_ids(hf, 40, offset=3)
    eager = _run(model_dir, cache_root, prompts, enforce_eager=True)
    cold = _run(model_dir, cache_root, prompts, enforce_eager=False, logprob_prompt=logprob_prompt)
    warm = _run(model_dir, cache_root, prompts, enforce_eager=False)
    assert eager[4] == CompilationMode.NONE and cold[4] == warm[4] == CompilationMode.VLLM_COMPILE
    return dict(eager=eager, cold=cold, warm=warm, logprob_prompt=logprob_prompt)


def test_compiled_greedy_tokens_equal_hf_and_eager(runs, prompts, hf):
    eager, cold, warm = runs["eager"][0], runs["cold"][0], runs["warm"][0]
    for k, ids in enumerate(prompts):
        ref = hf_greedy(hf, ids, NEW_TOKENS)
        assert cold[k] == ref, f"compiled, prompt of {len(ids)} tokens"
        assert eager[k] == ref, f"eager, prompt of {len(ids)} tokens"
        assert warm[k] == ref, f"compiled, loaded from vLLM's cache, prompt of {len(ids)} tokens"


def test_compiled_prompt_logprobs_match_cpu(runs, hf):
    ids = runs["logprob_prompt"]
    ref = hf_log_softmax(hf, ids)
    got = runs["cold"][3]
    assert len(got) == len(ids) - 1
    for i, lp in enumerate(got, start=1):
        assert lp == pytest.approx(ref[i - 1, ids[i]].item(), abs=1e-4), f"prompt token {i}"


def test_the_model_ran_as_compiled_neuron_kernels(runs):
    _, cold, _, _, _ = runs["cold"]
    _, warm, _, _, _ = runs["warm"]
    _, _, eager_ops, _, _ = runs["eager"]
    _, _, cold_ops, _, _ = runs["cold"]
    # Compiled by vLLM's backend with Inductor (piecewise: 2 attention layers split the
    # model into 3 pieces), then loaded from its cache by the second engine.
    assert cold["num_graphs_seen"] == 1 and cold["num_piecewise_graphs_seen"] >= 3
    assert cold["num_inductor_compiles"] >= 3 and cold["num_eager_compiles"] == 0
    assert warm["num_compiled_artifacts_loaded"] >= 3 and warm["num_inductor_compiles"] == 0
    # Eager runs RMSNorm and SiLU as ATen ops; compiled, they are fused Inductor kernels
    # (device tasks that the ATen op tracking does not list) around Inductor's extern matmuls.
    for op in ("aten::rsqrt", "aten::silu"):
        assert op in eager_ops, op
        assert op not in cold_ops, op
    assert "aten::mm.out" in cold_ops


def test_the_server_runs_in_compiled_mode(model_dir, hf, tmp_path):
    """``vllm serve`` in vLLM's default (compiled) mode, compiling cold, answers as HF on CPU."""
    from tests.vllm.test_server import CHAT_TEMPLATE, _post, serve

    with open(f"{model_dir}/chat_template.jinja", "w") as f:
        f.write(CHAT_TEMPLATE)
    with open(tmp_path / "server.log", "w+") as log:
        with serve(model_dir, log, env={"VLLM_CACHE_ROOT": str(tmp_path / "vllm_cache")}) as (_, base):
            body = {"model": "tiny", "prompt": "the quick brown fox", "max_tokens": 10, "temperature": 0,
                    "ignore_eos": True, "return_token_ids": True}
            out = _post(base + "/v1/completions", body)["choices"][0]
        log.seek(0)
        text = log.read()
    assert "'mode': <CompilationMode.VLLM_COMPILE: 3>" in text and "Compiling a graph" in text
    assert out["token_ids"] == hf_greedy(hf, out["prompt_token_ids"], 10)
