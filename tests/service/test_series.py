"""Thinning a job's metric series for charts: bounded, every kept point a reported one,
extremes and ends kept."""

from __future__ import annotations

from service.series import Row, Span, thin


def series(name: str, values: dict[int, float]) -> list[Row]:
    return [(name, step, float(step), value) for step, value in sorted(values.items())]


def spans_of(rows: list[Row]) -> dict[str, Span]:
    spans: dict[str, Span] = {}
    for name, step, _, _ in rows:
        span = spans.get(name)
        spans[name] = (
            Span(step, step, 1) if span is None else Span(span.first, step, span.count + 1)
        )
    return spans


def test_a_long_series_is_thinned_to_its_extremes_and_ends() -> None:
    loss = series("loss", {2 * k: 1.0 / k for k in range(1, 100_001)})
    loss[54_321] = (*loss[54_321][:3], 9.0)  # a spike
    dip = loss[77_777] = (*loss[77_777][:3], -1.0)
    evals = series("eval_loss", {500 * k: 0.5 for k in range(1, 401)})
    points = evals + loss  # by series name, then step
    kept = thin(iter(points), spans_of(points), 2000)
    kept_loss = [row for row in kept if row[0] == "loss"]
    kept_evals = [row for row in kept if row[0] == "eval_loss"]
    assert kept_evals == evals  # 400 points: all of them
    # Every span keeps its lowest and highest point: about 2,000 of them, not a few that
    # happen to hold the ends and the extremes (one span for the whole series passed all
    # but this).
    assert 2000 <= len(kept_loss) <= 2002
    assert kept_loss[0] == loss[0] and kept_loss[-1] == loss[-1]
    assert loss[54_321] in kept_loss and dip in kept_loss
    assert [row[1] for row in kept_loss] == sorted({row[1] for row in kept_loss})  # in order, once
    assert set(kept_loss) <= set(loss)


def test_a_series_of_few_points_is_kept_whole_however_uneven_its_steps() -> None:
    points = series("accuracy", {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4, 1000: 0.9})
    assert thin(points, spans_of(points), 4) == points
    assert thin([], {}, 4) == []
    one = series("loss", {7: 1.0})
    assert thin(one, spans_of(one), 2) == one
