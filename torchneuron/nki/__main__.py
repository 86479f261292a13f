"""``python -m torchneuron.nki run kernel_file.py [args...]``: runs a file written for the NKI SDK
unmodified (``import nki``, ``neuronxcc.nki``), with torchneuron serving those imports."""

import os
import runpy
import sys

USAGE = "usage: python -m torchneuron.nki run <script.py> [args...]"


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "run":
        print(USAGE, file=sys.stderr)
        return 2
    from torchneuron.nki import install_alias

    install_alias()
    sys.argv = argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[1])))  # as `python script.py` does
    runpy.run_path(argv[1], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
