"""The compiling child of adaptive eager (see ``_engine.py``).

Reads ``(key, description, inductor_config, time_limit)`` requests on stdin,
compiles each segment with Inductor under the parent's config (filling the
compile cache), records the outcome in the segment index and answers ``(key,
ok, seconds, reason)`` on stdout. It yields the cores to the program it
compiles for (``yield_to_the_program``).

A compile that takes longer than its time limit (``compile_timeout`` of
``torchneuron.adaptive.configure``, 300 s by default) is abandoned: the child
compiles one segment at a time, so one huge segment (ten optimizer steps
without a synchronisation between them took 15 minutes) would otherwise hold
back every segment behind it. The timeout is reported as the segment's
failure but not recorded in the index: another process, on a quieter
machine, may try again.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


# How the compiler yields to the program. Chosen with `benchmarks/adaptive.py --impact`
# (docs/adaptive.md, "The compiler's cost to the program").
PRIORITY = {"sched_idle": True}


def yield_to_the_program(sched_idle: bool = False, nice: int = 0, compile_threads: int | None = None) -> None:
    """Lowers this process's claim on the cores, for every thread it has and every
    process it starts (Inductor's compile workers, the C++ compiler inherit it).

    ``sched_idle``: Linux's SCHED_IDLE, which runs only on cycles no other task
    wants and is preempted as soon as one does; ``nice``: added to the inherited
    niceness (Linux applies it per thread); ``compile_threads``: Inductor's
    parallel kernel compiles (None: Inductor's choice, one per core).
    """
    for task in os.listdir("/proc/self/task"):
        tid = int(task)
        try:
            if sched_idle:
                try:
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                except PermissionError:  # refused (a sandbox): the lowest niceness instead
                    nice = 19
            if nice:
                os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
        except OSError:  # a thread that just ended, or a system that refuses: the compile still runs
            pass
    if compile_threads is not None:
        import torch._inductor.config

        torch._inductor.config.compile_threads = compile_threads


class CompileTimeout(BaseException):  # not an Exception: the compiler must not swallow it
    pass


def warm_up() -> None:
    """What every first compile in a process pays, paid before the first request
    (the child starts when the mode is turned on, before any segment is hot): the
    compiler's imports, and a one-op compile for the code generator's own imports
    and compiler checks. Seconds on a quiet machine, tens of seconds on a busy one."""
    start = time.perf_counter()
    try:
        from torchneuron.adaptive import _engine

        settings = _engine.compiler_settings()
        _engine.compile_segment(_engine.warm_up_segment(), settings)
        # Recorded as any segment: a later program loads it at once (Engine.prestart).
        _engine.write_index(_engine.segment_key(_engine.warm_up_segment(), settings),
                            {"ok": True, "reason": "", "seconds": time.perf_counter() - start})
    except Exception as error:  # a warm-up only: the real compiles report their own errors
        print(f"torchneuron adaptive compiler: warm-up failed ({type(error).__name__}: {error})", file=sys.stderr)
    global WARM_UP_SECONDS
    WARM_UP_SECONDS = time.perf_counter() - start


WARM_UP_SECONDS = 0.0


def main(priority: dict | None = None) -> None:
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # compiler chatter must not reach the answer pipe
    yield_to_the_program(**(PRIORITY if priority is None else priority))
    from torchneuron.adaptive import _engine

    warm_up()
    # Tells the program the compiler is warm (the key "" names no segment): the program
    # then loads the warm-up's program, for its own first load's imports.
    try:
        _engine._send(answers, ("", True, WARM_UP_SECONDS, "warm-up"))
    except BrokenPipeError:  # the program does not read answers any more; the index still gets them
        os.dup2(os.open(os.devnull, os.O_WRONLY), answers.fileno())
    limit = 0.0

    def abandon(signum, frame):
        raise CompileTimeout(f"the compile took longer than {limit:g} s (the compile_timeout of "
                             "torchneuron.adaptive.configure, TORCHNEURON_ADAPTIVE_COMPILE_TIMEOUT)")

    signal.signal(signal.SIGALRM, abandon)
    while True:
        request = _engine._receive(requests)
        if request is None:
            return
        key, desc, settings, limit = request
        start = time.perf_counter()
        persist = True
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            _engine.compile_segment(desc, settings)
            ok, reason = True, ""
        except CompileTimeout as error:
            ok, reason, persist = False, f"CompileTimeout: {error}", False
        except Exception as error:  # any failure is the segment's, reported with its reason
            message = str(error).strip().splitlines()
            ok, reason = False, f"{type(error).__name__}: {message[0] if message else ''}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        seconds = time.perf_counter() - start
        if persist:
            _engine.write_index(key, {"ok": ok, "reason": reason, "seconds": seconds})
        try:
            _engine._send(answers, (key, ok, seconds, reason))
        except BrokenPipeError:  # the program exited meanwhile; the index keeps the outcome
            os.dup2(os.open(os.devnull, os.O_WRONLY), answers.fileno())  # nothing left to flush at exit
            return


if __name__ == "__main__":
    # An optional JSON argument replaces PRIORITY (benchmarks/adaptive.py --impact compares them).
    main(json.loads(sys.argv[1]) if len(sys.argv) > 1 else None)
