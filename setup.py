# Builds torchneuron._C against the installed torch. Install with
#   pip install --no-build-isolation -e .
# so pip never fetches another torch (see README).
import glob
import os

import torch

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

sources = sorted(glob.glob("csrc/**/*.cpp", recursive=True))
debug = os.environ.get("TORCHNEURON_DEBUG_BUILD") == "1"

setup(
    packages=find_packages(include=["torchneuron", "torchneuron.*"]),
    ext_modules=[
        CppExtension(
            "torchneuron._C",
            sources,
            # Kineto's plugin interface (the PrivateUse1 activity profiler);
            # libtorch exports the registry, the headers ship in the wheel.
            include_dirs=[os.path.join(os.path.dirname(torch.__file__), "include", "kineto")],
            define_macros=[("USE_KINETO", None), ("KINETO_NAMESPACE", "libkineto"), ("FMT_HEADER_ONLY", None)],
            # -g0: the interpreter's flags add -g, which doubles compile time for no use here.
            extra_compile_args=["-O0", "-g"] if debug else ["-O2", "-g0", "-fvisibility=hidden"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
