"""/api/v1/tensorboard: start (or reuse), read and stop the service's TensorBoard."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from service.deps import RuntimeDep
from service.errors import FieldErrors
from service.schemas import ErrorPublic, TensorBoardCreate, TensorBoardPublic
from service.tensorboard import PATH_PREFIX, TensorBoardLauncher

router = APIRouter(prefix="/tensorboard", tags=["tensorboard"])


def _public(launcher: TensorBoardLauncher, request: Request) -> TensorBoardPublic:
    instance = launcher.instance
    if instance is None:
        return TensorBoardPublic(state="stopped", last_error=launcher.last_error)
    base = str(request.base_url).rstrip("/")
    return TensorBoardPublic.model_validate(
        {
            "state": launcher.state,
            "url": f"{base}{PATH_PREFIX}/",
            "job_ids": list(instance.job_ids) if instance.job_ids is not None else None,
            "pid": instance.pid,
            "started_at": instance.started_at,
            "last_used_at": launcher.last_used,
            "idle_stop_at": launcher.last_used + launcher.idle_seconds,
            "last_error": launcher.last_error,
        }
    )


@router.post(
    "",
    response_model=TensorBoardPublic,
    status_code=201,
    responses={
        200: {"model": TensorBoardPublic, "description": "Reused: already up for this selection"},
        422: {"model": ErrorPublic, "description": "Unknown job ids"},
    },
)
async def start_tensorboard(
    runtime: RuntimeDep, request: Request, response: Response, body: TensorBoardCreate | None = None
) -> TensorBoardPublic:
    """Start TensorBoard over the given jobs (all jobs when `job_ids` is left out), or reuse
    the one already up over the same selection. It is served under /tensorboard/ and
    answers once it has loaded (`state` goes from `starting` to `running`)."""
    job_ids = body.job_ids if body is not None else None
    if job_ids == []:  # a TensorBoard over nothing: surely not what was meant
        raise FieldErrors(
            [
                {
                    "field": "job_ids",
                    "message": "Expected at least one job id, or no `job_ids` for every job. "
                    "Received: []",
                }
            ]
        )
    if job_ids is not None:
        errors = [
            {"field": f"job_ids.{index}", "message": f"Unknown job. Received: {job_id!r}"}
            for index, job_id in enumerate(job_ids)
            if runtime.store.get(job_id) is None
        ]
        if errors:
            raise FieldErrors(errors)
    _, started = await runtime.launcher.start(job_ids)
    response.status_code = 201 if started else 200
    return _public(runtime.launcher, request)


@router.get("", response_model=TensorBoardPublic)
async def read_tensorboard(runtime: RuntimeDep, request: Request) -> TensorBoardPublic:
    """Whether TensorBoard is stopped, starting or running, and where."""
    return _public(runtime.launcher, request)


@router.delete("", response_model=TensorBoardPublic)
async def stop_tensorboard(runtime: RuntimeDep, request: Request) -> TensorBoardPublic:
    """Stop TensorBoard (nothing to do when it is not running)."""
    await runtime.launcher.stop()
    return _public(runtime.launcher, request)
