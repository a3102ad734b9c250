"""A full or read-only data dir is said as such, not as a bare 500 "Internal Server Error"."""

from __future__ import annotations

import asyncio
import errno
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from service.errors import install_error_handlers


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
