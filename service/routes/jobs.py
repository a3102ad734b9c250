"""/api/v1/jobs: submit, list, read, cancel, delete, follow, and read what a job wrote."""

from __future__ import annotations

import json
import math
import re
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from datetime import datetime
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi import Path as FastAPIPath
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask, BackgroundTasks
from typing_extensions import TypedDict  # pydantic needs it, not typing's, before 3.12

from service import deletion, metricscsv
from service.admission import WorkerImports, admit
from service.archives import ArchiveHead
from service.checkpoints import (
    Checkpoint,
    describe_archive,
    list_checkpoints,
    open_archive,
)
from service.deps import (
    JobDep,
    Runtime,
    RuntimeDep,
    SettingsDep,
    check_query,
    job_not_found,
    known_query,
)
from service.downloads import MEDIA_TYPE, archive_response, job_attachment
from service.errors import FieldErrors, store_is_full
from service.events import JobEvent, next_event, ready_events, sse_response
from service.exports import describe_export, open_export
from service.jobjson import render_job
from service.jsonbody import JSONBodyRoute
from service.progress import SERIES, percent_done
from service.runfiles import OffsetPastEnd, inside, read_lines_from, tail_with_end
from service.schemas import (
    BODY_REFUSED,
    UNKNOWN_QUERY,
    CheckpointPublic,
    CheckpointsPublic,
    ErrorPublic,
    JobCreate,
    JobPublic,
    JobsPublic,
    MetricsPublic,
    PriorityUpdate,
    ProfileCreate,
    ProfilePublic,
    ResumeCreate,
    RewoundPublic,
)
from service.series import Row
from service.settings import Settings
from service.store import (
    ATTEMPT_FIELDS,
    JobRecord,
    JobState,
    MetricRows,
    QueuePlace,
    Rewound,
    UnknownRevision,
    in_run_order,
)
from service.workers import this_python, worker_pythonpath
from trainer.rundir import RunDir, json_object, write_json_atomic
from trainer.spec import field_errors, options_not_read, shown_value, without_unread

router = APIRouter(prefix="/jobs", tags=["jobs"], route_class=JSONBodyRoute)

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorPublic, "description": "No such job"}
}
_JSON = "application/json"
# A cursor is a job's seq: plain ASCII digits ("²".isdigit() is true, int() refuses it),
# few enough to bind as SQLite's 64-bit integer.
_CURSOR = re.compile(r"[0-9]{1,18}")
# The queued jobs alone, listed in the order they start, read on after a place in the
# queue (`QueuePlace`): the last job's priority, when it joined the queue (its time as
# Python's repr writes it, which reads back as the same float) and its seq.
_PLACE_CURSOR = re.compile(
    r"(-?[0-9]{1,4})_([0-9]{1,20}(?:\.[0-9]{1,20})?(?:e[+-]?[0-9]{1,3})?)_([0-9]{1,18})"
)


def _cursor_after(job: JobRecord, run_order: bool) -> str:
    """The `next_cursor` of a page whose last job is `job`."""
    if not run_order:
        return str(job.seq)
    place = QueuePlace.of(job)
    return f"{place.priority}_{place.since!r}_{place.seq}"


def _read_cursor(cursor: str, run_order: bool) -> int | QueuePlace | None:
    """The seq a newest-first page reads on below, or the place in the queue a page of the
    queued jobs reads on after; None for a cursor that is no `next_cursor` of such a page."""
    if not run_order:
        return int(cursor) if _CURSOR.fullmatch(cursor) else None
    found = _PLACE_CURSOR.fullmatch(cursor)
    if not found or not math.isfinite(since := float(found[2])):
        return None
    return QueuePlace(int(found[1]), since, int(found[3]))


def _run(settings: Settings, job: JobRecord) -> RunDir:
    return RunDir(settings.runs_dir / job.id)


class DirectRoute(APIRoute):
    """An APIRoute whose endpoint is called straight with the request and its path
    parameters: no dependencies to solve, nothing to validate. Documented as usual. Only
    for an endpoint that takes exactly its path parameters (strings) and `request`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        endpoint = self.endpoint

        async def handle(request: Request) -> Response:
            response: Response = await endpoint(request=request, **request.path_params)
            return response

        return handle


async def read_job(job_id: str, request: Request) -> Response:
    """A job's state, progress, latest eval, result and error."""
    # The route every dashboard polls: a version check and the rendered JSON (see
    # service.jobjson), through a DirectRoute added first to the app (see `include`).
    if request.scope["query_string"]:  # no dependencies here: the check `known_query` does
        check_query(request, ())
    runtime: Runtime = request.app.state.runtime
    body = runtime.job_json.get(job_id)
    if body is None:
        raise HTTPException(404, job_not_found(job_id))
    return Response(body, media_type=_JSON)


def include(app: FastAPI, prefix: str) -> None:
    """Add the jobs routes to `app`. GET /jobs/{id} goes first and straight on the app:
    FastAPI's dependency solving and included-router matching cost more per request than
    the route's own work."""
    app.router.add_api_route(
        f"{prefix}/jobs/{{job_id}}",
        read_job,
        methods=["GET"],
        response_model=JobPublic,
        # Its own 422 (`check_query`'s), documented as the router's: FastAPI's default,
        # HTTPValidationError, is a shape the service never sends.
        responses={**_NOT_FOUND, **UNKNOWN_QUERY},
        tags=["jobs"],
        route_class_override=DirectRoute,
    )
    app.include_router(
        router, prefix=prefix, dependencies=[Depends(known_query)], responses=UNKNOWN_QUERY
    )


def _admit(spec: JobCreate, runtime: Runtime) -> tuple[JobCreate, list[dict[str, str]]]:
    """`admission.admit` on this service's devices, data roots and worker path."""
    settings = runtime.settings
    worker = WorkerImports(
        path=worker_pythonpath(),
        # Workers on another interpreter have other packages: a module that is on none of
        # this one's paths may be there.
        installed=settings.python == sys.executable,
        compiles=runtime.worker_python == this_python(),
    )
    return admit(
        spec,
        pool=runtime.pool,
        data_roots=settings.allowed_data_roots,
        worker=worker,
        model_modules=settings.model_modules,
    )


@router.post(
    "",
    status_code=201,
    response_model=JobPublic,
    responses={
        **BODY_REFUSED,
        422: {"model": ErrorPublic, "description": "Every problem with the spec"},
    },
)
def create_job(job_in: JobCreate, runtime: RuntimeDep) -> Response:
    """Validate a job spec, store it as `queued` and return it with its id."""
    spec, errors = _admit(job_in, runtime)
    errors += options_not_read(job_in)
    if errors:
        raise FieldErrors(errors)
    job = runtime.store.create(without_unread(spec.model_dump(mode="json")))
    runtime.broker.publish(JobEvent.state(job))  # a new row for whoever follows every job
    runtime.supervisor.wake()
    return Response(render_job(job), status_code=201, media_type=_JSON)


