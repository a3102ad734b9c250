"""The CLI's watch folds an `end` event as the service does: no ETA unless it succeeded,
and a cancelled run's loss and accuracy of the step it stopped at; and a `trace` event's
step, the trace's, is a lower bound of the job's, and a trace without times says why."""

from __future__ import annotations

import io
from typing import Any

import pytest

from service.client.display import ProgressLine, fold_event


@pytest.mark.parametrize("outcome", ["cancelled", "failed"])
def test_fold_event_end_of_a_job_that_did_not_succeed_drops_its_eta(outcome: str) -> None:
    job = {
        "id": "j1",
        "state": "running",
        "progress": {"step": 1683, "total": 20000, "phase": "training", "eta_seconds": 111.0},
    }
    end = {"event": "end", "outcome": outcome, "phase": "done", "step": 1683, "total": 20000}
    folded = fold_event(job, "end", end)
    assert folded["progress"]["eta_seconds"] is None
    # The state event comes after the end event: until then the watch prints this line.
    assert "ETA" not in ProgressLine(io.StringIO()).text(folded)


def test_fold_event_end_of_a_succeeded_job_is_due_now() -> None:
    job = {"id": "j1", "state": "running",
           "progress": {"step": 39, "total": 40, "eta_seconds": 1.0}}  # fmt: skip
    end = {"event": "end", "outcome": "succeeded", "phase": "done", "step": 40, "total": 40}
    assert fold_event(job, "end", end)["progress"]["eta_seconds"] == 0.0


def test_fold_event_end_of_a_cancelled_job_takes_its_last_steps_numbers() -> None:
    job = {"id": "j1", "state": "running",
           "progress": {"step": 30, "total": 40, "loss": 0.5, "accuracy": 0.75}}  # fmt: skip
    end = {"event": "end", "outcome": "cancelled", "phase": "done", "step": 34, "total": 40,
           "loss": 0.25, "accuracy": 0.875}  # fmt: skip
    folded = fold_event(job, "end", end)["progress"]
    assert (folded["step"], folded["loss"], folded["accuracy"]) == (34, 0.25, 0.875)


def test_fold_event_trace_keeps_the_step_later_reports_put_the_job_at() -> None:
    # The worker writes a trace's line once the trace is read, off its loop: reports of
    # later steps come before it (the watch went back to step 22 until the next one).
    job = {"id": "j1", "state": "running", "progress": {"step": 30, "total": 100}}
    trace = {"event": "trace", "step": 22, "tower_ms": [3.0, 4.0]}
    folded = fold_event(job, "trace", trace)["progress"]
    assert (folded["step"], folded["percent"], folded["tower_ms"]) == (30, 30.0, [3.0, 4.0])


def test_fold_event_trace_is_a_step_the_job_has_done() -> None:
    # Before the next report says so, the job is at least at the traced step (the status
    # said trace_step 335 at step 330).
    job = {"id": "j1", "state": "running", "progress": {"step": 330, "total": 1000}}
    trace = {"event": "trace", "step": 335, "tower_ms": [3.0, 4.0]}
    folded = fold_event(job, "trace", trace)["progress"]
    assert (folded["step"], folded["percent"], folded["trace_step"]) == (335, 33.5, 335)


def test_fold_event_trace_without_times_says_why_in_their_place() -> None:
    # A trace whose times could not be read (no CUPTI on a GPU host): the older trace's
    # times go, and why stays until a trace with times, as the service folds it.
    why = "Expected the trace to hold the towers' GPU kernels. Received: none"
    before = {"step": 30, "total": 100, "tower_ms": [1.0, 2.0], "trace_step": 6}
    job: dict[str, Any] = {"id": "j1", "state": "running", "progress": before}
    untimed = {"event": "trace", "step": 22, "tower_ms_error": why, "requested": True}
    job = fold_event(job, "trace", untimed)
    p = job["progress"]
    assert (p["step"], p["trace_step"], p["tower_ms_error"]) == (30, 22, why)
    assert "tower_ms" not in p
    timed = {"event": "trace", "step": 40, "tower_ms": [3.0, 4.0]}
    p = fold_event(job, "trace", timed)["progress"]
    assert (p["step"], p["trace_step"], p["tower_ms"]) == (40, 40, [3.0, 4.0])
    assert "tower_ms_error" not in p
