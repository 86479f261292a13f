"""examples/hf/finetune_gpt2.py runs end to end on neuron (a short run; slow
tier: it trains a tokenizer and imports transformers in a fresh process)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf" / "finetune_gpt2.py"


@pytest.mark.slow
def test_finetune_example_trains_on_neuron_and_generates(tmp_path):
    done = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "30", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["device"] == "neuron:0"
    assert summary["last_loss"] < summary["first_loss"] - 0.5, summary
    assert summary["sample"].startswith("Return a new") and len(summary["sample"]) > len("Return a new") + 10
