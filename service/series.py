"""A job's metric series thinned to a bounded number of points, for charts.

A job of 200k steps reports some 100k points a series, 32 MB of JSON for its six series,
and a chart 600 pixels wide shows no more than two points a pixel column. `thin` cuts each
series' steps into equal spans and keeps, in each, its lowest and its highest point (a spike
stays, as a chart of every point shows it), and the series' first and last point (its line
ends where the job is). Every point kept is a reported one. The points are read as a stream
in series and step order; only those kept are held. static/js/charts.js thins alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# A point as the store reads it: (series, step, time, value). Plain tuples: a long job's
# series are hundreds of thousands of rows, and only the few kept become MetricPoints.
Row = tuple[str, int, float, float]


@dataclass(frozen=True)
class Span:
    """What the store says of one series before it is read: its first and last step, and
    how many points it has."""

    first: int
    last: int
    count: int


def thin(rows: Iterable[Row], spans: Mapping[str, Span], most: int) -> list[Row]:
    """At most `most` + 2 of `rows` a series; every row of a series of no more.

    `rows`: ordered by series, then step. The steps of a series are cut into `most` // 2
    equal spans, each keeping its lowest and highest point, and its first and last point
    are kept."""
    buckets = max(1, most // 2)
    kept: list[Row] = []
    low: Row | None = None  # the open span's lowest and highest points
    high: Row | None = None
    last: Row | None = None
    series: str | None = None
    whole = True
    first_step, width, index = 0, 1, -1

    def close() -> None:
        if low is not None and high is not None:
            kept.extend((low,) if low is high else sorted((low, high), key=lambda row: row[1]))

    for row in rows:
        name, step, _, value = row
        if name != series:
            close()
            if last is not None and kept[-1] is not last:
                kept.append(last)  # the previous series' last point
            span = spans[name]
            series, whole, low, high, index = name, span.count <= most + 2, None, None, -1
            first_step, width = span.first, span.last - span.first + 1
            kept.append(row)  # its first point
            last = row
            continue
        last = row
        if whole:
            kept.append(row)
            continue
        at = (step - first_step) * buckets // width
        if at != index:
            close()
            index, low, high = at, row, row
        elif value < low[3]:  # type: ignore[index]
            low = row
        elif value > high[3]:  # type: ignore[index]
            high = row
    close()
    if last is not None and kept[-1] is not last:
        kept.append(last)
    return kept