@router.get("", response_model=JobsPublic)
def read_jobs(
    runtime: RuntimeDep,
    state: Annotated[list[JobState], Query(description="Only jobs in these states")] = [],  # noqa: B006
    name: Annotated[
        str | None,
        Query(
            max_length=200,
            description="Only jobs whose name contains this text, in any case of the ASCII letters",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page")] = None,
) -> Response:
    """Jobs, newest first, a page at a time (`count`: how many match in all). The queued
    jobs alone (`state=queued`, with or without `name`) come in the order they start
    instead, as `GET /api/v1/queue` lists them: highest priority first, then by when each
    joined the queue."""
    # A plain def, each job rendered apart: a page carries every job's spec, and a custom
    # model's `params` may fill a body's 1 MiB, so a page of 200 jobs can be 200 MB. Read
    # and rendered whole on the event loop, it held up every other request for seconds.
    run_order = in_run_order(state)
    after: int | QueuePlace | None = None
    if cursor is not None:
        after = _read_cursor(cursor, run_order)
        if after is None:
            raise FieldErrors(
                [
                    {
                        "field": "query.cursor",
                        "message": "Expected the `next_cursor` of a previous page. "
                        f"Received: {shown_value(cursor)}",
                    }
                ]
            )
    # One more than asked tells whether there is a next page.
    jobs, count = runtime.store.page(
        states=state,
        name=name,
        limit=limit + 1,
        before_seq=after if isinstance(after, int) else None,
        after_place=after if isinstance(after, QueuePlace) else None,
    )
    more = len(jobs) > limit
    jobs = jobs[:limit]
    # `JobsPublic(...).model_dump_json()`, byte for byte, a job at a time: pydantic holds
    # the GIL for a whole call, the event loop's thread included.
    next_cursor = _JSON_STR.dump_json(_cursor_after(jobs[-1], run_order)) if more else b"null"
    body = b"".join(
        [
            b'{"data":[',
            b",".join(runtime.job_json.of(job) for job in jobs),
            b'],"count":%d,"next_cursor":' % count,
            next_cursor,
            b"}",
        ]
    )
    return Response(body, media_type=_JSON)


@router.post(
    "/{job_id}/cancel",
    response_model=JobPublic,
    responses={
        **_NOT_FOUND,
        202: {"model": JobPublic, "description": "Running: SIGTERM sent, the job ends soon"},
        409: {"model": ErrorPublic, "description": "The job has already ended"},
    },
)
def cancel_job(job: JobDep, runtime: RuntimeDep) -> Response:
    """Cancel a job: a queued one at once (200); a running one gets SIGTERM, checkpoints
    and exits, or is killed after the grace period (202). A resumed job whose attempt has
    not started goes back to how it was when it was resumed (200, its earlier state: a
    succeeded job's "train longer" taken back is succeeded again)."""
    store = runtime.store
    # Looked at again while the job moves between queued and running: one requeued between
    # the two looks (its worker had just died) was answered 409, "is queued; only queued or
    # running jobs can be cancelled". Three looks: each move takes a worker's start or end.
    for _ in range(3):
        if store.cancel_queued(job.id):
            status = 200
            break
        if store.request_cancel(job.id):
            status = 202
            runtime.supervisor.wake()
            break
    else:
        current = store.get(job.id)
        if current is None:  # ended and deleted by others since the route found it
            raise HTTPException(404, job_not_found(job.id))
        raise HTTPException(
            409,
            f"Job {job.id!r} {_is_in(current.state)}; only queued or running jobs can be "
            "cancelled.",
        )
    updated = store.get(job.id)
    if updated is None:  # cancelled, then deleted by another client before this read
        raise HTTPException(404, job_not_found(job.id))
    # Either way the job changed (cancelled, or running with `cancel_requested`): followers
    # see it now, not only when the worker has ended after its grace period.
    runtime.broker.publish(JobEvent.state(updated))
    return Response(render_job(updated), status_code=status, media_type=_JSON)


@router.patch(
    "/{job_id}",
    response_model=JobPublic,
    responses={
        **_NOT_FOUND,
        409: {"model": ErrorPublic, "description": "The job has ended: resume it with a "
              "`priority` instead"},
        422: {"model": ErrorPublic, "description": "No body, a key other than `priority`, or "
              "a priority out of its range"},
        **BODY_REFUSED,
    },
)  # fmt: skip
def update_job(job_id: str, runtime: RuntimeDep, update: PriorityUpdate | None = None) -> Response:
    """Change a queued or running job's `priority` (the one change a job takes): in the
    queue's order at once and in its stored spec (so its next attempt's spec.json, its
    `spec` here and Edit & resubmit say it), committed before the answer. A queued job keeps
    the time it joined the queue: it goes where it would be had it been submitted (or
    resumed) at the new priority, behind the jobs of that priority that were waiting before
    it and ahead of those that came after. A running job's new priority takes effect if it
    is requeued (its worker dies, the service restarts) or resumed. An ended job is
    refused (409): `POST /resume` takes a `priority`."""
    # The path's job is looked up after the body, so a bad body is a 422 for any id.
    if update is None:
        raise FieldErrors(
            [
                {
                    "field": "(body)",
                    "message": 'Expected a JSON body: {"priority": N}, the job\'s new '
                    "priority. Received: no body",
                }
            ]
        )
    store = runtime.store
    if not store.set_priority(job_id, update.priority):
        current = store.get(job_id)
        if current is None:
            raise HTTPException(404, job_not_found(job_id))
        then = (
            'with a larger total too, e.g. {"steps": N, "priority": P}'
            if current.state is JobState.SUCCEEDED
            else 'with {"priority": P}'
        )
        raise HTTPException(
            409,
            f"Job {job_id!r} {_is_in(current.state)}; only a queued or running job's priority "
            f"can be changed. To run it again at another priority, resume it {then} "
            f"(POST /api/v1/jobs/{job_id}/resume).",
        )
    updated = store.get(job_id)
    if updated is None:  # ended and deleted by others since the change
        raise HTTPException(404, job_not_found(job_id))
    # Followers of the job and of every job (the queue's place, the Queued list) see it move.
    runtime.broker.publish(JobEvent.state(updated))
    runtime.supervisor.wake()  # a job moved ahead of one that does not fit may start now
    return Response(render_job(updated), media_type=_JSON)


# One delete or resume of an ended job at a time: a second delete of a job must not put
# back the directory of a job the first one has deleted, nor a resume queue a job whose
# directory a delete has moved aside.
_ENDED_JOB_LOCK = threading.Lock()
# The jobs a delete is moving aside and deleting now, under that lock: a read that finds
# a job's files gone waits on that job's delete alone, not on every delete and resume
# (which hold the lock across a store write, up to SQLite's 30 s busy wait).
_DELETING: set[str] = set()
_DELETE_ENDED = threading.Condition()

# A worker outlives its result.json by TensorFlow's teardown, about a second. A delete or
# resume asked for then waits up to this long for the exit: answered at once with a 409,
# a script's `cancel --wait` (or `submit --watch`) and then `delete` failed one time in
# three. A worker still there after it (a busy host, a hang the supervisor kills after
# its grace) gets the 409 still, so a request never hangs for long. The wait is on the
# event loop, not a thread: dozens of them on the 40 threads every plain route runs on
# held up every other request (logs, downloads, submits) for as long.
EXIT_WAIT_SECONDS = 5.0


@router.delete(
    "/{job_id}",
    status_code=204,
    response_class=Response,
    responses={
        **_NOT_FOUND,
        204: {"description": "Deleted: the job, its metrics and its run directory"},
        409: {"model": ErrorPublic, "description": "The job has not ended, or its worker "
              f"has not exited within {EXIT_WAIT_SECONDS:g} s of the request"},
        500: {"model": ErrorPublic, "description": "Its run directory could not be moved"},
    },
)  # fmt: skip
async def delete_job(job: JobDep, runtime: RuntimeDep) -> Response:
    """Delete an ended job for good: its record, metrics, logs, checkpoints and export.
    Its files leave the API and TensorBoard at once; the disk space is freed just after."""
    await _wait_for_its_exit(job.id, runtime)
    return await anyio.to_thread.run_sync(_delete_alone, job.id, runtime)


def _delete_alone(job_id: str, runtime: Runtime) -> Response:
    with _ENDED_JOB_LOCK:  # a second delete of the same job finds it gone: 404
        with _DELETE_ENDED:
            _DELETING.add(job_id)
        try:
            return _delete(job_id, runtime)
        finally:
            with _DELETE_ENDED:
                _DELETING.discard(job_id)
                _DELETE_ENDED.notify_all()


def _being_deleted(job_id: str) -> bool:
    with _DELETE_ENDED:
        return job_id in _DELETING


def _gone_or_back(job_id: str, runtime: Runtime) -> bool:
    """Whether the job is gone, once a delete of it under way (if any) has ended: deleted,
    or its files put back (a record the store would not delete keeps them)."""
    with _DELETE_ENDED:
        _DELETE_ENDED.wait_for(lambda: job_id not in _DELETING)
    return runtime.store.version(job_id) is None


async def _wait_for_its_exit(job_id: str, runtime: Runtime) -> None:
    """Return once the job's worker has exited after its end, or it has none, or after
    `EXIT_WAIT_SECONDS`. Each look is one column of a primary-key read: on the loop, 50
    looks of a record whole (a spec may be a MiB, 8 ms to read) for each of dozens of
    waiting requests would hold it up."""
    deadline = time.monotonic() + EXIT_WAIT_SECONDS
    while runtime.store.is_exiting(job_id):
        if time.monotonic() >= deadline:
            return
        await anyio.sleep(0.1)  # the supervisor's poll is 0.2 s


def _ended_job(job_id: str, runtime: Runtime, verb: str, then: str = "") -> JobRecord:
    """The job, as the store has it, if it can be `verb` ("deleted", "resumed") now: a 404
    when there is none, a 409 when it has not ended (`then`, if given, follows that
    message to say what to do) or when its worker process is still exiting."""
    job = runtime.store.get(job_id)
    if job is None:
        raise HTTPException(404, job_not_found(job_id))
    if job.state is JobState.RUNNING and job.cancel_requested_at is not None:
        # Not `then`, which says to cancel it: a user who just had was left to do it again.
        raise HTTPException(
            409,
            f"Job {job.id!r} is stopping (cancel requested); only an ended job can be "
            f"{verb}: try again once it has ended.",
        )
    if not job.state.is_terminal:
        raise HTTPException(
            409,
            f"Job {job.id!r} is {job.state.value}; only an ended job can be {verb}."
            + (f" {then}" if then else ""),
        )
    if job.exiting is not None:
        raise HTTPException(
            409,
            f"Job {job.id!r} has ended but its worker process is still exiting; try again "
            "in a few seconds.",
        )
    return job


def _delete(job_id: str, runtime: Runtime) -> Response:
    job = _ended_job(
        job_id,
        runtime,
        "deleted",
        then=f"Cancel it first (POST /api/v1/jobs/{job_id}/cancel), then delete it once it "
        "has ended.",
    )
    runs_dir = runtime.settings.runs_dir
    try:
        aside = deletion.set_aside(runs_dir, job.id)
    except OSError as error:
        raise HTTPException(
            500,
            f"Job {job.id!r} was not deleted: its run directory could not be moved aside "
            f"({error.strerror or error}).",
        ) from error
    try:
        deleted = runtime.store.delete(job.id)
    except BaseException as error:
        if aside is not None:
            deletion.put_back(aside, runs_dir, job.id)
        if store_is_full(error):
            # The one change that frees space needs some to be recorded: the generic 507
            # ("free space on its disk") left an operator with a full disk no way through
            # the API, and no word of where this job's own files are.
            raise HTTPException(
                507,
                f"Job {job.id!r} was not deleted: the service's data dir has no space left, "
                f"and recording a delete needs some. Its files are kept, in "
                f"{runs_dir / job.id}: remove its checkpoints/ there (or other files on that "
                "disk) to make room, then delete it again.",
            ) from error
        raise
    if not deleted:  # not ended, or still exiting, after all: nothing else changes it
        if aside is not None:
            deletion.put_back(aside, runs_dir, job.id)
        raise HTTPException(409, f"Job {job.id!r} cannot be deleted now; try again.")
    runtime.job_json.forget(job.id)
    runtime.broker.publish(JobEvent(job.id, "deleted", {"id": job.id}))
    # After the answer: removing gigabytes of checkpoints, or millions of points, takes a
    # while.
    background = BackgroundTasks()
    if aside is not None:
        background.add_task(deletion.remove, aside)
    background.add_task(deletion.purge, runtime.store)
    return Response(status_code=204, background=background)


@router.post(
    "/{job_id}/resume",
    response_model=JobPublic,
    responses={
        **_NOT_FOUND,
        409: {"model": ErrorPublic, "description": "The job has not ended, its worker has "
              f"not exited within {EXIT_WAIT_SECONDS:g} s of the request, or it succeeded and "
              "no new total was given"},
        422: {"model": ErrorPublic, "description": "The new length, or the job's spec on "
              "this service now, is refused"},
        **BODY_REFUSED,
    },
)  # fmt: skip
async def resume_job(
    job: JobDep, runtime: RuntimeDep, resume_in: ResumeCreate | None = None
) -> Response:
    """Put an ended job back in the queue, behind the jobs already waiting at its priority
    (a `priority` given is its new one, in its spec too). Its next worker restores its
    latest checkpoint and trains on from there (from step 0 when it has none). A cancelled or failed job resumes as it is; a succeeded one needs
    a new `steps` or `epochs` to train longer. A cancelled or failed job given `steps`
    equal to its latest checkpoint's step is finished there: its worker restores that
    checkpoint, trains no step, runs the final eval and exports the model, and the job
    succeeds at that step. Its spec is admitted again, as at submission (the data must
    still be there, the towers still fit)."""
    await _wait_for_its_exit(job.id, runtime)
    return await anyio.to_thread.run_sync(_resume_alone, job.id, resume_in, runtime)


def _resume_alone(job_id: str, resume_in: ResumeCreate | None, runtime: Runtime) -> Response:
    with _ENDED_JOB_LOCK:  # not while a delete of the job moves its files
        return _resume(job_id, resume_in or ResumeCreate(), runtime)


def _is_in(state: JobState) -> str:
    """A job's state as a message says it: "has ended (succeeded)", not "is succeeded"."""
    return f"has ended ({state.value})" if state.is_terminal else f"is {state.value}"


def _steps_per_epoch(job: JobRecord) -> int | None:
    """An epoch's steps, as the job's worker counted them, or None when unknown."""
    # Said in its start line since 2026-11-27; before that, known only for a job of epochs
    # (total = epochs x an epoch).
    progress = job.progress or {}
    per_epoch = progress.get("steps_per_epoch")
    if isinstance(per_epoch, int):
        return per_epoch
    epochs, total = job.spec.get("epochs"), progress.get("total")
    if epochs and isinstance(total, int):
        per_epoch = total // epochs
    return per_epoch if isinstance(per_epoch, int) else None


def _length_errors(job: JobRecord, resume_in: ResumeCreate, last: int) -> list[dict[str, str]]:
    """The field errors of a new `steps` or `epochs` that would not reach `last`, the step
    of the job's latest checkpoint, where it resumes. A cancelled or failed job may end
    there ("finish here": restored, no step trained, its final eval and export); a
    succeeded one must train past it (it has its export)."""
    errors = []
    finishes = last > 0 and job.state in (JobState.CANCELLED, JobState.FAILED)
    there = "finishes the job there: its final eval and export, no step trained"
    if resume_in.steps is not None and (
        resume_in.steps < last if finishes else resume_in.steps <= last
    ):
        where = f"{last}, the step of the job's latest checkpoint, where it resumes"
        expected = f"at least {where} ({last} {there})" if finishes else f"more than {where}"
        errors.append(
            {"field": "steps", "message": f"Expected {expected}. Received: {resume_in.steps}"}
        )
    epochs, per_epoch = resume_in.epochs, _steps_per_epoch(job)
    if epochs is None or not per_epoch:
        return errors
    # Ending at the checkpoint takes epochs that end exactly on its step.
    at_it = finishes and last % per_epoch == 0
    if (epochs * per_epoch < last) if at_it else (epochs * per_epoch <= last):
        done = last // per_epoch
        least, then = (
            (f"at least {done}", f" ({done} {there})") if at_it else (f"more than {done}", "")
        )
        errors.append(
            {
                "field": "epochs",
                "message": f"Expected {least}: the job's latest checkpoint, where it resumes, "
                f"is at step {last}, and an epoch is {per_epoch} steps{then}. "
                f"Received: {epochs}",
            }
        )
    return errors


def _resumed_progress(
    job: JobRecord, resume_in: ResumeCreate, changed: bool, last: int
) -> dict[str, Any] | None:
    """The progress snapshot the resumed job shows until its next worker reports: the
    last attempt's, less what was that attempt's own, and of the new total if `changed`.
    A job that ran past its latest checkpoint (at step `last`; a failed one, say) shows
    that step, where it resumes, with no training numbers: its last report's were of a
    step past it, which the next attempt trains again or, finishing there, never does."""
    if job.progress is None:
        return None
    # The last attempt's phase ("done", "stopped", "failed"), ETA and speed are not this
    # one's: `status` and `--watch` would show the new attempt "running (done)" until its
    # worker reports, and the page a speed for a job that is not running.
    progress = {**job.progress, **dict.fromkeys(ATTEMPT_FIELDS)}
    step = progress.get("step")
    if last and isinstance(step, int) and step > last:
        step = last
        progress.update(step=step, loss=None, accuracy=None)
    total = progress.get("total")
    if changed:
        # Until the next worker reports, the job shows its step of the new total (of an
        # unknown one for epochs: the worker counts the steps an epoch takes).
        total = resume_in.steps
    progress.update(total=total, percent=percent_done(step, total) if total else None)
    return progress


def _resume(job_id: str, resume_in: ResumeCreate, runtime: Runtime) -> Response:
    # A queued or running job's priority is changed in place: said where one was given.
    # Else what a delete's refusal says: it left the user to guess how to get to a resume.
    then = (
        f'To change its priority, PATCH /api/v1/jobs/{job_id} with {{"priority": P}}.'
        if resume_in.priority is not None
        else f"Cancel it first (POST /api/v1/jobs/{job_id}/cancel), then resume it once it "
        "has ended."
    )
    job = _ended_job(job_id, runtime, "resumed", then=then)
    longer = resume_in.steps is not None or resume_in.epochs is not None
    if job.state is JobState.SUCCEEDED and not longer:
        raise HTTPException(
            409,
            f"Job {job.id!r} has succeeded: it trained all its steps. To train it longer, "
            'give a larger total, e.g. {"steps": N} or {"epochs": N}.',
        )
    spec = dict(job.spec)
    if longer:
        spec.update(steps=resume_in.steps, epochs=resume_in.epochs)
    if resume_in.priority is not None:
        spec.update(priority=resume_in.priority)
    try:
        admitted = JobCreate.model_validate(spec)
    except ValidationError as error:
        raise FieldErrors(field_errors(error)) from error
    admitted, errors = _admit(admitted, runtime)
    checkpoints = list_checkpoints(_run(runtime.settings, job))
    last = checkpoints[-1].step if checkpoints else 0
    errors += _length_errors(job, resume_in, last)
    if errors:
        raise FieldErrors(errors)
    # Resumed as it is, a job whose latest checkpoint has passed its total (one resumed
    # with fewer `epochs` than it had trained) fails again at once: say so here instead.
    old_total = job.spec.get("steps")
    if job.spec.get("epochs"):  # a job of epochs: the steps its worker counted
        old_total = (job.progress or {}).get("total")
    if not longer and isinstance(old_total, int) and last > old_total:
        raise HTTPException(
            409,
            f"Job {job.id!r} cannot train on as it is: its latest checkpoint, where it "
            f"resumes, is at step {last}, past its total of {old_total} steps. Give a larger "
            f'total, e.g. {{"steps": N}} with N over {last}.',
        )
    new_spec = without_unread(admitted.model_dump(mode="json"))
    changed = new_spec != without_unread(job.spec)  # a job stored before kept every option
    # Of a new length: a new priority alone leaves the total as it was.
    progress = _resumed_progress(job, resume_in, longer and changed, last)
    if not runtime.store.resume(job.id, spec=new_spec if changed else None, progress=progress):
        current = runtime.store.get(job.id)
        state = current.state.value if current else "deleted"
        raise HTTPException(409, f"Job {job.id!r} is {state} now and cannot be resumed.")
    resumed = runtime.store.get(job.id)
    if resumed is None:  # resumed, then cancelled and deleted by others before this read
        raise HTTPException(404, job_not_found(job.id))
    runtime.broker.publish(JobEvent.state(resumed))
    runtime.supervisor.wake()
    return Response(render_job(resumed), media_type=_JSON)


# One profile request at a time: each reads what is pending and writes the merge.
_PROFILE_LOCK = threading.Lock()


def _pending_trace_steps(run: RunDir) -> int | None:
    """The steps of a trace request the worker has not taken yet, if any."""
    if not inside(run.root, run.profile_request):
        return None
    try:
        request = json_object(run.profile_request.read_bytes()) or {}
    except OSError:
        return None
    steps = request.get("steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


@router.post(
    "/{job_id}/profile",
    response_model=ProfilePublic,
    status_code=202,
    responses={
        **_NOT_FOUND,
        409: {"model": ErrorPublic, "description": "The job is not running, or is stopping"},
        **BODY_REFUSED,
    },
)
def profile_job(
    job: JobDep, runtime: RuntimeDep, profile_in: ProfileCreate | None = None
) -> ProfilePublic:
    """Capture a device trace of the next N steps of a running job. The worker takes the
    request at its next progress report (within a few seconds); a `trace` event on the
    job's event stream says when it is done, and the trace then shows in TensorBoard's
    profile plugin. A request made while another still waits for the worker joins it: one
    trace, of the larger number of steps."""
    steps = (profile_in or ProfileCreate()).steps
    if job.state is not JobState.RUNNING:
        raise HTTPException(
            409, f"Job {job.id!r} {_is_in(job.state)}; only a running job can be traced."
        )
    if job.cancel_requested_at is not None:
        raise HTTPException(
            409, f"Job {job.id!r} is stopping (cancel requested); only a running job can be traced."
        )
    run = _run(runtime.settings, job)
    # Not while a delete moves the job's files: the job read above as running may have
    # ended and be going, and the request's write (which makes its folder) would leave a
    # run directory behind it. Under the lock, a job still in the store is not going.
    with _ENDED_JOB_LOCK, _PROFILE_LOCK:
        if runtime.store.version(job.id) is None:
            raise HTTPException(404, job_not_found(job.id))
        pending = _pending_trace_steps(run)
        traced = max(steps, pending or 0)
        write_json_atomic(run.profile_request, {"steps": traced})
    if pending is None:
        asked = f"A trace of the next {traced} steps was requested from the worker."
    else:  # one file, one trace: replacing it would cut short what was asked before
        asked = (
            f"A trace of the next {pending} steps was already waiting for the worker; "
            f"the trace now covers the next {traced} steps."
        )
    return ProfilePublic(
        job_id=job.id,
        steps=traced,
        detail=f"{asked} Follow GET /api/v1/jobs/{job.id}/events for its `trace` event "
        "(none comes if the job ends first); the trace then shows in TensorBoard's profile "
        "plugin.",
    )


@router.get(
    "/{job_id}/events",
    response_class=EventSourceResponse,
    responses={
        **_NOT_FOUND,
        200: {
            "content": {"text/event-stream": {}},
            "description": "`state` events (the job as JSON) and the worker's progress "
            "events (`start`, `progress`, `eval`, `checkpoint`, `trace`, `end`); the stream "
            "ends after the job does (what comes later, `exited` as its worker is gone and "
            "`deleted`, is on /api/v1/events; a stream opened as the job is deleted says "
            "`deleted` and ends).",
        },
    },
)
async def stream_job_events(job: JobDep, runtime: RuntimeDep) -> EventSourceResponse:
    """Server-Sent Events of a job's progress and state changes, live."""

    async def events(stopping: anyio.Event) -> AsyncIterator[ServerSentEvent | bytes]:
        with runtime.broker.listen(job.id) as queue:
            # Read after subscribing, so no change falls between the two.
            current = runtime.store.get(job.id)
            if current is None:  # deleted since the route found it: as its followers saw
                yield ServerSentEvent(event="deleted", data=json.dumps({"id": job.id}))
                return
            yield ServerSentEvent(event="state", data=render_job(current).decode())
            if current.state.is_terminal:
                return
            while (event := await next_event(queue, stopping)) is not None:
                # What is already waiting goes in one write, up to the job's end.
                events = ready_events(queue, event)
                ends = [
                    e.event == "state" and JobState(e.data["state"]).is_terminal for e in events
                ]
                if any(ends):
                    events = events[: ends.index(True) + 1]
                yield b"".join(
                    ServerSentEvent(event=e.event, data=json.dumps(e.data)).encode() for e in events
                )
                if any(ends):
                    return

    return sse_response(events)


LOG_OFFSET_HEADER = "X-Log-Offset"
_LOG_READ_BYTES = 1024 * 1024
_LOG_TAIL = 200  # lines, unless `tail` says


@router.get(
    "/{job_id}/logs",
    # Not PlainTextResponse: FastAPI documents every error's ErrorPublic under the route
    # class's media type, and they are sent as JSON. The 200 says its own.
    response_class=Response,
    responses={
        **_NOT_FOUND,
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "headers": {
                LOG_OFFSET_HEADER: {"description": "Pass as `offset` to read on from here"}
            },
        },
        416: {"model": ErrorPublic, "description": "`offset` is past the end of the log"},
    },
)
def read_job_logs(
    job: JobDep,
    runtime: RuntimeDep,
    tail: Annotated[
        int | None,
        Query(ge=1, le=100_000, description=f"How many last lines ({_LOG_TAIL} unless given)"),
    ] = None,
    offset: Annotated[
        int | None,
        Query(
            ge=0,
            description="Read whole lines from this byte on instead of the tail: the "
            f"{LOG_OFFSET_HEADER} header of the previous read",
        ),
    ] = None,
    limit: Annotated[
        int | None,
        Query(
            ge=1,
            le=16 * _LOG_READ_BYTES,
            description=f"With `offset`: at most this many bytes ({_LOG_READ_BYTES} unless given)",
        ),
    ] = None,
) -> PlainTextResponse:
    """The job's worker.log (empty before its worker starts): the last `tail` lines, or
    whole lines from byte `offset` on. Either way the `X-Log-Offset` header says where to
    read on from, so a follower sees every line once."""
    # Each reads the log its own way: one given with the other's would be left unread.
    if offset is not None and tail is not None:
        raise FieldErrors(
            [
                {
                    "field": "query.tail",
                    "message": "Expected `tail` or `offset`, not both: `tail` reads the last "
                    "lines, `offset` reads on from a byte. "
                    f"Received: tail={tail}, offset={offset}",
                }
            ]
        )
    if offset is None and limit is not None:
        raise FieldErrors(
            [
                {
                    "field": "query.limit",
                    "message": "Expected `limit` with `offset` only: it caps the bytes read "
                    f"from `offset` on (a tail reads `tail` lines). Received: limit={limit}",
                }
            ]
        )
    tail = _LOG_TAIL if tail is None else tail
    limit = _LOG_READ_BYTES if limit is None else limit
    run = _run(runtime.settings, job)
    read = _read_log(run, tail, offset, limit)
    if not isinstance(read, tuple):
        # No log, or none that far: a delete may have just moved the run directory aside,
        # which it does before it deletes the job's record (a record it cannot delete
        # keeps its files). A follower's read between the two answered 416 for a job
        # that was going. Once that delete has ended, it has either deleted the job (404)
        # or put its files back, and the log reads as it is; unless a delete of it began
        # meanwhile, which is waited on the same way.
        while True:
            if _gone_or_back(job.id, runtime):
                raise HTTPException(404, job_not_found(job.id))
            read = _read_log(run, tail, offset, limit)
            if isinstance(read, tuple) or not _being_deleted(job.id):
                break
    if isinstance(read, OffsetPastEnd):
        raise HTTPException(416, f"Cannot read the log of job {job.id}: {read}.") from read
    text, end = read if read is not None else ("", 0)
    return PlainTextResponse(text, headers={LOG_OFFSET_HEADER: str(end)})


def _read_log(
    run: RunDir, tail: int, offset: int | None, limit: int
) -> tuple[str, int] | OffsetPastEnd | None:
    """The text and the offset to read on from; None when there is no log (not yet, or
    not a plain file of the run directory); OffsetPastEnd when it ends before `offset`."""
    if not inside(run.root, run.log):
        return OffsetPastEnd(offset, 0) if offset else None
    if offset is None:
        lines, end = tail_with_end(run.log, tail)
        return "".join(f"{line}\n" for line in lines), end
    try:
        return read_lines_from(run.log, offset, limit)
    except OffsetPastEnd as e:
        return e


class _MetricPoint(TypedDict):
    """`MetricPointPublic` as a TypedDict: validated and dumped by pydantic alike, so the
    same JSON, without a model instance per point."""

    step: int
    time: datetime
    value: float


_METRIC_POINTS = TypeAdapter(list[_MetricPoint])
_JSON_STR = TypeAdapter(str)
_METRICS_CHUNK = 2000


def _metrics_json(job_id: str, revision: int, rows: Iterable[Row]) -> Iterator[bytes]:
    """`MetricsPublic(job_id, series).model_dump_json()`, byte for byte, in parts of
    _METRICS_CHUNK points, from rows in series and step order: a long job has millions of
    points, pydantic holds the GIL for a whole call, and a part at a time the service
    never holds them all (nor their JSON) at once. A point whose value is not finite is
    left out, as no point: the store holds none since it took one as no value
    (`service.progress`), but an older service stored infinities, which JSON has no number
    for (pydantic wrote null, against the schema's number)."""

    def points(batch: list[Row], more: bool) -> bytes:
        values = [{"step": step, "time": time, "value": value} for _, step, time, value in batch]
        chunk = _METRIC_POINTS.validate_python(values)
        return (b"," if more else b"") + _METRIC_POINTS.dump_json(chunk)[1:-1]

    yield b'{"job_id":%s,"revision":%d,"series":{' % (_JSON_STR.dump_json(job_id), revision)
    series: str | None = None
    batch: list[Row] = []
    sent = False  # whether the open series has sent points already
    for row in rows:
        if not math.isfinite(row[3]):
            continue
        if row[0] != series:
            if batch:
                yield points(batch, sent)
            yield (b"]," if series is not None else b"") + _JSON_STR.dump_json(row[0]) + b":["
            series, batch, sent = row[0], [], False
        batch.append(row)
        if len(batch) == _METRICS_CHUNK:
            yield points(batch, sent)
            batch, sent = [], True
    if batch:
        yield points(batch, sent)
    yield b"]}}" if series is not None else b"}}"


_CSV = "text/csv; charset=utf-8"
_SERIES_NAMES = Query(description=f"Only these series (repeat it): {', '.join(SERIES)}")


def _known_series(name: list[str]) -> None:
    """A 422 for each series in `name` that is none of SERIES: each named `query.name`, as
    a repeated parameter's values are (`service.errors`), its value saying which."""
    errors = [
        {
            "field": "query.name",
            "message": f"Expected one of {', '.join(SERIES)}. Received: {series[:200]!r}",
        }
        for series in name
        if series not in SERIES
    ]
    if errors:
        raise FieldErrors(errors)


# A read on, as /metrics and /metrics.csv both take it.
_AFTER_STEP = Query(
    ge=0,
    le=2**63 - 1,
    description="Only points after this step: the last step already read, to read on",
)
_REVISION = Query(
    ge=0,
    le=2**63 - 1,
    description="With `after_step`: the `revision` of the answer the points up to it "
    "came in (0 if not given): a 409 says where to read again from if they changed",
)
_REWOUND = {
    "model": RewoundPublic,
    "description": "Reading on: the points up to `after_step` changed since `revision`",
}


def _revision_beside(after_step: int | None, revision: int | None) -> None:
    """A 422 for a `revision` without the `after_step` it is the revision of."""
    if revision is not None and after_step is None:
        raise FieldErrors([{"field": "query.revision", "message": "Expected after_step beside it"}])


def _unknown_revision(e: UnknownRevision, revision: int | None) -> FieldErrors:
    """The 422 of a `revision` past the job's."""
    message = (
        f"Expected at most {e.revision}, the latest revision of the job's series (each "
        f"resume that changed steps already given made one). Received: {revision}"
    )
    return FieldErrors([{"field": "query.revision", "message": message}])


@router.get(
    "/{job_id}/metrics",
    response_model=MetricsPublic,
    responses={
        **_NOT_FOUND,
        409: _REWOUND,
        422: {"model": ErrorPublic, "description": "An unknown series, or a revision to come"},
    },
)
def read_job_metrics(
    job: JobDep,
    runtime: RuntimeDep,
    name: Annotated[list[str], _SERIES_NAMES] = [],  # noqa: B006
    after_step: Annotated[int | None, _AFTER_STEP] = None,
    points: Annotated[
        int | None,
        Query(
            ge=2,
            le=100_000,
            description="At most about this many points a series, for a chart: the steps cut "
            "into points/2 equal spans, each keeping its lowest and highest point, and the "
            "series' first and last point (a series of no more points comes whole)",
        ),
    ] = None,
    revision: Annotated[int | None, _REVISION] = None,
) -> Response:
    """The job's scalar series, from its progress lines."""
    _known_series(name)
    # A plain def: a long job's series take a while to render, on a worker thread rather
    # than the event loop every other request needs.
    _revision_beside(after_step, revision)
    try:
        if points is None:  # every point: sent as read, never held whole
            rows = runtime.store.stream_metrics(
                job.id, names=name, after_step=after_step, revision=revision
            )
            # Closed once the answer is over, however it ended: Starlette leaves a body
            # unclosed when its client goes away mid-stream, and its open read of the store
            # kept SQLite from checkpointing the WAL (which grew with every write) until a
            # cycle collection.
            return StreamingResponse(
                _metrics_json(job.id, rows.revision, rows),
                media_type=_JSON,
                background=BackgroundTask(rows.close),
            )
        current, read = runtime.store.read_metrics(
            job.id, names=name, after_step=after_step, most=points, revision=revision
        )
    except Rewound as e:
        return _rewound(e)
    except UnknownRevision as e:
        raise _unknown_revision(e, revision) from e
    thinned = ((p.name, p.step, p.time, p.value) for p in read)
    return Response(b"".join(_metrics_json(job.id, current, thinned)), media_type=_JSON)


def _metrics_csv(columns: list[str], rows: MetricRows) -> Iterator[bytes]:
    """The CSV's header and rows, about _METRICS_CHUNK rows a part, from rows in step order."""
    yield metricscsv.header(columns).encode()
    part: list[str] = []
    for line in metricscsv.stream_rows(rows, columns):
        part.append(line)
        if len(part) == _METRICS_CHUNK:
            yield "".join(part).encode()
            part = []
    if part:
        yield "".join(part).encode()


# The CSV has a path of its own, as a checkpoint's and the export's downloads do, rather
# than a `?format=csv` of /metrics: it is a file to save (`Content-Disposition`), of
# another media type, and of other parameters (`points` thins for a chart, which a
# spreadsheet's file does not want), each documented as what it is. `after_step` reads on
# as /metrics does, so a script can fetch the rows a CSV it keeps lacks with curl.
METRICS_REVISION_HEADER = "X-Metrics-Revision"


@router.get(
    "/{job_id}/metrics.csv",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/csv": {}},
            "description": "`step`, then a column per series; a row per step, in step order, "
            "each value as Python's repr (exact), empty where a series has no point",
            "headers": {
                METRICS_REVISION_HEADER: {
                    "description": "The series' `revision`: pass it beside `after_step` to "
                    "read on, as /metrics' answer's `revision`"
                }
            },
        },
        **_NOT_FOUND,
        409: _REWOUND,
        422: {"model": ErrorPublic, "description": "An unknown series, or a revision to come"},
    },
)
def download_job_metrics_csv(
    job: JobDep,
    runtime: RuntimeDep,
    name: Annotated[list[str], _SERIES_NAMES] = [],  # noqa: B006
    after_step: Annotated[int | None, _AFTER_STEP] = None,
    revision: Annotated[int | None, _REVISION] = None,
) -> Response:
    """The job's scalar series as a CSV file, as `towerboard metrics ID` prints it (the
    same bytes for the same `name`s and `after_step`): the columns `step` and each series
    named, in their order, or without `name` each series that has points (after
    `after_step`), by name. Every point, as an exact read of /metrics gives them: the
    newest step of a job that has not ended is left out while its eval may still come.
    With `after_step`, only the rows after it, under the header, refused as /metrics
    refuses a read on (409) where the points up to it changed since `revision`. Sent as
    read: the service holds one step's values, however long the job. Saved as `<job
    name>-<id>-metrics.csv`."""
    _known_series(name)
    _revision_beside(after_step, revision)
    try:
        rows = runtime.store.stream_metrics(
            job.id, names=name, after_step=after_step, revision=revision, by_step=True
        )
    except Rewound as e:
        return _rewound(e)
    except UnknownRevision as e:
        raise _unknown_revision(e, revision) from e
    columns = metricscsv.columns_of(name, rows.series or [])
    # Closed once the answer is over, however it ended, as /metrics' stream is.
    return StreamingResponse(
        _metrics_csv(columns, rows),
        media_type=_CSV,
        headers={
            "Content-Disposition": job_attachment(job.name, job.id, "metrics.csv"),
            METRICS_REVISION_HEADER: str(rows.revision),
        },
        background=BackgroundTask(rows.close),
    )


