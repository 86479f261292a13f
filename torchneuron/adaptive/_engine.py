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
import signal
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


def warm_up_segment() -> dict:
    """A one-op segment (x + x) that the compiler compiles when it starts and the
    program then loads: both pay their first compile's and load's imports before
    any real segment needs them."""
    return {"device": 0, "inputs": [(torch.float32, (8,), (1,), 0, 8)], "lifted": [],
            "values": [(torch.float32, (8,), (1,), 0)], "live": [0],
            "ops": [("aten::add", "Tensor", [("tensor", ("input", 0, None)), ("tensor", ("input", 0, None)),
                                             ("constant", 1)], [[0]])]}


def segment_key(desc: dict, settings: dict) -> str:
    """A segment's name on disk: its structure, the compiler settings and the build."""
    return _graph.key_of(desc, (torch.__version__, build_id(), sorted(settings.items())))


def _warm_load() -> None:
    try:
        compile_segment(warm_up_segment(), compiler_settings())
    except Exception:  # a warm-up only
        pass


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


def cost_units(desc: dict) -> float:
    """A segment's compile cost in units of about one op's: one per op, plus a
    quarter per tensor beyond the first of an op's longest tensor list
    (``_foreach_``: Inductor generates code for every tensor, in kernels it
    combines). Measured here (``docs/performance.md``, a d=64 GPT step): 64-op
    pieces of the forward and backward took 95-138 s, the 28-op piece with the
    optimizer's foreach ops over 50 parameters (380 units) 151 s, under load."""
    units = 0.0
    for _name, _overload, args, _returns in desc["ops"]:
        units += 1 + max([0] + [len(payload) - 1 for kind, payload in args if kind == "list"]) / 4
    return units


