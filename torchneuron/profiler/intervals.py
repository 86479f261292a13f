"""Time intervals [start, end) in ns: the arithmetic the export and the
analyser share."""

from __future__ import annotations

from bisect import bisect_right
from typing import Iterable, Sequence


def union(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The intervals merged: sorted, disjoint, not touching."""
    merged: list[tuple[int, int]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def covered(intervals: Iterable[tuple[int, int]]) -> int:
    """Total length of the union."""
    return sum(e - s for s, e in union(intervals) if e > s)


def overlap(start: int, end: int, disjoint: Sequence[Sequence[int]], starts: Sequence[int]) -> int:
    """Length of [start, end) covered by sorted, disjoint intervals whose
    starts are `starts` (each interval's first two items are its start and end)."""
    total = 0
    i = max(bisect_right(starts, start) - 1, 0)
    while i < len(disjoint) and disjoint[i][0] < end:
        total += max(0, min(end, disjoint[i][1]) - max(start, disjoint[i][0]))
        i += 1
    return total
