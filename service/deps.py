"""What route handlers depend on, as `Annotated` aliases (so tests can override them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import httpx
from fastapi import Depends, HTTPException, Request

from service.devices import DevicePool
from service.events import EventBroker
from service.jobjson import JobJson
from service.settings import Settings
from service.store import JobRecord, JobStore
from service.supervisor import Supervisor
from service.tensorboard import TensorBoardLauncher


@dataclass(frozen=True)
class Runtime:
    """The long-lived parts of a running service, made in the app's lifespan."""

    settings: Settings
    store: JobStore
    pool: DevicePool
    broker: EventBroker
    supervisor: Supervisor
    launcher: TensorBoardLauncher
    http: httpx.AsyncClient
    job_json: JobJson


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


async def get_job(job_id: str, runtime: RuntimeDep) -> JobRecord:
    # A primary-key read on the event loop: quicker than a hop to the thread pool.
    job = runtime.store.get(job_id)
    if job is None:
        raise HTTPException(404, f"Job {job_id!r} not found.")
    return job


JobDep = Annotated[JobRecord, Depends(get_job)]