class Engine:
    """Queues hot segments for the compiling child, best first, and keeps each
    segment's timeline (``timeline()``, in ``get_adaptive_metrics()["timeline"]``).

    The child compiles one segment at a time. The next one is the segment that
    saves the most device launches per estimated compile second (launches saved
    per occurrence: its ops less the one fused task; compile seconds:
    ``FIXED_SECONDS + per_unit * cost_units``, with ``per_unit`` learnt from the
    compiles so far): small segments first, and among segments of equal
    compile cost, the longest. An optimizer's step over many parameters costs
    units per parameter, so it is not "small" to compile.
    """

    FIXED_SECONDS = 3.0  # a compile's cost whatever its size (tracing, AOTAutograd, loading the module)
    PER_UNIT_SECONDS = 0.5  # the starting estimate (a 220-op GPT step, 360 units: 90 s on 2 quiet cores)
    # The segments of one step turn hot within about a step of each other: the first
    # waits this long in the queue, so that the best of them is compiled first.
    GATHER_SECONDS = 1.0

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._child: subprocess.Popen | None = None
        self._waiting: set[str] = set()  # keys queued or compiling, not answered yet
        self._queue: list[tuple[str, tuple, float]] = []  # (key, request, queued at)
        self._compiling: str | None = None
        self._per_unit = self.PER_UNIT_SECONDS
        self._timeline: dict[str, dict] = {}
        self._epoch = time.monotonic()
        self._dispatcher: threading.Thread | None = None
        # How the next compiler process yields to this one (None: the worker's PRIORITY;
        # benchmarks/adaptive.py --impact sets others), and when the current one became warm.
        self.priority: dict | None = None
        self.warm_at: float | None = None
        self._warm_loading = False

    # ---- called by the runtime (with the GIL) --------------------------------

    def submit(self, desc: dict) -> tuple[str, str, str]:
        """A segment turned hot: (key, "ready" | "compiling" | "failed", reason)."""
        hot_at = time.monotonic()
        settings = compiler_settings()
        key = segment_key(desc, settings)
        ops, units = len(desc["ops"]), cost_units(desc)
        record = {"key": key, "ops": ops, "cost_units": round(units, 2), "hot_at": round(hot_at - self._epoch, 3),
                  "source": "compiler", "estimated_seconds": None, "queued_seconds": None,
                  "compile_seconds": None, "hot_to_ready_seconds": None, "load_seconds": None,
                  "hot_to_first_replay_seconds": None, "order": None, "failure": None}
        with self._lock:
            self._timeline[key] = record
        entry = read_index(key)
        if entry is not None:
            record["source"] = "disk cache"
            if entry["ok"]:
                record["hot_to_ready_seconds"] = 0.0
                return key, "ready", ""
            record["failure"] = entry["reason"]
            return key, "failed", entry["reason"]
        try:
            _graph.build(desc)  # refuse what cannot become a graph without bothering the child
        except _graph.Unsupported as error:
            record["failure"] = str(error)
            return key, "failed", str(error)
        with self._lock:
            record["estimated_seconds"] = round(self._estimate(units), 1)
            self._ensure_child()
            self._waiting.add(key)
            _hot, _max_ops, _idle_ms, time_limit = _C._adaptive_settings()
            self._queue.append((key, (key, desc, settings, time_limit), hot_at))
            self._lock.notify_all()
        return key, "compiling", ""

    def load(self, key: str, desc: dict):
        """The segment's program, from the compile cache the child filled."""
        start = time.monotonic()
        program = _program(compile_segment(desc, compiler_settings()))
        end = time.monotonic()
        with self._lock:
            record = self._timeline.get(key)
            if record is not None and record["hot_to_first_replay_seconds"] is None:
                record["load_seconds"] = round(end - start, 3)
                record["hot_to_first_replay_seconds"] = round(end - self._epoch - record["hot_at"], 3)
        return program

    # ---- statistics ------------------------------------------------------------------

    def timeline(self) -> list[dict]:
        """Per hot segment, in the order they turned hot: its key, ``ops``,
        ``cost_units``; ``source`` ("compiler" or "disk cache"); ``hot_at`` (seconds
        since the engine started or was reset); ``estimated_seconds``, ``order`` (its
        place in the compile order), ``queued_seconds``, ``compile_seconds`` (the
        child's), ``hot_to_ready_seconds``; ``load_seconds`` and
        ``hot_to_first_replay_seconds`` (None until its first replay: the occurrence
        after the compile loads the program and replays it); ``failure``."""
        with self._lock:
            return [dict(r) for r in sorted(self._timeline.values(), key=lambda r: r["hot_at"])]

    def reset_timeline(self) -> None:
        with self._lock:
            self._timeline = {k: r for k, r in self._timeline.items() if k in self._waiting}
            self._epoch = time.monotonic()
            for r in self._timeline.values():  # still queued or compiling: times from now on
                r["hot_at"] = 0.0

    def _estimate(self, units: int) -> float:
        return self.FIXED_SECONDS + self._per_unit * units

    def _priority(self, request: tuple) -> float:
        """Launches saved per occurrence per estimated compile second."""
        record = self._timeline[request[0]]
        return (record["ops"] - 1) / self._estimate(record["cost_units"])

    # ---- the compiling child ---------------------------------------------------

    def prestart(self) -> None:
        """Starts the compiler process ahead of the first hot segment (it imports the
        compiler meanwhile, at its low priority)."""
        with self._lock:
            self._ensure_child()
        entry = read_index(segment_key(warm_up_segment(), compiler_settings()))
        if entry is not None and entry["ok"]:  # an earlier process compiled it: no need to wait for the child
            self._warm_load()

    def _warm_load(self) -> None:
        """Loads the warm-up program in the background, once: this process's first load
        (the compiler's imports, seconds) is then not paid by a segment's first replay."""
        with self._lock:
            if self._warm_loading:
                return
            self._warm_loading = True
        threading.Thread(target=_warm_load, daemon=True, name="torchneuron-adaptive-warm-load").start()

    def _ensure_child(self) -> subprocess.Popen:
        """The compiler process, started if needed (with the lock held)."""
        if self._dispatcher is None:
            self._dispatcher = threading.Thread(target=self._dispatch, daemon=True,
                                                name="torchneuron-adaptive-queue")
            self._dispatcher.start()
        if self._child is not None and self._child.poll() is None:
            return self._child
        env = dict(os.environ, TORCHNEURON_ADAPTIVE_EAGER="0")
        priority = [] if self.priority is None else [json.dumps(self.priority)]
        self.warm_at = None
        # Its own process group, with Inductor's compile workers and the C++ compilers they
        # start: close() stops them all, and a Ctrl-C meant for the program does not reach them.
        self._child = subprocess.Popen([sys.executable, "-m", "torchneuron.adaptive._worker", *priority],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, process_group=0)
        threading.Thread(target=self._read_answers, args=(self._child,), daemon=True,
                         name="torchneuron-adaptive-compiles").start()
        return self._child

    def _dispatch(self) -> None:
        """Sends the child the best queued segment whenever it is idle."""
        while True:
            with self._lock:
                while True:
                    while not self._queue or self._compiling is not None:
                        self._lock.wait()
                    gathered = min(queued for _k, _r, queued in self._queue) + self.GATHER_SECONDS
                    if time.monotonic() >= gathered:
                        break
                    self._lock.wait(gathered - time.monotonic())
                best = max(range(len(self._queue)), key=lambda i: (self._priority(self._queue[i][1]), -i))
                key, request, queued = self._queue.pop(best)
                record = self._timeline.get(key)
                if record is not None:
                    record["queued_seconds"] = round(time.monotonic() - queued, 3)
                    record["order"] = sum(1 for r in self._timeline.values() if r["order"] is not None)
                self._compiling = key
                child = self._ensure_child()
            try:
                # Outside the lock: the child reads it when its warm-up is done, and a
                # large segment's description fills the pipe until then.
                _send(child.stdin, request)
            except (BrokenPipeError, OSError, ValueError):  # the child died or was stopped: its reader reports the key
                pass

    def _read_answers(self, child: subprocess.Popen) -> None:
        while True:
            try:
                answer = _receive(child.stdout)
            except Exception:
                answer = None
            if answer is None:  # the child exited: the compile it was running failed
                with self._lock:
                    lost = self._compiling if self._child is child else None
                    if lost is not None:
                        self._compiling = None
                        self._waiting.discard(lost)
                        self._lock.notify_all()
                if lost is not None:
                    _C._adaptive_compile_done(lost, False, 0.0, f"the compiler process exited with {child.wait()}")
                return
            key, ok, seconds, reason = answer
            if key == "":  # the compiler is warm: so is this process's loading, from now on in the background
                self.warm_at = time.monotonic()
                self._warm_load()
                continue
            with self._lock:
                self._waiting.discard(key)
                if self._compiling == key:
                    self._compiling = None
                record = self._timeline.get(key)
                if record is not None:
                    record["compile_seconds"] = round(seconds, 3)
                    record["hot_to_ready_seconds"] = round(time.monotonic() - self._epoch - record["hot_at"], 3)
                    if not ok:
                        record["failure"] = reason
                    elif seconds > 2 * self.FIXED_SECONDS:
                        # Learns the cost of a unit, halfway to the latest; not from short
                        # compiles (mostly hits in Inductor's cache), and within bounds, so
                        # that the fixed cost never outweighs a segment's size.
                        observed = (seconds - self.FIXED_SECONDS) / record["cost_units"]
                        self._per_unit = min(5.0, max(0.1, (self._per_unit + observed) / 2))
                self._lock.notify_all()
            _C._adaptive_compile_done(key, ok, seconds, reason)

    def close(self) -> None:
        """Stops the compiler process; what it had not answered fails (in this
        process only). The next hot segment starts a new one."""
        with self._lock:
            child, self._child = self._child, None
            lost = [key for key, _r, _q in self._queue] + ([self._compiling] if self._compiling else [])
            self._queue, self._compiling = [], None
            for key in lost:
                self._waiting.discard(key)
            self._lock.notify_all()
        if child is not None:
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:  # the whole group has exited already
                pass
            child.wait()
        for key in lost:
            _C._adaptive_compile_done(key, False, 0.0, "the compiler process was stopped")

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
