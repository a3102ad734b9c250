"""A full or read-only data dir is said as such, not as a bare 500 "Internal Server Error"."""

from __future__ import annotations

import asyncio
import errno
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from service.errors import install_error_handlers
from tests.service.harness import Service, job_spec, worker_env


def _app(error: Exception) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/boom")
    async def boom() -> None:
        raise error

    return app


def _post(app: FastAPI) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/boom")

    # In a thread of its own: after the browser tests, Playwright keeps an event loop
    # running in this one, and asyncio.run() refuses to start another beside it.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, go()).result()


@pytest.mark.parametrize(
    ("error", "status", "words"),
    [
        (sqlite3.OperationalError("database or disk is full"), 507, "no space left"),
        (OSError(errno.ENOSPC, "No space left on device", "/d/runs/x/spec.json"), 507,
         "no space left (/d/runs/x/spec.json)"),
        (OSError(errno.EROFS, "Read-only file system", "/d/x"), 503, "read-only (/d/x)"),
        (sqlite3.OperationalError("attempt to write a readonly database"), 503, "read-only"),
    ],
)  # fmt: skip
def test_storage_error_is_said_in_json(error: Exception, status: int, words: str) -> None:
    response = _post(_app(error))
    assert response.status_code == status
    assert words in response.json()["detail"]


def test_other_errors_stay_500() -> None:
    assert _post(_app(OSError(errno.EIO, "I/O error"))).status_code == 500
    assert _post(_app(sqlite3.OperationalError("no such table: jobs"))).status_code == 500


def _locked_error(path: Path) -> sqlite3.OperationalError:
    """The error SQLite itself gives a writer while another connection (a backup tool, a
    sqlite3 shell) holds a write transaction on the file past the writer's busy timeout."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("CREATE TABLE IF NOT EXISTS t (x)")
    holder.execute("BEGIN IMMEDIATE")
    writer = sqlite3.connect(path, isolation_level=None, timeout=0.05)
    try:
        writer.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as error:
        return error
    finally:
        writer.close()
        holder.execute("ROLLBACK")
        holder.close()
    raise AssertionError("the second writer got the lock")


def test_store_locked_by_another_process_is_said(tmp_path: Path) -> None:
    response = _post(_app(_locked_error(tmp_path / "towerboard.db")))
    assert response.status_code == 503
    detail = response.json()["detail"]
    assert "locked by another process" in detail
    assert "nothing was changed: try again" in detail


# Fills the disk of its run directory, as a checkpoint that found no room does, and exits
# 1 without result.json: the trainer's own line naming the full disk goes to worker.log,
# on that disk too, and is lost with it.
_FILLING_WORKER = """\
import sys
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
try:
    with open(job_dir / "filler", "wb", buffering=0) as filler:
        while True:
            filler.write(b"x" * 65536)
except OSError:
    pass
sys.exit(1)
"""


def test_a_job_failed_by_a_full_disk_says_so_once_it_is_recorded(
    small_disk: Path, tmp_path: Path
) -> None:
    # Its error said "The worker exited with code 1." over a log cut off mid-line. The store
    # is on that disk too, so the end is recorded only once space is freed: the space is
    # the one seen as the worker ended, not the one freed by then.
    env = worker_env(tmp_path, "filling_worker", _FILLING_WORKER)
    service = Service(small_disk, env)  # its log beside the disk, not on it
    service.start()
    try:
        job = service.submit(job_spec())
        filler = small_disk / "runs" / job["id"] / "filler"
        # Until the service has seen the worker end: its store refusing the end, or taking
        # it (a WAL with room left).
        deadline = time.monotonic() + 60
        while f"Job {job['id']}: watching its worker failed" not in service.log.read_text():
            if service.job(job["id"])["state"] == "failed":
                break
            assert time.monotonic() < deadline, service.log.read_text()[-3000:]
            time.sleep(0.05)
        filler.unlink()
        failed = service.wait_state(job["id"], "failed", timeout=60)
    finally:
        service.close()
    reason = failed["error"]["reason"]
    assert reason.startswith("The worker exited with code 1. The disk of its run directory had ")
    assert "free when its end was seen: a full disk fails a checkpoint" in reason, reason