def _rewound(e: Rewound) -> JSONResponse:
    """The 409 of a read on whose points have changed since the client's revision."""
    detail = (
        f"The points of job {e.job_id} after step {e.after} changed since revision {e.since}"
        " (a resumed attempt trained those steps again, or added an eval of one): the ones"
        f" held after step {e.after} are not the job's now. Drop them and read on with"
        f" after_step={e.after}&revision={e.revision}."
    )
    body = RewoundPublic(detail=detail, read_again_after=e.after, revision=e.revision)
    return JSONResponse(body.model_dump(mode="json"), status_code=409)


@router.get("/{job_id}/checkpoints", response_model=CheckpointsPublic, responses=_NOT_FOUND)
def read_job_checkpoints(job: JobDep, settings: SettingsDep, request: Request) -> CheckpointsPublic:
    """The job's retained checkpoints: step, time and size of each."""
    base = str(request.url_for("download_checkpoint", job_id=job.id, step=0)).rsplit("/", 1)[0]
    return CheckpointsPublic(
        job_id=job.id,
        data=[
            CheckpointPublic.model_validate(
                {
                    "step": checkpoint.step,
                    "time": checkpoint.time,
                    "size_bytes": checkpoint.size_bytes,
                    "url": f"{base}/{checkpoint.step}",
                }
            )
            for checkpoint in list_checkpoints(_run(settings, job))
        ],
    )


