"""Adaptive eager: eager semantics at the speed of fused programs.

With the mode on, eager ops are not enqueued one by one: each stream holds
them in a pending segment, which is flushed whenever anything could observe
the difference (a synchronisation, a read on the host, an event, a
collective, a graph capture, a cross-stream wait), at a size limit, and when
the host stops issuing work for a few milliseconds. A segment that recurs is
compiled in the background (a child process running Inductor); from then on
each occurrence runs as one device task. Outputs are allocated and returned
at once, as in eager, and every tensor the program can still see holds the
same values as in eager.

Turn it on with ``TORCHNEURON_ADAPTIVE_EAGER=1``, ``set_enabled(True)`` or
``with torchneuron.adaptive.enabled():``. ``NEURON_LAUNCH_BLOCKING=1`` and
``torch.use_deterministic_algorithms(True)`` keep it off.
"""

from __future__ import annotations

import contextlib

from torchneuron import _C

from ._engine import Engine

__all__ = ["enabled", "set_enabled", "is_enabled", "configure", "get_metrics", "reset", "wait_for_compiles"]

_ENGINE = Engine()
_C._adaptive_set_engine(_ENGINE)


def is_enabled() -> bool:
    return _C._adaptive_enabled()


def set_enabled(on: bool) -> None:
    """Turns adaptive eager on or off for the whole process (work already
    deferred still runs, in order). Stays off while the stream sanitizer is
    on: it checks eager's ops one by one (and the two together crashed in a
    fuzzed program, see torchneuron/sanitizer.py)."""
    from torchneuron import sanitizer  # a sibling of this package, imported late to keep the import order

    _C._adaptive_set_enabled(bool(on) and not sanitizer.is_enabled())
    if is_enabled():
        _ENGINE.prestart()  # the compiler's imports and warm-up, before the first segment turns hot


@contextlib.contextmanager
def enabled(on: bool = True):
    """Turns adaptive eager on (or off) inside the block, then restores it."""
    previous = is_enabled()
    set_enabled(on)
    try:
        yield
    finally:
        set_enabled(previous)


def configure(*, hot: int | None = None, max_ops: int | None = None, idle_ms: float | None = None,
              compile_timeout: float | None = None) -> dict:
    """Sets the mode's tunables and returns them all.

    ``hot``: occurrences after which a segment is compiled (default 2,
    ``TORCHNEURON_ADAPTIVE_HOT``); ``max_ops``: ops after which a segment
    flushes (1024, ``TORCHNEURON_ADAPTIVE_MAX_OPS``); ``idle_ms``: how long the
    host may issue no work before the pending segment flushes (5 ms,
    ``TORCHNEURON_ADAPTIVE_IDLE_MS``); ``compile_timeout``: seconds after which
    the compiler gives up on a segment, which then runs op by op (300 s,
    ``TORCHNEURON_ADAPTIVE_COMPILE_TIMEOUT``; it applies to segments that turn
    hot from now on).
    """
    names = ("hot", "max_ops", "idle_ms", "compile_timeout")
    current = dict(zip(names, _C._adaptive_settings()))
    for name, value in zip(names, (hot, max_ops, idle_ms, compile_timeout)):
        if value is not None:
            current[name] = value
    _C._adaptive_configure(int(current["hot"]), int(current["max_ops"]), float(current["idle_ms"]),
                           float(current["compile_timeout"]))
    return current


def get_metrics() -> dict:
    """What adaptive eager did so far.

    ``segments``: flushed segments; ``ops_deferred``: ops they held;
    ``distinct_segments``: distinct structures seen; ``hot``: segments that
    recurred and were sent to compile; ``compiled``: programs loaded;
    ``replays``: occurrences run as one fused task; ``ops_per_replay``;
    ``launches_saved``: device tasks saved by replays; ``aborted_replays``:
    occurrences that ran op by op although compiled; ``intermediates_elided``:
    results no tensor referenced any more at a replay, which the program
    did not write back; ``op_by_op``: segments that were not considered for
    compilation, by reason; ``compile_seconds``:
    time the compiler process spent; ``failures``: segments that will not be
    compiled, each with its key, op count and reason; ``timeline``: per
    segment that turned hot, when (``hot_at``), its size (``ops``,
    ``cost_units``), where its program came from (``source``: "compiler" or
    "disk cache"), its place in the compile order (``order``), seconds queued,
    compiling and from hot to ready, and ``hot_to_first_replay_seconds``
    (None until it replays; see ``Engine.timeline``).
    """
    m = _C._adaptive_metrics()
    m["ops_per_replay"] = m["ops_replayed"] / m["replays"] if m["replays"] else 0.0
    m["timeline"] = _ENGINE.timeline()
    return m


def reset() -> None:
    """Forgets every segment and zeroes the metrics (compiled programs on disk stay)."""
    _C._adaptive_reset()
    _ENGINE.reset_timeline()


def wait_for_compiles(timeout: float | None = None) -> bool:
    """Blocks until every segment sent to the compiler has its answer."""
    return _ENGINE.wait_idle(timeout)
