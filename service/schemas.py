"""The API's request and response bodies, split by role."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from service.store import JobRecord, JobState, QueueEntry
from trainer.rundir import PROFILE_STEPS_DEFAULT, PROFILE_STEPS_MAX
from trainer.spec import PRIORITY_MAX, PRIORITY_MIN, JobSpec, JsonInt, without_unread

# Body of POST /jobs: exactly the trainer's job spec, validated by the same code.
JobCreate = JobSpec

# Where the API is served; here, as a job's JSON names a download by its path on it.
API_PREFIX = "/api/v1"


def _time(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


class FieldError(BaseModel):
    """One problem with one field of a request."""

    field: str
    message: str


class ErrorPublic(BaseModel):
    """Every 4xx/5xx body: what went wrong, and for 422 each field error."""

    detail: str
    errors: list[FieldError] = Field(default_factory=list)


# OpenAPI entries shared by many routes. Every route that takes a body refuses one not
# sent as JSON; the 413 of one past 1 MiB is every POST's, PUT's and PATCH's, whether it
# reads a body or not (`service.bodylimit`), declared on them all by `service.apidoc`.
BODY_REFUSED: dict[int | str, dict[str, Any]] = {
    415: {"model": ErrorPublic, "description": "The body was not sent as JSON"},
}
UNKNOWN_QUERY: dict[int | str, dict[str, Any]] = {
    422: {"model": ErrorPublic, "description": "An unknown or invalid parameter"}
}


def error_answer(description: str) -> dict[str, Any]:
    """An answer whose body is ErrorPublic, as /openapi.json writes one: for the statuses
    added to the built schema (`service.apidoc`, `service.auth`), those of the middlewares
    and app-wide handlers, which no route's `responses` names."""
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorPublic"}}},
    }


class DataPublic(BaseModel):
    """What a job trains and evaluates on, as its worker loaded it."""

    train_examples: int
    eval_examples: int = Field(
        description="Held out from the training files by `eval_fraction`, or the eval files'"
    )
    classes: int
    image_shape: list[int] = Field(description="Height, width and channels of an image.")


class ProgressPublic(BaseModel):
    """A running job's latest progress, from the worker's progress.jsonl."""

    # Not "forbid": a store from before `memory_shared` went holds it in jobs' progress,
    # which would make them unreadable. A key the fold keeps undeclared would vanish
    # unseen instead; tests/service/test_progress.py holds every one it keeps to a field.
    model_config = ConfigDict(extra="ignore")

    step: int | None = None
    total: int | None = None
    percent: float | None = None
    phase: str | None = Field(
        None,
        description="What the worker is doing: `preparing` (from its start until its `start` "
        "line: TensorFlow's import, the data, the model, the checkpoint; `stage` says which), "
        "`starting` (its first step), `training`, `eval`, `checkpoint`, `exporting`; once it "
        "has ended, how: `done` (it trained every step), `stopped` (by SIGTERM, after a "
        "checkpoint) or `failed` (workers before these said `done` of every end).",
    )
    phase_done: int | None = Field(
        None, description="How much of the phase is done (eval: batches)."
    )
    phase_total: int | None = Field(None, description="How much the phase has to do.")
    stage: str | None = Field(
        None,
        description="While `preparing`, which stage of it the worker is in, as it last said: "
        "`importing TensorFlow`, `checking data` (TFRecord files: every record header walked "
        "before any file is loaded), `loading data`, `joining data` (several files' examples "
        "copied into one array), `building the model` (and the input pipelines), "
        "`restoring checkpoint`. None from its `start` line on, and while a worker that "
        "says none prepares (an older one): then only `preparing` is known. A job that "
        "ended while preparing keeps the stage it ended in.",
    )
    stage_done: int | None = Field(
        None,
        description="How far the stage is, where it says (`checking data`, `loading data`: "
        "bytes of the data files walked or read, as they are on disk; `joining data`: bytes "
        "of the images copied; `restoring checkpoint`: bytes of its data files read). "
        "Said at most about once a second, and as the stage ends.",
    )
    stage_total: int | None = Field(
        None, description="What the stage has to do, in `stage_done`'s unit (bytes)."
    )
    stage_percent: float | None = Field(
        None,
        description="`stage_done` of `stage_total` in percent, to one decimal, as `percent`.",
    )
    loss: float | None = None
    accuracy: float | None = None
    examples_per_sec: float | None = None
    eta_seconds: float | None = None
    learning_rate: float | None = None
    towers: int | None = None
    steps_per_epoch: int | None = Field(
        None,
        description="How many steps one epoch of the job's training data takes at its batch "
        "size, as its worker counted them (a resume's `epochs` is checked by it).",
    )
    data: DataPublic | None = Field(
        None, description="What the job trains and evaluates on, once its worker has loaded it."
    )
    tower_ms: list[float] | None = None
    trace_step: int | None = Field(
        None,
        description="The step the latest device trace ended at: the one that gave `tower_ms`, "
        "or, where it gave none, `tower_ms_error`.",
    )
    tower_ms_error: str | None = Field(
        None,
        description="Why the device trace that ended at `trace_step` gave no per-tower times "
        "(its profiler could not record the GPU's kernels, say); the trace is still in "
        "TensorBoard's profile tab.",
    )
    memory_mb: list[float] | None = Field(
        None,
        description="The most memory (MiB) TensorFlow's allocator has held on each tower's "
        "GPU since the job's worker process started (a resume's worker starts its own), one "
        "a tower in `tower_ms`'s order. None for towers on CPUs (a CPU's counters miss a "
        "small model's tensors) and where the worker could not read the counters.",
    )
    checkpoint: str | None = None
    updated_at: datetime | None = None


