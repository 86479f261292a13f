"""The Parquet export's tables and columns: the single source of truth.

``export_parquet`` writes exactly these columns with these types, writes this
table itself as ``schema.parquet``, and ``docs/profiler.md`` documents it.
Bump ``SCHEMA_VERSION`` whenever a column changes meaning, type or name;
adding a table or a column at the end is a minor bump.
"""

from __future__ import annotations

from typing import NamedTuple

SCHEMA_VERSION = "1.1"


class Column(NamedTuple):
    name: str
    type: str  # an Arrow type name: int64, int32, string, bool, double
    unit: str  # "" when the value has no unit
    meaning: str


def _source(prefix: str) -> list[Column]:
    return [
        Column("frame_id", "int64", "", f"innermost Python frame of the {prefix} (stack_frames.frame_id), -1 if none"),
        Column("source_file", "string", "", f"file of the innermost user frame of the {prefix} (outside torch, "
               "torchneuron and the standard library); empty if none"),
        Column("source_line", "int64", "", "line in source_file, -1 if none"),
        Column("source_function", "string", "", "function of that frame"),
        Column("source_from", "string", "", "launch: the line that ran it; forward: a backward pass's row, given "
               "the line of the forward op it differentiates (the backward runs on autograd's threads, with no "
               "Python line of its own); empty if no user line"),
    ]


