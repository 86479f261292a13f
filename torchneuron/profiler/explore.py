"""``torchneuron explore``: finds what slows a profiled program down.

Reads a directory written by ``export_parquet`` (the tables of
``schema.py``) and returns a report: an overview and a list of findings,
each with the time it is estimated to cost and the source lines behind it.
``report_text.format_text`` renders the report for a terminal,
``report_html.render`` as one self-contained HTML page; ``json.dumps(report)`` is the JSON output.

Command line: ``torchneuron explore DIR [--format text|json|html]
[--output FILE] [--top N]`` (see ``torchneuron.cli``).

The report (times in ns; ``*_ns`` instants are ns since the Unix epoch,
like the export's; ``*_pct`` are percentages)::

    report_version     "1"
    directory          the export analysed
    schema_version, torchneuron_version, torch_version   of the export
    start_ns, end_ns   the profile's span
    thresholds         {name: value} of the constants below
    overview           wall_ns, device_busy_ns, device_busy_pct (of wall time
                       times devices), host_blocked_ns, host_blocked_pct (of
                       wall time), warmup_blocked_ns (first-call waits, part of
                       host_blocked_ns), sync_count, task_count,
                       host_op_count, peak_allocated_bytes,
                       devices: [{device, tasks, busy_ns, busy_pct,
                       first_start_ns, last_end_ns, peak_allocated_bytes}]
    findings           sorted by impact_ns, largest first; each:
      kind             idle_gaps | top_tasks | sync | round_trip | ping_pong |
                       launch_overhead | memory_peak | exposed_communication
      title            one line
      impact_ns        the time it is estimated to cost (per kind below)
      device           neuron device index, null when it spans devices
      explanation      one paragraph: what happens and a concrete fix
      lines            the source lines responsible, each {file, line,
                       function, from ("launch", "forward": a backward row
                       given its forward line, "" if unknown), role, label
                       (task, op or wait), count, time_ns, bytes}
      details          per kind, below

    kind             details; impact_ns; lines' time_ns
    idle_gaps        device, span_ns (first task start to last task end),
                     idle_ns (all idle time in it), idle_pct, gap_ns and
                     gap_count (gaps of at least IDLE_GAP_MIN_NS), gaps: the
                     largest, each {start_ns, end_ns, duration_ns, before and
                     after (a line plus task: the tasks around the gap),
                     syncs: [a line plus what, duration_ns, in_gap_ns],
                     host_ops: [{name, overlap_ns}] (outermost torch ops on
                     the host), annotations: [record_function names],
                     untracked_ns (the host ran no torch op and did not
                     wait: plain Python, or framework overhead)};
                     impact gap_ns; lines: gap time around / waits inside
    top_tasks        groups: [{name, kind, file, line, function, from, count,
                     device_ns, mean_ns, busy_pct, flops, bytes}]; impact the
                     heaviest group's device_ns (what speeding it up saves at
                     most); lines: device time
    sync, round_trip what, plain (the Python that waits), count, blocked_ns,
                     mean_ns, max_ns, lost_overlap_ns; impact lost_overlap_ns:
                     the device's idle time after each wait, capped by the
                     wait (the host/device overlap it took away); lines:
                     blocked time
    ping_pong        device, pairs, bytes, copy_ns, idle_between_ns (device
                     idle between download and upload), download and upload
                     (lines); impact copy_ns + idle_between_ns; lines: copy time
    launch_overhead  device, tasks, task_pct, mean_duration_ns,
                     mean_interval_ns (host time between launches), device_ns,
                     idle_ns (device idle just before those tasks); impact
                     idle_ns; lines: idle time before
    memory_peak      device, peak_bytes, time_ns, reserved_bytes, live_blocks,
                     before_profile_bytes (live, allocated before the
                     profile), holders: [{file, line, function, from, host_op,
                     blocks, bytes}]; impact 0; lines: bytes held at the peak
    exposed_communication  name, count, bytes, duration_ns, overlapped_ns,
                     exposed_ns; impact exposed_ns; lines: exposed time
"""

from __future__ import annotations

import os
from bisect import bisect_left, bisect_right
from collections import defaultdict
from typing import Any, Iterable

from torchneuron.profiler.intervals import covered, overlap
from torchneuron.profiler.schema import SCHEMA_VERSION, TABLES

REPORT_VERSION = "1"

# A device idle longer than this between two tasks means the host did
# something else than launching (a launch costs ~10-50 us here); shorter gaps
# are launch overhead (see LAUNCH_BOUND_*).
IDLE_GAP_MIN_NS = 100_000
# The same line waiting this many times is a wait in a loop: worth a finding
# even when each wait is short.
RECURRING_MIN_COUNT = 3
# A wait that is not recurring is reported only when the device idled after
# it at least as long as a host-bound gap (a final synchronize costs nothing).
SYNC_MIN_LOST_NS = IDLE_GAP_MIN_NS
# A task is launch-bound when it runs for less than this fraction of the
# host's interval between two launches: the device then waits for the host.
LAUNCH_BOUND_RATIO = 0.5
# Fusing or capturing pays off for many small tasks, not for a handful...
LAUNCH_BOUND_MIN_TASKS = 50
# ...and only when the device actually waited for them: short tasks behind a
# backlog (the host far ahead) cost nothing.
LAUNCH_BOUND_MIN_IDLE_NS = 1_000_000
# A host-to-device copy is taken for a download coming back when its size is
# within this factor of the download's (an unrelated upload, such as the next
# batch after a loss was read, rarely is).
PING_PONG_SIZE_RATIO = 4.0
# Repeated round trips are the problem; a single one is a normal read-back.
PING_PONG_MIN_PAIRS = 2
# Communication is reported when more than this share of it ran with no
# compute beside it, and it cost at least IDLE_GAP_MIN_NS.
COMM_EXPOSED_MIN_SHARE = 0.1
# A host op is shown in a gap when it covers at least this share of it.
GAP_HOST_OP_MIN_SHARE = 0.05

