"""bfloat16 with Hugging Face models on neuron: autocast training follows the
fp32 run within bfloat16's tolerance, and models loaded in bfloat16 run and
agree with the same bfloat16 model on CPU."""

import torch
from transformers import LlamaForCausalLM

from tests.models.zoo import FAMILIES, to_device

DEV = "neuron"


def test_bf16_autocast_training_follows_fp32():
    family = FAMILIES["llama"]
    torch.manual_seed(1)
    batches = [to_device(family.batch(), DEV) for _ in range(6)]
    losses = {}
    for precision in ("fp32", "bf16"):
        model = family.build().to(DEV).eval()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses[precision] = []
        for batch in batches:
            with torch.autocast(DEV, dtype=torch.bfloat16, enabled=precision == "bf16"):
                out = model(**batch)
            assert out.logits.dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
            opt.zero_grad()
            out.loss.backward()
            assert model.lm_head.weight.grad.dtype == torch.float32      # master weights stay fp32
            opt.step()
            losses[precision].append(out.loss.item())
    assert losses["fp32"][-1] < losses["fp32"][0]                         # it is learning
    torch.testing.assert_close(losses["bf16"], losses["fp32"], rtol=2e-2, atol=0)
    assert losses["bf16"] != losses["fp32"]                               # autocast did change the arithmetic


def test_models_loaded_in_bfloat16_run_and_match_cpu(tmp_path):
    FAMILIES["llama"].build().save_pretrained(tmp_path / "ckpt")
    on_cpu = LlamaForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.bfloat16).eval()
    on_neuron = LlamaForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.bfloat16, device_map=DEV).eval()
    assert {p.dtype for p in on_neuron.parameters()} == {torch.bfloat16}
    ids = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want, got = on_cpu(ids).logits, on_neuron(ids.to(DEV)).logits
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu(), want, rtol=1.6e-2, atol=1e-2)
    tokens = on_neuron.generate(ids[:, :4].to(DEV), max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert tokens.shape == (2, 9) and tokens.device.type == DEV
