"""The JSON of a job as the API shows it, rendered once per change of the job.

`GET /jobs/{id}` is what dashboards and scripts poll, far more often than a job changes
(a worker writes a progress line every few seconds). Each read checks the row's version,
one indexed lookup, and re-renders only when it moved, so the answer is never stale.
"""

from __future__ import annotations

import threading

from service.schemas import JobPublic
from service.store import JobRecord, JobStore

# Rendered jobs kept, and their bytes in all; past either the cache starts again empty.
# Counted alone, 4,096 jobs whose specs each carry a MiB of a custom model's `params` (the
# most a body may be) held 4 GiB; most jobs' JSON is 2-4 KB, so 4,096 of them fit.
_MAX_JOBS = 4096
_MAX_BYTES = 64 * 1024 * 1024


def render_job(job: JobRecord) -> bytes:
    return JobPublic.from_record(job).model_dump_json().encode()


class JobJson:
    def __init__(self, store: JobStore) -> None:
        self._store = store
        self._rendered: dict[str, tuple[int, bytes]] = {}
        self._bytes = 0  # of the bodies in `_rendered`
        # `put` runs on the event loop, `forget` on a delete's worker thread.
        self._lock = threading.Lock()

    def get(self, job_id: str) -> bytes | None:
        """The job's current JSON, or None when there is no such job."""
        version = self._store.version(job_id)
        if version is None:
            return None
        hit = self._rendered.get(job_id)
        if hit is not None and hit[0] == version:
            return hit[1]
        job = self._store.get(job_id)
        if job is None:
            return None
        return self.put(job)

    def of(self, job: JobRecord) -> bytes:
        """`job`'s JSON, as kept if that is of this version, else rendered now and not
        kept: a page of jobs read (up to 200 at a time) would fill the cache with jobs
        no one reads apart."""
        hit = self._rendered.get(job.id)
        if hit is not None and hit[0] == job.version:
            return hit[1]
        return render_job(job)

    def forget(self, job_id: str) -> None:
        """Drop a deleted job's JSON."""
        with self._lock:
            self._drop(job_id)

    def _drop(self, job_id: str) -> None:
        dropped = self._rendered.pop(job_id, None)
        if dropped is not None:
            self._bytes -= len(dropped[1])

    def put(self, job: JobRecord) -> bytes:
        """Render `job` and keep it for later reads."""
        body = render_job(job)
        with self._lock:
            self._drop(job.id)
            if len(self._rendered) >= _MAX_JOBS or self._bytes + len(body) > _MAX_BYTES:
                self._rendered.clear()
                self._bytes = 0
            self._rendered[job.id] = (job.version, body)
            self._bytes += len(body)
        return body
