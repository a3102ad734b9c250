"""Reads a worker's progress.jsonl a bounded part at a time, and folds its lines into the
job's latest snapshot and metric series.

The supervisor reads the lines (`read_progress_chunk`) and stores what `fold_progress`
returns, a part at a time: a file that grew by 50 MB while the service was down (a week's
job reports some 300,000 lines) was read, parsed and folded whole, holding half a GB.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.store import EVAL_SERIES, MetricPoint
from trainer.rundir import json_object

# The most of progress.jsonl one read takes: some 4,000 lines, a few hundred bytes each.
PROGRESS_READ_BYTES = 1024 * 1024
# Looking for the end of a line longer than a read (no progress line is), this much at a time.
_SKIP_BLOCK = 64 * 1024

# progress-line field -> metric series name
_TRAIN_SERIES = {
    "loss": "loss",
    "accuracy": "accuracy",
    "examples_per_sec": "examples_per_sec",
    "learning_rate": "learning_rate",
}
_EVAL_SERIES = {name: name for name in EVAL_SERIES}  # its field and series: eval_loss, ...
# Every series a job can have, in the order the API names them.
SERIES = (*_TRAIN_SERIES.values(), *_EVAL_SERIES.values())
_SNAPSHOT_FIELDS = ("loss", "accuracy", "examples_per_sec", "eta_seconds", "learning_rate")


def read_progress_chunk(
    path: Path, offset: int, limit: int = PROGRESS_READ_BYTES
) -> tuple[list[dict[str, Any]], int]:
    """The complete lines of progress.jsonl from byte `offset` on, at most `limit` bytes of
    them, as JSON objects; and the offset after them (`offset` itself when there are none).

    A line still being written is left for the next read. A line that holds no JSON object
    (`trainer.rundir.json_object`: torn, or junk a crashed host left) is skipped, and so
    is a line longer than `limit`, once it has ended, so a reader always moves on. A
    missing file reads as empty.
    """
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(limit)
            end = data.rfind(b"\n")
            if end < 0 and len(data) == limit:  # one line longer than a read
                return [], _past_line_end(f, offset)
    except FileNotFoundError:
        return [], offset
    if end < 0:
        return [], offset
    lines = [line for raw in data[: end + 1].splitlines() if (line := json_object(raw)) is not None]
    return lines, offset + end + 1


def _past_line_end(f: Any, offset: int) -> int:
    """Past the newline of the line that began at `offset` and runs on where `f` is; or
    `offset` while it has not ended (the next read looks again)."""
    position = f.tell()
    while block := f.read(_SKIP_BLOCK):
        newline = block.find(b"\n")
        if newline >= 0:
            return position + newline + 1
        position += len(block)
    return offset


def _number(value: Any) -> float | None:
    """A finite number, else None: a NaN or infinity (Python's json reads `NaN`, which
    today's trainer writes as null) would make the job's JSON unwritable, not just odd."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _numbers(value: Any) -> list[float] | None:
    """A list of finite numbers (`_number`), else None: a null or a string in it, stored,
    failed every read of the job (its API JSON takes numbers alone)."""
    if not isinstance(value, list):
        return None
    numbers = [number for item in value if (number := _number(item)) is not None]
    return numbers if len(numbers) == len(value) else None


@dataclass
class _Folded:
    """What the lines folded so far made: the job's snapshot, its latest eval, and the
    metric points to store."""

    snapshot: dict[str, Any]
    eval: dict[str, Any] | None
    points: list[MetricPoint]


def fold_progress(
    progress: dict[str, Any] | None,
    eval: dict[str, Any] | None,
    lines: list[dict[str, Any]],
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, list[MetricPoint]]:
    """Apply `lines` in order; returns the new (progress, eval, metric points)."""
    folded = _Folded(dict(progress) if progress else {}, dict(eval) if eval else None, [])
    for line in lines:
        step, when = line.get("step"), _number(line.get("time")) or 0.0
        _fold_any(folded.snapshot, line, step, when)
        event = line.get("event")
        if isinstance(event, str) and (fold := _FOLD_EVENT.get(event)) is not None:
            fold(folded, line, step, when)
    if not lines and not progress:
        return None, folded.eval, folded.points
    snapshot = folded.snapshot
    snapshot["percent"] = percent_done(snapshot.get("step"), snapshot.get("total"))
    return snapshot, folded.eval, folded.points


def _fold_any(snapshot: dict[str, Any], line: dict[str, Any], step: Any, when: float) -> None:
    """What a line of any event says: where the job is, and when."""
    if isinstance(step, int):
        snapshot["step"] = step_after(snapshot.get("step"), line.get("event"), step)
    if isinstance(line.get("total"), int):
        snapshot["total"] = line["total"]
    fold_phase(snapshot, line)
    snapshot["updated_at"] = when
    if (tower_ms := _numbers(line.get("tower_ms"))) is not None:
        snapshot["tower_ms"] = tower_ms


def fold_phase(snapshot: dict[str, Any], line: dict[str, Any]) -> None:
    """A line that sets the phase: the phase, how far into it (eval batches, say) when the
    line says, and the stage of a preparation (`fold_stage`); a line that sets the phase
    without them clears them. The CLI folds a stream's events with this too."""
    if not isinstance(line.get("phase"), str):
        return
    snapshot["phase"] = line["phase"]
    done, of = line.get("phase_done"), line.get("phase_total")
    if isinstance(done, int) and isinstance(of, int):
        snapshot["phase_done"], snapshot["phase_total"] = done, of
    else:
        snapshot.pop("phase_done", None)
        snapshot.pop("phase_total", None)
    fold_stage(snapshot, line)


# What a worker's preparation says of its stage (`trainer.preparing`); an attempt's alone.
STAGE_FIELDS = ("stage", "stage_done", "stage_total", "stage_percent")


def fold_stage(snapshot: dict[str, Any], line: dict[str, Any]) -> None:
    """A line that sets the phase: the stage of the worker's preparation it names (`loading
    data`), with how far that is where it says (`stage_done` of `stage_total` bytes, and
    their `stage_percent`, rounded as `percent`). A line that sets a phase without a stage
    (the `start` line's `starting`) ends it; a worker that writes none (an older one, a
    stand-in) leaves the job `preparing` alone, as before."""
    stage = line.get("stage")
    if not isinstance(stage, str):
        for key in STAGE_FIELDS:
            snapshot.pop(key, None)
        return
    snapshot["stage"] = stage
    done, of = line.get("stage_done"), line.get("stage_total")
    if (
        isinstance(done, int)
        and isinstance(of, int)
        and not isinstance(done, bool)
        and not isinstance(of, bool)
        and 0 <= done <= of
        and of > 0
    ):
        snapshot["stage_done"], snapshot["stage_total"] = done, of
        snapshot["stage_percent"] = percent_done(done, of)
    else:
        for key in STAGE_FIELDS[1:]:
            snapshot.pop(key, None)


def _fold_start(folded: _Folded, line: dict[str, Any], step: Any, when: float) -> None:
    if isinstance(step, int):
        # A run starting at `step` (a resume): what an earlier run reported past it was
        # lost with that run, and this one reports those steps again.
        folded.points = [point for point in folded.points if point.step <= step]
    if not isinstance(line.get("towers"), int):
        return
    snapshot = folded.snapshot
    snapshot["towers"] = line["towers"]
    per_epoch = line.get("steps_per_epoch")
    if isinstance(per_epoch, int) and not isinstance(per_epoch, bool) and per_epoch > 0:
        snapshot["steps_per_epoch"] = per_epoch
    if (data := _data_summary(line.get("data"))) is not None:
        snapshot["data"] = data


def _fold_report(folded: _Folded, line: dict[str, Any], step: Any, when: float) -> None:
    """A `progress` line: the training numbers, in the snapshot and as points."""
    for field in _SNAPSHOT_FIELDS:
        folded.snapshot[field] = _number(line.get(field))
    fold_memory(folded.snapshot, line)
    if isinstance(step, int):
        folded.points.extend(
            MetricPoint(series, step, when, value)
            for field, series in _TRAIN_SERIES.items()
            if (value := _number(line.get(field))) is not None
        )


def fold_memory(snapshot: dict[str, Any], line: dict[str, Any]) -> None:
    """A `progress` line's `memory_mb`, each tower's GPU's peak MiB. A line without it
    (towers on CPUs, a worker that could not read the counters, an older worker), or with
    a list of anything but finite numbers, keeps the last good one: stored, a null or a
    string in the list failed every read of the job."""
    if (memory_mb := _numbers(line.get("memory_mb"))) is not None:
        snapshot["memory_mb"] = memory_mb


def _fold_eval(folded: _Folded, line: dict[str, Any], step: Any, when: float) -> None:
    examples = line.get("eval_examples")
    folded.eval = {
        # Checked as the snapshot's step is: a hand-written `"step": "x"` stored as it
        # was failed the job's every read (its API JSON, the list, the stream).
        "step": step if isinstance(step, int) else None,
        "loss": _number(line.get("eval_loss")),
        "accuracy": _number(line.get("eval_accuracy")),
        "examples": examples if isinstance(examples, int) else None,
        "time": when,
    }
    if isinstance(step, int):
        folded.points.extend(
            MetricPoint(series, step, when, value)
            for field, series in _EVAL_SERIES.items()
            if (value := _number(line.get(field))) is not None
        )


def _fold_checkpoint(folded: _Folded, line: dict[str, Any], step: Any, when: float) -> None:
    if isinstance(line.get("checkpoint"), str):
        folded.snapshot["checkpoint"] = line["checkpoint"]


def _fold_end(folded: _Folded, line: dict[str, Any], step: Any, when: float) -> None:
    snapshot = folded.snapshot
    # Nothing is left to wait for, but a cancelled or failed job is not "done in 0 s": its
    # last estimate would go on promising an end it will not reach.
    snapshot["eta_seconds"] = 0.0 if line.get("outcome") == "succeeded" else None
    # A cancelled run's end says the loss and accuracy of the step it stopped at, which
    # its last report (up to 2 s before) was not: the job and its charts end with the
    # numbers its result has.
    for field in ("loss", "accuracy"):
        if (value := _number(line.get(field))) is not None:
            snapshot[field] = value
            if isinstance(step, int):
                folded.points.append(MetricPoint(_TRAIN_SERIES[field], step, when, value))


def step_after(at: Any, event: Any, step: Any) -> Any:
    """Where a job at step `at` is after a line of `event` at `step`. A `trace` line's step
    is the trace's last: the worker writes the line once the trace is read, off its loop,
    reports of later steps before it (the job went back to the trace's step until its next
    report). Still a step the job has done: the job is at least there (it showed
    trace_step 335 at step 330 until the next report)."""
    if event == "trace" and isinstance(at, int):
        return max(at, step) if isinstance(step, int) else at
    return step


def _fold_trace(folded: _Folded, line: dict[str, Any], step: Any, when: float) -> None:
    fold_trace_line(folded.snapshot, line)


def fold_trace_line(snapshot: dict[str, Any], line: dict[str, Any]) -> None:
    """A `trace` line's own fields: which trace the times are from, or why it gave none."""
    step = line.get("step")
    if isinstance(step, int):
        # Every later line repeats tower_ms; only the trace's own line says which trace
        # (the spec's trace_steps or one asked for later) the times are from.
        snapshot["trace_step"] = step
    if "tower_ms" in line:
        # Times (odd ones, hand-written, are left out as `_fold_any` leaves them).
        if _numbers(line["tower_ms"]) is not None:
            snapshot.pop("tower_ms_error", None)
        return
    # A trace written whose times could not be read (no CUPTI on a GPU host): the older
    # trace's times are not this one's, and why it gave none is kept to be said instead.
    snapshot.pop("tower_ms", None)
    error = line.get("tower_ms_error")
    if isinstance(error, str):
        snapshot["tower_ms_error"] = error
    else:
        snapshot.pop("tower_ms_error", None)


# What each event adds to what every line says (`_fold_any`); others (`phase`) add nothing.
_FOLD_EVENT: dict[str, Callable[[_Folded, dict[str, Any], Any, float], None]] = {
    "start": _fold_start,
    "progress": _fold_report,
    "eval": _fold_eval,
    "checkpoint": _fold_checkpoint,
    "end": _fold_end,
    "trace": _fold_trace,
}


def restarted_at(lines: list[dict[str, Any]]) -> int | None:
    """The earliest step a run in `lines` started at (a `start` line), or None: the job's
    stored points past it are from a run that was lost, and go (see `fold_progress`)."""
    starts = [
        line["step"]
        for line in lines
        if line.get("event") == "start" and isinstance(line.get("step"), int)
    ]
    return min(starts, default=None)


def percent_done(step: Any, total: Any) -> float | None:
    """`step` of `total` in percent, to one decimal, a half rounded up: as the dashboard
    rounds it (`Math.round`), so the page and the API never differ by a tenth. Python's
    `round` takes a half to the even neighbour: 245 of 2000 was 12.2 here, 12.3 there."""
    if (
        not isinstance(step, int)
        or isinstance(step, bool)
        or not isinstance(total, int)
        or total <= 0
    ):
        return None
    return math.floor(1000 * step / total + 0.5) / 10


def _data_summary(data: Any) -> dict[str, Any] | None:
    """A start line's `data` (`trainer.data.Arrays.summary`), or None where it is not one
    (a worker from before it said it, or a hand-written line)."""

    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if not isinstance(data, dict):
        return None
    shape = data.get("image_shape")
    if not (
        all(count(data.get(key)) for key in ("train_examples", "eval_examples", "classes"))
        and isinstance(shape, list)
        and len(shape) == 3
        and all(count(size) for size in shape)
    ):
        return None
    return {key: data[key] for key in ("train_examples", "eval_examples", "classes", "image_shape")}
