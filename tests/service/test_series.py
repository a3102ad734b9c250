"""Thinning a job's metric series for charts: bounded, every kept point a reported one,
extremes and ends kept."""

from __future__ import annotations

from service.series import Span, thin
from service.store import MetricPoint


def series(name: str, values: dict[int, float]) -> list[MetricPoint]:
    return [MetricPoint(name, step, float(step), value) for step, value in sorted(values.items())]


def spans_of(points: list[MetricPoint]) -> dict[str, Span]:
    spans: dict[str, Span] = {}
    for point in points:
        span = spans.get(point.name)
        spans[point.name] = (
            Span(point.step, point.step, 1)
            if span is None
            else Span(span.first, point.step, span.count + 1)
        )
    return spans


def test_a_long_series_is_thinned_to_its_extremes_and_ends() -> None:
    loss = series("loss", {2 * k: 1.0 / k for k in range(1, 100_001)})
    loss[54_321] = MetricPoint("loss", loss[54_321].step, loss[54_321].time, 9.0)  # a spike
    dip = loss[77_777] = MetricPoint("loss", loss[77_777].step, loss[77_777].time, -1.0)
    evals = series("eval_loss", {500 * k: 0.5 for k in range(1, 401)})
    points = evals + loss  # by series name, then step
    kept = thin(iter(points), spans_of(points), 2000)
    kept_loss = [point for point in kept if point.name == "loss"]
    kept_evals = [point for point in kept if point.name == "eval_loss"]
    assert kept_evals == evals  # 400 points: all of them
    assert len(kept_loss) <= 2002
    assert kept_loss[0] == loss[0] and kept_loss[-1] == loss[-1]
    assert loss[54_321] in kept_loss and dip in kept_loss
    assert [p.step for p in kept_loss] == sorted({p.step for p in kept_loss})  # in order, once
    assert set(kept_loss) <= set(loss)


def test_a_series_of_few_points_is_kept_whole_however_uneven_its_steps() -> None:
    points = series("accuracy", {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4, 1000: 0.9})
    assert thin(points, spans_of(points), 4) == points
    assert thin([], {}, 4) == []
    one = series("loss", {7: 1.0})
    assert thin(one, spans_of(one), 2) == one
