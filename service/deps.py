"""What route handlers depend on, as `Annotated` aliases (so tests can override them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import httpx
from fastapi import Depends, HTTPException, Request

from service.devices import DevicePool
from service.events import EventBroker
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


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def get_settings(request: Request) -> Settings:
    return get_runtime(request).settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


async def get_job(job_id: str, request: Request) -> JobRecord:
    # async: a primary-key read is quicker than a hop to the thread pool.
    job = get_runtime(request).store.get(job_id)
    if job is None:
        raise HTTPException(404, f"Job {job_id!r} not found.")
    return job


JobDep = Annotated[JobRecord, Depends(get_job)]
