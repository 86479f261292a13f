"""``transformers.Trainer`` trains on neuron by itself: the script below has
no neuron-specific line, and its losses equal the same script with
``use_cpu=True``. The Hugging Face libraries detect the backend by the import
name ``torch_neuronx`` (see ``torchneuron/_torch_neuronx_name.py``)."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 24
        def __getitem__(self, i):
            ids = torch.randint(3, 96, (12,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    args = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=4, max_steps=6, learning_rate=1e-3,
                             logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True, seed=0,
                             use_cpu=sys.argv[2] == "cpu", bf16=sys.argv[3] == "bf16")
    head_dtypes = set()
    model.lm_head.register_forward_hook(lambda module, inputs, out: head_dtypes.add(str(out.dtype)))
    trainer = Trainer(model=model, args=args, train_dataset=Tokens())
    trainer.train()
    print(json.dumps({"args_device": str(args.device), "model_device": str(next(model.parameters()).device),
                      "accelerator_device": str(trainer.accelerator.device), "head_dtypes": sorted(head_dtypes),
                      "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h]}))
""")


def _train(tmp_path, where, precision="fp32"):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / where), where, precision],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_trainer_picks_neuron_by_itself_and_matches_cpu(tmp_path):
    on_neuron = _train(tmp_path, "default")
    on_cpu = _train(tmp_path, "cpu")
    assert on_neuron["args_device"] == "neuron:0" and on_neuron["accelerator_device"].startswith("neuron")
    assert on_neuron["model_device"] == "neuron:0"
    assert on_cpu["model_device"] == "cpu"
    assert len(on_neuron["losses"]) == 6
    # Trainer logs losses rounded to 4 significant digits.
    torch.testing.assert_close(on_neuron["losses"], on_cpu["losses"], rtol=2e-3, atol=0)


@pytest.mark.slow  # two more Trainer processes
def test_trainer_bf16_autocasts_on_neuron_and_follows_fp32(tmp_path):
    bf16 = _train(tmp_path, "default", "bf16")
    fp32 = _train(tmp_path, "cpu")
    assert bf16["model_device"] == "neuron:0" and bf16["head_dtypes"] == ["torch.bfloat16"]
    assert fp32["head_dtypes"] == ["torch.float32"]
    torch.testing.assert_close(bf16["losses"], fp32["losses"], rtol=2e-2, atol=0)


def test_hugging_face_libraries_detect_the_backend():
    import importlib.util

    import accelerate.utils
    import transformers.utils.import_utils as hf

    assert importlib.util.find_spec("torch_neuronx") is not None
    assert accelerate.utils.is_neuron_available() and hf.is_torch_neuron_available()
    # The stand-in says what it is rather than failing obscurely.
    import torch_neuronx
    with pytest.raises(AttributeError, match="stand-in.*use torch.neuron or torchneuron"):
        torch_neuronx.trace
