"""Builds the FastAPI app: the API under /api/v1, /healthz and /metrics, the TensorBoard
proxy under /tensorboard, and the dashboard (static/) at /. Long-lived parts start in the
lifespan, never at import. One data dir has one service: the lifespan first takes an
exclusive lock on <data_dir>/towerboard.lock and refuses to start when another holds it
(two would each adopt the other's workers, double-book devices and stop each other's
TensorBoard).

    uvicorn --factory service.main:create_app        (or: towerboard serve)
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from starlette.responses import RedirectResponse, Response

from service import deletion
from service.apidoc import document_answers
from service.auth import BearerAuth, document_bearer_auth
from service.bodylimit import BodyLimit
from service.browsers import BrowserGuard, listens_on_loopback
from service.deps import Runtime, known_query
from service.devices import DevicePool
from service.errors import install_error_handlers
from service.events import EventBroker
from service.headmethod import HeadAsGet
from service.jobjson import JobJson
from service.proxy import proxy_tensorboard
from service.routes import devices, events, health, jobs, queue, tensorboard
from service.schemas import API_PREFIX, UNKNOWN_QUERY
from service.settings import Settings
from service.store import JobStore
from service.supervisor import Supervisor
from service.tensorboard import PATH_PREFIX, TensorBoardLauncher
from service.upstream import Upstream
from service.workers import PythonVersion, this_python

DOCS_ASSETS = "/static/api-docs"  # Swagger UI's and ReDoc's scripts, styles and icon

log = logging.getLogger(__name__)

# The dashboard: plain files, no build step (see static/index.html).
STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
_PROXY_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
LOCK_NAME = "towerboard.lock"


class DataDirInUse(RuntimeError):
    """Another service holds the data dir's lock."""


