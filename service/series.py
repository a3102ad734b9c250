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
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the store thins with this module: no import of it at run time
    from service.store import MetricPoint


@dataclass(frozen=True)
class Span:
    """What the store says of one series before it is read: its first and last step, and
    how many points it has."""

    first: int
    last: int
    count: int


def thin(points: Iterable[MetricPoint], spans: Mapping[str, Span], most: int) -> list[MetricPoint]:
    """At most `most` + 2 of `points` a series; every point of a series of no more.

    `points`: ordered by series, then step. The steps of a series are cut into `most` // 2
    equal spans, each keeping its lowest and highest point, and its first and last point
    are kept."""
    buckets = max(1, most // 2)
    kept: list[MetricPoint] = []
    bucket: list[MetricPoint] = []  # the open span's lowest and highest points
    series: str | None = None
    span = Span(0, 0, 0)
    index = -1
    last: MetricPoint | None = None

    def close() -> None:
        kept.extend(sorted(set(bucket), key=lambda point: point.step))
        bucket.clear()

    def end_series() -> None:
        close()
        if last is not None and kept[-1] is not last:
            kept.append(last)

    for point in points:
        if point.name != series:
            end_series()
            series, span, index = point.name, spans[point.name], -1
            kept.append(point)  # its first point
            last = point
            continue
        last = point
        if span.count <= most + 2:
            kept.append(point)
            continue
        at = (point.step - span.first) * buckets // (span.last - span.first + 1)
        if at != index:
            close()
            index = at
            bucket[:] = [point, point]
        elif point.value < bucket[0].value:
            bucket[0] = point
        elif point.value > bucket[1].value:
            bucket[1] = point
    end_series()
    return kept
