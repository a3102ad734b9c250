"""Pre-thinned copies of each job's metric series, so a long job's chart reads thousands of
rows, not millions.

`service.series.thin` keeps, in each of a chart's spans of steps, the lowest and highest
point. Read from the points themselves, a job of 700k steps (4M points over its series)
took 4 s a chart: every point went through Python. Here each series also keeps, for fixed
buckets of 16, 64, 256, ... 65,536 steps, each bucket's lowest and highest point and its
count, updated as points arrive (in the transaction that stores them). A chart then thins
the rows of the widest buckets that still put two or more in each of its spans: fewer than
8 buckets a span, whatever the job's length.

What that gives up: the lowest point of a chart's span is the lowest of the bucket rows in
it, so where a bucket straddles two spans, its extremes count for the span they fall in and
the other span shows its own next-lowest. Every point shown is a reported one, and a spike
still shows, in the span that holds its step.

Only jobs created with this module keep the copy (the `rollup_jobs` table marks them); the points of
a job made by an earlier version are thinned from the points, as before.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from service.series import Row

# Bucket widths in steps. Each is 4 times the one before: a chart of `most` points reads
# fewer than 4 * 2 buckets (16 rows) per span of its own, and the finest serves series
# from 16 * most steps (32k for the dashboard's 2,000; below, the points are read, no more
# than that). Writes cost little more for the wider ones: a batch lands in one or two.
WIDTHS = (16, 64, 256, 1024, 4096, 16384, 65536)

SCHEMA = """
CREATE TABLE IF NOT EXISTS metric_rollups (
    job_id TEXT NOT NULL,
    name TEXT NOT NULL,
    width INTEGER NOT NULL,
    bucket INTEGER NOT NULL,
    count INTEGER NOT NULL,
    low_step INTEGER NOT NULL,
    low_time REAL NOT NULL,
    low_value REAL NOT NULL,
    high_step INTEGER NOT NULL,
    high_time REAL NOT NULL,
    high_value REAL NOT NULL,
    PRIMARY KEY (job_id, name, width, bucket)
) WITHOUT ROWID;
-- The jobs whose rollups hold every point they have (made since rollups were kept).
CREATE TABLE IF NOT EXISTS rollup_jobs (job_id TEXT PRIMARY KEY) WITHOUT ROWID;
"""

# A point into its bucket: the lower (or higher) of the two, the earlier on a tie, as
# `thin` keeps the first of equal points. SET's right-hand sides all read the old row.
_UPSERT = """
INSERT INTO metric_rollups VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (job_id, name, width, bucket) DO UPDATE SET
    count = count + excluded.count,
    low_step = CASE WHEN excluded.low_value < low_value THEN excluded.low_step ELSE low_step END,
    low_time = CASE WHEN excluded.low_value < low_value THEN excluded.low_time ELSE low_time END,
    low_value = MIN(excluded.low_value, low_value),
    high_step = CASE WHEN excluded.high_value > high_value
        THEN excluded.high_step ELSE high_step END,
    high_time = CASE WHEN excluded.high_value > high_value
        THEN excluded.high_time ELSE high_time END,
    high_value = MAX(excluded.high_value, high_value)
"""


def _series_of(table: str) -> str:
    """A `WITH` clause naming `series` the job's (`:job`) series in `table` (keyed by
    job_id, name, ...), each found by one seek of the key. A condition on steps alone
    walks every point of the job, the key's next column being the name: a resumed long
    job's first batch took 4 s (4.2M points), every other write of the service waiting
    behind it. `name IN (SELECT name FROM series)` seeks each series' steps instead."""
    return f"""WITH RECURSIVE series(name) AS (
    SELECT MIN(name) FROM {table} WHERE job_id = :job
    UNION ALL
    SELECT (SELECT MIN(name) FROM {table} WHERE job_id = :job AND name > series.name)
    FROM series WHERE series.name IS NOT NULL
)
"""


_SERIES_IN = "name IN (SELECT name FROM series WHERE name IS NOT NULL)"
_SERIES_NAMES = f"{_series_of('metrics')} SELECT name FROM series WHERE name IS NOT NULL"


