"""What route handlers depend on, as `Annotated` aliases (so tests can override them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from service.devices import DevicePool
from service.errors import FieldErrors
from service.events import EventBroker
from service.jobjson import JobJson
from service.settings import Settings
from service.store import JobRecord, JobStore
from service.supervisor import Supervisor
from service.tensorboard import TensorBoardLauncher
from service.upstream import Upstream
from service.workers import PythonVersion


@dataclass(frozen=True)
class Runtime:
    """The long-lived parts of a running service, made in the app's lifespan."""

    settings: Settings
    store: JobStore
    pool: DevicePool
    broker: EventBroker
    supervisor: Supervisor
    launcher: TensorBoardLauncher
    upstream: Upstream
    job_json: JobJson
    # Which Python runs workers (None: not known, as under `uvicorn --factory` with a
    # TOWERBOARD_PYTHON): admission compiles a custom model's module only when it is this one's.
    worker_python: PythonVersion | None


# Dependencies are async: FastAPI runs a plain `def` dependency in the thread pool, a hop
# that costs more than the work itself.
async def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def get_settings(request: Request) -> Settings:
    runtime: Runtime = request.app.state.runtime
    return runtime.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def job_not_found(job_id: str) -> str:
    """The 404's message; an id past any real one's length is cut, not sent back whole."""
    shown = (
        repr(job_id[:200])[:-1] + "..." + repr(job_id)[-1] if len(job_id) > 200 else repr(job_id)
    )
    return f"Job {shown} not found."


async def get_job(job_id: str, runtime: RuntimeDep) -> JobRecord:
    # A primary-key read on the event loop: quicker than a hop to the thread pool.
    job = runtime.store.get(job_id)
    if job is None:
        raise HTTPException(404, job_not_found(job_id))
    return job


JobDep = Annotated[JobRecord, Depends(get_job)]


# Query parameter names each route declares, found once per route. Keyed by id (routes
# compare by value, so are not hashable); the route is kept with them, so an id is never
# taken for another route's.
_KNOWN_QUERY: dict[int, tuple[APIRoute, tuple[str, ...]]] = {}


def _query_names(dependant: Dependant) -> tuple[str, ...]:
    names = [field.alias for field in dependant.query_params]
    for sub in dependant.dependencies:
        names += [name for name in _query_names(sub) if name not in names]
    return tuple(names)


def check_query(request: Request, known: tuple[str, ...]) -> None:
    """422 for a query parameter the route does not take: a misspelt filter (`status=`
    for `state=`) would otherwise be ignored, and the unfiltered answer look like the
    filtered one."""
    unknown = [name for name in request.query_params if name not in known]
    if unknown:
        takes = ", ".join(known) or "none"
        raise FieldErrors(
            [
                {
                    "field": f"query.{name[:100]}",
                    "message": f"Unknown query parameter; this route takes {takes}. "
                    "Remove it or check its spelling.",
                }
                for name in unknown
            ]
        )


async def known_query(request: Request) -> None:
    """A route dependency: `check_query` against the parameters the route declares."""
    if not request.scope.get("query_string"):
        return
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    cached = _KNOWN_QUERY.get(id(route))
    if cached is None or cached[0] is not route:
        cached = _KNOWN_QUERY[id(route)] = (route, _query_names(route.dependant))
    check_query(request, cached[1])
