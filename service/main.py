"""Builds the FastAPI app: the API under /api/v1, /healthz and /metrics, the TensorBoard
proxy under /tensorboard, and the dashboard (static/) at /. Long-lived parts start in the
lifespan, never at import.

    uvicorn --factory service.main:create_app        (or: towerboard serve)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response

from service.auth import BearerAuth
from service.deps import Runtime
from service.devices import DevicePool
from service.errors import install_error_handlers
from service.events import EventBroker
from service.jobjson import JobJson
from service.proxy import proxy_tensorboard
from service.routes import devices, events, health, jobs, tensorboard
from service.settings import Settings
from service.store import JobStore
from service.supervisor import Supervisor
from service.tensorboard import PATH_PREFIX, TensorBoardLauncher

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
# The dashboard: plain files, no build step (see static/index.html).
STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
_PROXY_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = (settings or Settings()).resolved()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.runs_dir.mkdir(parents=True, exist_ok=True)
        store = JobStore(settings.db_path)
        pool = DevicePool.from_settings(settings)
        broker = EventBroker(asyncio.get_running_loop())
        supervisor = Supervisor(settings=settings, store=store, pool=pool, publish=broker.publish)
        # No pooled keep-alive limit worth having: TensorBoard is one local upstream.
        http = httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=5.0))
        launcher = TensorBoardLauncher(settings=settings, client=http)
        launcher.stop_orphan()
        supervisor.start()
        tensorboard_watch = asyncio.create_task(launcher.watch())
        app.state.runtime = Runtime(
            settings=settings,
            store=store,
            pool=pool,
            broker=broker,
            supervisor=supervisor,
            launcher=launcher,
            http=http,
            job_json=JobJson(store),
        )
        log.info("Towerboard serving with data dir %s, %s", settings.data_dir, pool.describe())
        try:
            yield
        finally:
            tensorboard_watch.cancel()
            supervisor.stop()  # workers keep running: the next service adopts them
            await launcher.stop()
            await http.aclose()
            store.close()

    app = FastAPI(
        title="Towerboard",
        summary="A monitoring-first TensorFlow training service.",
        version="0.1.0",
        lifespan=lifespan,
        # FastAPI's native OpenTelemetry asks the global providers on every request;
        # Towerboard exports no traces, so skip that cost on the hot status route.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    install_error_handlers(app)
    jobs.include(app, API_PREFIX)  # first: routes are matched in order
    for module in (events, tensorboard, devices):
        app.include_router(module.router, prefix=API_PREFIX)
    app.include_router(health.router)

    async def tensorboard_proxy(request: Request) -> Response:
        runtime: Runtime = request.app.state.runtime
        return await proxy_tensorboard(request, runtime.launcher, runtime.http)

    for path in (PATH_PREFIX, f"{PATH_PREFIX}/{{path:path}}"):
        app.add_api_route(path, tensorboard_proxy, methods=_PROXY_METHODS, include_in_schema=False)

    if (STATIC_DIR / "index.html").is_file():
        app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

        async def read_dashboard() -> FileResponse:
            return FileResponse(STATIC_DIR / "index.html")

        app.add_api_route("/", read_dashboard, methods=["GET"], include_in_schema=False)

    if settings.token is not None:
        app.add_middleware(BearerAuth, token=settings.token.get_secret_value())
    return app
