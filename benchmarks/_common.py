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
    medians = interleaved_all({"candidate": candidate, "baseline": baseline}, rounds, warmup)
    return medians["candidate"], medians["baseline"]


def interleaved_all(measurements: dict[str, Callable[[], float]], rounds: int = 7,
                    warmup: int = 2) -> dict[str, float]:
    """`interleaved` for any number of measurements: name -> median."""
    for _ in range(warmup):
        for measure in measurements.values():
            measure()
    samples = {name: [] for name in measurements}
    for _ in range(rounds):
        for name, measure in measurements.items():
            samples[name].append(measure())
    return {name: statistics.median(values) for name, values in samples.items()}


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
