"""``torchneuron explore --format html``: the report as one self-contained page.

Inline SVG and CSS only (no script, nothing fetched): a timeline with one
lane per device stream and one for host waits, idle gaps shaded; bar charts
of device time by task and by line; allocated memory over time; then the
findings. Tasks narrower than a pixel are merged into one mark per pixel run,
so the page stays small for tens of thousands of tasks.
"""

from __future__ import annotations

import html
from collections import defaultdict
from typing import Any, Iterable

from torchneuron.profiler.explore import (WARMUP_WAIT, Export, device_work, format_bytes, format_ns, location,
                                          short_path)
from torchneuron.profiler.report_text import (Table, devices_table, gap_activity, gaps_table, lines_table,
                                              overview_table)

PLOT_WIDTH = 1100  # px of the time axis
LABEL_WIDTH = 150  # px of the lane labels
LANE_HEIGHT = 18
# Marks closer than this (px) merge: finer detail is invisible anyway.
MERGE_PX = 1.0
BAR_ROWS = 15

_KIND_COLORS = {"kernel": "#4878d0", "copy": "#6acc64", "collective": "#d65f5f", "graph": "#956cb4"}
_MIXED_COLOR = "#8c8c8c"
_WAIT_COLOR, _WARMUP_COLOR = "#ee854a", "#c8c8c8"

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1320px; }
h1 { font-size: 20px; margin-bottom: 2px; } h2 { font-size: 17px; margin-top: 28px; }
.sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; margin: 6px 0; }
td, th { padding: 2px 10px 2px 0; text-align: left; vertical-align: top; }
th { color: #555; font-weight: 600; border-bottom: 1px solid #ddd; }
td.num, th.num { text-align: right; }
.finding { border: 1px solid #ddd; border-radius: 6px; padding: 8px 14px; margin: 12px 0; }
.finding h3 { font-size: 15px; margin: 4px 0; }
.kind { font: 12px monospace; background: #eef; padding: 1px 6px; border-radius: 4px; }
.impact { color: #a33; font-weight: 600; margin-left: 8px; }
.scroll { overflow-x: auto; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
.legend span { display: inline-block; width: 12px; height: 12px; margin: 0 4px -2px 12px; }
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


class _Axis:
    """Maps ns since the Unix epoch to px of the plot."""

    def __init__(self, start_ns: int, end_ns: int, width: float = PLOT_WIDTH):
        self.start, self.width = start_ns, width
        self.scale = width / max(end_ns - start_ns, 1)

    def x(self, t: int) -> float:
        return LABEL_WIDTH + (t - self.start) * self.scale

    def ticks(self) -> list[tuple[float, str]]:
        span = self.width / self.scale
        step = 1
        while span / step > 10:
            for factor in (2, 5, 10):
                if span / (step * factor) <= 10:
                    step *= factor
                    break
            else:
                step *= 10
        return [(self.x(self.start + k * step), format_ns(k * step)) for k in range(int(span // step) + 1)]


def _merged(intervals: Iterable[tuple[int, int, str, str]], axis: _Axis) -> list[dict[str, Any]]:
    """Marks for (start, end, name, category) intervals, merging runs closer than MERGE_PX."""
    marks: list[dict[str, Any]] = []
    for start, end, name, category in sorted(intervals):
        x0, x1 = axis.x(start), axis.x(end)
        last = marks[-1] if marks else None
        if last is not None and x0 <= last["x1"] + MERGE_PX:
            last["x1"] = max(last["x1"], x1)
            last["end"] = max(last["end"], end)
            last["count"] += 1
            last["busy"] += end - start
            last["names"][name] += 1
            last["categories"].add(category)
        else:
            marks.append({"x0": x0, "x1": x1, "start": start, "end": end, "count": 1, "busy": end - start,
                          "names": defaultdict(int, {name: 1}), "categories": {category}})
    return marks


def _mark_svg(m: dict[str, Any], y: float, height: float, color: str, axis: _Axis) -> str:
    when = f"+{format_ns(m['start'] - axis.start)}"
    if m["count"] == 1:
        tip = f"{next(iter(m['names']))} - {format_ns(m['busy'])} at {when}"
    else:
        top = sorted(m["names"].items(), key=lambda kv: -kv[1])[:3]
        tip = (f"{m['count']} merged, {format_ns(m['busy'])} busy from {when} to "
               f"+{format_ns(m['end'] - axis.start)}: " + ", ".join(f"{n} x{c}" for n, c in top))
    # A merged mark is as opaque as the share of its span its tasks ran.
    opacity = max(0.25, min(1.0, m["busy"] / max(m["end"] - m["start"], 1)))
    return (f'<rect x="{m["x0"]:.2f}" y="{y:.1f}" width="{max(m["x1"] - m["x0"], 0.6):.2f}" height="{height}" '
            f'fill="{color}" fill-opacity="{opacity:.2f}"><title>{_e(tip)}</title></rect>')


def _timeline(export: Export, report: dict[str, Any]) -> str:
    axis = _Axis(report["start_ns"], report["end_ns"])
    tasks = device_work(export.tables["tasks"])
    lanes: dict[tuple[int, int], list] = defaultdict(list)
    for t in tasks:
        label = f"{t['name']} ({location(_line(t))})"
        lanes[(t["device"], t["stream"])].append((t["start_ns"], t["end_ns"], label, t["kind"]))
    rows = [(f"neuron:{d} stream {s}", marks, (d, s)) for (d, s), marks in sorted(lanes.items())]
    waits = [(s["start_ns"], s["end_ns"], f"{s['what']} ({location(_line(s))})",
              "warmup" if s["what"] == WARMUP_WAIT else "wait") for s in export.tables["syncs"]]
    rows.append(("host waits", waits, None))

    top, pitch = 24, LANE_HEIGHT + 6
    height = top + pitch * len(rows) + 4
    parts = []
    lane_y = {key: top + i * pitch for i, (_, _, key) in enumerate(rows) if key is not None}
    # Idle gaps behind the lanes of their device.
    for f in report["findings"]:
        if f["kind"] != "idle_gaps":
            continue
        ys = [y for (d, _), y in lane_y.items() if d == f["device"]]
        for g in f["details"]["gaps"]:
            x0, x1 = axis.x(g["start_ns"]), axis.x(g["end_ns"])
            tip = (f"neuron:{f['device']} idle {format_ns(g['duration_ns'])} between {location(g['before'])} and "
                   f"{location(g['after'])}: " + ", ".join(gap_activity(g)[:3]))
            parts.append(f'<rect x="{x0:.2f}" y="{min(ys) - 3}" width="{max(x1 - x0, 1.5):.2f}" '
                         f'height="{max(ys) - min(ys) + LANE_HEIGHT + 6}" fill="#e03030" fill-opacity="0.18">'
                         f'<title>{_e(tip)}</title></rect>')
    for i, (label, intervals, _) in enumerate(rows):
        y = top + i * pitch
        parts.append(f'<text x="4" y="{y + LANE_HEIGHT - 5}">{_e(label)}</text>')
        parts.append(f'<line x1="{LABEL_WIDTH}" x2="{LABEL_WIDTH + PLOT_WIDTH}" y1="{y + LANE_HEIGHT / 2}" '
                     f'y2="{y + LANE_HEIGHT / 2}" stroke="#eee"/>')
        for m in _merged(intervals, axis):
            cats = m["categories"]
            if cats <= {"wait", "warmup"}:
                color = _WARMUP_COLOR if cats == {"warmup"} else _WAIT_COLOR
            else:
                color = _KIND_COLORS.get(next(iter(cats)), _MIXED_COLOR) if len(cats) == 1 else _MIXED_COLOR
            parts.append(_mark_svg(m, y, LANE_HEIGHT, color, axis))
    for x, text in axis.ticks():
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="14" y2="{height - 4}" stroke="#ccc" '
                     f'stroke-dasharray="2,3"/><text x="{x + 2:.1f}" y="11">{_e(text)}</text>')
    legend = "".join(f'<span style="background:{c}"></span>{_e(k)}' for k, c in
                     [*_KIND_COLORS.items(), ("merged mixed", _MIXED_COLOR), ("host wait", _WAIT_COLOR),
                      ("first-call warm-up", _WARMUP_COLOR), ("idle gap", "#f3c4c4")])
    return (f'<div class="legend">{legend}</div><div class="scroll">'
            f'<svg width="{LABEL_WIDTH + PLOT_WIDTH + 10}" height="{height}" role="img">{"".join(parts)}</svg></div>')


def _line(row: dict[str, Any]) -> dict[str, Any]:
    return {"file": row["source_file"], "line": row["source_line"]}


def _bars(rows: list[tuple[str, int, str]], title: str) -> str:
    """A horizontal bar chart of (label, value ns, tooltip)."""
    rows = rows[:BAR_ROWS]
    if not rows:
        return f"<p>No {_e(title)}.</p>"
    label_w, bar_w, pitch = 360, 600, 20
    biggest = max(v for _, v, _ in rows) or 1
    parts = []
    for i, (label, value, tip) in enumerate(rows):
        y = 4 + i * pitch
        # Cut the middle: the op name starts a label, the line number ends it.
        short = label if len(label) <= 52 else label[:22] + "..." + label[-27:]
        w = max(bar_w * value / biggest, 1)
        parts.append(f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end">{_e(short)}</text>'
                     f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{pitch - 5}" fill="#4878d0">'
                     f'<title>{_e(tip)}</title></rect>'
                     f'<text x="{label_w + w + 4:.1f}" y="{y + 12}">{_e(format_ns(value))}</text>')
    return (f'<svg width="{label_w + bar_w + 90}" height="{8 + pitch * len(rows)}" role="img">'
            f'{"".join(parts)}</svg>')


def _task_bars(report: dict[str, Any]) -> str:
    groups = next((f["details"]["groups"] for f in report["findings"] if f["kind"] == "top_tasks"), [])
    return _bars([(f"{g['name']} @ {location(g)}", g["device_ns"],
                   f"{g['name']} at {location(g)}: {g['count']} runs, {format_ns(g['device_ns'])}") for g in groups],
                 "tasks")


def _line_bars(export: Export) -> str:
    by_line: dict[tuple, list] = defaultdict(lambda: [0, 0])
    for t in device_work(export.tables["tasks"]):
        if t["start_ns"] > 0:
            entry = by_line[(t["source_file"], t["source_line"], t["source_function"])]
            entry[0] += t["end_ns"] - t["start_ns"]
            entry[1] += 1
    ranked = sorted(by_line.items(), key=lambda kv: -kv[1][0])
    return _bars([(f"{location({'file': f, 'line': n})} {fn}", ns,
                   f"{location({'file': f, 'line': n})}: {count} tasks, {format_ns(ns)}")
                  for (f, n, fn), (ns, count) in ranked], "source lines")


def _memory_chart(export: Export, report: dict[str, Any]) -> str:
    events: dict[int, list] = defaultdict(list)
    for m in export.tables["memory"]:
        events[m["device"]].append(m)
    if not events:
        return "<p>No allocator events.</p>"
    axis = _Axis(report["start_ns"], report["end_ns"])
    height, top = 160, 10
    peak = max(m["allocated_bytes"] for ms in events.values() for m in ms) or 1
    colors = list(_KIND_COLORS.values())
    parts = [f'<text x="4" y="{top + 10}">{_e(format_bytes(peak))}</text>',
             f'<text x="4" y="{top + height}">0</text>',
             f'<line x1="{LABEL_WIDTH}" x2="{LABEL_WIDTH + PLOT_WIDTH}" y1="{top + height}" y2="{top + height}" '
             f'stroke="#999"/>']
    for i, (d, ms) in enumerate(sorted(events.items())):
        ms.sort(key=lambda m: m["event_id"])
        # One point per pixel column: its highest value, so peaks survive.
        columns: dict[int, int] = {}
        for m in ms:
            col = int(axis.x(m["time_ns"]))
            columns[col] = max(columns.get(col, 0), m["allocated_bytes"])
        points, last_y = [], None
        for col in sorted(columns):
            y = top + height - height * columns[col] / peak
            if last_y is not None:
                points.append(f"{col:.0f},{last_y:.1f}")
            points.append(f"{col:.0f},{y:.1f}")
            last_y = y
        color = colors[i % len(colors)]
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{" ".join(points)}">'
                     f'<title>{_e(f"neuron:{d} allocated bytes")}</title></polyline>')
        best = max(ms, key=lambda m: m["allocated_bytes"])
        x, y = axis.x(best["time_ns"]), top + height - height * best["allocated_bytes"] / peak
        label = _e(f"neuron:{d} peak {format_bytes(best['allocated_bytes'])}")
        right = x > LABEL_WIDTH + 0.75 * PLOT_WIDTH  # keep the label inside the chart
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}"><title>{label}</title></circle>'
                     f'<text x="{x - 6 if right else x + 6:.1f}" y="{y + 4:.1f}" '
                     f'text-anchor="{"end" if right else "start"}">{label}</text>')
    for x, text in axis.ticks():
        parts.append(f'<text x="{x:.1f}" y="{top + height + 14}">{_e(text)}</text>')
    return (f'<div class="scroll"><svg width="{LABEL_WIDTH + PLOT_WIDTH + 10}" height="{top + height + 20}" '
            f'role="img">{"".join(parts)}</svg></div>')


def _table(table: Table) -> str:
    def cells(row: list[str], tag: str) -> str:
        return "".join(f'<{tag} class="num">{_e(c)}</{tag}>' if i in table.numeric else f"<{tag}>{_e(c)}</{tag}>"
                       for i, c in enumerate(row))

    head = f"<tr>{cells(table.header, 'th')}</tr>" if table.header else ""
    body = "".join(f"<tr>{cells(row, 'td')}</tr>" for row in table.rows)
    return f"<table>{head}{body}</table>"


def _finding_html(n: int, f: dict[str, Any], start_ns: int) -> str:
    impact = f"impact {format_ns(f['impact_ns'])}" if f["impact_ns"] else "no time impact"
    out = [f'<div class="finding" id="finding-{n}"><h3>{n}. {_e(f["title"])}</h3>'
           f'<span class="kind">{_e(f["kind"])}</span><span class="impact">{_e(impact)}</span>'
           f'<p>{_e(f["explanation"])}</p>']
    if f["kind"] == "idle_gaps":
        out.append(_table(gaps_table(f, start_ns)))
    if f["lines"]:
        out.append(_table(lines_table(f["lines"])))
    out.append("</div>")
    return "".join(out)


def render(export: Export, report: dict[str, Any]) -> str:
    """The page for ``report`` (from ``explore.analyse(export)``)."""
    overview, devices = _table(overview_table(report)), _table(devices_table(report))
    findings = "".join(_finding_html(n, f, report["start_ns"]) for n, f in enumerate(report["findings"], 1)) \
        or "<p>No findings.</p>"
    title = f"torchneuron explore: {short_path(report['directory'])}"
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{_CSS}</style></head><body>"
        f"<h1>{_e(title)}</h1><p class=\"sub\">schema {_e(report['schema_version'])}, torchneuron "
        f"{_e(report['torchneuron_version'])}, torch {_e(report['torch_version'])}</p>"
        f"<h2>Overview</h2>{overview}{devices}"
        f"<h2>Timeline</h2><p class=\"sub\">Hover a mark for details. Marks closer than a pixel are merged; a "
        "merged mark is as opaque as the share of its span that its tasks ran.</p>"
        f"{_timeline(export, report)}"
        f"<h2>Device time by task and line</h2>{_task_bars(report)}"
        f"<h2>Device time by source line</h2>{_line_bars(export)}"
        f"<h2>Allocated memory</h2>{_memory_chart(export, report)}"
        f"<h2>Findings, largest estimated impact first</h2>{findings}"
        "</body></html>\n")