def series_names(conn: sqlite3.Connection, job_id: str) -> list[str]:
    """The names of the job's series that have points, a seek each (see `_series_of`)."""
    return [name for (name,) in conn.execute(_SERIES_NAMES, {"job": job_id})]


# One bucket of every series of a job, read again from its points. SQLite gives a query
# with a single MIN (or MAX) the other columns of the row that holds it.
_REBUILD = f"""{_series_of("metrics")}
INSERT OR REPLACE INTO metric_rollups
SELECT low.job_id, low.name, :width, :bucket, low.n, low.step, low.time, low.value,
       high.step, high.time, high.value
FROM (SELECT job_id, name, COUNT(*) AS n, step, time, MIN(value) AS value FROM metrics
      WHERE job_id = :job AND {_SERIES_IN} AND step BETWEEN :first AND :last
      GROUP BY name) AS low
JOIN (SELECT name, step, time, MAX(value) AS value FROM metrics
      WHERE job_id = :job AND {_SERIES_IN} AND step BETWEEN :first AND :last
      GROUP BY name) AS high
USING (name)
"""
# A job's points past a step (a run resumed from it), and its buckets that held any:
# their series named from the buckets, as a series whose points all lay past the step
# has none left once they are gone, and its buckets must go too.
FORGET_POINTS = (
    f"{_series_of('metrics')} DELETE FROM metrics WHERE job_id = :job AND {_SERIES_IN}"
    " AND step > :step"
)
_FORGET_BUCKETS = (
    f"{_series_of('metric_rollups')} DELETE FROM metric_rollups WHERE job_id = :job"
    f" AND {_SERIES_IN} AND width = :width AND bucket >= :bucket"
)


def start(conn: sqlite3.Connection, job_id: str) -> None:
    """Keep rollups for a new job (in the transaction that creates it)."""
    conn.execute("INSERT OR IGNORE INTO rollup_jobs VALUES (?)", (job_id,))


# A bucket as folded in Python: [count, low step, low time, low value, high step, ...].
_Folded = dict[tuple[str, int], list[Any]]


