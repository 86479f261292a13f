"""Moving Hugging Face models between devices: checkpoints saved on neuron
load on CPU and back, ``from_pretrained`` places weights on neuron directly,
and a model split across devices fails like eager, naming the op."""

import pytest
import torch
from transformers import LlamaForCausalLM

from tests.models.zoo import FAMILIES

DEV = "neuron"


def _ids():
    return torch.randint(3, 96, (2, 7), generator=torch.Generator().manual_seed(5))


def test_a_model_split_across_neuron_and_cpu_fails_naming_the_op():
    model = FAMILIES["llama"].build().eval().to(DEV)
    model.lm_head.to("cpu")
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device.*cpu.*neuron:0.*aten::mm"):
        model(_ids().to(DEV))
    # The process and the device are fine afterwards: moving the head back works.
    model.lm_head.to(DEV)
    torch.testing.assert_close(model(_ids().to(DEV)).logits.cpu(),
                               FAMILIES["llama"].build().eval()(_ids()).logits, rtol=1e-4, atol=1e-5)


def test_save_pretrained_on_neuron_loads_on_cpu_and_back(tmp_path):
    trained = FAMILIES["llama"].build().to(DEV)
    with torch.no_grad():                                   # weights no fresh build has
        for p in trained.parameters():
            p.mul_(1.5).add_(0.01)
    trained.save_pretrained(tmp_path / "ckpt")
    on_cpu = LlamaForCausalLM.from_pretrained(tmp_path / "ckpt")
    on_neuron = LlamaForCausalLM.from_pretrained(tmp_path / "ckpt", device_map=DEV)
    assert next(on_neuron.parameters()).device.type == DEV
    for (name, want), got_cpu, got_dev in zip(trained.state_dict().items(), on_cpu.state_dict().values(),
                                              on_neuron.state_dict().values()):
        torch.testing.assert_close(got_cpu, want.cpu(), rtol=0, atol=0, msg=name)
        torch.testing.assert_close(got_dev.cpu(), want.cpu(), rtol=0, atol=0, msg=name)
    on_neuron.eval(), on_cpu.eval()
    torch.testing.assert_close(on_neuron(_ids().to(DEV)).logits.cpu(), on_cpu(_ids()).logits, rtol=1e-4, atol=1e-5)


def test_torch_save_of_a_neuron_state_dict_maps_to_cpu_and_back(tmp_path):
    model = FAMILIES["gpt2"].build().to(DEV)
    torch.save(model.state_dict(), tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", map_location="cpu")
    assert {t.device.type for t in state.values()} == {"cpu"}
    again = FAMILIES["gpt2"].build()
    with torch.no_grad():
        for p in again.parameters():
            p.zero_()
    again.load_state_dict(state)
    again.to(DEV)
    for (name, want), got in zip(model.state_dict().items(), again.state_dict().values()):
        torch.testing.assert_close(got.cpu(), want.cpu(), rtol=0, atol=0, msg=name)
    # GPT-2 ties its head to the embedding; the tie survives the round trip.
    assert again.lm_head.weight is again.transformer.wte.weight
