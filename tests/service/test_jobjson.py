"""The rendered-JSON cache of the status route, over a real store."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from service import jobjson
from service.jobjson import JobJson
from service.schemas import JobCreate
from service.store import JobRecord, JobState, JobStore
from tests.service.harness import job_spec


def _create(store: JobStore, **changes: object) -> JobRecord:
    """A job stored as the submit route stores it: its spec with every default."""
    return store.create(JobCreate.model_validate(job_spec(**changes)).model_dump(mode="json"))


def _held(cache: JobJson) -> int:
    return sum(len(body) for _, body in cache._rendered.values())


def test_the_cache_holds_at_most_its_bytes_whatever_the_jobs_size(tmp_path: Path) -> None:
    # Counted by jobs alone, 4,096 jobs whose specs carry a MiB of a custom model's
    # `params` each held 4 GiB of rendered JSON.
    store = JobStore(tmp_path / "jobs.db")
    params = {"blob": "p" * (jobjson._MAX_BYTES // 3)}
    jobs = [
        _create(store, name=f"big{n}", model={"name": "m:build", "params": params})
        for n in range(4)
    ]
    cache = JobJson(store)
    try:
        for job in jobs:
            body = cache.get(job.id)
            assert body is not None and json.loads(body)["id"] == job.id
            held = _held(cache)
            assert held <= jobjson._MAX_BYTES, (
                f"Expected at most {jobjson._MAX_BYTES} bytes kept. Received: {held}"
            )
        # What is kept is counted as it is dropped: a deleted job's JSON, and one rendered
        # again for a new version, leave no bytes behind in the count.
        for job in jobs:
            cache.forget(job.id)
        assert cache._bytes == _held(cache) == 0
        small = _create(store, name="small")
        cache.get(small.id)
        store.record_progress(small.id, offset=1, progress={"step": 1}, eval=None, points=[])
        assert json.loads(cache.get(small.id) or b"{}")["progress"]["step"] == 1
        assert cache._bytes == _held(cache) == len(cache.get(small.id) or b"")
    finally:
        store.close()


def test_export_url_only_while_a_succeeded_job_has_exported(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.db")
    try:
        job = _create(store, name="exports")
        exported = {"outcome": "succeeded", "export": "export"}
        url = f"/api/v1/jobs/{job.id}/export"

        def export_url(
            state: JobState = JobState.QUEUED, result: dict[str, Any] | None = None
        ) -> object:
            rendered = jobjson.render_job(replace(job, state=state, result=result))
            return json.loads(rendered)["export_url"]

        assert export_url() is None  # queued, never run
        assert export_url(state=JobState.RUNNING, result=None) is None
        assert export_url(state=JobState.SUCCEEDED, result=exported) == url
        # Its worker said it wrote none (a worker of a cluster other than its chief).
        assert export_url(state=JobState.SUCCEEDED, result={**exported, "export": None}) is None
        # Resumed to train on: its result and export on disk are the last run's, which the
        # export route refuses, so no URL leads there.
        assert export_url(state=JobState.QUEUED, result=exported) is None
        assert export_url(state=JobState.CANCELLED, result=exported) is None
    finally:
        store.close()
