"""torchneuron explore: finds problems planted in a real profile of the neuron device.

The workload below plants an ``.item()`` and a ``nonzero`` in loops, a
CPU<->device ping-pong, an idle gap (a sleep between device work) and a large
block held across the memory peak, each on a line marked ``# PLANT: <name>``;
the tests look for them at those lines with the counts the workload's
constants give.
"""

import html
import inspect
import json
import os
import re
import shutil
import time

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from torchneuron import cli  # noqa: E402
from torchneuron.profiler import SCHEMA_VERSION, explore, export_parquet, report_html  # noqa: E402

ITEM_LOOPS = 6
ROUND_TRIPS = 3
PING_PONGS = 4
SLEEP_S = 0.05
HELD_BYTES = 2**20  # far above anything else the workload allocates


def _workload(x: torch.Tensor, sleep_s: float) -> float:
    held = torch.zeros(HELD_BYTES // 4, device="neuron")  # PLANT: held
    total = 0.0
    for _ in range(ITEM_LOOPS):
        y = x @ x
        total += y.sum().item()  # PLANT: item
    for _ in range(ROUND_TRIPS):
        total += len(torch.nonzero(y > 0))  # PLANT: round trip
    for _ in range(PING_PONGS):
        on_host = y.cpu()  # PLANT: download
        y = (on_host * 0.5).to("neuron")  # PLANT: upload
    before = y + 1  # PLANT: before gap
    torch.neuron.synchronize()  # the device is idle when the sleep starts: the gap lasts at least the sleep
    time.sleep(sleep_s)
    after = before * 2  # PLANT: after gap
    return total + after.sum().item() + held[0].item()


def _line(marker: str) -> int:
    source, first = inspect.getsourcelines(_workload)
    hits = [first + i for i, text in enumerate(source) if text.rstrip().endswith(f"# PLANT: {marker}")]
    assert len(hits) == 1, marker
    return hits[0]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """One profile of the workload, exported, with the allocator's own peak for it."""
    x = torch.randn(32, 32, device="neuron")
    _workload(x, 0)  # first calls of the ops (their one-off warm-up waits) happen outside the profile
    torch.neuron.synchronize()
    torch.neuron.reset_peak_memory_stats()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        _workload(x, SLEEP_S)
    directory = tmp_path_factory.mktemp("profile") / "export"
    export_parquet(prof, directory)
    return {"dir": str(directory), "peak": torch.neuron.max_memory_allocated()}


@pytest.fixture(scope="module")
def report(export):
    return explore.analyse(export["dir"])


def _at(entry: dict, marker: str) -> bool:
    return bool(entry["file"]) and os.path.realpath(entry["file"]) == os.path.realpath(__file__) \
        and entry["line"] == _line(marker)


def _findings(report: dict, kind: str) -> list[dict]:
    return [f for f in report["findings"] if f["kind"] == kind]


def test_item_in_a_loop_is_found_at_its_line_with_its_count(report):
    found = [f for f in _findings(report, "sync") if any(_at(e, "item") for e in f["lines"])]
    assert len(found) == 1, [f["title"] for f in report["findings"]]
    f = found[0]
    assert f["details"]["what"] == "aten::_local_scalar_dense"
    assert f["details"]["count"] == ITEM_LOOPS
    assert ".item()" in f["title"] and f"test_explore.py:{_line('item')}" in f["title"]
    assert f["details"]["blocked_ns"] > 0 and f["impact_ns"] <= f["details"]["blocked_ns"]


def test_data_dependent_op_in_a_loop_is_a_round_trip_at_its_line(report):
    found = [f for f in _findings(report, "round_trip") if any(_at(e, "round trip") for e in f["lines"])]
    assert len(found) == 1, [f["title"] for f in report["findings"]]
    assert found[0]["details"]["what"].startswith("aten::nonzero")
    assert found[0]["details"]["count"] == ROUND_TRIPS


def test_ping_pong_is_found_at_the_download_and_upload_lines(report):
    found = _findings(report, "ping_pong")
    assert len(found) == 1, [f["title"] for f in report["findings"]]
    d = found[0]["details"]
    assert _at(d["download"], "download") and _at(d["upload"], "upload")
    assert d["pairs"] == PING_PONGS
    assert d["bytes"] == 2 * PING_PONGS * 32 * 32 * 4
    roles = {e["role"]: e for e in found[0]["lines"]}
    assert _at(roles["download"], "download") and roles["download"]["count"] == PING_PONGS
    assert _at(roles["upload"], "upload") and roles["upload"]["count"] == PING_PONGS


def test_sleep_between_device_work_is_an_idle_gap_between_its_lines(report):
    (f,) = [f for f in _findings(report, "idle_gaps") if f["device"] == 0]
    gaps = [g for g in f["details"]["gaps"] if _at(g["before"], "before gap") and _at(g["after"], "after gap")]
    assert len(gaps) == 1, f["details"]["gaps"]
    assert gaps[0]["duration_ns"] >= SLEEP_S * 1e9
    # Sleeping is plain Python: no torch op ran on the host for most of it.
    assert gaps[0]["untracked_ns"] >= SLEEP_S * 1e9 / 2
    assert f["impact_ns"] >= gaps[0]["duration_ns"]
    assert any(e["role"] == "before gap" and _at(e, "before gap") for e in f["lines"])
    assert any(e["role"] == "after gap" and _at(e, "after gap") for e in f["lines"])


def test_memory_peak_matches_the_allocator_and_names_the_held_block(report, export):
    (f,) = [f for f in _findings(report, "memory_peak") if f["device"] == 0]
    assert f["details"]["peak_bytes"] == export["peak"]
    top = f["details"]["holders"][0]
    assert _at(top, "held") and top["bytes"] >= HELD_BYTES


def test_findings_are_sorted_by_impact(report):
    impacts = [f["impact_ns"] for f in report["findings"]]
    assert impacts == sorted(impacts, reverse=True)


# The keys the module docstring documents.
REPORT_KEYS = {"report_version", "directory", "schema_version", "torchneuron_version", "torch_version", "start_ns",
               "end_ns", "thresholds", "overview", "findings"}
OVERVIEW_KEYS = {"wall_ns", "device_busy_ns", "device_busy_pct", "host_blocked_ns", "host_blocked_pct",
                 "warmup_blocked_ns", "sync_count", "task_count", "host_op_count",
                 "peak_allocated_bytes", "devices"}
DEVICE_KEYS = {"device", "tasks", "busy_ns", "busy_pct", "first_start_ns", "last_end_ns", "peak_allocated_bytes"}
FINDING_KEYS = {"kind", "title", "impact_ns", "device", "explanation", "lines", "details"}
LINE_KEYS = {"file", "line", "function", "from", "role", "label", "count", "time_ns", "bytes"}
KINDS = {"idle_gaps", "top_tasks", "sync", "round_trip", "ping_pong", "launch_overhead", "memory_peak",
         "exposed_communication"}


def test_json_output_is_valid_and_has_the_documented_keys(export, capsys):
    assert cli.main(["explore", export["dir"], "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in REPORT_KEYS | OVERVIEW_KEYS | DEVICE_KEYS | FINDING_KEYS | LINE_KEYS | KINDS:
        assert key in explore.__doc__, f"{key} is not documented"
    assert set(report) == REPORT_KEYS
    assert set(report["overview"]) == OVERVIEW_KEYS
    assert [set(d) for d in report["overview"]["devices"]] == [DEVICE_KEYS]
    assert {f["kind"] for f in report["findings"]} <= KINDS
    for f in report["findings"]:
        assert set(f) == FINDING_KEYS
        assert all(set(e) == LINE_KEYS for e in f["lines"])
    assert report["overview"]["task_count"] == len(pq.read_table(os.path.join(export["dir"], "tasks.parquet")))


def test_html_is_self_contained_and_holds_the_findings(export, report, tmp_path):
    path = tmp_path / "report.html"
    assert cli.main(["explore", export["dir"], "--format", "html", "--output", str(path)]) == 0
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "<script" not in page and "<link" not in page and "@import" not in page
    (item,) = [f for f in _findings(report, "sync") if any(_at(e, "item") for e in f["lines"])]
    assert html.escape(item["title"]) in page


def test_html_defaults_to_the_export_directory(export, tmp_path):
    directory = tmp_path / "copy"
    shutil.copytree(export["dir"], directory)
    assert cli.main(["explore", str(directory), "--format", "html"]) == 0
    assert (directory / "report.html").is_file()


def test_text_output_through_the_cli_names_the_planted_lines(export, capsys):
    assert cli.main(["explore", export["dir"], "--top", "5"]) == 0
    text = capsys.readouterr().out
    assert "Overview" in text and "Findings" in text
    for marker in ("item", "download", "upload", "before gap", "after gap"):
        assert f"test_explore.py:{_line(marker)}" in text, marker


def test_a_directory_that_is_no_export_is_refused_clearly(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a profile")
    with pytest.raises(explore.ExportError, match="is not a torchneuron profile export.*export_parquet"):
        explore.load(tmp_path)
    assert cli.main(["explore", str(tmp_path)]) == 1
    assert "is not a torchneuron profile export" in capsys.readouterr().err
    with pytest.raises(explore.ExportError, match="is not a directory"):
        explore.load(tmp_path / "missing")


def _with_schema_version(source: str, target, version: str) -> str:
    shutil.copytree(source, target)
    path = os.path.join(target, "summary.parquet")
    table = pq.read_table(path)
    table = table.set_column(table.schema.get_field_index("schema_version"), "schema_version",
                             pa.array([version] * table.num_rows, pa.string()))
    pq.write_table(table, path)
    return str(target)


def test_another_major_schema_version_is_refused_clearly(export, tmp_path):
    newer = f"{int(SCHEMA_VERSION.split('.')[0]) + 1}.0"
    directory = _with_schema_version(export["dir"], tmp_path / "newer", newer)
    with pytest.raises(explore.ExportError, match=rf"schema version {re.escape(newer)}.*reads schema "
                                                  rf"{re.escape(SCHEMA_VERSION.split('.')[0])}\.x"):
        explore.load(directory)


def test_a_later_minor_schema_version_is_read(export, tmp_path):
    directory = _with_schema_version(export["dir"], tmp_path / "minor", f"{SCHEMA_VERSION.split('.')[0]}.99")
    assert explore.analyse(directory)["schema_version"].endswith(".99")


def test_report_html_render_escapes_text(export):
    loaded = explore.load(export["dir"])
    report = explore.analyse(loaded)
    report["findings"].insert(0, {**report["findings"][0], "title": "<b>&'\"</b>", "explanation": "<script>x</script>"})
    page = report_html.render(loaded, report)
    assert "<b>&" not in page and "<script>" not in page
    assert "&lt;b&gt;&amp;" in page