class EvalPublic(BaseModel):
    """The latest evaluation of a job."""

    step: int | None = None
    loss: float | None = None
    accuracy: float | None = None
    examples: int | None = Field(
        None,
        description="How many eval examples loss and accuracy are over (`eval.batches` "
        "may read only the first of them).",
    )
    time: datetime | None = None


class JobErrorPublic(BaseModel):
    """Why a job failed (or how a cancel ended in a kill), with the end of its log."""

    reason: str
    exit_code: int | None = None
    signal: str | None = None
    log_tail: list[str] = Field(default_factory=list)


class _DeclaredAs:
    """A field's value kept as it is given, declared in the JSON schema as `model`'s (by a
    $ref to its component): for a stored dict that is a dump of `model`, which validating
    again would change (defaults filled in) and could refuse (a bound tightened since)."""

    def __init__(self, model: type[BaseModel]) -> None:
        self._model = model

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        model = self._model.__pydantic_core_schema__
        ref = model.get("ref")
        if not isinstance(ref, str):
            raise TypeError(f"Expected a model with a core schema ref. Received: {self._model}")
        # As a definition and a reference to it: the model's schema handed over alone is
        # written out in place, a copy of the component beside it, not a $ref to it.
        return handler(
            core_schema.definitions_schema(core_schema.definition_reference_schema(ref), [model])
        )


class JobPublic(BaseModel):
    """A job as the API shows it."""

    id: str
    name: str
    state: JobState
    priority: int
    spec: Annotated[dict[str, Any], _DeclaredAs(JobSpec)] = Field(
        description="The job spec as it was submitted and stored: a JobSpec with every "
        "default filled in, less the options its optimizer and schedule ignore, so that it "
        "can be submitted again as it is. A job stored by an earlier version lacks the "
        "fields added since, which have their defaults."
    )
    devices: list[str] = Field(description="The devices it holds: only while it runs.")
    ran_on: list[str] | None = Field(
        description="The devices its latest attempt was given, kept after it ends and while "
        "it waits for its next attempt; null before any attempt has started."
    )
    attempts: int
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None = Field(
        description="When its latest attempt started; null while it is queued (a resumed "
        "or requeued job's next attempt has not started: `attempts` counts it)."
    )
    finished_at: datetime | None = Field(
        description="When its latest attempt ended; null until then."
    )
    updated_at: datetime
    progress: ProgressPublic | None
    eval: EvalPublic | None
    result: dict[str, Any] | None = Field(
        description="The worker's result.json once it ends, its `finished_at` as ISO-8601 "
        "text, as every time here (the file holds Unix seconds)."
    )
    export_url: str | None = Field(
        description="The path on this service of its exported model's download (a .tar.gz "
        "of the SavedModel, GET or HEAD), once it has succeeded with one; null before, and "
        "while a resumed job trains on. A path, not a whole URL: the JSON is the same for "
        "every reader and every address the service is reached at."
    )
    error: JobErrorPublic | None

    @classmethod
    def from_record(cls, job: JobRecord) -> JobPublic:
        progress = dict(job.progress) if job.progress else None
        if progress is not None:
            progress["updated_at"] = _time(progress.get("updated_at"))
        eval = dict(job.eval) if job.eval else None
        if eval is not None:
            eval["time"] = _time(eval.get("time"))
        return cls(
            id=job.id,
            name=job.name,
            state=job.state,
            priority=job.priority,
            spec=without_unread(job.spec),  # a job stored before kept every option
            devices=job.devices,
            ran_on=job.ran_on,
            attempts=job.attempts,
            cancel_requested=job.cancel_requested_at is not None,
            created_at=_time(job.created_at),
            started_at=_time(job.started_at),
            finished_at=_time(job.finished_at),
            updated_at=_time(job.updated_at),
            progress=ProgressPublic.model_validate(progress) if progress else None,
            eval=EvalPublic.model_validate(eval) if eval else None,
            result=_result(job.result),
            export_url=_export_url(job),
            error=JobErrorPublic.model_validate(job.error) if job.error else None,
        )


