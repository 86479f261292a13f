"""Operator conformance: every OpInfo of PyTorch's op database at every dtype
it supports on CPU (among DTYPES), every module of its module_db, on neuron
against CPU. Writes the coverage report `docs/op_coverage.md`.

    python -m tests.conformance.run [--samples N] [--ops NAME ...] [--jobs J] [--report PATH]

`make conformance` runs it whole. See op_checks.py, error_checks.py and
module_checks.py for what is compared, known.py for the cases that are not
plain comparisons.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import multiprocessing
import sys
import time
import warnings
from pathlib import Path

import torch

import torchneuron

from . import known

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.complex64, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool,
          # OpInfo has CPU float8 samples for a few ops only (_scaled_mm, eye, ...), checked all the same.
          torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
MODULE_DTYPES = [torch.float32, torch.float64]
REPORT = Path(__file__).resolve().parents[2] / "docs" / "op_coverage.md"
PARTS = ("forward", "inputs_intact", "inplace", "out", "grad")


def _short(dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_ops(names: list[str], max_samples: int | None) -> list[dict]:
    """One record per (op, dtype), plus one per op for its error inputs."""
    from torch.testing._internal.common_methods_invocations import op_db

    from .error_checks import check_errors
    from .op_checks import OpCheck, Result, _message, op_name, summarize

    records = []
    for op in op_db:
        name = op_name(op)
        if name not in names:
            continue
        supported = op.supported_dtypes("cpu")
        for dtype in DTYPES:
            if dtype not in supported:
                continue
            reason = known.impossible(name, dtype)
            torchneuron.clear_op_tracking()
            if reason:
                parts = {"all": Result("impossible", reason)}
                status = parts["all"]
            else:
                try:
                    parts = OpCheck(op, dtype, max_samples=max_samples).run()
                except Exception as e:  # noqa: BLE001 - one broken check must not end the run
                    parts = {"forward": Result("error", "harness: " + _message(e))}
                status = summarize(parts)
            host = bool(torchneuron.get_fallback_ops()) and status.status == "pass"
            records.append({"kind": "op", "op": name, "dtype": _short(dtype),
                            "status": "host round trip" if host else status.status, "detail": status.detail,
                            "parts": {p: r.status for p, r in parts.items()}})
        try:
            result, count = check_errors(op)
        except Exception as e:  # noqa: BLE001
            result, count = Result("error", "harness: " + _message(e)), 0
        records.append({"kind": "errors", "op": name, "status": result.status, "detail": result.detail,
                        "count": count})
    return records


def check_modules(names: list[str], max_inputs: int | None) -> list[dict]:
    from torch.testing._internal.common_modules import module_db

    from .module_checks import check_module
    from .op_checks import Result, _message

    records = []
    for info in module_db:
        if info.name not in names:
            continue
        for dtype in MODULE_DTYPES:
            if dtype not in info.dtypes:
                continue
            torchneuron.clear_op_tracking()
            try:
                result = check_module(info, dtype, max_inputs=max_inputs)
            except Exception as e:  # noqa: BLE001
                result = Result("error", "harness: " + _message(e))
            records.append({"kind": "module", "op": info.name, "dtype": _short(dtype), "status": result.status,
                            "detail": result.detail, "aten_ops": sorted(torchneuron.get_executed_ops())})
    return records


def _work(job):
    kind, names, limit = job
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")  # deprecations and beta notes of the ops under test
    return check_ops(names, limit) if kind == "ops" else check_modules(names, limit)


def run(op_names, module_names, *, samples, jobs) -> list[dict]:
    chunks = [("ops", op_names[i::16], samples) for i in range(16)]
    chunks += [("modules", module_names[i::2], samples) for i in range(2)]
    start, records = time.time(), []
    # Fresh worker processes (spawn): the device must not be forked.
    with multiprocessing.get_context("spawn").Pool(jobs, maxtasksperchild=1) as pool:
        for done, part in enumerate(pool.imap_unordered(_work, chunks), 1):
            records += part
            print(f"[{done}/{len(chunks)}] {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    return records


def write_report(records: list[dict], path: Path, command: str, seconds: float) -> dict:
    ops = [r for r in records if r["kind"] == "op"]
    errors = [r for r in records if r["kind"] == "errors"]
    modules = [r for r in records if r["kind"] == "module"]
    count = collections.Counter(r["status"] for r in ops)
    checked = sum(v for k, v in count.items() if k not in ("skipped",))
    good = count["pass"] + count["host round trip"]
    err_count = collections.Counter(r["status"] for r in errors)
    mod_count = collections.Counter(r["status"] for r in modules)
    mod_checked = sum(v for k, v in mod_count.items() if k != "skipped")
    module_ops = sorted({o for r in modules for o in r["aten_ops"]})
    part_count = {p: collections.Counter(r["parts"].get(p, "skipped") for r in ops) for p in PARTS}
    summary = {"pairs": checked, "pairs_passing": good, "pair_rate": good / max(checked, 1),
               "modules": mod_checked, "modules_passing": mod_count["pass"],
               "error_ops": sum(v for k, v in err_count.items() if k != "skipped"), "error_ops_passing": err_count["pass"]}
    lines = [
        "# Operator coverage",
        "",
        f"Generated by `{command}` on {datetime.date.today()} in {seconds / 60:.0f} min (torch {torch.__version__}).",
        "",
        f"- **(op, dtype) pairs: {good} / {checked} pass ({100 * summary['pair_rate']:.2f} %)**: "
        f"{count['pass']} pass, {count['host round trip']} pass with a host round trip, {count['fail']} fail "
        f"(wrong values), {count['error']} error, {count['impossible']} impossible (listed below); "
        f"{count['skipped']} skipped (no sample input runs on CPU).",
        f"- **torch.nn modules (module_db): {mod_count['pass']} / {mod_checked} (module, dtype) pairs pass** "
        f"(forward, buffers, input and parameter gradients; train and eval); {len(module_ops)} distinct ATen "
        "ops ran on neuron in them.",
        f"- **Error parity: {err_count['pass']} / {summary['error_ops']} ops raise CPU's exception type** for "
        f"every one of their error inputs ({sum(r['count'] for r in errors)} error inputs), leaving no device "
        "memory allocated and other tensors intact.",
        "",
        "Each (op, dtype) runs every sample input of the OpInfo (and its noncontiguous twin) on neuron and on "
        "CPU. Parts: forward values; inputs left intact; the in-place variant on a copy and on a strided view; "
        "`out=` with right-sized and with empty outputs; gradients (float32/float64, differentiable ops). "
        "A pair passes when every part that applies passes; \"host round trip\" means it passed but some op "
        "had to synchronise with the host (data-dependent output shapes).",
        "",
        "| part | pass | fail | error | not applicable |",
        "|---|---|---|---|---|",
    ]
    for p in PARTS:
        c = part_count[p]
        lines.append(f"| {p} | {c['pass']} | {c['fail']} | {c['error']} | {c['skipped'] + c['impossible']} |")
    lines += ["", "## Known cases (tests/conformance/known.py)", "", "| op | dtype | treatment | reason |",
              "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in known.table()]
    lines += ["", "## Not passing", "", "| op | dtype | status | detail |", "|---|---|---|---|"]
    for r in sorted(ops + modules, key=lambda r: (r["op"], r["dtype"])):
        if r["status"] in ("fail", "error"):
            lines.append(f"| {r['op']} | {r['dtype']} | {r['status']} | {_cell(r['detail'])} |")
    for r in sorted(errors, key=lambda r: r["op"]):
        if r["status"] in ("fail", "error"):
            lines.append(f"| {r['op']} | error inputs | {r['status']} | {_cell(r['detail'])} |")
    lines += ["", "## torch.nn modules", "", "| module | float32 | float64 |", "|---|---|---|"]
    by_module = collections.defaultdict(dict)
    for r in modules:
        by_module[r["op"]][r["dtype"]] = r["status"]
    for name in sorted(by_module):
        lines.append(f"| {name} | {by_module[name].get('float32', '')} | {by_module[name].get('float64', '')} |")
    lines += ["", "ATen ops the modules ran on neuron: " + ", ".join(f"`{o}`" for o in module_ops), ""]
    lines += ["## All pairs", "", "| op | " + " | ".join(_short(d) for d in DTYPES) + " | error inputs |",
              "|---|" + "---|" * (len(DTYPES) + 1)]
    cells = collections.defaultdict(dict)
    for r in ops:
        cells[r["op"]][r["dtype"]] = r["status"]
    err_by_op = {r["op"]: r for r in errors}
    label = {"pass": "pass", "host round trip": "host", "fail": "FAIL", "error": "ERROR", "skipped": "skip",
             "impossible": "n/a"}
    for name in sorted(cells):
        row = [label[cells[name][_short(d)]] if _short(d) in cells[name] else "" for d in DTYPES]
        e = err_by_op.get(name)
        row.append(label[e["status"]] + (f" ({e['count']})" if e and e["count"] else "") if e else "")
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    path.write_text("\n".join(lines) + "\n")
    return summary


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")[:300]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=None, help="sample inputs per (op, dtype); default all")
    parser.add_argument("--ops", nargs="*", help="only these OpInfo / module names")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--report", type=Path, default=REPORT)
    parser.add_argument("--json", type=Path, help="also write the raw records here")
    args = parser.parse_args(argv)
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.common_modules import module_db

    from .op_checks import op_name

    op_names = [op_name(op) for op in op_db]  # unique
    module_names = [m.name for m in module_db]
    if args.ops:
        op_names = [n for n in op_names if any(n == o or n.startswith(o + ".") for o in args.ops)]
        module_names = [n for n in module_names if n in args.ops]
    start = time.time()
    records = run(op_names, module_names, samples=args.samples, jobs=args.jobs)
    given = argv if argv is not None else sys.argv[1:]
    # Where the output goes is not part of what was measured.
    options = [a for i, a in enumerate(given)
               if not a.startswith(("--json", "--report")) and not (i and given[i - 1] in ("--json", "--report"))]
    command = "python -m tests.conformance.run" + "".join(f" {a}" for a in options) if options else "make conformance"
    summary = write_report(records, args.report, command, time.time() - start)
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