TABLES: dict[str, list[Column]] = {
    "tasks": [
        Column("task_id", "int64", "", "row number, in enqueue order"),
        Column("name", "string", "", "kernel: the ATen op, compiled kernel or NKI kernel; copy_ (<direction>); "
               "a collective's name; graph replay"),
        Column("kind", "string", "", "kernel | copy | collective | graph | wait (a stream held until a "
               "collective is done, by Work.wait(); idle, not compute) | fused (eager ops run as one compiled "
               "program by adaptive eager)"),
        Column("device", "int32", "", "neuron device index"),
        Column("stream", "int32", "", "stream id on that device (0 = default stream)"),
        Column("enqueue_ns", "int64", "ns since the Unix epoch", "when the host enqueued the task"),
        Column("start_ns", "int64", "ns since the Unix epoch", "when the device started it (a collective: when its "
               "input was ready, after the caller's stream)"),
        Column("end_ns", "int64", "ns since the Unix epoch", "when the device finished it"),
        Column("duration_ns", "int64", "ns", "end_ns - start_ns"),
        Column("queued_ns", "int64", "ns", "start_ns - enqueue_ns: how far the host ran ahead"),
        Column("bytes_read", "int64", "bytes", "tensor bytes the task reads (logical sizes)"),
        Column("bytes_written", "int64", "bytes", "tensor bytes the task writes"),
        Column("flops", "int64", "FLOP", "estimated floating-point operations (matmul-like ops only, else 0)"),
        Column("correlation_id", "int64", "", "the host op that launched it (host_ops.correlation_id), 0 if none"),
        Column("host_op", "string", "", "name of that host op; empty if none"),
        Column("replaced_ops", "string", "", "fused: the eager ops the task ran, comma-separated; else empty"),
        *_source("launch"),
    ],
    "host_ops": [
        Column("correlation_id", "int64", "", "torch.profiler's id of the op (links tasks, syncs and memory)"),
        Column("name", "string", "", "ATen op, record_function range or autograd node"),
        Column("thread_id", "int64", "", "host thread that ran it"),
        Column("start_ns", "int64", "ns since the Unix epoch", "start on the host"),
        Column("end_ns", "int64", "ns since the Unix epoch", "end on the host"),
        Column("duration_ns", "int64", "ns", "end_ns - start_ns"),
        Column("sequence_nr", "int64", "", "autograd sequence number (forward op and its backward share it), -1"),
        Column("is_user_annotation", "bool", "", "a record_function range"),
        Column("input_shapes", "string", "", "input shapes when recorded (record_shapes=True), else empty"),
        Column("device_time_ns", "int64", "ns", "total duration of the tasks it launched directly"),
        Column("task_count", "int64", "", "number of tasks it launched directly"),
    ],
    "stack_frames": [
        Column("frame_id", "int64", "", "frame id"),
        Column("parent_id", "int64", "", "the calling frame, -1 at the outermost recorded frame"),
        Column("file", "string", "", "Python source file"),
        Column("line", "int64", "", "line being executed"),
        Column("function", "string", "", "qualified function name"),
        Column("is_user", "bool", "", "outside torch, torchneuron and the standard library"),
    ],
    "copies": [
        Column("task_id", "int64", "", "the copy's row in tasks"),
        Column("direction", "string", "", "host_to_device | device_to_host | device_to_device | between_devices"),
        Column("bytes", "int64", "bytes", "bytes copied"),
        Column("device", "int32", "", "neuron device that ran it"),
        Column("stream", "int32", "", "stream id"),
        Column("start_ns", "int64", "ns since the Unix epoch", "device start"),
        Column("end_ns", "int64", "ns since the Unix epoch", "device end"),
        Column("bandwidth_gbps", "double", "GB/s", "bytes / duration"),
        *_source("copy"),
    ],
    "collectives": [
        Column("task_id", "int64", "", "the collective's row in tasks"),
        Column("name", "string", "", "collective (all_reduce, all_gather, send, ...)"),
        Column("bytes", "int64", "bytes", "bytes of the tensors passed in"),
        Column("device", "int32", "", "neuron device"),
        Column("stream", "int32", "", "communication stream id"),
        Column("start_ns", "int64", "ns since the Unix epoch", "transfer start"),
        Column("end_ns", "int64", "ns since the Unix epoch", "transfer end"),
        Column("overlapped_ns", "int64", "ns", "part of the transfer during which a compute task ran on the device"),
        *_source("collective"),
    ],
    "syncs": [
        Column("sync_id", "int64", "", "row number"),
        Column("what", "string", "", "why the host waited: device synchronize, stream synchronize, event "
               "synchronize, copy_ (device to host), copy_ (device to device) (a storage copy of the allocator), "
               "an op with data-dependent output (aten::nonzero, aten::_local_scalar_dense for .item()), a "
               "collective's name (Work.wait with a timeout), or the first call of an op"),
        Column("device", "int32", "", "neuron device waited for"),
        Column("stream", "int32", "", "stream waited for, -1 for the whole device"),
        Column("start_ns", "int64", "ns since the Unix epoch", "host starts waiting"),
        Column("end_ns", "int64", "ns since the Unix epoch", "host resumes"),
        Column("duration_ns", "int64", "ns", "time the host was blocked"),
        Column("correlation_id", "int64", "", "host op that waited, 0 if none"),
        Column("host_op", "string", "", "its name"),
        *_source("wait"),
    ],
    "memory": [
        Column("event_id", "int64", "", "row number, in time order per device"),
        Column("device", "int32", "", "neuron device"),
        Column("time_ns", "int64", "ns since the Unix epoch", "when the allocator served or took back the block"),
        Column("address", "int64", "", "device address of the block"),
        Column("bytes", "int64", "bytes", "block size: positive for an allocation, negative for a free"),
        Column("allocated_bytes", "int64", "bytes", "bytes allocated on the device right after"),
        Column("reserved_bytes", "int64", "bytes", "bytes the caching allocator holds right after"),
        Column("correlation_id", "int64", "", "host op that allocated (0 for frees and outside ops)"),
        Column("host_op", "string", "", "its name"),
        *_source("allocation"),
    ],
    "summary": [
        Column("schema_version", "string", "", "version of this schema"),
        Column("torchneuron_version", "string", "", "torchneuron that wrote the export"),
        Column("torch_version", "string", "", "PyTorch that wrote the export"),
        Column("start_ns", "int64", "ns since the Unix epoch", "profile start"),
        Column("end_ns", "int64", "ns since the Unix epoch", "profile end"),
        Column("wall_ns", "int64", "ns", "end_ns - start_ns"),
        Column("devices", "int32", "", "devices with tasks"),
        Column("task_count", "int64", "", "rows of tasks"),
        Column("device_busy_ns", "int64", "ns", "time at least one stream of a device ran a task, summed over devices"),
        Column("host_op_count", "int64", "", "rows of host_ops"),
        Column("sync_count", "int64", "", "rows of syncs"),
        Column("host_blocked_ns", "int64", "ns", "sum of syncs.duration_ns"),
        Column("peak_allocated_bytes", "int64", "bytes", "highest allocated_bytes in memory (any device)"),
    ],
    "schema": [
        Column("table", "string", "", "table name (file <table>.parquet)"),
        Column("column", "string", "", "column name"),
        Column("type", "string", "", "Arrow type"),
        Column("unit", "string", "", "unit, empty if none"),
        Column("meaning", "string", "", "what the column holds"),
        Column("schema_version", "string", "", "version of the schema"),
    ],
}


def markdown() -> str:
    """The tables as the Markdown of docs/profiler.md's schema section."""
    out = [f"Schema version: {SCHEMA_VERSION}", ""]
    for table, columns in TABLES.items():
        out += [f"### `{table}`", "", "| column | type | unit | meaning |", "|---|---|---|---|"]
        out += [f"| `{c.name}` | {c.type} | {c.unit} | {c.meaning.replace('|', chr(92) + '|')} |" for c in columns]
        out.append("")
    return "\n".join(out)
