"""``torchneuron`` command line: ``torchneuron info``, ``torchneuron explore DIR``."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys


def _info() -> int:
    import torch

    import torchneuron
    from torchneuron import _C

    cfg = _C._config()
    p = _C._platform()
    print(f"torchneuron {torchneuron.__version__}  torch {torch.__version__}  python {platform.python_version()}")
    if cfg["error"]:
        print(f"environment error: {cfg['error']}")
        return 1
    print(f"platform: {p['target']} ({p['core_name']}, emulated)  cores per chip: {p['cores_per_chip']}")
    print(f"launch blocking: {cfg['launch_blocking']}")
    n = torch.neuron.device_count()
    print(f"devices: {n}")
    for i in range(n):
        props = torch.neuron.get_device_properties(i)
        free, total = torch.neuron.mem_get_info(i)
        print(f"  neuron:{i}  {props.name}  memory {total / 2**30:.2f} GiB (free {free / 2**30:.2f} GiB)"
              f"  SBUF {props.sbuf_bytes // 2**20} MiB  PSUM {props.psum_bytes // 2**20} MiB")
    return 0


def _explore(args: argparse.Namespace) -> int:
    from torchneuron.profiler import explore

    try:
        export = explore.load(args.directory)
    except explore.ExportError as e:
        print(f"torchneuron explore: {e}", file=sys.stderr)
        return 1
    report = explore.analyse(export, top=args.top)
    if args.format == "html":
        from torchneuron.profiler import report_html

        path = args.output or os.path.join(args.directory, "report.html")
        with open(path, "w", encoding="utf-8") as f:
            f.write(report_html.render(export, report))
        print(f"wrote {path}")
        return 0
    if args.format == "json":
        text = json.dumps(report, indent=2) + "\n"
    else:
        from torchneuron.profiler.report_text import format_text

        text = format_text(report)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchneuron", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="devices, platform, memory and versions")
    explore = sub.add_parser("explore", help="find what slows a profile down (a directory export_parquet wrote)")
    explore.add_argument("directory", help="the export directory")
    explore.add_argument("--format", choices=["text", "json", "html"], default="text",
                         help="text (default) or json to stdout, html to DIR/report.html")
    explore.add_argument("--output", "-o", help="write to this file instead")
    explore.add_argument("--top", type=_positive, default=10, help="rows per list (default 10)")
    args = parser.parse_args(argv)
    if args.command == "info":
        return _info()
    if args.command == "explore":
        return _explore(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
