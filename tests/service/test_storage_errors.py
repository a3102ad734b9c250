"""A full or read-only data dir is said as such, not as a bare 500 "Internal Server Error"."""

from __future__ import annotations

import asyncio
import errno
import sqlite3
from concurrent.futures import ThreadPoolExecutor

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
