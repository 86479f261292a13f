"""Tiny Hugging Face models built in code: random weights, a few layers, small
widths, no hub access. One entry per model family; each knows how to build
the model, make a batch and compute a training loss.

Every builder seeds the global generator first, so the same entry builds the
same weights on every call (the CPU reference and the neuron copy start equal).
"""

from dataclasses import dataclass, field
from typing import Callable

import torch

VOCAB = 96
SEQ = 12
BATCH = 2


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable[[], torch.nn.Module]
    batch: Callable[[], dict]                 # CPU tensors; a fresh batch per call
    loss: Callable[[torch.nn.Module, dict], torch.Tensor] = None
    causal_lm: bool = False                   # has generate() with a KV cache
    compiled: bool = False                    # in the compiled parity tier
    tags: tuple = field(default_factory=tuple)

    def training_loss(self, model, batch):
        if self.loss is not None:
            return self.loss(model, batch)
        return model(**batch).loss


def to_device(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj


def _ids(vocab=VOCAB, seq=SEQ, batch=BATCH):
    return torch.randint(3, vocab, (batch, seq))


def _lm_batch():
    ids = _ids()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def _seeded(build):
    def seeded():
        torch.manual_seed(0)
        return build().float()
    return seeded


def _decoder(config_cls, model_cls, **extra):
    def build():
        cfg = config_cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2, **extra)
        return model_cls(cfg)
    return _seeded(build)


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    return _decoder(LlamaConfig, LlamaForCausalLM)()


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM
    return _decoder(Qwen3Config, Qwen3ForCausalLM, head_dim=8)()


def _mistral():
    from transformers import MistralConfig, MistralForCausalLM
    return _decoder(MistralConfig, MistralForCausalLM, sliding_window=8)()


def _mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM
    return _decoder(MixtralConfig, MixtralForCausalLM, num_local_experts=4, num_experts_per_tok=2)()


def _gemma():
    from transformers import GemmaConfig, GemmaForCausalLM
    return _decoder(GemmaConfig, GemmaForCausalLM, head_dim=8)()


def _phi():
    from transformers import PhiConfig, PhiForCausalLM
    return _decoder(PhiConfig, PhiForCausalLM)()


@_seeded
def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0))


@_seeded
def _mamba():
    from transformers import MambaConfig, MambaForCausalLM
    return MambaForCausalLM(MambaConfig(vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2,
                                        expand=2, conv_kernel=4, pad_token_id=0, bos_token_id=1, eos_token_id=2))


@_seeded
def _bert():
    from transformers import BertConfig, BertForMaskedLM
    return BertForMaskedLM(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, max_position_embeddings=64))


def _bert_batch():
    ids = _ids()
    labels = torch.full_like(ids, -100)
    labels[:, ::3] = ids[:, ::3]                 # a third of the positions are predicted
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


@_seeded
def _t5():
    from transformers import T5Config, T5ForConditionalGeneration
    return T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                               num_decoder_layers=2, num_heads=4, decoder_start_token_id=0,
                                               pad_token_id=0, eos_token_id=2))


def _t5_batch():
    return {"input_ids": _ids(), "labels": _ids(seq=6)}


@_seeded
def _vit():
    from transformers import ViTConfig, ViTForImageClassification
    return ViTForImageClassification(ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                               intermediate_size=64, image_size=16, patch_size=4, num_labels=5))


def _vit_batch():
    return {"pixel_values": torch.randn(BATCH, 3, 16, 16), "labels": torch.randint(0, 5, (BATCH,))}


@_seeded
def _clip():
    from transformers import CLIPConfig, CLIPModel
    text = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 32, "projection_dim": 16}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "image_size": 16, "patch_size": 4, "projection_dim": 16}
    return CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))


def _clip_batch():
    ids = _ids()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "pixel_values": torch.randn(BATCH, 3, 16, 16), "return_loss": True}


@_seeded
def _whisper():
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    return WhisperForConditionalGeneration(WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_source_positions=16, max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1, suppress_tokens=None, begin_suppress_tokens=None))


def _whisper_batch():
    # max_source_positions 16 frames after the encoder's stride-2 convolution.
    return {"input_features": torch.randn(BATCH, 8, 32), "labels": _ids(seq=6)}


@_seeded
def _llava():
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              image_size=16, patch_size=4)
    text = LlamaConfig(vocab_size=VOCAB + 1, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlavaForConditionalGeneration(LlavaConfig(vision_config=vision, text_config=text, image_token_id=VOCAB,
                                                     vision_feature_layer=-1, vision_feature_select_strategy="default"))


def _llava_batch():
    # 16 patches of a 16×16 image fill 16 image-token positions before the text.
    ids = torch.cat([torch.full((BATCH, 16), VOCAB), _ids()], dim=1)
    labels = ids.clone()
    labels[:, :16] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "pixel_values": torch.randn(BATCH, 3, 16, 16), "labels": labels}


@_seeded
def _unet():
    from diffusers import UNet2DModel
    return UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
                       block_out_channels=(16, 32), norm_num_groups=8,
                       down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"))


def _unet_batch():
    return {"clean": torch.randn(BATCH, 3, 8, 8), "noise": torch.randn(BATCH, 3, 8, 8),
            "timesteps": torch.randint(0, 1000, (BATCH,))}


def ddpm_scheduler():
    from diffusers import DDPMScheduler
    return DDPMScheduler(num_train_timesteps=1000)


def _unet_loss(model, batch):
    """The DDPM training objective: predict the noise added at a timestep."""
    noisy = ddpm_scheduler().add_noise(batch["clean"], batch["noise"], batch["timesteps"])
    pred = model(noisy, batch["timesteps"]).sample
    return torch.nn.functional.mse_loss(pred, batch["noise"])


FAMILIES = {f.name: f for f in [
    Family("llama", _llama, _lm_batch, causal_lm=True, compiled=True),
    Family("qwen3", _qwen3, _lm_batch, causal_lm=True, compiled=True),
    Family("mistral", _mistral, _lm_batch, causal_lm=True, compiled=True),
    Family("mixtral", _mixtral, _lm_batch, causal_lm=True, compiled=True, tags=("moe",)),
    Family("gemma", _gemma, _lm_batch, causal_lm=True, compiled=True),
    Family("phi", _phi, _lm_batch, causal_lm=True, compiled=True),
    Family("gpt2", _gpt2, _lm_batch, causal_lm=True, compiled=True),
    Family("bert", _bert, _bert_batch, tags=("masked LM",)),
    Family("t5", _t5, _t5_batch, tags=("encoder-decoder",)),
    Family("vit", _vit, _vit_batch, compiled=True, tags=("vision",)),
    Family("clip", _clip, _clip_batch, tags=("multimodal",)),
    Family("whisper", _whisper, _whisper_batch, tags=("speech", "encoder-decoder")),
    Family("llava", _llava, _llava_batch, tags=("vision-language",)),
    Family("mamba", _mamba, _lm_batch, causal_lm=True, tags=("state-space",)),
    Family("unet2d", _unet, _unet_batch, loss=_unet_loss, tags=("diffusion",)),
]}
