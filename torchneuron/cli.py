"""``torchneuron`` command line: ``torchneuron info``."""

from __future__ import annotations

import argparse
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchneuron", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="devices, platform, memory and versions")
    args = parser.parse_args(argv)
    if args.command == "info":
        return _info()
    return 2


if __name__ == "__main__":
    sys.exit(main())