_LATEST = "latest"
# A step as a path segment: plain ASCII digits, few enough for a 64-bit integer.
_STEP = re.compile(r"[0-9]{1,18}")
# `latest` re-reads the listing when the newest checkpoint went between listing and
# opening: a job with `keep: 1` deletes its previous checkpoint at every save.
_LATEST_TRIES = 5


_DOWNLOAD_HEADERS = {
    "ETag": {"description": "Strong; changes when the files do. Send it as If-Range to resume"},
    "Accept-Ranges": {"description": "`bytes`: a single `Range` is served (206)"},
}
_HEAD_DESCRIPTION = "The headers a GET would answer (length, ETag, name), without reading a file"
_HEAD_OK: dict[int | str, dict[str, Any]] = {
    200: {"headers": _DOWNLOAD_HEADERS, "description": "What a GET would send, without a body"}
}
_BAD_STEP: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorPublic, "description": "`step` is neither a step nor `latest`"}
}
_NO_CHECKPOINT: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorPublic, "description": "No such job, or no such checkpoint"}
}
_NO_EXPORT: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorPublic, "description": "No such job, or no export (yet)"}
}
_A = TypeVar("_A", bound=ArchiveHead)


def _download_responses(what: str) -> dict[int | str, dict[str, Any]]:
    return {
        200: {
            "content": {MEDIA_TYPE: {}},
            "headers": _DOWNLOAD_HEADERS,
            "description": f"A .tar.gz of {what} (uncompressed gzip, with Content-Length)",
        },
        206: {
            "content": {MEDIA_TYPE: {}},
            "headers": _DOWNLOAD_HEADERS,
            "description": "The single range `Range` asked for (`If-Range` matching the ETag, "
            "or absent); several ranges get the whole, as a 200",
        },
        416: {"model": ErrorPublic, "description": "The range starts past the end"},
    }


