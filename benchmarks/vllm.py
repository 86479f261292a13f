"""vLLM serving on neuron against vLLM's own CPU platform: throughput and latency.

Run it with the serving environment's Python (vLLM lives there, see docs/serving.md):

    .venv-vllm/bin/python benchmarks/vllm.py                 # default: a few minutes
    .venv-vllm/bin/python benchmarks/vllm.py --prompts 64 --max-tokens 128 --rounds 7 --requests 8

The model is the tiny random-weight Llama of the serving tests (tests/vllm/tiny_models.py:
hidden 128, 2 layers, GQA 4/2 heads, head_dim 64, float32), built locally: no downloads.

Cases (one JSON line each, ``ratio`` > 1 means neuron is better):

* ``offline_throughput``: ``LLM.generate`` of the same batch of prompts (token ids, lengths
  spread over a range, ``ignore_eos`` so every prompt yields exactly ``--max-tokens``), output
  tokens/s. Each platform needs its own engine (vLLM picks its platform once per process), so
  each runs in a subprocess that keeps its engine and generates on request; the parent
  alternates the two (warm-up rounds first) and reports the medians. With ``--compiled`` a
  third engine runs neuron in vLLM's compiled mode (its default: Dynamo, piecewise Inductor
  generating neuron kernels; the other two are ``enforce_eager``), and two more rows compare it
  with vLLM CPU and with neuron eager (``offline_throughput_compiled*``). Its compile is part
  of its start-up, printed to stderr, not measured. With ``--sync`` another neuron engine runs
  with ``async_scheduling=False`` (vLLM's default, which the other engines use, is on), and a
  row compares the two (``offline_throughput_*_async_vs_sync``).
* ``server_ttft`` / ``server_itl``: the OpenAI server (``python -m torchneuron.vllm serve``,
  vLLM's ``vllm serve``), one streamed
  ``/v1/completions`` request at a time (prompts unique per round: no prefix-cache hits),
  client-side: time to the first streamed token, and inter-token
  latency (time from the first to the last token over the tokens after the first). Both servers
  are up together and requests alternate between them; ``--no-cpu-server`` measures neuron alone
  (the row then has no baseline and ``ratio`` null).

Engine and server start-up are not measured (printed to stderr). The CPU platform is selected
with ``VLLM_TARGET_DEVICE=cpu`` and ``TORCHNEURON_VLLM=0``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# This file is named vllm.py: its directory must not shadow the vllm package (here, in the
# worker subprocesses and in the processes vLLM spawns, which inherit sys.path).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))
from benchmarks._common import report  # noqa: E402

MARK = "@@bench "  # the worker's result lines; vLLM logs to the same stdout
PLATFORMS = ("neuron", "cpu")


def platform_env(platform: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if platform == "cpu":
        env.update(VLLM_TARGET_DEVICE="cpu", TORCHNEURON_VLLM="0")
    else:
        env.pop("VLLM_TARGET_DEVICE", None)
        env.pop("TORCHNEURON_VLLM", None)
    return env


def prompt_ids(n: int, shortest: int, longest: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    lengths = [shortest + (longest - shortest) * i // max(n - 1, 1) for i in range(n)]
    return [[rng.randrange(3, vocab) for _ in range(length)] for length in lengths]


# --- offline: a worker process per platform ---------------------------------------------------

def worker_main(args) -> None:
    """Build one engine, then generate the batch once per line read on stdin."""
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    start = time.perf_counter()
    llm = LLM(model=args.model, dtype="float32", seed=0, max_model_len=args.max_model_len,
              max_num_seqs=args.prompts, kv_cache_memory_bytes=args.kv_cache_mib << 20,
              enforce_eager=not args.compiled_worker, async_scheduling=not args.sync_worker)
    with open(os.path.join(args.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    prompts = [{"prompt_token_ids": ids}
               for ids in prompt_ids(args.prompts, args.shortest, args.longest, vocab)]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    config = llm.llm_engine.vllm_config
    print(MARK + json.dumps({"ready": current_platform.device_type,
                             "mode": config.compilation_config.mode.name,
                             "async": bool(config.scheduler_config.async_scheduling),
                             "start_s": time.perf_counter() - start}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        print(MARK + json.dumps({"tokens": tokens, "seconds": elapsed}), flush=True)


class Worker:
    def __init__(self, platform: str, args, model: str, log_dir: str, compiled: bool = False, sync: bool = False):
        self.platform = platform
        self.compiled = compiled
        self.sync = sync
        self.name = platform + ("_compiled" if compiled else "") + ("_sync" if sync else "")
        self.log = open(os.path.join(log_dir, f"offline_{self.name}.log"), "w")
        cmd = [sys.executable, __file__, "--_worker", "--model", model]
        cmd += (["--_compiled"] if compiled else []) + (["--_sync"] if sync else [])
        for name in ("prompts", "shortest", "longest", "max_tokens", "max_model_len", "kv_cache_mib"):
            cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, env=platform_env(platform), start_new_session=True)

    def _reply(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
            self.log.write(line)
        self.log.flush()
        raise RuntimeError(f"offline worker on {self.platform} exited ({self.proc.wait()}); see {self.log.name}")

    def ready(self) -> dict:
        reply = self._reply()
        if reply["ready"] != self.platform:
            raise RuntimeError(f"worker meant for {self.platform} runs on {reply['ready']}")
        if (reply["mode"] != "NONE") != self.compiled:
            raise RuntimeError(f"worker {self.name} runs in compilation mode {reply['mode']}")
        # vLLM's CPU platform turns async scheduling off itself; neuron keeps vLLM's default.
        if self.platform == "neuron" and reply["async"] == self.sync:
            raise RuntimeError(f"worker {self.name} runs with async_scheduling={reply['async']}")
        return reply

    def run(self) -> float:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        reply = self._reply()
        return reply["tokens"] / reply["seconds"]

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(60)
        except Exception:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.log.close()


def offline(args, model: str, log_dir: str) -> list[dict]:
    engines = [Worker(p, args, model, log_dir) for p in PLATFORMS]  # all start at once
    if args.compiled:
        engines.append(Worker("neuron", args, model, log_dir, compiled=True))
    if args.sync:
        engines.append(Worker("neuron", args, model, log_dir, sync=True))
    workers = {w.name: w for w in engines}
    try:
        for name, w in workers.items():
            print(f"offline engine {name}: {w.ready()['start_s']:.1f} s to start", file=sys.stderr)
        samples = {name: [] for name in workers}
        for i in range(args.warmup + args.rounds):
            # Rotate which engine goes first, so none always runs right after the same other.
            order = list(workers)[i % len(workers):] + list(workers)[:i % len(workers)]
            for name in order:
                value = workers[name].run()
                if i >= args.warmup:
                    samples[name].append(value)
    finally:
        for w in workers.values():
            w.close()
    med = {name: statistics.median(v) for name, v in samples.items()}
    case = f"offline_throughput_{args.prompts}x{args.max_tokens}"
    extra = dict(rounds={name: [round(x, 1) for x in v] for name, v in samples.items()},
                 prompt_tokens=f"{args.shortest}-{args.longest}")
    rows = [report("vllm", case, "output_tokens_per_s", med["neuron"], "vllm_cpu_platform", med["cpu"],
                   higher_is_better=True, **extra)]
    if args.compiled:
        rows.append(report("vllm", case + "_compiled", "output_tokens_per_s", med["neuron_compiled"],
                           "vllm_cpu_platform", med["cpu"], higher_is_better=True, **extra))
        rows.append(report("vllm", case + "_compiled_vs_eager", "output_tokens_per_s", med["neuron_compiled"],
                           "neuron_eager", med["neuron"], higher_is_better=True, **extra))
    if args.sync:
        rows.append(report("vllm", case + "_async_vs_sync", "output_tokens_per_s", med["neuron"],
                           "neuron_sync_scheduling", med["neuron_sync"], higher_is_better=True, **extra))
    return rows


# --- server ------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, platform: str, args, model: str, log_dir: str):
        self.platform = platform
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(log_dir, f"server_{platform}.log"), "w+")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchneuron.vllm", "serve", model,
             "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", str(args.max_model_len),
             "--kv-cache-memory-bytes", str(args.kv_cache_mib << 20), "--enforce-eager",
             "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT, env=platform_env(platform), start_new_session=True)

    def wait_ready(self, timeout: float = 600) -> float:
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{self.platform} server exited ({self.proc.returncode}):\n"
                                   + self.log.read()[-3000:])
            try:
                urllib.request.urlopen(self.base + "/v1/models", timeout=5)
                return time.perf_counter() - self.started
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError(f"{self.platform} server not up in {timeout} s")
                time.sleep(1)

    def request(self, ids: list[int], max_tokens: int) -> tuple[float, float]:
        """One streamed completion: (time to first token, inter-token latency), seconds."""
        body = {"model": "tiny", "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        req = urllib.request.Request(self.base + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        t0 = time.perf_counter()
        first = last = None
        tokens = None
        with urllib.request.urlopen(req, timeout=300) as resp:
            for line in resp:
                line = line.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: "):])
                if event.get("choices"):
                    now = time.perf_counter()
                    first = first if first is not None else now
                    last = now
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
        if first is None or tokens != max_tokens:
            raise RuntimeError(f"{self.platform} server streamed {tokens} tokens, expected {max_tokens}")
        return first - t0, (last - first) / (tokens - 1)

    def metrics(self) -> dict[str, float]:
        """The server's own latency histograms (Prometheus ``/metrics``): name -> sum or count."""
        names = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds")
        totals = {f"{n}_{part}": 0.0 for n in names for part in ("sum", "count")}
        with urllib.request.urlopen(self.base + "/metrics", timeout=30) as resp:
            for line in resp.read().decode().splitlines():
                key = line.split("{")[0].split(" ")[0]
                if key in totals:
                    totals[key] += float(line.rsplit(" ", 1)[1])
        return totals

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self.log.close()


