"""The error a kernel gets for breaking a rule of the language or the hardware."""

import linecache
import os
import sys

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


_own_files = {}


def _is_own(filename):
    own = _own_files.get(filename)
    if own is None:
        own = _own_files[filename] = os.path.abspath(filename).startswith(_PACKAGE_DIR + os.sep)
    return own


def kernel_position():
    """(file, line number) of the innermost frame outside this package: the kernel line."""
    frame = sys._getframe(1)
    while frame is not None and _is_own(frame.f_code.co_filename):
        frame = frame.f_back
    return None if frame is None else (frame.f_code.co_filename, frame.f_lineno)


def kernel_line():
    """(file, line number, source text) of the kernel line."""
    position = kernel_position()
    if position is None:
        return None
    return position[0], position[1], linecache.getline(*position).strip()


class NKIError(RuntimeError):
    """A kernel broke a rule: ``rule`` names it, ``line`` is (file, line, source) of the kernel line.

    Raised while the kernel is checked, before anything runs, so outputs are never written.
    """

    def __init__(self, rule: str, message: str):
        self.rule = rule
        self.line = kernel_line()
        where = ""
        if self.line is not None:
            filename, lineno, text = self.line
            where = f"\n  at {filename}:{lineno}: {text}"
        super().__init__(f"[{rule}] {message}{where}")