def _spec_json(job: JobRecord) -> bytes:
    return (json.dumps(without_unread(job.spec), indent=2, sort_keys=True) + "\n").encode()


def _data_json(job: JobRecord) -> bytes | None:
    """The job's `progress.data` (image shape, classes, example counts) as a checkpoint
    archive's data.json; None until a worker of the job has loaded its data."""
    data = (job.progress or {}).get("data")
    if data is None:
        return None
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def _checkpoint_archive(
    job: JobRecord,
    settings: Settings,
    step: str,
    build: Callable[[Checkpoint, bytes, bytes | None], _A | None],
) -> tuple[Checkpoint, _A]:
    """The checkpoint `step` names, and `build` of it (an open archive, or its head)."""
    if step != _LATEST and not _STEP.fullmatch(step):
        raise FieldErrors(
            [
                {
                    "field": "path.step",
                    "message": "Expected a checkpoint's step (a whole number of at most 18 "
                    f"digits) or {_LATEST!r}. "
                    f"Received: {step[:200]!r}",
                }
            ]
        )
    run = _run(settings, job)
    spec, data = _spec_json(job), _data_json(job)
    checkpoint, archive = None, None
    for _ in range(_LATEST_TRIES if step == _LATEST else 1):
        retained = list_checkpoints(run)
        if step == _LATEST:
            checkpoint = retained[-1] if retained else None
        else:
            checkpoint = next((c for c in retained if c.step == int(step)), None)
        archive = build(checkpoint, spec, data) if checkpoint is not None else None
        if archive is not None or checkpoint is None:
            break
    if checkpoint is None or archive is None:
        steps = ", ".join(str(c.step) for c in list_checkpoints(run)) or "none"
        if step == _LATEST:
            detail = f"Job {job.id!r} has no retained checkpoint (it is {job.state.value})."
            if steps != "none":  # every try lost the race with the worker's deletions
                detail = (
                    f"Job {job.id!r} replaced its latest checkpoint while it was being read; "
                    f"try again. Retained steps: {steps}."
                )
        else:
            detail = (
                f"Job {job.id!r} has no checkpoint at step {int(step)}. Retained steps: {steps}."
            )
        raise HTTPException(404, detail)
    return checkpoint, archive


