"""Tiny random-weight decoder models (GQA, head_dim 64) with a locally trained tokenizer: no downloads.

``build(path)`` writes a Llama, ``build(path, family="qwen3")`` a Qwen3 (per-head
q/k RMSNorm), ``family="mixtral"`` a Mixtral (4 experts, top 2). head_dim is 64 because vLLM's CPU attention refuses less (the
neuron backend does not, but the same model then runs on vLLM's CPU platform).
"""

from __future__ import annotations

import os

# Enough text for a byte-level BPE vocabulary of a few hundred tokens.
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a neuron device keeps the weights and the paged key value cache in its own memory",
    "continuous batching runs prompts of different lengths together",
    "prefix caching reuses the blocks of a shared prompt prefix",
    "streams are in order queues and events order them",
    "hello world, this is a small language model with random weights",
    "one two three four five six seven eight nine ten eleven twelve",
] * 20


def build(path: str, *, family: str = "llama", vocab_size: int = 384, seed: int = 0) -> str:
    """Write config, safetensors weights and tokenizer to `path`; return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM,
                              PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM)

    os.makedirs(path, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)

    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM),
                             "mixtral": (MixtralConfig, MixtralForCausalLM)}[family]
    extra = dict(num_local_experts=4, num_experts_per_tok=2) if family == "mixtral" else {}
    config = config_cls(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # GQA
        head_dim=64,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
        initializer_range=0.08,  # peaked logits: greedy choices far from ties
        **extra,
    )
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    model.save_pretrained(path, safe_serialization=True)
    return path
