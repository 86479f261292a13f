"""Make this checkout's torchneuron importable in another virtual environment, without rebuilding.

``make test-vllm`` runs vLLM in its own environment (``.venv-vllm``: vLLM's
pins would change the main one). ``pip install -e .`` there would compile the
extension a second time, in place, against that environment's torch headers;
both environments hold the same torch wheel (2.13.0+cpu), so the extension
built by ``make build`` loads as it is. This writes what an editable install
would: a ``.pth`` pointing at the checkout and a ``torchneuron`` dist-info with
the entry points of ``pyproject.toml`` (``torch.backends`` autoload,
``torch_dynamo_backends``, ``vllm.platform_plugins``), which vLLM's plugin
discovery reads.

Usage: ``<env>/bin/python tests/vllm/link_torchneuron.py [--main-python PATH]``
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import sysconfig
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--main-python", help="the interpreter the extension was built with (checks torch matches)")
    args = parser.parse_args()

    if not glob.glob(os.path.join(ROOT, "torchneuron", "_C*.so")):
        sys.exit(f"no built extension in {ROOT}/torchneuron: run `make build` first")
    import torch

    if args.main_python:
        built = subprocess.run(
            [args.main_python, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
            check=True, capture_output=True, text=True, env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        ).stdout.strip()
        if built != torch.__version__:
            sys.exit(f"torch {torch.__version__} here, but the extension was built against torch {built}")

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    site = sysconfig.get_paths()["purelib"]
    dist = os.path.join(site, f"torchneuron-{project['version']}.dist-info")
    os.makedirs(dist, exist_ok=True)
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: torchneuron\nVersion: {project['version']}\n",
        "INSTALLER": "tests/vllm/link_torchneuron.py\n",
        "entry_points.txt": "".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
            for group, eps in project.get("entry-points", {}).items()
        ) + "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in project.get("scripts", {}).items()),
    }
    for name, text in files.items():
        with open(os.path.join(dist, name), "w") as f:
            f.write(text)
    pth = os.path.join(site, "torchneuron-checkout.pth")
    with open(pth, "w") as f:
        f.write(ROOT + "\n")
    records = [os.path.join(dist, n) for n in files] + [pth]
    with open(os.path.join(dist, "RECORD"), "w") as f:
        f.writelines(f"{os.path.relpath(p, site)},,\n" for p in records + [os.path.join(dist, "RECORD")])
    print(f"torchneuron ({ROOT}) linked into {site}")


if __name__ == "__main__":
    main()
