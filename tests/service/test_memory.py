"""Each tower's peak device memory, from the worker's progress lines to the job's JSON:
folded as the latest good line says it, and carried through a real service's status route."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.client.display import fold_event
from service.progress import fold_progress
from service.schemas import JobPublic
from service.store import JobStore
from tests.service.harness import Service, job_spec, stand_in_head, stand_in_service
from tests.service.test_client import towerboard

# `python -m memory_worker run --job-dir DIR`: progress lines with the peak memory its
# spec's name asks for, then it succeeds: "gpus" each tower's GPU's, after a trace's times,
# and a later line with a bad list; "cpus" none, as the trainer writes for towers on CPUs
# (and an older one for any). "live" reports a peak, and a higher one once a `go` file is
# in its run directory, until SIGTERM stops it (exit 3, as the trainer stops).
MEMORY_WORKER = (
    stand_in_head(100)
    + """\


def end(outcome, code):
    progress(event="end", step=3, outcome=outcome, phase="done")
    (job_dir / "result.json").write_text(json.dumps({"outcome": outcome, "message": name}))
    sys.exit(code)


progress(event="start", step=0, phase="starting", towers=2)
if name == "gpus":
    progress(event="trace", step=1, tower_ms=[1.0, 2.0])
    progress(event="progress", step=1, loss=0.5, memory_mb=[700.0, 650.5])
    progress(event="progress", step=2, loss=0.4, memory_mb=[812.4, 790.1])
    progress(event="progress", step=3, loss=0.3, memory_mb=[900.0, "lots"])
    end("succeeded", 0)
if name == "cpus":
    progress(event="progress", step=3, loss=0.3)
    end("succeeded", 0)
step, peak = 0, [100.0, 90.0]
while not stopped:
    step += 1
    if (job_dir / "go").exists():
        peak = [300.0, 290.0]
    progress(event="progress", step=step, loss=1 / step, memory_mb=peak)
    time.sleep(0.1)
end("cancelled", 3)
"""
)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(
        tmp_path_factory.mktemp("stand-in"), ("memory_worker", MEMORY_WORKER)
    ) as svc:
        yield svc


def ended(service: Service, name: str, **changes: Any) -> dict[str, Any]:
    """A job of `name` (what its worker writes; the spec with `changes`) run to its end,
    as the status route says."""
    job = service.submit(job_spec(name=name, towers=2, **changes))
    done = service.wait_state(job["id"], "succeeded", "failed", "cancelled")
    assert done["state"] == "succeeded", done
    return done


def test_status_route_has_each_towers_peak_memory(service: Service) -> None:
    # The last good line's; the one after it with a string in its list is left out.
    progress = ended(service, "gpus")["progress"]
    assert progress["memory_mb"] == [812.4, 790.1]


def test_status_route_has_no_memory_from_a_worker_that_says_none(service: Service) -> None:
    progress = ended(service, "cpus")["progress"]
    assert progress["memory_mb"] is None and progress["step"] == 3  # its lines were read


REPORT = {"time": 1.0, "event": "progress", "step": 2, "loss": 0.5}


def test_fold_progress_takes_the_latest_lines_memory() -> None:
    lines = [
        {**REPORT, "memory_mb": [700.0, 650.5]},
        {**REPORT, "step": 3, "memory_mb": [812.4, 790.1]},
        {**REPORT, "step": 4},  # a line without it keeps the last (an older worker's)
    ]
    progress, _, _ = fold_progress(None, None, lines)
    assert progress is not None and progress["memory_mb"] == [812.4, 790.1]


@pytest.mark.parametrize(
    "said",
    [
        [None, 1.0],
        [1.0, "lots"],
        [[1.0], 2.0],
        [1.0, float("nan")],
        [True, 1.0],
        "812.4",
        None,
    ],
    ids=str,
)
def test_fold_progress_keeps_odd_memory_out_of_the_job(tmp_path: Path, said: object) -> None:
    """A hand-written line's memory of another type is left out, the last good kept:
    stored, a null or a string in the list failed every read of the job's JSON. Folded,
    stored in a real store and read back as the API reads a job."""
    before = {"step": 1, "memory_mb": [2048.0, 1024.0]}
    progress, eval, points = fold_progress(before, None, [{**REPORT, "memory_mb": said}])
    store = JobStore(tmp_path / "jobs.db")
    job = store.create({"name": "hand-written", "priority": 0})
    store.record_progress(job.id, offset=1, progress=progress, eval=eval, points=points)
    stored = store.get(job.id)
    assert stored is not None
    public = JobPublic.from_record(stored).progress
    assert public is not None
    assert public.memory_mb == [2048.0, 1024.0]


def status_rows(service: Service, job_id: str) -> dict[str, str]:
    """`towerboard status ID`, its rows by name."""
    shown = towerboard("status", job_id, url=service.base_url)
    assert shown.returncode == 0, shown.stderr
    return dict(re.split(r"\s{2,}", line, maxsplit=1) for line in shown.stdout.splitlines())


def test_status_of_a_job_shows_each_towers_peak_memory(service: Service) -> None:
    rows = status_rows(service, ended(service, "gpus")["id"])
    assert rows["memory"] == "812.4, 790.1 MiB (peak)"
    rows = status_rows(service, ended(service, "cpus")["id"])
    assert "memory" not in rows and rows["state"] == "succeeded", rows


def test_watch_folds_a_progress_events_memory_as_the_service_does() -> None:
    job = {"id": "j1", "state": "running", "progress": {"step": 1, "memory_mb": [1.0, 2.0]}}
    good = {"event": "progress", "step": 2, "memory_mb": [812.4, 790.1]}
    p = fold_event(job, "progress", good)["progress"]
    assert p["memory_mb"] == [812.4, 790.1]
    odd = {"event": "progress", "step": 3, "memory_mb": [900.0, None]}
    p = fold_event({**job, "progress": p}, "progress", odd)["progress"]
    assert (p["step"], p["memory_mb"]) == (3, [812.4, 790.1])
