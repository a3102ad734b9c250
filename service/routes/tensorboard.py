"""/api/v1/tensorboard: start (or reuse), read and stop the service's TensorBoard."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from service.deps import RuntimeDep
from service.errors import FieldErrors
from service.jsonbody import JSONBodyRoute
from service.schemas import BODY_REFUSED, ErrorPublic, TensorBoardCreate, TensorBoardPublic
from service.tensorboard import PATH_PREFIX, StartOutcome, TensorBoardLauncher
from trainer.spec import shown_value

router = APIRouter(prefix="/tensorboard", tags=["tensorboard"], route_class=JSONBodyRoute)


def _public(launcher: TensorBoardLauncher, request: Request) -> TensorBoardPublic:
    instance = launcher.instance
    if instance is None:
        return TensorBoardPublic(state="stopped", last_error=launcher.last_error)
    base = str(request.base_url).rstrip("/")
    replaced = instance.replaced
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
            "replaced": None
            if replaced is None
            else {
                "job_ids": list(replaced.job_ids) if replaced.job_ids is not None else None,
                "pid": replaced.pid,
                "started_at": replaced.started_at,
                "last_used_at": replaced.last_used_at,
            },
        }
    )


@router.post(
    "",
    response_model=TensorBoardPublic,
    status_code=201,
    responses={
        200: {
            "model": TensorBoardPublic,
            "description": "Reused: already up over these jobs, or they were added to it",
        },
        422: {"model": ErrorPublic, "description": "Unknown job ids"},
        **BODY_REFUSED,
    },
)
async def start_tensorboard(
    runtime: RuntimeDep, request: Request, response: Response, body: TensorBoardCreate | None = None
) -> TensorBoardPublic:
    """Show the given jobs (all jobs when `job_ids` is left out) in the one TensorBoard the
    service runs for everyone: 201 when it starts now, 200 when the running one already
    showed them or they were added to it in place (no restart: a selection that includes
    every job it shows, or any selection with `merge`). A selection that leaves out jobs it
    shows restarts it over just these, and `replaced` says which jobs it showed. It is
    served under /tensorboard/ and answers once it has loaded (`state` goes from
    `starting` to `running`, or to `stopped` with `last_error`)."""
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
        # Its version, one indexed lookup, not the job (on the event loop: a job read whole
        # is its spec too, which a custom model's `params` can make a MiB).
        errors = [
            {
                "field": f"job_ids.{index}",
                "message": f"Unknown job. Received: {shown_value(job_id)}",
            }
            for index, job_id in enumerate(job_ids)
            if runtime.store.version(job_id) is None
        ]
        if errors:
            raise FieldErrors(errors)
    merge = body.merge if body is not None else False
    instance, outcome = await runtime.launcher.start(job_ids, merge=merge)
    if outcome is StartOutcome.ADDED and job_ids is not None:
        # Answer once TensorBoard lists them, so a tab opened on this answer shows them.
        await runtime.launcher.wait_runs_listed(instance, job_ids)
    response.status_code = 201 if outcome is StartOutcome.STARTED else 200
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
