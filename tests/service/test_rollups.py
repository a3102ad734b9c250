"""The pre-thinned copies of a job's metric series (`service.rollups`), on a real SQLite
file: they stay exactly what their points make through resumes, replaced steps and
deletes, and a long job's chart read from them keeps what a chart of the points keeps."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from service import rollups
from service.series import Span, thin
from service.store import JobStore, MetricPoint

SPEC = {"name": "j", "priority": 0, "towers": 1}


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(tmp_path / "jobs.db")


def stored_rollups(path: Path, job_id: str) -> set[tuple[object, ...]]:
    with sqlite3.connect(path) as conn:
        return set(
            conn.execute(
                "SELECT name, width, bucket, count, low_step, low_time, low_value,"
                " high_step, high_time, high_value FROM metric_rollups WHERE job_id = ?",
                (job_id,),
            )
        )


def stored_points(path: Path, job_id: str) -> list[tuple[str, int, float, float]]:
    with sqlite3.connect(path) as conn:
        return list(
            conn.execute(
                "SELECT name, step, time, value FROM metrics WHERE job_id = ? ORDER BY name, step",
                (job_id,),
            )
        )


def batch(rng: random.Random, steps: range, names: tuple[str, ...]) -> list[MetricPoint]:
    return [MetricPoint(name, step, float(step), rng.random()) for step in steps for name in names]


def test_rollups_hold_exactly_what_the_points_make(store: JobStore, tmp_path: Path) -> None:
    """Built batch by batch, through a restart that drops the points past it and a step
    reported again, the buckets equal those folded from the stored points at once."""
    rng = random.Random(7)
    job = store.create(SPEC)
    names = ("loss", "accuracy", "eval_loss")
    for first in range(0, 90_000, 3_000):  # batches as the supervisor stores them
        store.record_progress(
            job.id, offset=first, progress=None, eval=None,
            points=batch(rng, range(first, first + 3_000, 5), names)
            # and a series that began past the restart below: its points and buckets go
            + batch(rng, range(max(first, 80_000), first + 3_000, 5), ("late",)),
        )  # fmt: skip
    # A run resumed from step 70,003 (inside buckets of every width) reports again from there.
    store.record_progress(
        job.id, offset=1, progress=None, eval=None,
        points=batch(rng, range(70_003, 75_000, 5), names), forget_after=70_003,
    )  # fmt: skip
    # A step stored already, reported again with a new value and no restart; and a step
    # that one batch holds twice.
    store.record_progress(
        job.id, offset=2, progress=None, eval=None,
        points=[MetricPoint("loss", 40_000, 1.0, 5.0), MetricPoint("loss", 40_005, 1.0, -5.0),
                MetricPoint("loss", 80_001, 1.0, 7.0), MetricPoint("loss", 80_001, 1.0, 0.5)],
    )  # fmt: skip
    points = stored_points(tmp_path / "jobs.db", job.id)
    assert max(step for _, step, _, _ in points) == 80_001  # the lost run's steps are gone
    assert ("loss", 80_001, 1.0, 0.5) in points and not any(
        step == 75_000 for _, step, _, _ in points
    )
    expected = set(rollups.fold(points))
    assert stored_rollups(tmp_path / "jobs.db", job.id) == expected
    assert rollups.counts(store._reader(), job.id, ()) == {
        name: sum(1 for point in points if point[0] == name) for name in names
    }


def test_a_long_series_is_charted_from_its_rollups(store: JobStore, tmp_path: Path) -> None:
    """100k points: at most `most` + 2 kept a series, each a stored point, in step order,
    with its ends, its spike and its dip; drawn from a few thousand bucket rows."""
    rng = random.Random(3)
    job = store.create(SPEC)
    for first in range(0, 200_000, 10_000):
        store.record_progress(
            job.id, offset=first, progress=None, eval=None,
            points=[MetricPoint("loss", step, float(step), 1.0 + rng.random())
                    for step in range(first + 1, first + 10_001, 2)],
        )  # fmt: skip
    store.record_progress(
        job.id, offset=1, progress=None, eval=None,
        points=[MetricPoint("loss", 200_001, 0.0, 1.5), MetricPoint("eval_loss", 5, 0.0, 0.5)],
    )  # fmt: skip
    spike, dip = (124_681, 9.0), (177_777, -1.0)
    store.record_progress(
        job.id, offset=2, progress=None, eval=None,
        points=[MetricPoint("loss", step, float(step), value) for step, value in (spike, dip)],
    )  # fmt: skip
    points = {(step, value) for name, step, _, value in stored_points(tmp_path / "jobs.db", job.id)
              if name == "loss"}  # fmt: skip
    width = rollups.width_for(1, 200_001, 2000)
    assert width == 64  # the widest that puts two buckets or more in each of 1,000 spans
    assert len(rollups.candidates(store._reader(), job.id, "loss", width)) <= 2 * 200_001 // 64 + 2

    kept = store.metrics(job.id, most=2000)
    loss = [(p.step, p.value) for p in kept if p.name == "loss"]
    assert [(p.step, p.value) for p in kept if p.name == "eval_loss"] == [(5, 0.5)]
    assert 1000 < len(loss) <= 2002
    assert set(loss) <= points
    assert [step for step, _ in loss] == sorted({step for step, _ in loss})
    assert loss[0][0] == 1 and loss[-1] == (200_001, 1.5)
    assert spike in loss and dip in loss


def test_a_short_series_is_thinned_from_its_points(store: JobStore, tmp_path: Path) -> None:
    """Below 16 * `most` steps no bucket width fits: the chart is the points' own thinning,
    exactly; and a job from before rollups reads as it always did."""
    rng = random.Random(5)
    job = store.create(SPEC)
    store.record_progress(
        job.id, offset=1, progress=None, eval=None,
        points=batch(rng, range(0, 6_000), ("loss", "accuracy")),
    )  # fmt: skip
    rows = stored_points(tmp_path / "jobs.db", job.id)
    spans = {name: Span(0, 5_999, 6_000) for name in ("loss", "accuracy")}
    expected = thin(iter(rows), spans, 300)
    assert rollups.width_for(0, 5_999, 300) is not None  # a width would fit at 300 points...
    assert rollups.width_for(0, 5_999, 2000) is None  # ...but not at 2,000
    assert [tuple(vars(p).values()) for p in store.metrics(job.id, most=2000)] == thin(
        iter(rows), spans, 2000
    )
    with sqlite3.connect(tmp_path / "jobs.db") as conn:  # as if stored before rollups were kept
        conn.execute("DELETE FROM rollup_jobs")
    assert [tuple(vars(p).values()) for p in store.metrics(job.id, most=300)] == expected


def test_deleting_a_job_purges_its_rollups(store: JobStore, tmp_path: Path) -> None:
    job = store.create(SPEC)
    store.record_progress(
        job.id, offset=1, progress=None, eval=None,
        points=[MetricPoint("loss", 1, 0.0, 1.0)],
    )  # fmt: skip
    assert stored_rollups(tmp_path / "jobs.db", job.id)
    assert store.cancel_queued(job.id)
    assert store.delete(job.id)
    store.purge_points(chunk=3)  # a few rows a chunk: the rollups' 7 go in three
    assert not stored_rollups(tmp_path / "jobs.db", job.id)
    assert not rollups.kept(store._reader(), job.id)


def test_a_span_beside_an_end_keeps_its_own_extremes(store: JobStore) -> None:
    """A loss's first point is its highest, so it is the highest of its bucket too: that
    bucket's next-highest point (the curve's early drop) is charted as from the points,
    not replaced by a later bucket's highest; the same at the series' last point."""
    job = store.create(SPEC)
    values = {50: 0.68, 100: 0.14, 150: 0.03}
    points = [MetricPoint("loss", step, float(step), values.get(step, 0.001 - step * 1e-7))
              for step in range(50, 5_001, 50)]  # fmt: skip
    points[-2] = MetricPoint("loss", 4_950, 4_950.0, -1.0)  # the lowest, beside the last
    store.record_progress(job.id, offset=1, progress=None, eval=None, points=points)
    rows = [(p.name, p.step, p.time, p.value) for p in points]
    assert rollups.width_for(50, 5_000, 2) == 1024  # read from the rollups
    assert [tuple(vars(p).values()) for p in store.metrics(job.id, most=2)] == thin(
        iter(rows), {"loss": Span(50, 5_000, len(rows))}, 2
    )
    for most in (4, 8, 16):  # spans inside may differ where a bucket straddles two
        assert rollups.width_for(50, 5_000, most) is not None
        kept = [(p.step, p.value) for p in store.metrics(job.id, most=most)]
        assert kept[:2] == [(50, 0.68), (100, 0.14)] and (4_950, -1.0) in kept
