"""What the compiled path did: ``torchneuron.get_dynamo_metrics()``.

Dynamo and Inductor keep their own counters (graph breaks, cache hits) in
``torch._dynamo.utils.counters``; the backend adds what only it knows: graphs
it compiled, recompiles it saw, graphs that fell back to eager and why,
compile time, and device-graph recordings and replays of reduce-overhead.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from torch._dynamo.utils import counters


@dataclass
class _Metrics:
    compiled_graphs: int = 0
    recompiles: list = field(default_factory=list)  # {"graph", "reason"}
    fallbacks: list = field(default_factory=list)  # {"graph", "reason"}
    compile_seconds: float = 0.0
    graph_recordings: int = 0
    graph_replays: int = 0
    graph_rerecords: int = 0
    graph_fallbacks: list = field(default_factory=list)  # {"graph", "reason"}: ran without replay


_lock = threading.Lock()
_metrics = _Metrics()


def record(**changes) -> None:
    """Adds to counters (ints, floats) or appends to lists, atomically."""
    with _lock:
        for name, value in changes.items():
            current = getattr(_metrics, name)
            if isinstance(current, list):
                current.append(value)
            else:
                setattr(_metrics, name, current + value)


def get_dynamo_metrics() -> dict:
    """Counters of ``torch.compile`` on neuron since the last reset.

    Keys: ``compiled_graphs``, ``graph_breaks`` and ``graph_break_reasons``
    (reason -> count), ``recompiles`` and ``recompile_reasons``, ``fallbacks``
    and ``fallback_reasons`` (graphs that failed to compile and ran eagerly),
    ``cache_hits`` / ``cache_misses`` (Inductor's FX graph cache and the
    AOTAutograd cache), ``compile_seconds``, and for ``mode="reduce-overhead"``
    ``graph_recordings``, ``graph_replays``, ``graph_rerecords`` and
    ``graph_replay_fallbacks``.
    """
    with _lock:
        m = _metrics
        breaks = dict(counters["graph_break"])
        return {
            "compiled_graphs": m.compiled_graphs,
            "graph_breaks": sum(breaks.values()),
            "graph_break_reasons": breaks,
            "recompiles": len(m.recompiles),
            "recompile_reasons": [dict(r) for r in m.recompiles],
            "fallbacks": len(m.fallbacks),
            "fallback_reasons": [dict(f) for f in m.fallbacks],
            "cache_hits": {
                "inductor_fx_graph": counters["inductor"]["fxgraph_cache_hit"],
                "aot_autograd": counters["aot_autograd"]["autograd_cache_hit"],
            },
            "cache_misses": {
                "inductor_fx_graph": counters["inductor"]["fxgraph_cache_miss"],
                "aot_autograd": counters["aot_autograd"]["autograd_cache_miss"],
            },
            "compile_seconds": m.compile_seconds,
            "graph_recordings": m.graph_recordings,
            "graph_replays": m.graph_replays,
            "graph_rerecords": m.graph_rerecords,
            "graph_replay_fallbacks": [dict(f) for f in m.graph_fallbacks],
        }


def reset_dynamo_metrics() -> None:
    """Zeroes the counters above (Dynamo's and Inductor's included)."""
    global _metrics
    with _lock:
        _metrics = _Metrics()
        counters.clear()
