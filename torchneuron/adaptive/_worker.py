"""The compiling child of adaptive eager (see ``_engine.py``).

Reads ``(key, description)`` requests on stdin, compiles each segment with
Inductor (filling the compile cache), records the outcome in the segment
index and answers ``(key, ok, seconds, reason)`` on stdout. It runs at a
lower priority than the program it compiles for.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # compiler chatter must not reach the answer pipe
    try:
        os.nice(10)
    except OSError:
        pass
    from torchneuron.adaptive import _engine

    while True:
        request = _engine._receive(requests)
        if request is None:
            return
        key, desc = request
        start = time.perf_counter()
        try:
            _engine.compile_segment(desc)
            ok, reason = True, ""
        except Exception as error:  # any failure is the segment's, reported with its reason
            message = str(error).strip().splitlines()
            ok, reason = False, f"{type(error).__name__}: {message[0] if message else ''}"
        seconds = time.perf_counter() - start
        _engine.write_index(key, {"ok": ok, "reason": reason, "seconds": seconds})
        try:
            _engine._send(answers, (key, ok, seconds, reason))
        except BrokenPipeError:  # the program exited meanwhile; the index keeps the outcome
            os.dup2(os.open(os.devnull, os.O_WRONLY), answers.fileno())  # nothing left to flush at exit
            return


if __name__ == "__main__":
    main()