WARMUP_WAIT = "first call of an op (checks its output plan)"

# The Python behind each wait, in the user's words, and what else does the same.
_SYNC_PLAIN = {
    "aten::_local_scalar_dense": (".item()", "print(t), bool(t), float(t) and `if t:` on a device tensor wait "
                                             "the same way"),
    "copy_ (device to host)": (".cpu()", ".to('cpu'), .numpy() and .tolist() wait the same way"),
    "device synchronize": ("torch.neuron.synchronize()", ""),
    "stream synchronize": ("Stream.synchronize()", ""),
    "event synchronize": ("Event.synchronize()", ""),
}
_SYNC_FIX = {
    "aten::_local_scalar_dense":
        "keep the value on the device: accumulate with tensor ops (`total += loss.detach()`) and read it once "
        "after the loop, or only every N steps",
    "copy_ (device to host)":
        "keep the computation that follows on the device; if the host needs the data, read it less often, "
        "gather several tensors into one copy, or start the copy early with `t.to('cpu', non_blocking=True)` "
        "and wait on a torch.neuron.Event only where the data is used",
    "device synchronize":
        "remove it from the hot path: results read with .cpu() or .item() already wait, and timing is better "
        "done with torch.neuron.Event(enable_timing=True)",
    "stream synchronize":
        "let the device wait instead of the host: `stream.wait_stream(other)` or `stream.wait_event(event)` "
        "orders the work without blocking Python",
    "event synchronize":
        "let the device wait instead of the host: `stream.wait_event(event)` orders the work without "
        "blocking Python",
}
# Data-dependent-output ops (without overload), in the user's words.
_ROUND_TRIP_PLAIN = {
    "aten::nonzero": "torch.nonzero / torch.where(cond) / x[mask]",
    "aten::masked_select": "x[mask] / torch.masked_select",
    "aten::unique": "torch.unique",
    "aten::_unique2": "torch.unique",
    "aten::unique_consecutive": "torch.unique_consecutive",
    "aten::repeat_interleave": "torch.repeat_interleave with a tensor of repeats",
    "aten::index": "x[mask]",
}


class ExportError(ValueError):
    """The directory is not a readable export of a schema this torchneuron reads."""


class Export:
    """The tables of one export directory, as lists of rows (dicts)."""

    def __init__(self, directory: str, tables: dict[str, list[dict[str, Any]]]):
        self.directory = directory
        self.tables = tables
        self.summary = tables["summary"][0]


def _major(version: str) -> str:
    return str(version).split(".")[0]


