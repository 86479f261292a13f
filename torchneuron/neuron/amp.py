"""Mixed precision support facts for ``torch.autocast("neuron")``."""

import torch


def get_amp_supported_dtype() -> list[torch.dtype]:
    # NeuronCores compute natively in bf16 and fp16 (and fp32 accumulation).
    return [torch.bfloat16, torch.float16, torch.float32]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True
