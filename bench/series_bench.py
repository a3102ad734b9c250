"""Benchmark: a long job's chart (`GET /jobs/{id}/metrics?points=N`, the store's read), with
each series' rollups (`service/rollups.py`) and without them, and what keeping them costs
the writes, measured side by side in one run.

    .venv/bin/python bench/series_bench.py [--steps 1400000] [--every 2] [--series 6]

Two real SQLite stores (WAL, synchronous=FULL, as the service runs them) are filled with the
same points, batch by batch through `JobStore.record_progress` as the supervisor stores a
worker's progress (1,000 steps a batch); the second's job is marked as made before rollups,
so it keeps none and is charted from its points. Then each store's chart is read at 2,000
and 600 points a series. The defaults make a job of 700k points a series (4.2M in all).
"""

from __future__ import annotations

import argparse
import math
import platform
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from service.store import JobStore, MetricPoint  # noqa: E402

SERIES = ("loss", "accuracy", "examples_per_sec", "learning_rate", "grad_norm", "eval_loss")
BATCH_STEPS = 1000


def fill(path: Path, args: argparse.Namespace, rolled: bool) -> tuple[JobStore, str, float]:
    """A store holding one job's points; the seconds its batches took to store."""
    store = JobStore(path)
    job_id = store.create({"name": "bench", "priority": 0, "towers": 1}).id
    if not rolled:
        with sqlite3.connect(path) as conn:
            conn.execute("DELETE FROM rollup_jobs")  # as a job stored before rollups
    rng = random.Random(0)
    names = SERIES[: args.series]
    seconds = 0.0
    for first in range(0, args.steps, BATCH_STEPS):
        points = [
            MetricPoint(name, step, float(step), math.exp(-step / 1e5) + 0.1 * rng.random())
            for step in range(first, min(first + BATCH_STEPS, args.steps), args.every)
            for name in names
        ]
        start = time.perf_counter()
        store.record_progress(job_id, offset=first, progress=None, eval=None, points=points)
        seconds += time.perf_counter() - start
    return store, job_id, seconds


def read_seconds(store: JobStore, job_id: str, most: int, repeats: int = 3) -> float:
    """The best of `repeats` reads of the job's chart at `most` points a series."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        store.metrics(job_id, most=most)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1_400_000, help="steps of the job")
    parser.add_argument("--every", type=int, default=2, help="a point every this many steps")
    parser.add_argument("--series", type=int, default=6, choices=range(1, len(SERIES) + 1))
    args = parser.parse_args()
    points = len(range(0, args.steps, args.every)) * args.series
    print(
        f"{platform.machine()}, Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}"
    )
    print(f"job: {args.steps:,} steps, {points:,} points over {args.series} series\n")
    with tempfile.TemporaryDirectory(prefix="series-bench-") as tmp:
        # Per store: seconds to store, bytes, and seconds a chart (keyed by its points).
        figures: dict[bool, dict[str | int, float]] = {}
        for kept in (True, False):
            path = Path(tmp) / f"{'rolled' if kept else 'points'}.db"
            store, job_id, stored = fill(path, args, kept)
            figures[kept] = {
                "store": stored,
                "size": path.stat().st_size + Path(f"{path}-wal").stat().st_size,
                **{most: read_seconds(store, job_id, most) for most in (2000, 600)},
            }
            store.close()
    rolled, points_only = figures[True], figures[False]
    print("| measurement | with rollups | from the points | ratio |")
    print("|---|---:|---:|---:|")
    for most in (2000, 600):
        print(
            f"| chart of {most:,} points a series | {rolled[most]:.3f} s"
            f" | {points_only[most]:.3f} s | {points_only[most] / rolled[most]:.0f}x faster |"
        )
    print(
        f"| storing every batch | {rolled['store']:.1f} s | {points_only['store']:.1f} s"
        f" | {rolled['store'] / points_only['store']:.2f}x the time |"
    )
    print(
        f"| store file (+ WAL) | {rolled['size'] / 2**20:.0f} MiB"
        f" | {points_only['size'] / 2**20:.0f} MiB | {rolled['size'] / points_only['size']:.2f}x |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