def load(directory: str | os.PathLike) -> Export:
    """Reads an export directory; ``ExportError`` if it is none or of another schema."""
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError("torchneuron explore reads Parquet with pyarrow: pip install 'torchneuron[profiler]'") \
            from e

    path = os.fspath(directory)
    if not os.path.isdir(path):
        raise ExportError(f"{path} is not a directory: pass the directory torchneuron.profiler.export_parquet "
                          "wrote")

    def read(table: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
        file = os.path.join(path, f"{table}.parquet")
        try:
            return pq.read_table(file, columns=columns).to_pylist()
        except (OSError, ValueError, KeyError) as e:  # pyarrow's errors derive from these
            raise ExportError(f"{path}: cannot read {table}.parquet as schema {SCHEMA_VERSION} expects it: {e}") \
                from e

    if not all(os.path.isfile(os.path.join(path, f"{t}.parquet")) for t in ("summary", "schema")):
        raise ExportError(f"{path} is not a torchneuron profile export: it has no summary.parquet and "
                          "schema.parquet; write one with torchneuron.profiler.export_parquet(prof, directory)")
    summary = read("summary")
    versions = {row.get("schema_version") for row in summary}
    versions |= {row["schema_version"] for row in read("schema", ["schema_version"])}
    wrong = sorted(str(v) for v in versions if _major(str(v)) != _major(SCHEMA_VERSION))
    if wrong or not summary:
        written = summary[0].get("torchneuron_version", "?") if summary else "?"
        raise ExportError(f"{path} is a profile export of schema version {', '.join(wrong) or 'unknown'} "
                          f"(written by torchneuron {written}), but this torchneuron reads schema "
                          f"{_major(SCHEMA_VERSION)}.x ({SCHEMA_VERSION}): analyse it with the torchneuron that "
                          "wrote it, or export the profile again with this one")
    missing = [f"{t}.parquet" for t in TABLES if not os.path.isfile(os.path.join(path, f"{t}.parquet"))]
    if missing:
        raise ExportError(f"{path}: incomplete profile export: {', '.join(missing)} missing")
    # Only the known columns: a later minor version may add more.
    tables = {t: read(t, [c.name for c in cols]) for t, cols in TABLES.items() if t not in ("summary", "schema",
                                                                                            "stack_frames")}
    tables["summary"] = summary
    return Export(path, tables)


# --------------------------------------------------------------------------- formatting

def format_ns(ns: float) -> str:
    ns = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= scale:
            value = ns / scale
            return f"{value:.1f} {unit}" if abs(value) < 100 else f"{value:.0f} {unit}"
    return f"{ns:.0f} ns"


def format_bytes(n: float) -> str:
    n = float(n)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def short_path(path: str, cwd: str | None = None) -> str:
    """``path`` relative to the working directory when it lies below it."""
    if not path:
        return path
    cwd = cwd or os.getcwd()
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:  # another drive
        return path
    return path if rel.startswith("..") else rel


def location(row: dict[str, Any]) -> str:
    """``file:line`` of a line entry (or of any row with file/line)."""
    if not row.get("file"):
        return "(no user line)"
    return f"{short_path(row['file'])}:{row['line']}"


# --------------------------------------------------------------------------- lines

def _source(row: dict[str, Any]) -> dict[str, Any]:
    """The source line of an export row (task, sync, copy, memory event)."""
    return {"file": row["source_file"], "line": row["source_line"], "function": row["source_function"],
            "from": row["source_from"]}


def _source_key(row: dict[str, Any]) -> tuple:
    return row["source_file"], row["source_line"], row["source_function"], row["source_from"]


class _Lines:
    """Source lines of a finding, each with counts and times summed."""

    def __init__(self):
        self._rows: dict[tuple, dict[str, Any]] = {}

    def add(self, source: dict[str, Any], role: str, label: str, count: int = 1, time_ns: int = 0,
            nbytes: int = 0) -> None:
        key = (source["file"], source["line"], source["function"], source["from"], role, label)
        entry = self._rows.setdefault(key, {"file": key[0], "line": key[1], "function": key[2], "from": key[3],
                                            "role": role, "label": label, "count": 0, "time_ns": 0, "bytes": 0})
        entry["count"] += count
        entry["time_ns"] += int(time_ns)
        entry["bytes"] += int(nbytes)

    def top(self, n: int) -> list[dict[str, Any]]:
        return sorted(self._rows.values(), key=lambda e: (-e["time_ns"], -e["bytes"], -e["count"]))[:n]


def _where(source: dict[str, Any]) -> str:
    """A line for prose: ``file:line in function``."""
    if not source["file"]:
        return "a place with no user line"
    text = f"{short_path(source['file'])}:{source['line']}"
    if source["function"] and source["function"] != "<module>":
        text += f" in {source['function']}"
    if source["from"] == "forward":
        text += " (its backward pass)"
    return text


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _finding(kind: str, title: str, impact_ns: int, device: int | None, explanation: str,
             lines: list[dict[str, Any]], details: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "title": title, "impact_ns": int(impact_ns), "device": device,
            "explanation": explanation, "lines": lines, "details": details}


# --------------------------------------------------------------------------- timeline

def device_work(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tasks that occupy the device: a stream held until a collective is
    done (kind "wait", Work.wait()) is idle."""
    return [t for t in tasks if t["kind"] != "wait"]


class _Device:
    """One device's tasks and the union of their intervals (busy periods)."""

    def __init__(self, tasks: list[dict[str, Any]]):
        self.tasks = tasks  # in enqueue order
        # [start, end, first task, task that ends it], disjoint and sorted.
        self.busy: list[list] = []
        for t in sorted(tasks, key=lambda t: (t["start_ns"], t["end_ns"])):
            if self.busy and t["start_ns"] <= self.busy[-1][1]:
                if t["end_ns"] > self.busy[-1][1]:
                    self.busy[-1][1], self.busy[-1][3] = t["end_ns"], t
            else:
                self.busy.append([t["start_ns"], t["end_ns"], t, t])
        self._starts = [b[0] for b in self.busy]
        self.busy_ns = sum(e - s for s, e, _, _ in self.busy)
        self.first_start_ns = self.busy[0][0] if self.busy else 0
        self.last_end_ns = self.busy[-1][1] if self.busy else 0
        self.span_ns = self.last_end_ns - self.first_start_ns

    def gaps(self) -> Iterable[tuple[int, int, dict, dict]]:
        """(start, end, task before, task after) of every idle period in the span."""
        for (_, end, _, before), (start, _, after, _) in zip(self.busy, self.busy[1:]):
            yield end, start, before, after

    def idle_after(self, t: int) -> int:
        """How long the device stays idle from ``t`` until its next task (0 if busy at ``t``)."""
        i = bisect_right(self._starts, t) - 1
        if i >= 0 and t < self.busy[i][1]:
            return 0
        return self.busy[i + 1][0] - t if i + 1 < len(self.busy) else 0

    def idle_within(self, a: int, b: int) -> int:
        """Idle time of the device within [a, b)."""
        return max(0, b - a - overlap(a, b, self.busy, self._starts))


class _Overlapping:
    """Rows with start_ns/end_ns, found by the interval they overlap."""

    def __init__(self, rows: list[dict[str, Any]]):
        self.rows = sorted(rows, key=lambda r: r["start_ns"])
        self._starts = [r["start_ns"] for r in self.rows]
        self._longest = max((r["end_ns"] - r["start_ns"] for r in self.rows), default=0)

    def within(self, a: int, b: int) -> list[dict[str, Any]]:
        i = bisect_left(self._starts, a - self._longest)
        j = bisect_left(self._starts, b)
        return [r for r in self.rows[i:j] if r["end_ns"] > a]


class _Profile:
    """The export with the indexes the analyses share."""

    def __init__(self, export: Export, top: int):
        self.export, self.top = export, top
        t = export.tables
        self.tasks = device_work(t["tasks"])
        by_device: dict[int, list] = defaultdict(list)
        for r in self.tasks:
            by_device[r["device"]].append(r)
        self.devices = {d: _Device(rows) for d, rows in sorted(by_device.items())}
        self.syncs = _Overlapping(t["syncs"])
        self.host_ops = _Overlapping([r for r in t["host_ops"] if not r["is_user_annotation"]])
        self.annotations = _Overlapping([r for r in t["host_ops"] if r["is_user_annotation"]])

    def lost_overlap(self, sync: dict[str, Any]) -> int:
        """Device idle time after a wait, capped by the wait: the overlap of
        host and device work the wait took away."""
        device = self.devices.get(sync["device"])
        return min(sync["duration_ns"], device.idle_after(sync["end_ns"])) if device else 0


# --------------------------------------------------------------------------- findings

def _idle_gaps(p: _Profile) -> list[dict[str, Any]]:
    findings = []
    for d, dev in p.devices.items():
        gaps = [g for g in dev.gaps() if g[1] - g[0] >= IDLE_GAP_MIN_NS]
        if not gaps:
            continue
        idle_ns = dev.span_ns - dev.busy_ns
        gap_ns = sum(e - s for s, e, _, _ in gaps)
        shown = [_describe_gap(p, *g) for g in sorted(gaps, key=lambda g: g[0] - g[1])[:p.top]]
        lines = _Lines()
        for g in shown:
            lines.add(g["before"], "before gap", g["before"]["task"], time_ns=g["duration_ns"])
            lines.add(g["after"], "after gap", g["after"]["task"], time_ns=g["duration_ns"])
            for s in g["syncs"]:
                if s["what"] != WARMUP_WAIT:
                    lines.add(s, "wait in gap", s["what"], time_ns=s["in_gap_ns"])
        big = shown[0]
        cause, fix = _gap_cause(big)
        explanation = (
            f"neuron:{d} ran no task for {format_ns(gap_ns)} in {len(gaps)} gaps longer than "
            f"{format_ns(IDLE_GAP_MIN_NS)} ({100 * gap_ns / max(dev.span_ns, 1):.0f}% of the "
            f"{format_ns(dev.span_ns)} from its first to its last task): the host was not giving it work. "
            f"The biggest gap, {format_ns(big['duration_ns'])}, lies between {big['before']['task']} at "
            f"{_where(big['before'])} and {big['after']['task']} at {_where(big['after'])}. {cause}Fix: {fix}")
        findings.append(_finding(
            "idle_gaps",
            f"neuron:{d} idle {format_ns(gap_ns)} in {len(gaps)} host-bound gaps "
            f"({100 * gap_ns / max(dev.span_ns, 1):.0f}% of its active span)",
            gap_ns, d, explanation, lines.top(p.top),
            {"device": d, "span_ns": dev.span_ns, "idle_ns": idle_ns,
             "idle_pct": 100 * idle_ns / max(dev.span_ns, 1), "gap_ns": gap_ns, "gap_count": len(gaps),
             "gaps": shown}))
    return findings


def _describe_gap(p: _Profile, start: int, end: int, before: dict[str, Any], after: dict[str, Any]) \
        -> dict[str, Any]:
    """A device idle gap: the tasks around it and what the host did meanwhile."""
    duration, waits = end - start, p.syncs.within(start, end)
    # Time in waits or torch ops is not plain Python.
    busy_host = [(max(start, s["start_ns"]), min(end, s["end_ns"])) for s in waits]
    syncs = [{**_source(s), "what": s["what"], "duration_ns": s["duration_ns"], "in_gap_ns": e - b}
             for s, (b, e) in zip(waits, busy_host)]
    host_ops = []
    for op in _outermost(p.host_ops.within(start, end)):
        busy_host.append((max(start, op["start_ns"]), min(end, op["end_ns"])))
        in_gap = busy_host[-1][1] - busy_host[-1][0]
        if in_gap >= GAP_HOST_OP_MIN_SHARE * duration:
            host_ops.append({"name": op["name"], "overlap_ns": in_gap})
    host_ops.sort(key=lambda o: -o["overlap_ns"])
    return {"start_ns": start, "end_ns": end, "duration_ns": duration,
            "before": {**_source(before), "task": before["name"]}, "after": {**_source(after), "task": after["name"]},
            "syncs": syncs, "host_ops": host_ops[:5],
            "annotations": sorted({a["name"] for a in p.annotations.within(start, end)}),
            "untracked_ns": duration - covered(busy_host)}


def _outermost(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ops not nested in another op of the list (per thread)."""
    kept: list[dict[str, Any]] = []
    open_end: dict[int, int] = {}
    for op in sorted(ops, key=lambda o: (o["start_ns"], -o["end_ns"])):
        if op["start_ns"] >= open_end.get(op["thread_id"], 0):
            kept.append(op)
            open_end[op["thread_id"]] = op["end_ns"]
    return kept


_GAP_FIXES = {
    "wait": "remove or defer that wait (see its own finding), so the host keeps queueing work ahead of the "
            "device.",
    "ops": "these torch ops spend their time on the host: look for CPU tensors mixed into the computation (their "
           "ops run on the host) and cut per-op host overhead by fusing with torch.compile(model, "
           "backend=\"neuron\").",
    "python": "if that is your Python, take it off the device's critical path: queue the next device work "
              "before it, prefetch input with a DataLoader (num_workers > 0, pin_memory=True), and log or read "
              "results every N steps instead of every step.",
    "warmup": "nothing to do if it happens once: the first call of an op checks its output plan; warm up "
              "before the measured region.",
}


def _gap_cause(gap: dict[str, Any]) -> tuple[str, str]:
    """What the host did during a gap, and the fix for the largest part."""
    shown = GAP_HOST_OP_MIN_SHARE * gap["duration_ns"]
    causes = []  # (time, what the host did, key of its fix)
    waits = [s for s in gap["syncs"] if s["what"] != WARMUP_WAIT and s["in_gap_ns"] >= shown]
    if waits:
        w = max(waits, key=lambda s: s["in_gap_ns"])
        causes.append((w["in_gap_ns"], f"waited in {w['what']} at {_where(w)} ({format_ns(w['in_gap_ns'])} of the "
                                       "gap)", "wait"))
    warmup = sum(s["in_gap_ns"] for s in gap["syncs"] if s["what"] == WARMUP_WAIT)
    if warmup >= shown:
        causes.append((warmup, "waited for the first call of an op (a one-off warm-up)", "warmup"))
    if gap["host_ops"]:
        names = ", ".join(f"{o['name']} ({format_ns(o['overlap_ns'])})" for o in gap["host_ops"][:3])
        # Waits run inside the ops that wait: that time is the waits'.
        in_ops = sum(o["overlap_ns"] for o in gap["host_ops"]) - sum(s["in_gap_ns"] for s in gap["syncs"])
        causes.append((in_ops, f"ran the torch ops {names}", "ops"))
    if gap["untracked_ns"] >= shown:
        causes.append((gap["untracked_ns"], f"ran no torch op for {format_ns(gap['untracked_ns'])} (plain Python "
                                            "such as data loading, logging, sleeps and control flow, or framework "
                                            "overhead)", "python"))
    if not causes:
        return "", _GAP_FIXES["python"]
    main = max(causes, key=lambda c: c[0])
    return "Meanwhile the host " + "; ".join(c[1] for c in causes) + ". ", _GAP_FIXES[main[2]]


def _top_tasks(p: _Profile) -> list[dict[str, Any]]:
    groups: dict[tuple, dict[str, Any]] = {}
    for t in p.tasks:
        key = (t["name"], t["kind"]) + _source_key(t)
        g = groups.setdefault(key, {"name": t["name"], "kind": t["kind"], **_source(t), "count": 0,
                                    "device_ns": 0, "flops": 0, "bytes": 0})
        g["count"] += 1
        g["device_ns"] += t["duration_ns"]
        g["flops"] += t["flops"]
        g["bytes"] += t["bytes_read"] + t["bytes_written"]
    if not groups:
        return []
    busy = max(sum(dev.busy_ns for dev in p.devices.values()), 1)
    ranked = sorted(groups.values(), key=lambda g: -g["device_ns"])[:p.top]
    lines = _Lines()
    for g in ranked:
        g["mean_ns"] = g["device_ns"] // g["count"]
        g["busy_pct"] = 100 * g["device_ns"] / busy
        lines.add(g, "launch", _task_label(g), g["count"], g["device_ns"])
    first = ranked[0]
    explanation = (
        f"Device time by task and line: {first['name']} at {_where(first)} takes {format_ns(first['device_ns'])} "
        f"over {plural(first['count'], 'run')} ({first['busy_pct']:.0f}% of all device busy time). Speeding "
        "these up shortens the run only while the device is the bottleneck (see the idle findings). Fix: run them in "
        "bfloat16 (torch.autocast('neuron', dtype=torch.bfloat16)), fuse chains of small element-wise ops "
        "with torch.compile(model, backend=\"neuron\"), and avoid recomputing or copying what can be kept.")
    return [_finding("top_tasks", f"Most device time: {first['name']} at {location(first)} "
                                  f"({format_ns(first['device_ns'])}, {first['busy_pct']:.0f}% of busy time)",
                     first["device_ns"], None, explanation, lines.top(p.top), {"groups": ranked})]


def _task_label(task: dict[str, Any]) -> str:
    """A task's name, with its kind where the name does not tell it."""
    return task["name"] if task["kind"] in ("kernel", "copy") else f"{task['name']} ({task['kind']})"


def _waits(p: _Profile) -> list[dict[str, Any]]:
    """Host waits grouped by (what, line): synchronisations and round trips."""
    groups: dict[tuple, list] = defaultdict(list)
    for s in p.syncs.rows:
        if s["what"] != WARMUP_WAIT:
            groups[(s["what"],) + _source_key(s)].append(s)
    findings = []
    for (what, *_), rows in groups.items():
        blocked = sum(s["duration_ns"] for s in rows)
        lost = sum(p.lost_overlap(s) for s in rows)
        if len(rows) < RECURRING_MIN_COUNT and lost < SYNC_MIN_LOST_NS:
            continue
        source, n = _source(rows[0]), len(rows)
        devices = {s["device"] for s in rows}
        loop = " - the same line again and again, so most likely in a loop" if n >= RECURRING_MIN_COUNT else ""
        cost = (f"Each wait drains the device's queue, and the device then idles while the host runs the Python "
                f"that follows and launches the next task: an estimated {format_ns(lost)} of device time lost.")
        if what.startswith("aten::") and what != "aten::_local_scalar_dense":
            kind, plain = "round_trip", _ROUND_TRIP_PLAIN.get(what.split(".")[0], what)
            title = f"Host round trip {what} at {location(source)}: {n}x, {format_ns(blocked)} blocked"
            explanation = (
                f"{what}{f' ({plain})' if plain != what else ''} at {_where(source)} ran {plural(n, 'time')} as "
                f"a host round trip{loop}: its output's shape depends on the data, so the host waits for the "
                f"device before it can go on ({format_ns(blocked)} blocked in total). {cost} Fix: keep shapes "
                "static - `torch.where(mask, x, 0)` or `x * mask` instead of `x[mask]`, `masked_fill` instead of "
                "boolean indexing, `torch.nonzero_static(x, size=k)` when a bound is known - or move it out of "
                "the hot loop.")
        else:
            kind, (plain, same) = "sync", _SYNC_PLAIN.get(what, (what, ""))
            fix = _SYNC_FIX.get(what, "avoid waiting for the device on this line, or wait less often")
            title = f"{plain} at {location(source)} waits for the device: {n}x, {format_ns(blocked)} blocked"
            explanation = (
                f"The host waited for the device {plural(n, 'time')} at {_where(source)}, in {plain} ({what})"
                f"{loop}; blocked {format_ns(blocked)} in total ({format_ns(blocked // n)} each). {cost} Fix: "
                f"{fix}.{f' ({same}.)' if same else ''}")
        lines = _Lines()
        lines.add(source, "wait", what, n, blocked)
        findings.append(_finding(
            kind, title, lost, devices.pop() if len(devices) == 1 else None, explanation, lines.top(p.top),
            {"what": what, "plain": plain, "count": n, "blocked_ns": blocked, "mean_ns": blocked // n,
             "max_ns": max(s["duration_ns"] for s in rows), "lost_overlap_ns": lost}))
    return findings


def _ping_pong(p: _Profile) -> list[dict[str, Any]]:
    direction = {c["task_id"]: c["direction"] for c in p.export.tables["copies"]}
    pairs: dict[tuple, list] = defaultdict(list)
    for d, dev in p.devices.items():
        download = None
        for t in dev.tasks:
            if direction.get(t["task_id"]) == "device_to_host":
                download = t
            elif direction.get(t["task_id"]) == "host_to_device" and download is not None:
                small, big = sorted((max(download["bytes_written"], 1), max(t["bytes_written"], 1)))
                if big <= PING_PONG_SIZE_RATIO * small:
                    pairs[(d,) + _source_key(download) + _source_key(t)].append((download, t))
                download = None
    findings = []
    for key, trips in pairs.items():
        if len(trips) < PING_PONG_MIN_PAIRS:
            continue
        d = key[0]
        down, up = _source(trips[0][0]), _source(trips[0][1])
        copy_ns = sum(a["duration_ns"] + b["duration_ns"] for a, b in trips)
        idle = sum(p.devices[d].idle_within(a["end_ns"], b["start_ns"]) for a, b in trips)
        nbytes = sum(a["bytes_written"] + b["bytes_written"] for a, b in trips)
        lines = _Lines()
        for a, b in trips:
            lines.add(down, "download", a["name"], time_ns=a["duration_ns"], nbytes=a["bytes_written"])
            lines.add(up, "upload", b["name"], time_ns=b["duration_ns"], nbytes=b["bytes_written"])
        explanation = (
            f"Data went from neuron:{d} to the host at {_where(down)} and back at {_where(up)} "
            f"{plural(len(trips), 'time')} "
            f"({format_bytes(nbytes / (2 * len(trips)))} each way): each round trip blocks the host on the "
            f"download, copies twice and leaves the device idle while the host computes "
            f"({format_ns(copy_ns)} copying, {format_ns(idle)} idle between download and upload). Fix: do the "
            "host-side step on the device instead (most NumPy and CPU tensor operations have a torch equivalent "
            "that runs on neuron), keep a host copy if the data does not change, or move the round trip out of "
            "the loop.")
        findings.append(_finding(
            "ping_pong", f"CPU<->device ping-pong: {location(down)} -> {location(up)}, {len(trips)} round trips",
            copy_ns + idle, d, explanation, lines.top(p.top),
            {"device": d, "pairs": len(trips), "bytes": nbytes, "copy_ns": copy_ns, "idle_between_ns": idle,
             "download": down, "upload": up}))
    return findings


def _launch_overhead(p: _Profile) -> list[dict[str, Any]]:
    findings = []
    for d, dev in p.devices.items():
        idle_before = {id(after): s_after - e_before for e_before, s_after, _, after in dev.gaps()}
        bound, intervals = [], 0
        for prev, t in zip(dev.tasks, dev.tasks[1:]):
            interval = t["enqueue_ns"] - prev["enqueue_ns"]
            if 0 < interval < IDLE_GAP_MIN_NS and t["duration_ns"] < LAUNCH_BOUND_RATIO * interval:
                bound.append(t)
                intervals += interval
        if len(bound) < LAUNCH_BOUND_MIN_TASKS:
            continue
        # Longer gaps are the idle_gaps finding's.
        idle = [i if i < IDLE_GAP_MIN_NS else 0 for i in (idle_before.get(id(t), 0) for t in bound)]
        idle_ns = sum(idle)
        if idle_ns < LAUNCH_BOUND_MIN_IDLE_NS:
            continue
        device_ns = sum(t["duration_ns"] for t in bound)
        lines = _Lines()
        for t, i in zip(bound, idle):
            lines.add(_source(t), "launch", t["name"], time_ns=i)
        mean_dur, mean_int = device_ns // len(bound), intervals // len(bound)
        explanation = (
            f"{len(bound)} tasks on neuron:{d} ({100 * len(bound) / len(dev.tasks):.0f}% of its tasks) run "
            f"{format_ns(mean_dur)} on average while the host launches one every {format_ns(mean_int)}: the "
            f"device waits for the host's per-launch overhead ({format_ns(idle_ns)} idle just before them). "
            "Fix: launch fewer, larger tasks - compile the model or step with torch.compile(model, "
            "backend=\"neuron\"), or capture the repeated step once with torch.accelerator.Graph() and replay "
            "it (CUDA-graph style); use foreach/fused optimizers (foreach=True) and larger batches.")
        findings.append(_finding(
            "launch_overhead",
            f"{len(bound)} tiny tasks on neuron:{d} are launch-bound ({format_ns(mean_dur)} each, one launch every "
            f"{format_ns(mean_int)})",
            idle_ns, d, explanation, lines.top(p.top),
            {"device": d, "tasks": len(bound), "task_pct": 100 * len(bound) / len(dev.tasks),
             "mean_duration_ns": mean_dur, "mean_interval_ns": mean_int, "device_ns": device_ns,
             "idle_ns": idle_ns}))
    return findings


def _memory_peaks(p: _Profile) -> list[dict[str, Any]]:
    by_device: dict[int, list] = defaultdict(list)
    for m in p.export.tables["memory"]:
        by_device[m["device"]].append(m)
    findings = []
    for d, events in sorted(by_device.items()):
        events.sort(key=lambda m: m["event_id"])
        peak_at = max(range(len(events)), key=lambda i: (events[i]["allocated_bytes"], -i))
        peak = events[peak_at]
        live: dict[int, dict] = {}
        for m in events[:peak_at + 1]:
            if m["bytes"] > 0:
                live[m["address"]] = m
            else:
                live.pop(m["address"], None)  # blocks from before the profile are not in `live`
        holders: dict[tuple, dict[str, Any]] = {}
        for m in live.values():
            h = holders.setdefault(_source_key(m) + (m["host_op"],),
                                   {**_source(m), "host_op": m["host_op"], "blocks": 0, "bytes": 0})
            h["blocks"] += 1
            h["bytes"] += m["bytes"]
        ranked = sorted(holders.values(), key=lambda h: -h["bytes"])
        before = peak["allocated_bytes"] - sum(h["bytes"] for h in ranked)
        lines = _Lines()
        for h in ranked[:p.top]:
            lines.add(h, "allocated", h["host_op"], h["blocks"], nbytes=h["bytes"])
        offset = peak["time_ns"] - p.export.summary["start_ns"]
        top_holder = (f" The largest holder, {format_bytes(ranked[0]['bytes'])} in "
                      f"{plural(ranked[0]['blocks'], 'block')}, "
                      f"was allocated by {ranked[0]['host_op'] or 'an op'} at {_where(ranked[0])}."
                      if ranked else "")
        explanation = (
            f"neuron:{d} peaked at {format_bytes(peak['allocated_bytes'])} allocated "
            f"({format_bytes(peak['reserved_bytes'])} reserved by the caching allocator), {format_ns(offset)} "
            f"into the profile. At that instant {plural(len(live), 'block')} allocated during the profile were live"
            f"{f' besides {format_bytes(before)} allocated before it' if before > 0 else ''}.{top_holder} Fix, if "
            "the peak limits you: free the biggest holders earlier (del what is no longer needed; store "
            "loss.detach() or .item() values rather than tensors that keep a graph alive), recompute "
            "activations in the backward pass with torch.utils.checkpoint, or lower the batch size or precision "
            "(bfloat16).")
        findings.append(_finding(
            "memory_peak", f"Peak memory on neuron:{d}: {format_bytes(peak['allocated_bytes'])}"
            + (f", mostly from {location(ranked[0])}" if ranked else ""),
            0, d, explanation, lines.top(p.top),
            {"device": d, "peak_bytes": peak["allocated_bytes"], "time_ns": peak["time_ns"],
             "reserved_bytes": peak["reserved_bytes"], "live_blocks": len(live), "before_profile_bytes": before,
             "holders": ranked[:p.top]}))
    return findings


def _exposed_communication(p: _Profile) -> list[dict[str, Any]]:
    groups: dict[tuple, list] = defaultdict(list)
    for c in p.export.tables["collectives"]:
        if c["start_ns"] > 0:
            groups[(c["device"], c["name"]) + _source_key(c)].append(c)
    findings = []
    for (d, name, *_), rows in groups.items():
        duration = sum(c["end_ns"] - c["start_ns"] for c in rows)
        overlapped = sum(c["overlapped_ns"] for c in rows)
        exposed = max(0, duration - overlapped)
        if exposed < IDLE_GAP_MIN_NS or exposed < COMM_EXPOSED_MIN_SHARE * duration:
            continue
        source = _source(rows[0])
        lines = _Lines()
        lines.add(source, "collective", name, len(rows), exposed, sum(c["bytes"] for c in rows))
        explanation = (
            f"{name} at {_where(source)} ran {plural(len(rows), 'time')} for {format_ns(duration)}, "
            f"{format_ns(exposed)} ({100 * exposed / max(duration, 1):.0f}%) of it with no compute running on neuron:{d}: the device "
            "waited for communication. Fix: overlap it with compute - launch it with async_op=True and wait "
            "only where the result is needed, let gradients be reduced in buckets during the backward pass "
            "(DistributedDataParallel does; tune bucket_cap_mb), and put independent work between the launch "
            "and the wait.")
        findings.append(_finding(
            "exposed_communication", f"{name} at {location(source)} not overlapped: {format_ns(exposed)} exposed",
            exposed, d, explanation, lines.top(p.top),
            {"name": name, "count": len(rows), "bytes": sum(c["bytes"] for c in rows), "duration_ns": duration,
             "overlapped_ns": overlapped, "exposed_ns": exposed}))
    return findings


_ANALYSES = (_idle_gaps, _top_tasks, _waits, _ping_pong, _launch_overhead, _memory_peaks, _exposed_communication)
_KIND_ORDER = ["idle_gaps", "sync", "round_trip", "ping_pong", "launch_overhead", "exposed_communication",
               "top_tasks", "memory_peak"]


# --------------------------------------------------------------------------- report

def _overview(p: _Profile) -> dict[str, Any]:
    s = p.export.summary
    wall = max(s["wall_ns"], 1)
    peaks: dict[int, int] = defaultdict(int)
    for m in p.export.tables["memory"]:
        peaks[m["device"]] = max(peaks[m["device"]], m["allocated_bytes"])
    warmup = sum(r["duration_ns"] for r in p.syncs.rows if r["what"] == WARMUP_WAIT)
    return {
        "wall_ns": s["wall_ns"],
        "device_busy_ns": s["device_busy_ns"],
        "device_busy_pct": 100 * s["device_busy_ns"] / (wall * max(len(p.devices), 1)),
        "host_blocked_ns": s["host_blocked_ns"],
        "host_blocked_pct": 100 * s["host_blocked_ns"] / wall,
        "warmup_blocked_ns": warmup,
        "sync_count": s["sync_count"],
        "task_count": s["task_count"],
        "host_op_count": s["host_op_count"],
        "peak_allocated_bytes": s["peak_allocated_bytes"],
        "devices": [{"device": d, "tasks": len(dev.tasks), "busy_ns": dev.busy_ns, "busy_pct": 100 * dev.busy_ns / wall,
                     "first_start_ns": dev.first_start_ns, "last_end_ns": dev.last_end_ns,
                     "peak_allocated_bytes": peaks.get(d, 0)} for d, dev in p.devices.items()],
    }


def analyse(export: Export | str | os.PathLike, top: int = 10) -> dict[str, Any]:
    """The report of an export (see the module docstring); ``top`` bounds every list."""
    if not isinstance(export, Export):
        export = load(export)
    p = _Profile(export, max(int(top), 1))
    findings = [f for analysis in _ANALYSES for f in analysis(p)]
    findings.sort(key=lambda f: (-f["impact_ns"], _KIND_ORDER.index(f["kind"])))
    s = export.summary
    return {
        "report_version": REPORT_VERSION,
        "directory": export.directory,
        "schema_version": s["schema_version"],
        "torchneuron_version": s["torchneuron_version"],
        "torch_version": s["torch_version"],
        "start_ns": s["start_ns"],
        "end_ns": s["end_ns"],
        "thresholds": {name: globals()[name] for name in (
            "IDLE_GAP_MIN_NS", "RECURRING_MIN_COUNT", "SYNC_MIN_LOST_NS", "LAUNCH_BOUND_RATIO",
            "LAUNCH_BOUND_MIN_TASKS", "LAUNCH_BOUND_MIN_IDLE_NS", "PING_PONG_SIZE_RATIO", "PING_PONG_MIN_PAIRS",
            "COMM_EXPOSED_MIN_SHARE",
            "GAP_HOST_OP_MIN_SHARE")},
        "overview": _overview(p),
        "findings": findings,
    }