def _export_url(job: JobRecord) -> str | None:
    """Where `GET /jobs/{id}/export` serves the job's model, where it serves one: a
    succeeded job whose worker says it exported (result.json's `export`, set once the
    SavedModel is written). Read from the record alone, as the JSON is rendered once per
    change of the job, not per read; a resumed job keeps its old export on disk, which
    the route refuses, so its URL goes with its `succeeded`."""
    exported = job.result is not None and job.result.get("export") is not None
    if job.state is not JobState.SUCCEEDED or not exported:
        return None
    return f"{API_PREFIX}/jobs/{job.id}/export"


def _result(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """A job's result.json as the API gives it: its `finished_at`, Unix seconds in the file
    (which other readers take as it is), as a time, like every other time the API gives."""
    if result is None:
        return None
    finished = result.get("finished_at")
    if isinstance(finished, int | float) and not isinstance(finished, bool):
        with contextlib.suppress(OverflowError, OSError, ValueError):  # not the trainer's
            return {**result, "finished_at": _time(finished)}
    return result


class JobsPublic(BaseModel):
    """A page of jobs, newest first (the queued jobs alone: in the order they start); pass
    `next_cursor` as `cursor` for the next page."""

    data: list[JobPublic]
    count: int = Field(description="Jobs matching the filter, over all pages.")
    next_cursor: str | None


class MetricPointPublic(BaseModel):
    step: int
    time: datetime
    value: float


class MetricsPublic(BaseModel):
    """A job's scalar series (loss, accuracy, examples_per_sec, learning_rate, eval_loss,
    eval_accuracy), each ordered by step."""

    job_id: str
    revision: int = Field(
        description="How many times a resumed attempt has replaced (or added to) points a "
        "read could already have given: send it back as `revision` when reading on"
    )
    series: dict[str, list[MetricPointPublic]]


class RewoundPublic(ErrorPublic):
    """A read on (`after_step`) whose points up to that step changed since the client's
    `revision`: the points it holds after `read_again_after` are not the job's now."""

    read_again_after: int = Field(
        description="Drop the points held after this step, and read on from it"
    )
    revision: int = Field(description="The series' revision now: send it with that read")


class CheckpointPublic(BaseModel):
    """One retained checkpoint of a job."""

    step: int
    time: datetime
    size_bytes: int
    url: str


class CheckpointsPublic(BaseModel):
    job_id: str
    data: list[CheckpointPublic]


class DevicePublic(BaseModel):
    """A device the service gives to jobs (a GPU, or a job slot on a CPU-only host)."""

    id: str
    kind: str
    job_id: str | None
    job_name: str | None = Field(
        None, description="The name of the job holding it (null where none holds it)."
    )
    exiting: bool = Field(
        False,
        description="True while the job holding it has ended and its worker process is "
        "still exiting (TensorFlow's teardown: seconds): the device is given out once the "
        "process is gone, which /api/v1/events says with the job's `exited` event.",
    )
    configured: bool = Field(
        True,
        description="False for a device a running job holds that the service's settings no "
        "longer name (set lower across a restart): it is not given out again.",
    )


class DevicesPublic(BaseModel):
    data: list[DevicePublic]
    max_towers: int


class QueuedJobPublic(BaseModel):
    """A queued job in the queue's order."""

    position: int = Field(description="Its place in the queue: 1 is the next job to start.")
    id: str
    name: str
    priority: int
    towers: int
    devices_needed: int = Field(
        description="The devices it holds once it runs: a GPU per tower, or on a CPU-only "
        "host one job slot whatever its towers."
    )
    queued_at: datetime = Field(
        description="When it joined the queue, the time that places it among the jobs of "
        "its priority: its submission, or its latest resume (a job requeued because its "
        "worker died or the service restarted keeps its place, and this time)."
    )

    @classmethod
    def from_entry(cls, position: int, entry: QueueEntry, devices_needed: int) -> QueuedJobPublic:
        return cls(
            position=position,
            id=entry.id,
            name=entry.name,
            priority=entry.priority,
            towers=entry.towers,
            devices_needed=devices_needed,
            queued_at=_time(entry.queued_at),
        )


class QueuePublic(BaseModel):
    """The queued jobs in the order the scheduler starts them: highest priority first, then
    the longest queued. The order is strict: a job at the head that does not fit holds back
    every job behind it (`waiting_for` says what it waits for)."""

    data: list[QueuedJobPublic] = Field(description="The first `limit` queued jobs, in order.")
    count: int = Field(description="Jobs queued in all, over the page and beyond it.")
    free_devices: int = Field(
        description="Configured devices free now: held by no running job and by no ended "
        "job's worker that is still exiting."
    )
    devices: int = Field(description="Devices the service is configured with.")
    waiting_for: str | None = Field(
        description="Why the first job has not started yet, e.g. `2 GPUs; 1 free` (the jobs "
        "behind it wait for it); null when nothing is queued."
    )


class ProfileCreate(BaseModel):
    """Body of POST /jobs/{id}/profile: how many of the next steps to trace."""

    model_config = ConfigDict(extra="forbid")

    # A number, not true or "3", as in a job spec.
    steps: JsonInt = Field(PROFILE_STEPS_DEFAULT, ge=1, le=PROFILE_STEPS_MAX)


class ResumeCreate(BaseModel):
    """Body of POST /jobs/{id}/resume: a new length for the job, to train it longer (or
    shorter, but past its latest checkpoint; a cancelled or failed job's may end at it, to
    finish the job there). Left out, the job keeps its own."""

    model_config = ConfigDict(extra="forbid")

    steps: JsonInt | None = Field(
        None,
        description="The job's new total steps (replaces `epochs`). A cancelled or failed "
        "job given its latest checkpoint's step is finished there: no step trained, its "
        "final eval and export.",
    )
    epochs: JsonInt | None = Field(
        None, description="The job's new total epochs (replaces `steps`)."
    )
    priority: JsonInt | None = Field(
        None,
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description="The job's new priority (its spec's `priority`): it goes back in the "
        "queue behind the jobs already waiting at that priority.",
    )


class PriorityUpdate(BaseModel):
    """Body of PATCH /jobs/{id}: a queued or running job's new priority."""

    model_config = ConfigDict(extra="forbid")

    priority: JsonInt = Field(
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description="The job's new priority, as its spec's `priority` (kept there too). A "
        "queued job moves in the queue at once, keeping the time it joined it: it goes where "
        "it would be had it been submitted (or resumed) at this priority. A running job's "
        "takes effect if it is requeued or resumed.",
    )


class ProfilePublic(BaseModel):
    """A trace request handed to a running job's worker."""

    job_id: str
    steps: int = Field(
        description="How many steps the trace will cover (with a request still pending, the larger)."
    )
    detail: str


class TensorBoardCreate(BaseModel):
    """Body of POST /tensorboard: the jobs to show, or all jobs when left out."""

    model_config = ConfigDict(extra="forbid")

    job_ids: list[str] | None = Field(None, max_length=200)
    merge: bool = Field(
        False,
        strict=True,  # true or false, not "yes" or 1
        description="Keep the jobs the running TensorBoard shows and add these (added in "
        "place, no restart): it is shared, and this never takes a job away from another "
        "user. Without it, a selection that leaves out jobs it shows restarts it over "
        "just these, and the answer's `replaced` says what was stopped.",
    )


class TensorBoardReplaced(BaseModel):
    """The TensorBoard a start stopped because it showed jobs the new selection leaves out."""

    job_ids: list[str] | None = Field(description="The jobs it showed (null: every job).")
    pid: int
    started_at: datetime
    last_used_at: datetime = Field(
        description="When it was last used (a proxied request or a start) before it was replaced."
    )


class TensorBoardPublic(BaseModel):
    """The TensorBoard the service runs, if any."""

    state: str = Field(description="stopped, starting or running")
    url: str | None = None
    job_ids: list[str] | None = Field(
        None, description="The jobs it shows; null for every job (or when stopped)."
    )
    pid: int | None = None
    started_at: datetime | None = None
    last_used_at: datetime | None = None
    idle_stop_at: datetime | None = None
    last_error: str | None = Field(
        None, description="Why the last TensorBoard ended on its own; null after a start."
    )
    replaced: TensorBoardReplaced | None = Field(
        None,
        description="The TensorBoard this one replaced when it started, because that one "
        "showed jobs this one does not (another user's, maybe); null when it replaced none.",
    )


class HealthPublic(BaseModel):
    status: str
