"""Benchmark: the job store and the supervisor at scale: a page of many jobs, a supervisor
pass over a long queue, and a long job read on and resumed.

    .venv/bin/python bench/scale_bench.py [--jobs 20000] [--queued 500] [--params-kb 0]
                                          [--steps 1400000] [--checkout DIR]

A real SQLite store (WAL, synchronous=FULL as the service runs it; filled with it off) is
filled through `JobStore`'s own calls: `--jobs` jobs, all ended (succeeded, failed or
cancelled, each with a few points) but the last `--queued`, each spec carrying
`--params-kb` of a custom model's params (0: the tests' tiny job). Then:
  - each query a page of `GET /api/v1/jobs` makes (its filters, a cursor), the best of 5,
    with SQLite's plan for its SELECT;
  - a supervisor pass (`Supervisor.tick`, in this process, as the service runs it) while a
    stand-in worker (tests/service/harness.py's stepping worker) holds the one slot and the
    rest wait: the median of 30 passes;
  - one more job of `--steps` steps with a point every 2 steps in 6 series (0: none),
    stored as series_bench.py stores it: reading on after its last 100 steps
    (`GET /metrics?after_step=`, with and without `points`), and the first batch of a run
    resumed 1,000 steps before its end, which drops the points past that step.
`--checkout` runs another checkout's service code (an older commit's, say) on the same
figures. Results go to stdout as Markdown tables.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SERIES = ("loss", "accuracy", "examples_per_sec", "learning_rate", "grad_norm", "eval_loss")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs in the store")
    parser.add_argument("--queued", type=int, default=500, help="of them, left queued")
    parser.add_argument("--params-kb", type=int, default=0, help="custom params a spec")
    parser.add_argument("--steps", type=int, default=1_400_000, help="the long job's steps")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="whose service runs")
    return parser.parse_args()


def best(call: Callable[[], Any], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    args = parse()
    sys.path.insert(0, str(args.checkout.resolve()))
    from service.devices import DevicePool
    from service.settings import Settings
    from service.store import JobState, JobStore, MetricPoint
    from service.supervisor import Supervisor
    from tests.service.harness import job_spec, kill_processes_under, stepping_worker_env
    from trainer.spec import JobSpec

    print(
        f"{platform.machine()}, Python {platform.python_version()}, SQLite "
        f"{sqlite3.sqlite_version}, service of {args.checkout}"
    )
    print(
        f"store: {args.jobs:,} jobs, {args.queued:,} queued, {args.params_kb} kB of params "
        f"a spec; long job: {args.steps:,} steps\n"
    )
    tmp = Path(tempfile.mkdtemp(prefix="scale-bench-"))
    try:
        for name, value in stepping_worker_env(tmp).items():
            os.environ[name] = value
        settings = Settings(data_dir=tmp / "data", cpu_jobs=1).resolved()
        store = JobStore(settings.db_path)
        store._writer.execute("PRAGMA synchronous=OFF")  # noqa: SLF001 - filling only
        rng = random.Random(0)
        words = ("resnet", "mlp", "cnn", "sweep")
        tiny = JobSpec.model_validate(job_spec()).model_dump(mode="json")
        ids = []
        start = time.perf_counter()
        for n in range(args.jobs):
            spec = {**tiny, "name": f"job-{n:05d}-{words[n % 4]}", "priority": 5 * (n % 4 == 0)}
            if args.params_kb:
                table = [round(rng.random(), 6) for _ in range(args.params_kb * 1024 // 9)]
                spec["model"] = {"name": "mymodels:build", "params": {"table": table}}
            ids.append(store.create(spec).id)
        for n, job_id in enumerate(ids[: args.jobs - args.queued]):
            if n % 10 == 9:
                store.cancel_queued(job_id)
                continue
            store.mark_running(job_id, devices=["cpu:0"])
            points = [MetricPoint("loss", step, 0.0, 1 / step) for step in (1, 11, 21, 31)]
            store.record_progress(job_id, offset=1, progress=None, eval=None, points=points)
            ended = JobState.FAILED if n % 10 == 8 else JobState.SUCCEEDED
            store.finish(job_id, ended, result=None, error=None)
        store._writer.execute("PRAGMA synchronous=FULL")  # noqa: SLF001
        print(f"filled in {time.perf_counter() - start:.1f} s\n")

        reader = store._reader()  # noqa: SLF001 - the connection a page is read on
        middle = store.get(ids[len(ids) // 2]).seq  # type: ignore[union-attr]
        pages: dict[str, dict[str, Any]] = {
            "newest 50": {},
            "newest 200": {"limit": 200},
            "state=queued": {"states": [JobState.QUEUED]},
            "state=succeeded, 200": {"states": [JobState.SUCCEEDED], "limit": 200},
            "state=failed&state=cancelled, 200": {
                "states": [JobState.FAILED, JobState.CANCELLED],
                "limit": 200,
            },
            "state=succeeded, cursor halfway": {
                "states": [JobState.SUCCEEDED],
                "before_seq": middle,
            },
            "name=resnet": {"name": "resnet"},
            "name=nomatch": {"name": "nomatch"},
        }
        print("| page of GET /api/v1/jobs | best of 5 | plan of its SELECT |")
        print("|---|---:|---|")
        for label, kwargs in pages.items():
            statements: list[str] = []
            reader.set_trace_callback(statements.append)
            store.page(**kwargs)
            reader.set_trace_callback(None)
            select = next(sql for sql in statements if sql.lstrip().startswith("SELECT *"))
            plan = "; ".join(row[3] for row in reader.execute(f"EXPLAIN QUERY PLAN {select}"))

            def read(kwargs: dict[str, Any] = kwargs) -> None:
                store.page(**kwargs)

            seconds = best(read)
            print(f"| {label} | {seconds * 1000:.2f} ms | {plan} |")

        pool = DevicePool.from_settings(settings)
        supervisor = Supervisor(settings=settings, store=store, pool=pool, publish=lambda _: None)
        supervisor.recover()
        supervisor.tick()  # starts the stand-in on the one slot
        time.sleep(0.5)
        passes = []
        for _ in range(30):
            start = time.perf_counter()
            supervisor.tick()
            passes.append(time.perf_counter() - start)
            time.sleep(0.05)
        queue = best(store.queue)
        kill_processes_under(settings.data_dir)
        print(
            f"\n| with {args.queued - 1:,} queued, the slot busy | median | max |\n|---|---:|---:|"
        )
        print(
            f"| supervisor pass | {statistics.median(passes) * 1000:.1f} ms"
            f" | {max(passes) * 1000:.1f} ms |"
        )
        print(f"| `JobStore.queue()`, all of it | {queue * 1000:.1f} ms | |")

        if args.steps:
            job_id = store.create({"name": "long", "priority": 0, "towers": 1}).id
            store.mark_running(job_id, devices=[])
            start = time.perf_counter()
            for first in range(0, args.steps, 1000):
                points = [
                    MetricPoint(name, step, float(step), math.exp(-step / 1e5) + rng.random())
                    for step in range(first, min(first + 1000, args.steps), 2)
                    for name in SERIES
                ]
                store.record_progress(job_id, offset=first, progress=None, eval=None, points=points)
            last = (args.steps - 1) // 2 * 2
            print(f"\nlong job stored in {time.perf_counter() - start:.1f} s\n")
            print("| long job | best of 5 |\n|---|---:|")
            for most in (None, 2000):

                def read_on(most: int | None = most) -> None:
                    store.metrics(job_id, after_step=last - 100, most=most)

                label = "read on after its last 100 steps" + (f", points={most}" if most else "")
                print(f"| {label} | {best(read_on) * 1000:.1f} ms |")
            resumed = []
            for _ in range(5):
                restart = last - 1000
                again = [MetricPoint(n, restart + 2, 0.0, 0.5) for n in SERIES]
                start = time.perf_counter()
                store.record_progress(
                    job_id, offset=1, progress=None, eval=None, points=again, forget_after=restart
                )
                resumed.append(time.perf_counter() - start)
                last = restart + 2
            print(
                f"| first batch of a run resumed 1,000 steps back | {min(resumed) * 1000:.1f} ms |"
            )
        store.close()
    finally:
        kill_processes_under(tmp / "data")
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
