"""The ETA's pace: wall-clock seconds a step over the last few minutes, so it follows a
host whose load changes, and over the whole run until then."""

from __future__ import annotations

import pytest

from trainer.controller import ETA_WINDOW_SECONDS, _Pace


def test_the_pace_follows_the_last_minutes_not_the_whole_run() -> None:
    pace = _Pace()
    assert pace.seconds_per_step() is None
    pace.mark(0.0, 1)
    assert pace.seconds_per_step() is None  # one mark: no pace yet
    for step in range(2, 601):  # ten minutes at 1 s a step, marked every 2 s
        if step % 2 == 0:
            pace.mark(float(step - 1), step)
    assert pace.seconds_per_step() == pytest.approx(1.0)
    now, step = 599.0, 600
    while now < 599.0 + ETA_WINDOW_SECONDS:  # then 5 minutes at 0.1 s a step
        now, step = now + 2.0, step + 20
        pace.mark(now, step)
    # The whole run's mean was 0.33 s a step: the ETA would have been 3.3 times too long.
    assert pace.seconds_per_step() == pytest.approx(0.1, rel=0.05)


def test_the_pace_counts_what_runs_between_steps() -> None:
    # An eval of 10 s every 100 steps of 0.1 s: it is part of the time left.
    pace = _Pace()
    now, step = 0.0, 1
    pace.mark(now, step)
    for _ in range(20):
        now, step = now + 10.0 + 10.0, step + 100
        pace.mark(now, step)
    assert pace.seconds_per_step() == pytest.approx(0.2, rel=0.1)
