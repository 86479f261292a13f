# Text in corpus.txt is from CPython standard-library docstrings (Python Software Foundation License).
"""Regenerate corpus.txt for the torchneuron demo: python examples/data/make_corpus.py

Walks a fixed list of stdlib modules, collects the docstrings of each module and
of its public classes, functions and methods, normalises them to printable ASCII
and drops duplicates. Output depends on the Python version it is run with.
"""
import importlib
import inspect
import re
import unicodedata
from pathlib import Path

MODULES = """
collections itertools functools json textwrap string re os pathlib datetime heapq
bisect random statistics fractions decimal csv logging argparse threading queue
subprocess shutil tempfile typing dataclasses enum contextlib inspect abc io math
urllib.parse urllib.request http.client http.server email.message unittest
""".split()
# A per-module budget keeps big modules (os, typing) from crowding out the rest
# and puts the corpus at ~250 KB.
MODULE_BUDGET = 10_000
OUT = Path(__file__).with_name("corpus.txt")


def normalise(text):
    # NFKD splits accented letters so the ASCII base letter survives the encode.
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = text.replace("\t", "    ")
    text = "".join(c for c in text if c == "\n" or " " <= c <= "~")
    lines = [line.rstrip() for line in text.strip().splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines))


def docstrings(module):
    yield inspect.getdoc(module)
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        yield inspect.getdoc(obj)
        if inspect.isclass(obj):
            for attr, member in sorted(vars(obj).items()):
                if not attr.startswith("_") and inspect.isroutine(member):
                    yield inspect.getdoc(member)


def main():
    seen, parts = set(), []
    for name in MODULES:
        size = 0
        for doc in docstrings(importlib.import_module(name)):
            doc = normalise(doc or "")
            # Skip one-liners like "Return self." that add little language.
            if len(doc) < 40 or doc in seen:
                continue
            if size + len(doc) > MODULE_BUDGET:
                break
            seen.add(doc)
            parts.append(doc)
            size += len(doc)
    OUT.write_text("\n\n".join(parts) + "\n", encoding="ascii")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(parts)} docstrings)")


if __name__ == "__main__":
    main()
