"""Offline generation with vLLM on neuron: an ordinary vLLM script, nothing in it names the device.

    .venv-vllm/bin/python examples/vllm/offline.py          # on neuron (vLLM picks the neuron platform)
    VLLM_TARGET_DEVICE=cpu .venv-vllm/bin/python examples/vllm/offline.py   # vLLM's own CPU platform

It builds a tiny random-weight Llama (GQA, head_dim 64) with a tokenizer trained on
examples/data/corpus.txt, so nothing is downloaded; the text it writes is noise, the point
is where it runs. It runs in vLLM's default compiled mode: the first start compiles the model
(30-60 s on 2 cores), later ones load vLLM's compile cache; pass enforce_eager=True to skip it.
See docs/serving.md (make test-vllm creates .venv-vllm).
"""

import os
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def build_model(path: str) -> str:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    with open(os.path.join(HERE, "..", "data", "corpus.txt")) as f:
        lines = f.read().splitlines()[:2000]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=512, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                         max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(tmp)
        start = time.time()
        llm = LLM(model=model, dtype="float32", max_model_len=256, kv_cache_memory_bytes=32 << 20, seed=0)
        print(f"engine on {current_platform.device_type} in {time.time() - start:.1f} s")
        prompts = ["the quick brown fox", "once upon a time", "streams and events", "hello"]
        start = time.time()
        # Greedy for the first two, seeded sampling for the others.
        params = [SamplingParams(temperature=0, max_tokens=24)] * 2 + [
            SamplingParams(temperature=0.8, top_p=0.9, seed=seed, max_tokens=24) for seed in (1, 2)]
        outputs = llm.generate(prompts, params)
        elapsed = time.time() - start
        for out in outputs:
            print(f"{out.prompt!r} -> {out.outputs[0].text!r}")
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        print(f"{tokens} tokens in {elapsed:.2f} s ({tokens / elapsed:.0f} tokens/s)")


if __name__ == "__main__":
    main()