_STEP_PATH = FastAPIPath(description="A retained checkpoint's step, or `latest`")


@router.get(
    "/{job_id}/checkpoints/{step}",
    response_class=StreamingResponse,
    responses={**_download_responses("the checkpoint"), **_NO_CHECKPOINT, **_BAD_STEP},
)
def download_checkpoint(
    job: JobDep,
    settings: SettingsDep,
    step: Annotated[str, _STEP_PATH],
    request: Request,
) -> Response:
    """One checkpoint (`latest`: the newest retained one) as a streamed .tar.gz with its
    spec.json and data.json (the image shape and class count to build its model for),
    restorable by `tf.train.Checkpoint` (extract it, then `tf.train.latest_checkpoint(dir)`). Resumable: `Range: bytes=N-` with `If-Range: ETAG`
    sends the rest (206), or the whole (200) if the files have changed since."""
    checkpoint, archive = _checkpoint_archive(job, settings, step, open_archive)
    return archive_response(request, archive, f"{job.id}-ckpt-{checkpoint.step}.tar.gz")


@router.head(
    "/{job_id}/checkpoints/{step}",
    response_class=Response,
    responses={**_HEAD_OK, **_NO_CHECKPOINT, **_BAD_STEP},
    description=_HEAD_DESCRIPTION,
)
def head_checkpoint(
    job: JobDep,
    settings: SettingsDep,
    step: Annotated[str, _STEP_PATH],
    request: Request,
) -> Response:
    checkpoint, head = _checkpoint_archive(job, settings, step, describe_archive)
    return archive_response(request, head, f"{job.id}-ckpt-{checkpoint.step}.tar.gz")


