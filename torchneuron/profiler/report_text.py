"""``torchneuron explore`` as text: the report for a terminal, and the
tables the text and the HTML renderings share."""

from __future__ import annotations

import textwrap
from typing import Any, NamedTuple

from torchneuron.profiler.explore import (GAP_HOST_OP_MIN_SHARE, WARMUP_WAIT, format_bytes, format_ns, location,
                                          plural, short_path)


class Table(NamedTuple):
    """Rows of cells for the text and the HTML renderings; ``numeric``: right-aligned columns."""
    header: list[str]
    rows: list[list[str]]
    numeric: frozenset[int]


def overview_table(report: dict[str, Any]) -> Table:
    o = report["overview"]
    warmup = f" ({format_ns(o['warmup_blocked_ns'])} of it first-call warm-up)" if o["warmup_blocked_ns"] else ""
    return Table([], [
        ["wall time", format_ns(o["wall_ns"]), ""],
        ["device busy", format_ns(o["device_busy_ns"]),
         f"{o['device_busy_pct']:.1f}% of wall time on {plural(len(o['devices']), 'device')}"],
        ["host blocked", format_ns(o["host_blocked_ns"]),
         f"{o['host_blocked_pct']:.1f}% of wall time, {plural(o['sync_count'], 'wait')}{warmup}"],
        ["tasks", str(o["task_count"]), ""],
        ["peak memory", format_bytes(o["peak_allocated_bytes"]), "allocated, highest device"],
    ], frozenset({1}))


def devices_table(report: dict[str, Any]) -> Table:
    return Table(["device", "tasks", "busy", "busy %", "peak memory"], [
        [f"neuron:{d['device']}", str(d["tasks"]), format_ns(d["busy_ns"]), f"{d['busy_pct']:.1f}%",
         format_bytes(d["peak_allocated_bytes"])] for d in report["overview"]["devices"]], frozenset({1, 2, 3, 4}))


def gaps_table(finding: dict[str, Any], start_ns: int) -> Table:
    """The gaps of an idle_gaps finding; times relative to ``start_ns``."""
    return Table(["at", "idle", "after the task of", "before the task of", "host meanwhile"], [
        [f"+{format_ns(g['start_ns'] - start_ns)}", format_ns(g["duration_ns"]),
         f"{location(g['before'])} {g['before']['task']}", f"{location(g['after'])} {g['after']['task']}",
         ", ".join(gap_activity(g)[:3])] for g in finding["details"]["gaps"]], frozenset({0, 1}))


def gap_activity(gap: dict[str, Any]) -> list[str]:
    """What the host did during a gap, largest first, in a few words each."""
    shown = GAP_HOST_OP_MIN_SHARE * gap["duration_ns"]
    items = [(s["in_gap_ns"], f"{'warm-up' if s['what'] == WARMUP_WAIT else s['what']} at {location(s)}")
             for s in gap["syncs"] if s["in_gap_ns"] >= shown]
    items += [(o["overlap_ns"], o["name"]) for o in gap["host_ops"]]
    if gap["untracked_ns"] >= shown:
        items.append((gap["untracked_ns"], "no torch op (Python)"))
    return [f"{text} {format_ns(ns)}" for ns, text in sorted(items, key=lambda i: -i[0])]


def lines_table(lines: list[dict[str, Any]]) -> Table:
    """A finding's source lines; the time and bytes columns only when some row has them."""
    show_time, show_bytes = any(e["time_ns"] for e in lines), any(e["bytes"] for e in lines)
    header = ["line", "function", "role", "what", "count"] + ["time"] * show_time + ["bytes"] * show_bytes
    rows = [[location(e), e["function"], e["role"], e["label"] + (" (backward)" if e["from"] == "forward" else ""),
             f"{e['count']}x"] + [format_ns(e["time_ns"])] * show_time + [format_bytes(e["bytes"])] * show_bytes
            for e in lines]
    return Table(header, rows, frozenset(range(4, len(header))))


# --------------------------------------------------------------------------- text

def _text_table(table: Table, indent: str) -> list[str]:
    rows = ([table.header] if table.header else []) + table.rows
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [(indent + "  ".join(c.rjust(w) if i in table.numeric else c.ljust(w)
                                for i, (c, w) in enumerate(zip(r, widths)))).rstrip() for r in rows]


def format_text(report: dict[str, Any], width: int = 100) -> str:
    """The report for a terminal: paths relative to the working directory."""
    out = [f"torchneuron explore {short_path(report['directory'])}",
           f"  schema {report['schema_version']}, torchneuron {report['torchneuron_version']}, "
           f"torch {report['torch_version']}", "", "Overview"]
    out += _text_table(overview_table(report), "  ")
    if report["overview"]["devices"]:
        out += [""] + _text_table(devices_table(report), "  ")
    out += ["", "Findings, largest estimated impact first" if report["findings"] else "No findings."]
    wrap = textwrap.TextWrapper(width=width, initial_indent="     ", subsequent_indent="     ")
    for n, f in enumerate(report["findings"], 1):
        impact = f"impact {format_ns(f['impact_ns'])}" if f["impact_ns"] else "no time impact"
        out += ["", f"{n:2d}. {f['title']}", f"     [{f['kind']}] {impact}"]
        out += wrap.wrap(f["explanation"])
        if f["kind"] == "idle_gaps":
            out += ["     biggest gaps:"] + _text_table(gaps_table(f, report["start_ns"]), "       ")
        if f["lines"]:
            out += ["     source lines:"] + _text_table(lines_table(f["lines"]), "       ")
    return "\n".join(out) + "\n"
