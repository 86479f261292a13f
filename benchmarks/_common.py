"""Shared benchmark helpers: interleaved rounds, medians, one JSON line per case."""

from __future__ import annotations

import json
import statistics
import time
from typing import Callable


def interleaved(candidate: Callable[[], float], baseline: Callable[[], float], rounds: int = 7,
                warmup: int = 2) -> tuple[float, float]:
    """Runs both measurements alternately (the machine is shared and noisy) and
    returns their medians. Each callable returns one measurement."""
    for _ in range(warmup):
        candidate()
        baseline()
    cand, base = [], []
    for _ in range(rounds):
        cand.append(candidate())
        base.append(baseline())
    return statistics.median(cand), statistics.median(base)


def report(bench: str, case: str, metric: str, value: float, baseline: str, baseline_value: float,
           higher_is_better: bool, **extra) -> dict:
    ratio = value / baseline_value if higher_is_better else baseline_value / value
    row = {"bench": bench, "case": case, "metric": metric, "value": round(value, 4), "baseline": baseline,
           "baseline_value": round(baseline_value, 4), "ratio": round(ratio, 3),
           "higher_is_better": higher_is_better, **extra}
    print(json.dumps(row), flush=True)
    return row


def timed(fn: Callable[[], None], sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0
