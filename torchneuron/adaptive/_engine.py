"""Compiling hot segments in the background and loading their programs.

The runtime calls ``submit(desc)`` when a segment turns hot and ``load(key,
desc)`` when its program is ready (``csrc/adaptive/Engine.cpp``).

Compiling takes seconds and holds the GIL for all of it, so it does not run
in this process: a child process (``_worker.py``) compiles each graph with
Inductor, which leaves the result in Inductor's on-disk FX graph cache, and
records the key in the segment index. Loading is then Inductor's cache hit
(milliseconds). The index outlives the process, so the next process loads a
segment it has seen compiled as soon as the segment turns hot.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import struct
import subprocess
import sys
import threading
import time

import torch

from torchneuron import _C

from torchneuron.compile.build_id import build_id

from . import _graph


@functools.cache
def _segment_overrides() -> dict:
    """Inductor settings every segment program is compiled with.

    Kernels use the intra-op threads of the device worker that runs them, as eager's
    kernels do. (One thread each, tried first, made a d=128 GPT step's fused program
    slower than eager: `docs/performance.md`.)
    """
    threads = _C._config()["worker_threads"] or torch.get_num_threads()
    return {"cpp.threads": threads, "fx_graph_cache": True}


def compiler_settings() -> dict:
    """The Inductor config of a segment's program: this process's own (its portable
    part, which a user may have changed) with the segment overrides on top.

    The compiling child applies exactly these, because the config is part of
    Inductor's cache key: the parent's load is then a cache hit, not a second
    compile in this process. They also name the segment on disk.
    """
    return {**torch._inductor.config.save_config_portable(), **_segment_overrides()}


def cache_dir() -> str:
    root = os.environ.get("TORCHNEURON_ADAPTIVE_CACHE_DIR")
    if not root:
        from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

        root = os.path.join(inductor_cache_dir(), "neuron_adaptive")
    os.makedirs(root, exist_ok=True)
    return root


def _index_path(key: str) -> str:
    return os.path.join(cache_dir(), key + ".json")


def read_index(key: str) -> dict | None:
    try:
        with open(_index_path(key)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_index(key: str, entry: dict) -> None:
    path = _index_path(key)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(entry, f)
    os.replace(tmp, path)  # atomic: a reader never sees half an entry


def compile_segment(desc: dict, settings: dict):
    """Inductor's compile of a segment's graph, for the neuron device, with the
    Inductor config `settings` (``compiler_settings()``)."""
    from torch._inductor.compile_fx import compile_fx
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from torchneuron import compile as neuron_compile

    neuron_compile.register()
    gm = _graph.build(desc)
    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    fakes = _graph.example_inputs(desc, fake_mode)
    # A tracing context with the fake mode: without it Inductor bypasses its
    # FX graph cache, and the parent could not load what the child compiled.
    with torch._guards.tracing(torch._guards.TracingContext(fake_mode)), \
            torch._inductor.config.patch(settings), torch.no_grad():
        return compile_fx(gm, fakes)


def _program(compiled):
    # compile_fx's callable takes the tensors as arguments (its _boxed_call
    # attribute is copied from the inner function it wraps).
    return lambda tensors: compiled(*tensors)


def _send(pipe, message) -> None:
    data = pickle.dumps(message)
    pipe.write(struct.pack("<Q", len(data)) + data)
    pipe.flush()


def _receive(pipe):
    header = pipe.read(8)
    if len(header) < 8:
        return None
    (size,) = struct.unpack("<Q", header)
    return pickle.loads(pipe.read(size))


class Engine:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None
        self._waiting: set[str] = set()  # keys sent to the child, not answered yet

    # ---- called by the runtime (with the GIL) --------------------------------

    def submit(self, desc: dict) -> tuple[str, str, str]:
        """A segment turned hot: (key, "ready" | "compiling" | "failed", reason)."""
        settings = compiler_settings()
        key = _graph.key_of(desc, (torch.__version__, build_id(), sorted(settings.items())))
        entry = read_index(key)
        if entry is not None:
            return (key, "ready", "") if entry["ok"] else (key, "failed", entry["reason"])
        try:
            _graph.build(desc)  # refuse what cannot become a graph without bothering the child
        except _graph.Unsupported as error:
            return key, "failed", str(error)
        with self._lock:
            child = self._ensure_child()
            self._waiting.add(key)
            _hot, _max_ops, _idle_ms, time_limit = _C._adaptive_settings()
            _send(child.stdin, (key, desc, settings, time_limit))
        return key, "compiling", ""

    def load(self, key: str, desc: dict):
        """The segment's program, from the compile cache the child filled."""
        return _program(compile_segment(desc, compiler_settings()))

    # ---- the compiling child ---------------------------------------------------

    def _ensure_child(self) -> subprocess.Popen:
        if self._child is not None and self._child.poll() is None:
            return self._child
        env = dict(os.environ, TORCHNEURON_ADAPTIVE_EAGER="0")
        self._child = subprocess.Popen([sys.executable, "-m", "torchneuron.adaptive._worker"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        threading.Thread(target=self._read_answers, args=(self._child,), daemon=True,
                         name="torchneuron-adaptive-compiles").start()
        return self._child

    def _read_answers(self, child: subprocess.Popen) -> None:
        while True:
            try:
                answer = _receive(child.stdout)
            except Exception:
                answer = None
            if answer is None:  # the child exited: what it had not answered failed
                with self._lock:
                    lost, self._waiting = self._waiting, set()
                for key in lost:
                    _C._adaptive_compile_done(key, False, 0.0, f"the compiler process exited with {child.wait()}")
                return
            key, ok, seconds, reason = answer
            with self._lock:
                self._waiting.discard(key)
            _C._adaptive_compile_done(key, ok, seconds, reason)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Waits until every submitted segment is answered (tests, benchmarks)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if not self._waiting:
                    return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)
