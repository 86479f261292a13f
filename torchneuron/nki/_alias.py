"""Import names of the NKI SDK, served by torchneuron.nki when no real NKI is installed.

Kernel files written for current NKI say ``import nki``, ``import nki.language as nl``,
``import nki.isa as nisa``, ``import nki.typing as nt`` (or the older ``neuronxcc.nki`` forms).
``install_alias()`` lets such files run unmodified on torchneuron: a finder placed first on
``sys.meta_path`` answers those names with torchneuron's modules. A real ``nki`` (or
``neuronxcc``) package that Python can find always wins: its names are then left alone.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

# Alias -> torchneuron module, per top-level package name.
_NAMES = {
    "nki": {
        "nki": "torchneuron.nki",
        "nki.language": "torchneuron.nki.language",
        "nki.isa": "torchneuron.nki.isa",
        "nki.isa.constants": "torchneuron.nki.isa.constants",
        "nki.typing": "torchneuron.nki.typing",
        "nki.dtype": "torchneuron.nki.dtype",
        "nki.simulator": "torchneuron.nki.simulator",
        "nki.collectives": "torchneuron.nki.collectives",
    },
    "neuronxcc": {
        "neuronxcc": "torchneuron.nki._neuronxcc",
        "neuronxcc.nki": "torchneuron.nki",
        "neuronxcc.nki.language": "torchneuron.nki.language",
        "neuronxcc.nki.isa": "torchneuron.nki.isa",
        "neuronxcc.nki.isa.constants": "torchneuron.nki.isa.constants",
        "neuronxcc.nki.typing": "torchneuron.nki.typing",
        "neuronxcc.nki.dtype": "torchneuron.nki.dtype",
    },
}


class _Loader(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)  # the same module object under both names

    def exec_module(self, module):
        pass  # already executed under its own name


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self):
        self.names: dict[str, str] = {}

    def find_spec(self, fullname, path=None, target=None):
        module = self.names.get(fullname)
        if module is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(module), is_package=True)


_finder = _Finder()


def _real_package_exists(top: str) -> bool:
    if top in sys.modules and not getattr(sys.modules[top], "__name__", "").startswith("torchneuron"):
        return True
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
        try:
            return importlib.util.find_spec(top) is not None
        finally:
            sys.meta_path.insert(0, _finder)
    return importlib.util.find_spec(top) is not None


def install_alias() -> list[str]:
    """Makes ``import nki`` (and ``neuronxcc.nki``) import torchneuron.nki unless a real package
    of that name is installed; returns the top-level names now served by torchneuron."""
    served = []
    for top, names in _NAMES.items():
        if _real_package_exists(top):
            continue
        _finder.names.update(names)
        served.append(top)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    return served


def uninstall_alias() -> None:
    """Removes the names (and the aliased modules already imported under them)."""
    for name in list(_finder.names):
        module = sys.modules.get(name)
        if module is not None and module.__name__ != name:
            del sys.modules[name]
    _finder.names.clear()
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