def lock_data_dir(data_dir: Path) -> int:
    """Take the data dir's exclusive lock for this process; returns the descriptor holding it
    (close it to let go). The kernel drops it when the process dies, however it dies, and
    workers do not inherit it (Python's descriptors are not inheritable)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirInUse(
            f"Another Towerboard service is using the data dir {data_dir} (it holds {path}); "
            "refusing to start a second one on it. Stop that one, or give this one another "
            "--data-dir / TOWERBOARD_DATA_DIR."
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for a person looking
    return fd


@contextlib.asynccontextmanager
async def _running(
    app: FastAPI, settings: Settings, worker_python: PythonVersion | None
) -> AsyncIterator[None]:
    """The service's long-lived parts, from start to stop (the data dir lock is held).

    Each part is stopped by an exit stack, in the reverse of the order it started, whatever
    the stops before it raised: a TensorBoard that failed to stop (or workers that failed
    to be stopped) left the upstream client and the store open. A start cut short stops
    what had started."""
    settings.runs_dir.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        store = JobStore(settings.db_path)
        stack.callback(store.close)
        # A job whose delete a stop cut short before it was recorded keeps its files; then
        # what a stopped service left half-removed goes, in the background, as a delete
        # removes, so a large leftover never delays the start (a daemon: a stop mid-way is
        # swept again).
        deletion.restore(settings.runs_dir, store)
        threading.Thread(
            target=deletion.sweep, args=(settings.runs_dir,), name="sweep", daemon=True
        ).start()
        # Points of jobs deleted before a stop, still to be removed; a chunk at a time,
        # beside the service's own writes.
        threading.Thread(target=deletion.purge, args=(store,), name="purge", daemon=True).start()
        pool = DevicePool.from_settings(settings)
        broker = EventBroker(asyncio.get_running_loop())
        supervisor = Supervisor(settings=settings, store=store, pool=pool, publish=broker.publish)
        upstream = Upstream()
        stack.push_async_callback(upstream.aclose)
        launcher = TensorBoardLauncher(
            settings=settings,
            upstream=upstream,
            job_exists=lambda job_id: store.version(job_id) is not None,
        )
        stack.push_async_callback(launcher.stop)
        launcher.stop_orphan()
        supervisor.start()
        # Workers are left running: the next service adopts them. A thread join of up to
        # 10 s (the supervisor's pass in progress), so not on the event loop.
        stack.push_async_callback(asyncio.to_thread, supervisor.stop)
        tensorboard_watch = asyncio.create_task(launcher.watch())
        stack.callback(tensorboard_watch.cancel)
        if settings.stop_workers_on_exit:  # a container: its stop would kill them unsaved
            stack.push_async_callback(
                asyncio.to_thread, supervisor.stop_workers, settings.cancel_grace_seconds
            )
        # First of all: `towerboard serve` did at the signal; other servers now.
        stack.callback(supervisor.stop_starting)
        app.state.runtime = Runtime(
            settings=settings,
            store=store,
            pool=pool,
            broker=broker,
            supervisor=supervisor,
            launcher=launcher,
            upstream=upstream,
            job_json=JobJson(store),
            worker_python=worker_python,
        )
        log.info("Towerboard serving with data dir %s, %s", settings.data_dir, pool.describe())
        yield


def create_app(
    settings: Settings | None = None, *, worker_python: PythonVersion | None = None
) -> FastAPI:
    """The app. `worker_python`: which Python `settings.python` is, as the check of it at
    start found (`workers.check_worker_command`); not given, it is known only when workers
    run on this interpreter (`uvicorn --factory` checks no TOWERBOARD_PYTHON)."""
    settings = (settings or Settings()).resolved()
    if worker_python is None and settings.python == sys.executable:
        worker_python = this_python()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            lock = lock_data_dir(settings.data_dir)
        except DataDirInUse as error:
            log.error("%s", error)
            raise
        try:
            async with _running(app, settings, worker_python):
                yield
        finally:
            os.close(lock)  # let go of the data dir only once everything has stopped

    # FastAPI's own /docs and /redoc load Swagger UI and ReDoc from a CDN: blank pages on
    # a host without internet, as GPU hosts often are. fastapi-offline serves them from its
    # package, under /static/ (open without the token, as the dashboard's files are).
    app = FastAPIOffline(
        static_url=DOCS_ASSETS,
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
    for module in (events, tensorboard, devices, queue):
        app.include_router(
            module.router,
            prefix=API_PREFIX,
            dependencies=[Depends(known_query)],
            responses=UNKNOWN_QUERY,
        )
    app.include_router(health.router)

    async def tensorboard_proxy(request: Request) -> Response:
        runtime: Runtime = request.app.state.runtime
        return await proxy_tensorboard(request, runtime.launcher, runtime.upstream)

    for path in (PATH_PREFIX, f"{PATH_PREFIX}/{{path:path}}"):
        app.add_api_route(path, tensorboard_proxy, methods=_PROXY_METHODS, include_in_schema=False)

    async def tensorboard_font(name: str) -> RedirectResponse:
        return RedirectResponse(f"{PATH_PREFIX}/font-roboto/{quote(name)}", status_code=308)

    # TensorBoard's index.html names its fonts at the root (`url(/font-roboto/...)`), whatever
    # its --path_prefix: sent on to where the proxy serves them (they 404ed, four console
    # errors on every TensorBoard page). One path segment: nothing else of the root is reached.
    app.add_api_route(
        "/font-roboto/{name}", tensorboard_font, methods=["GET", "HEAD"], include_in_schema=False
    )

    if (STATIC_DIR / "index.html").is_file():
        app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

        async def read_dashboard() -> FileResponse:
            return FileResponse(STATIC_DIR / "index.html")

        # HEAD as for /healthz: a monitor may probe the page a person opens.
        app.add_api_route("/", read_dashboard, methods=["GET", "HEAD"], include_in_schema=False)

    app.add_middleware(BodyLimit)
    if settings.token is not None:  # added late, so it runs early: no body is read unauthenticated
        app.add_middleware(BearerAuth, token=settings.token.get_secret_value())
        document_bearer_auth(app)
    # Outermost but for HeadAsGet: its headers go on every answer, a 401 included.
    check_host = settings.token is None and listens_on_loopback(settings.host)
    app.add_middleware(BrowserGuard, check_host=check_host)
    # Outside even that: a HEAD no route takes is a GET to all the rest, auth included,
    # and its answer (BrowserGuard's headers and all) ends with its head.
    app.add_middleware(HeadAsGet, routes=app.router.routes)
    # Last, over the 401's: the middlewares' answers in /openapi.json, HEAD's without bodies.
    document_answers(app, check_host=check_host)
    return app
