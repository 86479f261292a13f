"""Turns a finished torch.profiler profile into the tables of ``schema.py``.

Device rows come from the recorder of the last profiling session (the native
extension); host rows come from the profile's own Kineto events. The two
meet on Kineto's correlation id: the host op that launched a task, waited or
allocated.
"""

from __future__ import annotations

import os
import socket
import sysconfig
from typing import Any

import torch

from torchneuron import _C
from torchneuron.profiler.intervals import overlap, union
from torchneuron.profiler.schema import SCHEMA_VERSION, TABLES

_COPY_DIRECTIONS = {
    "copy_ (host to device)": "host_to_device",
    "copy_ (device to host)": "device_to_host",
    "copy_ (device to device)": "device_to_device",
    "copy_ (between neuron devices)": "between_devices",
}
# Kineto starts a profile's clock just before it starts our session (a
# fraction of a millisecond; far more under heavy load).
_SESSION_START_SLACK_NS = 50_000_000


class _UserCode:
    """Tells user code from library code: torch, torchneuron, the code
    Inductor generates and the standard library are libraries (other
    installed packages, such as model libraries, are not); the demo is user
    code that ships inside the package."""

    def __init__(self):
        import torchneuron

        def prefixes(paths):
            return tuple(os.path.join(os.path.realpath(p), "") for p in paths)

        from torch._inductor.runtime.cache_dir_utils import cache_dir

        package = os.path.dirname(torchneuron.__file__)
        self.ours = prefixes([os.path.dirname(torch.__file__), package, cache_dir()])
        self.installed = prefixes({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
        self.stdlib = prefixes({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")})
        self.exceptions = {os.path.realpath(os.path.join(package, "demo.py"))}

    def __call__(self, path: str) -> bool:
        if path.startswith("<frozen"):
            return False
        real = os.path.realpath(path)
        if real in self.exceptions:
            return True
        if real.startswith(self.ours):
            return False
        # site-packages may live inside the standard library's directory.
        return real.startswith(self.installed) or not real.startswith(self.stdlib)


class _Frames:
    """The stack-frame table and, per frame, the innermost user frame."""

    def __init__(self, frames: dict[str, list]):
        self.parent = frames["parent_id"]
        self.file = frames["file"]
        self.line = frames["line"]
        self.function = frames["function"]
        is_user = _UserCode()
        self.is_user = [is_user(f) for f in self.file]
        self._user: dict[int, int] = {}

    def user_frame(self, frame: int) -> int:
        if frame in self._user:
            return self._user[frame]
        walk, found = frame, -1
        while 0 <= walk < len(self.parent):
            if self.is_user[walk]:
                found = walk
                break
            walk = self.parent[walk]
        self._user[frame] = found
        return found


class _HostOps:
    """Host ops of the profile, by correlation id, with what encloses them."""

    def __init__(self, kineto_results):
        cpu = torch.autograd.DeviceType.CPU
        self.events = [e for e in kineto_results.events() if e.device_type() == cpu]
        self.by_id = {e.correlation_id(): e for e in self.events}
        # The autograd sequence number of every op: its own or its nearest
        # enclosing op's (relu's clamp_min has none of its own). Ops run by
        # the backward pass get their autograd node's, which names the
        # forward op it differentiates. Numbers count per forward thread.
        self.forward_seq: dict[int, tuple[int, int]] = {}
        self.backward_seq: dict[int, tuple[int, int]] = {}
        by_thread: dict[int, list] = {}
        for e in self.events:
            by_thread.setdefault(e.start_thread_id(), []).append(e)
        for ops in by_thread.values():
            ops.sort(key=lambda e: (e.start_ns(), -e.duration_ns()))
            open_ops: list = []  # enclosing ops, outermost first
            for e in ops:
                while open_ops and open_ops[-1].start_ns() + open_ops[-1].duration_ns() <= e.start_ns():
                    open_ops.pop()
                numbered = [o for o in reversed(open_ops + [e]) if o.sequence_nr() >= 0]
                node = next((o for o in numbered if "Backward" in o.name()), None)
                if node is not None:
                    self.backward_seq[e.correlation_id()] = (node.fwd_thread_id(), node.sequence_nr())
                elif numbered:
                    self.forward_seq[e.correlation_id()] = (numbered[0].start_thread_id(), numbered[0].sequence_nr())
                open_ops.append(e)

    def name(self, correlation: int) -> str:
        e = self.by_id.get(correlation)
        return e.name() if e is not None else ""


def _matching_session(prof) -> dict[str, Any]:
    results = getattr(prof, "profiler", prof)
    results = getattr(results, "kineto_results", None)
    if results is None:
        raise ValueError("export_parquet: the profile has no results yet; export after the profile stopped "
                         "(after the `with` block, or from on_trace_ready)")
    trace = _C._profiler_last_trace()
    device = torch.autograd.DeviceType.PrivateUse1
    device_events = sum(1 for e in results.events() if e.device_type() == device)
    ours = None if trace is None else sum(1 for kind in trace["tasks"]["kind"] if kind != "wait")
    if trace is None or abs(trace["start_ns"] - results.trace_start_ns()) > _SESSION_START_SLACK_NS \
            or device_events != ours:
        raise ValueError("export_parquet: this profile recorded no neuron activity; profile with "
                         "activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1] and export it before "
                         "starting another profile")
    trace["kineto_results"] = results
    return trace


def build_tables(prof) -> dict[str, dict[str, list]]:
    """The tables of ``schema.TABLES`` as columns (name -> list of values)."""
    import torchneuron

    trace = _matching_session(prof)
    frames = _Frames(trace["frames"])
    host = _HostOps(trace["kineto_results"])

    # Forward line of each autograd sequence number, from the forward tasks
    # and allocations that have one.
    forward_frame: dict[tuple[int, int], int] = {}
    for source in (trace["tasks"], trace["memory"]):
        for corr, frame in zip(source["correlation_id"], source["frame_id"]):
            if frame >= 0 and corr in host.forward_seq:
                forward_frame.setdefault(host.forward_seq[corr], frame)

    def source(frame: int, correlation: int) -> dict[str, Any]:
        origin = "launch"
        if frame < 0 and correlation in host.backward_seq:
            frame, origin = forward_frame.get(host.backward_seq[correlation], -1), "forward"
        user = frames.user_frame(frame) if frame >= 0 else -1
        if user < 0:
            return {"frame_id": frame, "source_file": "", "source_line": -1, "source_function": "",
                    "source_from": ""}
        return {"frame_id": frame, "source_file": frames.file[user], "source_line": frames.line[user],
                "source_function": frames.function[user], "source_from": origin}

    tables: dict[str, dict[str, list]] = {name: {c.name: [] for c in cols} for name, cols in TABLES.items()}

    def add(table: str, row: dict[str, Any]) -> None:
        for column, values in tables[table].items():
            values.append(row[column])

    t = trace["tasks"]
    order = sorted(range(len(t["name"])), key=lambda i: t["enqueue_ns"][i])
    device_time: dict[int, int] = {}
    task_count: dict[int, int] = {}
    compute: dict[int, list[tuple[int, int]]] = {}
    busy: dict[int, list[tuple[int, int]]] = {}
    for task_id, i in enumerate(order):
        start, end, corr = t["start_ns"][i], t["end_ns"][i], t["correlation_id"][i]
        row = {"task_id": task_id, **{k: t[k][i] for k in ("name", "kind", "device", "stream", "enqueue_ns",
                                                             "bytes_read", "bytes_written", "flops",
                                                             "replaced_ops")},
               "start_ns": start, "end_ns": end, "duration_ns": end - start, "queued_ns": start - t["enqueue_ns"][i],
               "correlation_id": corr, "host_op": host.name(corr), **source(t["frame_id"][i], corr)}
        add("tasks", row)
        if row["kind"] != "wait":  # a stream held for a collective is idle
            device_time[corr] = device_time.get(corr, 0) + end - start
            task_count[corr] = task_count.get(corr, 0) + 1
        if row["kind"] != "wait":
            busy.setdefault(row["device"], []).append((start, end))
        if row["kind"] not in ("collective", "wait"):
            compute.setdefault(row["device"], []).append((start, end))
        if row["kind"] == "copy":
            seconds = max(end - start, 1) / 1e9
            add("copies", {"task_id": task_id, "direction": _COPY_DIRECTIONS.get(row["name"], row["name"]),
                           "bytes": row["bytes_written"], "device": row["device"], "stream": row["stream"],
                           "start_ns": start, "end_ns": end, "bandwidth_gbps": row["bytes_written"] / seconds / 1e9,
                           **{k: row[k] for k in ("frame_id", "source_file", "source_line", "source_function",
                                                  "source_from")}})
    compute = {d: union(v) for d, v in compute.items()}
    compute_starts = {d: [s for s, _ in v] for d, v in compute.items()}
    for task_id, i in enumerate(order):
        if t["kind"][i] != "collective":
            continue
        d, start, end = t["device"][i], t["start_ns"][i], t["end_ns"][i]
        task_rows = tables["tasks"]
        add("collectives", {"task_id": task_id, "name": t["name"][i], "bytes": t["bytes_read"][i], "device": d,
                            "stream": t["stream"][i], "start_ns": start, "end_ns": end,
                            "overlapped_ns": overlap(start, end, compute.get(d, []), compute_starts.get(d, [])),
                            **{k: task_rows[k][task_id] for k in ("frame_id", "source_file", "source_line",
                                                            "source_function", "source_from")}})

    for e in host.events:
        corr, start = e.correlation_id(), e.start_ns()
        shapes = e.shapes()
        add("host_ops", {"correlation_id": corr, "name": e.name(), "thread_id": e.start_thread_id(),
                         "start_ns": start, "end_ns": start + e.duration_ns(), "duration_ns": e.duration_ns(),
                         "sequence_nr": e.sequence_nr(), "is_user_annotation": bool(e.is_user_annotation()),
                         "input_shapes": str(shapes) if any(shapes) else "",
                         "device_time_ns": device_time.get(corr, 0), "task_count": task_count.get(corr, 0)})

    s = trace["syncs"]
    # The wait torch.profiler's own exit adds (it synchronizes the device) is not the program's.
    profiler_exit = os.path.join("torch", "autograd", "profiler.py")
    for i in sorted(range(len(s["what"])), key=lambda i: s["start_ns"][i]):
        corr, frame = s["correlation_id"][i], s["frame_id"][i]
        if 0 <= frame < len(frames.file) and frames.file[frame].endswith(profiler_exit):
            continue
        add("syncs", {"sync_id": len(tables["syncs"]["sync_id"]), **{k: s[k][i] for k in ("what", "device", "stream", "start_ns", "end_ns")},
                      "duration_ns": s["end_ns"][i] - s["start_ns"][i], "correlation_id": corr,
                      "host_op": host.name(corr), **source(s["frame_id"][i], corr)})

    m = trace["memory"]
    for event_id, i in enumerate(sorted(range(len(m["bytes"])), key=lambda i: (m["device"][i], m["time_ns"][i]))):
        corr = m["correlation_id"][i]
        add("memory", {"event_id": event_id, **{k: m[k][i] for k in ("device", "time_ns", "address", "bytes",
                                                                      "allocated_bytes", "reserved_bytes")},
                       "correlation_id": corr, "host_op": host.name(corr), **source(m["frame_id"][i], corr)})

    for i in range(len(frames.file)):
        add("stack_frames", {"frame_id": i, "parent_id": frames.parent[i], "file": frames.file[i],
                             "line": frames.line[i], "function": frames.function[i], "is_user": frames.is_user[i]})

    start_ns = min([trace["start_ns"]] + tables["host_ops"]["start_ns"])
    end_ns = max([trace["end_ns"]] + tables["host_ops"]["end_ns"] + tables["tasks"]["end_ns"])
    add("summary", {
        "schema_version": SCHEMA_VERSION, "torchneuron_version": torchneuron.__version__,
        "torch_version": torch.__version__, "start_ns": start_ns, "end_ns": end_ns, "wall_ns": end_ns - start_ns,
        "devices": len(busy), "task_count": len(order),
        "device_busy_ns": sum(e - s for v in busy.values() for s, e in union(v)),
        "host_op_count": len(host.events), "sync_count": len(tables["syncs"]["sync_id"]),
        "host_blocked_ns": sum(tables["syncs"]["duration_ns"]),
        "peak_allocated_bytes": max(m["allocated_bytes"], default=0),
    })
    for name, cols in TABLES.items():
        if name == "schema":
            continue
        for c in cols:
            add("schema", {"table": name, "column": c.name, "type": c.type, "unit": c.unit, "meaning": c.meaning,
                           "schema_version": SCHEMA_VERSION})
    return tables


def export_parquet(prof, directory: str | os.PathLike) -> str:
    """Writes the profile as one Parquet file per table of ``schema.TABLES``.

    ``prof`` is a stopped ``torch.profiler.profile`` that recorded
    ``ProfilerActivity.PrivateUse1``. Returns the directory.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrow_types = {"int64": pa.int64(), "int32": pa.int32(), "string": pa.string(), "bool": pa.bool_(),
                   "double": pa.float64()}
    tables = build_tables(prof)
    os.makedirs(directory, exist_ok=True)
    for name, columns in tables.items():
        schema = pa.schema([pa.field(c.name, arrow_types[c.type]) for c in TABLES[name]],
                           metadata={"torchneuron.schema_version": SCHEMA_VERSION})
        pq.write_table(pa.Table.from_pydict(columns, schema=schema), os.path.join(directory, f"{name}.parquet"))
    return os.fspath(directory)


def parquet_trace_handler(dir_name: str | os.PathLike, worker_name: str | None = None):
    """An ``on_trace_ready`` handler: each trace goes to
    ``<dir_name>/<worker_name>.<step>/`` (worker: host name and process id),
    ready for ``torchneuron explore``."""
    worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"

    def handler(prof) -> None:
        export_parquet(prof, os.path.join(dir_name, f"{worker}.{prof.step_num}"))

    return handler