def server(args, model: str, log_dir: str) -> list[dict]:
    platforms = PLATFORMS if args.cpu_server else ("neuron",)
    servers = {p: Server(p, args, model, log_dir) for p in platforms}
    try:
        for p, s in servers.items():
            print(f"server on {p}: {s.wait_ready():.1f} s to start", file=sys.stderr)
        with open(os.path.join(model, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        prompts = prompt_ids(args.requests, args.shortest, args.longest, vocab)
        ttft = {p: [] for p in platforms}
        itl = {p: [] for p in platforms}
        before = {}
        for i in range(args.warmup + args.rounds):
            if i == args.warmup:
                before = {p: servers[p].metrics() for p in platforms}
            for j, ids in enumerate(prompts):
                # A first token of its own per round, so no round hits the prefix cache of an
                # earlier one (the time to first token includes the whole prefill).
                ids = [3 + (i * len(prompts) + j) % (vocab - 3)] + ids[1:]
                order = platforms if (i + j) % 2 == 0 else platforms[::-1]
                for p in order:
                    first, gap = servers[p].request(ids, args.server_tokens)
                    if i >= args.warmup:
                        ttft[p].append(first)
                        itl[p].append(gap)
        after = {p: servers[p].metrics() for p in platforms}
    finally:
        for s in servers.values():
            s.close()

    def server_mean_ms(p: str, name: str) -> float | None:
        count = after[p][name + "_count"] - before[p][name + "_count"]
        return round((after[p][name + "_sum"] - before[p][name + "_sum"]) / count * 1e3, 3) if count else None

    rows = []
    for case, samples, name in (("server_ttft", ttft, "vllm:time_to_first_token_seconds"),
                                ("server_itl", itl, "vllm:inter_token_latency_seconds")):
        med = {p: statistics.median(v) * 1e3 for p, v in samples.items()}
        # Client-side medians are the figures; the servers' own means (their histograms, measured
        # in the engine, free of the client's scheduling on a loaded machine) for comparison.
        extra = dict(requests=len(samples["neuron"]), tokens_per_request=args.server_tokens,
                     range_ms={p: [round(min(v) * 1e3, 2), round(max(v) * 1e3, 2)] for p, v in samples.items()},
                     server_side_mean_ms={p: server_mean_ms(p, name) for p in platforms})
        if "cpu" in med:
            rows.append(report("vllm", case, "ms", med["neuron"], "vllm_cpu_platform", med["cpu"],
                               higher_is_better=False, **extra))
        else:
            row = {"bench": "vllm", "case": case, "metric": "ms", "value": round(med["neuron"], 4),
                   "baseline": None, "baseline_value": None, "ratio": None, "higher_is_better": False, **extra}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16, help="offline batch size")
    parser.add_argument("--shortest", type=int, default=16, help="prompt tokens, shortest")
    parser.add_argument("--longest", type=int, default=76, help="prompt tokens, longest")
    parser.add_argument("--max-tokens", type=int, default=64, help="offline output tokens per prompt")
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument("--kv-cache-mib", type=int, default=32, help="KV cache per engine (both platforms)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1, help="warm-up rounds before the measured ones")
    parser.add_argument("--requests", type=int, default=3, help="server: streamed requests per round")
    parser.add_argument("--server-tokens", type=int, default=32, help="server: output tokens per request")
    parser.add_argument("--no-cpu-server", dest="cpu_server", action="store_false",
                        help="server: measure neuron only (saves a CPU server start, about a minute)")
    parser.add_argument("--cases", default="offline,server", help="comma-separated: offline, server")
    parser.add_argument("--compiled", action="store_true",
                        help="offline: another engine, neuron in vLLM's compiled mode")
    parser.add_argument("--sync", action="store_true",
                        help="offline: another engine, neuron eager without async scheduling")
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--_compiled", dest="compiled_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_sync", dest="sync_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._worker:
        worker_main(args)
        return []

    from tests.vllm import tiny_models

    cases = set(args.cases.split(","))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_vllm_") as tmp:
        model = tiny_models.build(os.path.join(tmp, "tiny_llama"))
        log_dir = os.path.join(tmp, "logs")
        os.makedirs(log_dir)
        try:
            if "offline" in cases:
                rows += offline(args, model, log_dir)
            if "server" in cases:
                rows += server(args, model, log_dir)
        except Exception:
            keep = tempfile.mkdtemp(prefix="bench_vllm_logs_")
            for name in os.listdir(log_dir):
                os.replace(os.path.join(log_dir, name), os.path.join(keep, name))
            print(f"logs kept in {keep}", file=sys.stderr)
            raise
    return rows


if __name__ == "__main__":
    main()