def _export_archive(
    job: JobRecord, settings: Settings, build: Callable[[RunDir, bytes], _A | None]
) -> _A:
    # Only a succeeded job's: a job resumed to train longer keeps its last export on disk
    # until its next one replaces it, and that model is not the one its spec now describes.
    archive = (
        build(_run(settings, job), _spec_json(job)) if job.state is JobState.SUCCEEDED else None
    )
    if archive is None:
        raise HTTPException(
            404,
            f"Job {job.id!r} has no exported model (a job exports its model as it succeeds; "
            f"it is {job.state.value}).",
        )
    return archive


@router.get(
    "/{job_id}/export",
    response_class=StreamingResponse,
    responses={**_download_responses("the SavedModel"), **_NO_EXPORT},
)
def download_export(job: JobDep, settings: SettingsDep, request: Request) -> Response:
    """The model a succeeded job exported, as a streamed .tar.gz: the SavedModel's files at
    its top (extract it, then `tf.saved_model.load(dir)`) with its model.json (the input's
    shape, range and pixel scaling, each output, the class ids, whose weights), and the
    job's spec.json and result.json. Resumable as a checkpoint's download is."""
    archive = _export_archive(job, settings, open_export)
    return archive_response(request, archive, f"{job.id}-export.tar.gz")


@router.head(
    "/{job_id}/export",
    response_class=Response,
    responses={**_HEAD_OK, **_NO_EXPORT},
    description=_HEAD_DESCRIPTION,
)
def head_export(job: JobDep, settings: SettingsDep, request: Request) -> Response:
    head = _export_archive(job, settings, describe_export)
    return archive_response(request, head, f"{job.id}-export.tar.gz")