def fold(points: Sequence[Row]) -> list[tuple[Any, ...]]:
    """A batch of points as bucket rows (name, width, bucket, count, low..., high...), to
    `add`. Folded here, before the store's write lock is taken, so that a batch costs an
    upsert a bucket, not one a point a width (most of a batch lands in a few buckets of
    each width); each width is folded from the one below, not from the points again."""
    rows: list[tuple[Any, ...]] = []
    below: _Folded = {}
    for name, step, time, value in points:
        _merge(below, (name, step // WIDTHS[0]), [1, step, time, value, step, time, value])
    for at, width in enumerate(WIDTHS):
        rows.extend((name, width, bucket, *held) for (name, bucket), held in below.items())
        if at + 1 < len(WIDTHS):
            ratio = WIDTHS[at + 1] // width
            above: _Folded = {}
            for (name, bucket), held in below.items():
                _merge(above, (name, bucket // ratio), held)
            below = above
    return rows


def _merge(buckets: _Folded, key: tuple[str, int], part: list[Any]) -> None:
    """Fold `part` (a point or a finer bucket) into the bucket at `key`; of equal values,
    the earlier step stays, as `thin` keeps the first of equal points."""
    held = buckets.get(key)
    if held is None:
        buckets[key] = list(part)
        return
    held[0] += part[0]
    if (part[3], part[1]) < (held[3], held[1]):
        held[1:4] = part[1:4]
    if part[6] > held[6] or (part[6] == held[6] and part[4] < held[4]):
        held[4:7] = part[4:7]


def add(conn: sqlite3.Connection, job_id: str, folded: Sequence[tuple[Any, ...]]) -> None:
    """Store `fold`'s rows (in the transaction that stores their points)."""
    conn.executemany(_UPSERT, [(job_id, *row) for row in folded])


def replaced(conn: sqlite3.Connection, job_id: str, points: Sequence[Row]) -> set[int]:
    """The steps of `points` that are stored already (call before storing them): the
    points they replace may be a bucket's lowest or highest, which `rebuild` must then
    drop. Rare (a run reports each step once; a resume drops what follows it first), and
    cheap to find: a range of the metrics' key a series, past the stored points."""
    steps: dict[str, list[int]] = {}
    for name, step, _, _ in points:
        steps.setdefault(name, []).append(step)
    stored: set[int] = set()
    for name, of in steps.items():
        found = conn.execute(
            "SELECT step FROM metrics WHERE job_id = ? AND name = ? AND step BETWEEN ? AND ?",
            (job_id, name, min(of), max(of)),
        )
        stored.update(set(of).intersection(step for (step,) in found))
    return stored


def forget_after(conn: sqlite3.Connection, job_id: str, step: int) -> None:
    """The job's points past `step` are gone (a run resumed from it): drop every bucket
    that held any. Call before the new run's points are added; `rebuild` afterwards."""
    for width in WIDTHS:
        conn.execute(_FORGET_BUCKETS, {"job": job_id, "width": width, "bucket": step // width})


def rebuild(conn: sqlite3.Connection, job_id: str, steps: Iterable[int]) -> None:
    """Read the buckets that hold `steps` again from the points, each bucket once (call
    after the points are stored): after `forget_after` they hold the points up to its step,
    kept, and the new run's past it; after `replaced`, what replaced what."""
    for width, bucket in sorted({(width, step // width) for step in steps for width in WIDTHS}):
        conn.execute(
            _REBUILD,
            {"job": job_id, "width": width, "bucket": bucket, "first": bucket * width,
             "last": (bucket + 1) * width - 1},
        )  # fmt: skip


# What a deleted job's purge removes a chunk at a time (`JobStore.purge_points`): each
# table, and the columns that pick a row of one job.
PURGED = (("metric_rollups", "name, width, bucket"),)


def delete(conn: sqlite3.Connection, job_id: str) -> None:
    """Forget a deleted job's rollups (after `PURGED` removed the most of them)."""
    conn.execute("DELETE FROM metric_rollups WHERE job_id = ?", (job_id,))
    conn.execute("DELETE FROM rollup_jobs WHERE job_id = ?", (job_id,))


def kept(conn: sqlite3.Connection, job_id: str) -> bool:
    """Whether the job's rollups hold all its points."""
    return (
        conn.execute("SELECT 1 FROM rollup_jobs WHERE job_id = ?", (job_id,)).fetchone() is not None
    )


def counts(conn: sqlite3.Connection, job_id: str, names: Sequence[str]) -> dict[str, int]:
    """Each series' number of points (of those in `names`; all when empty), from the
    widest buckets: a few rows a series."""
    where, args = "", [job_id, WIDTHS[-1]]
    if names:
        where = f" AND name IN ({', '.join('?' * len(names))})"
        args += names
    rows = conn.execute(
        "SELECT name, SUM(count) FROM metric_rollups WHERE job_id = ? AND width = ?"
        f"{where} GROUP BY name ORDER BY name",
        args,
    )
    return {name: int(count) for name, count in rows}


def width_for(first: int, last: int, most: int) -> int | None:
    """The widest buckets that put two or more in each of `most` // 2 spans of the steps
    from `first` to `last`; None when even the finest would not (read the points)."""
    spans = max(1, most // 2)
    fitting = [width for width in WIDTHS if (last - first + 1) >= 2 * spans * width]
    return fitting[-1] if fitting else None


def candidates(conn: sqlite3.Connection, job_id: str, name: str, width: int) -> list[Row]:
    """The lowest and highest point of each of the series' buckets of `width`, by step: a
    superset of what `thin` keeps from the points, but the straddling buckets' (above)."""
    rows: list[Row] = []
    for low_step, low_time, low_value, high_step, high_time, high_value in conn.execute(
        "SELECT low_step, low_time, low_value, high_step, high_time, high_value"
        " FROM metric_rollups WHERE job_id = ? AND name = ? AND width = ? ORDER BY bucket",
        (job_id, name, width),
    ):
        low: Row = (name, low_step, low_time, low_value)
        high: Row = (name, high_step, high_time, high_value)
        if low_step == high_step:
            rows.append(low)
        else:
            rows.extend((low, high) if low_step < high_step else (high, low))
    return rows
