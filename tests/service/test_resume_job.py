"""Resuming ended jobs: POST /api/v1/jobs/{id}/resume and `towerboard resume`."""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.store import JobStore
from tests.service.harness import (
    Service,
    fake_worker_env,
    job_spec,
    long_job,
    stand_in_checkpoint,
)
from tests.service.test_client import one_error_line, towerboard
from tests.service.test_supervisor import checkpoint_step, progress_lines


@pytest.fixture
def service(make_service: Callable[..., Service], tmp_path: Path) -> Iterator[Service]:
    """One job slot, stand-in workers (tests/service/harness.py): a job named "quick"
    succeeds at once, any other runs until cancelled."""
    service = make_service(env={"TOWERBOARD_CPU_JOBS": "1", **fake_worker_env(tmp_path)})
    service.start()
    yield service


def _cancelled(service: Service, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    job = service.submit(spec or job_spec(name="wait"))
    # Its start line: the stand-in stops on SIGTERM from then on.
    service.wait_reported(job["id"])
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    return _worker_gone(service, service.wait_state(job["id"], "cancelled"))


def _worker_gone(service: Service, job: dict[str, Any]) -> dict[str, Any]:
    """The ended job, once its worker has exited (resumable only then)."""
    service.wait_exited(job["id"])
    return service.job(job["id"])


def _resume(service: Service, job_id: str, body: dict[str, Any] | None = None) -> Any:
    return service.client.post(f"/api/v1/jobs/{job_id}/resume", json=body)


def _refused(service: Service, job_id: str, body: dict[str, Any]) -> list[dict[str, str]]:
    """The field errors of a resume with `body` that the service refuses (422)."""
    response = _resume(service, job_id, body)
    assert response.status_code == 422, response.text
    errors: list[dict[str, str]] = response.json()["errors"]
    return errors


def test_resume_cancelled_job_runs_it_again_as_the_next_attempt(service: Service) -> None:
    job = _cancelled(service)
    assert job["started_at"] is not None and job["finished_at"] is not None

    response = _resume(service, job["id"])

    assert response.status_code == 200, response.text
    resumed = response.json()
    assert resumed["state"] == "queued" and resumed["attempts"] == 2
    # Its attempt 2 has not started: the start of attempt 1 read as its.
    assert resumed["started_at"] is None
    assert resumed["finished_at"] is None and resumed["result"] is None
    assert resumed["spec"] == job["spec"]
    running = service.wait_state(job["id"], "running")
    assert running["attempts"] == 2
    assert running["started_at"] is not None and running["started_at"] > job["finished_at"]
    # The job is marked running before its worker starts and writes the log's header.
    log = service.data_dir / "runs" / job["id"] / "worker.log"
    deadline = time.monotonic() + 30
    while f"attempt 2 of job {job['id']}" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    # ... and it can be cancelled and resumed again, as often as wanted.
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    _worker_gone(service, service.wait_state(job["id"], "cancelled"))
    assert _resume(service, job["id"]).json()["attempts"] == 3


def test_resume_refuses_jobs_that_have_not_ended(service: Service) -> None:
    running = service.submit(job_spec(name="wait"))
    queued = service.submit(job_spec(name="wait"))
    service.wait_state(running["id"], "running")

    for job, state in ((running, "running"), (queued, "queued")):
        response = _resume(service, job["id"])
        assert response.status_code == 409, response.text
        # What to do, as a delete's refusal says it: it left the user to guess.
        assert response.json()["detail"] == (
            f"Job {job['id']!r} is {state}; only an ended job can be resumed. Cancel it first "
            f"(POST /api/v1/jobs/{job['id']}/cancel), then resume it once it has ended."
        )
    missing = _resume(service, "nosuchjob2")
    assert missing.status_code == 404
    assert missing.json()["detail"] == "Job 'nosuchjob2' not found."


def test_resume_succeeded_job_needs_a_longer_run(service: Service) -> None:
    job = service.submit(job_spec(name="quick"))
    done = _worker_gone(service, service.wait_state(job["id"], "succeeded"))

    refused = _resume(service, job["id"])

    assert refused.status_code == 409
    assert refused.json()["detail"] == (
        f"Job {job['id']!r} has succeeded: it trained all its steps. To train it longer, "
        'give a larger total, e.g. {"steps": N} or {"epochs": N}.'
    )
    assert service.job(job["id"])["state"] == "succeeded"  # nothing changed

    longer = _resume(service, job["id"], {"steps": 55})

    assert longer.status_code == 200, longer.text
    resumed = longer.json()
    assert resumed["state"] == "queued" and resumed["spec"]["steps"] == 55
    # Until its next worker reports, it shows its last step of the new total.
    assert resumed["progress"]["total"] == 55 and resumed["progress"]["eta_seconds"] is None
    assert resumed["progress"]["step"] == done["progress"]["step"]
    _worker_gone(service, service.wait_state(job["id"], "succeeded"))
    by_epochs = _resume(service, job["id"], {"epochs": 3}).json()
    assert by_epochs["spec"]["epochs"] == 3 and by_epochs["spec"]["steps"] is None


def test_resume_checks_the_new_length_and_the_body(service: Service) -> None:
    job = _cancelled(service)
    # A checkpoint at step 20 (the files a CheckpointManager writes; the service only
    # lists them): a total at or below it would leave nothing to train.
    stand_in_checkpoint(service, job["id"], 20)
    cases = {
        json.dumps({"steps": 19}): [
            {
                "field": "steps",
                "message": "Expected at least 20, the step of the job's latest checkpoint, "
                "where it resumes (20 finishes the job there: its final eval and export, no "
                "step trained). Received: 19",
            }
        ],
        json.dumps({"steps": 30, "epochs": 2}): [
            {
                "field": "(spec)",
                "message": "Give `steps` or `epochs`, not both. Received: steps=30, epochs=2",
            }
        ],
        json.dumps({"steps": 0}): [
            {"field": "steps", "message": "Input should be greater than or equal to 1. Received: 0"}
        ],
        json.dumps({"step": 30}): [
            {"field": "step", "message": "Unknown key. Did you mean `steps`?"}
        ],
        # A number, as in a job spec: "30" and true were read as 30 and 1.
        json.dumps({"steps": "30"}): [
            {"field": "steps", "message": "Input should be a valid integer. Received: '30'"}
        ],
        json.dumps({"epochs": True}): [
            {"field": "epochs", "message": "Input should be a valid integer. Received: true"}
        ],
    }
    for body, errors in cases.items():
        response = service.client.post(
            f"/api/v1/jobs/{job['id']}/resume",
            content=body,
            headers={"Content-Type": "application/json"},
        )
        assert response.status_code == 422, (body, response.text)
        assert response.json()["errors"] == errors, body
    not_json = service.client.post(f"/api/v1/jobs/{job['id']}/resume", content=b"steps=30")
    assert not_json.status_code == 415, not_json.text
    assert service.job(job["id"])["state"] == "cancelled"  # nothing changed

    assert _resume(service, job["id"], {"steps": 21}).json()["spec"]["steps"] == 21


def test_resume_by_epochs_must_reach_the_latest_checkpoint(service: Service) -> None:
    # The stand-in reports a total of 10 steps: for 2 epochs, 5 steps an epoch.
    job = _cancelled(service, job_spec(name="wait", steps=None, epochs=2))
    stand_in_checkpoint(service, job["id"], 20)
    # A checkpoint between two epochs' ends: no number of epochs ends there.
    between = _cancelled(service, job_spec(name="wait", steps=None, epochs=2))
    stand_in_checkpoint(service, between["id"], 22)

    assert _refused(service, job["id"], {"epochs": 3}) == [
        {
            "field": "epochs",
            "message": "Expected at least 4: the job's latest checkpoint, where it resumes, "
            "is at step 20, and an epoch is 5 steps (4 finishes the job there: its final "
            "eval and export, no step trained). Received: 3",
        }
    ]
    # 4 epochs end on the checkpoint's step: the job is finished there.
    assert _resume(service, job["id"], {"epochs": 4}).json()["spec"]["epochs"] == 4

    [refused] = _refused(service, between["id"], {"epochs": 4})
    assert refused["message"] == (
        "Expected more than 4: the job's latest checkpoint, where it resumes, is at step 22, "
        "and an epoch is 5 steps. Received: 4"
    )
    assert _resume(service, between["id"], {"epochs": 5}).json()["spec"]["epochs"] == 5


def test_resume_to_the_latest_checkpoint_finishes_a_cancelled_or_failed_job(
    service: Service,
) -> None:
    # "Finish here": `steps` equal to the latest checkpoint's step queues the job as any
    # resume, to end at that step (its worker trains no step, evaluates and exports).
    cancelled = _cancelled(service)
    stand_in_checkpoint(service, cancelled["id"], 20)
    failed = _worker_gone(
        service, service.wait_state(service.submit(job_spec(name="fail"))["id"], "failed")
    )
    stand_in_checkpoint(service, failed["id"], 10)
    stand_in_checkpoint(service, failed["id"], 20)
    # As a real worker leaves a job that failed at step 25 (a non-finite loss), 5 steps
    # past its checkpoint: its last report is of step 24.
    store = JobStore(service.data_dir / "towerboard.db")
    try:
        record = store.get(failed["id"])
        assert record is not None
        past = {**(record.progress or {}), "step": 25, "total": 40, "loss": 0.5, "accuracy": 0.75}
        store.record_progress(
            failed["id"], offset=record.progress_offset, progress=past, eval=record.eval, points=[]
        )
    finally:
        store.close()
    blocker = service.submit(job_spec(name="wait"))  # holds the one slot: both stay queued
    service.wait_state(blocker["id"], "running")

    for job in (cancelled, failed):
        response = _resume(service, job["id"], {"steps": 20})

        assert response.status_code == 200, response.text
        resumed = response.json()
        assert resumed["state"] == "queued" and resumed["attempts"] == 2
        assert resumed["spec"]["steps"] == 20
    # Until its worker reports, the failed job shows the step it resumes at, of its new
    # total (it showed 25 of 20, 125%), and no training numbers of the steps past it.
    progress = service.job(failed["id"])["progress"]
    assert (progress["step"], progress["total"], progress["percent"]) == (20, 20, 100.0)
    assert progress["loss"] is None and progress["accuracy"] is None
    assert progress["eta_seconds"] is None and progress["phase"] is None


def test_resume_of_a_succeeded_job_to_its_latest_checkpoint_is_refused(service: Service) -> None:
    # It has ended there already, with its export: nothing would change.
    done = _worker_gone(
        service, service.wait_state(service.submit(job_spec(name="quick"))["id"], "succeeded")
    )
    stand_in_checkpoint(service, done["id"], 10)

    assert _refused(service, done["id"], {"steps": 10}) == [
        {
            "field": "steps",
            "message": "Expected more than 10, the step of the job's latest checkpoint, "
            "where it resumes. Received: 10",
        }
    ]
    assert service.job(done["id"])["state"] == "succeeded"


def test_resume_as_it_is_refuses_a_job_whose_checkpoint_passed_its_total(
    service: Service,
) -> None:
    # The stand-in reports a total of 10 steps for 2 epochs; a checkpoint at step 20 is
    # what a job resumed with fewer epochs than it had trained is left with.
    job = _cancelled(service, job_spec(name="wait", steps=None, epochs=2))
    stand_in_checkpoint(service, job["id"], 20)

    refused = _resume(service, job["id"])

    assert refused.status_code == 409, refused.text
    assert "is at step 20, past its total of 10 steps" in refused.json()["detail"]
    assert service.job(job["id"])["state"] == "cancelled"
    assert _resume(service, job["id"], {"epochs": 5}).status_code == 200


def test_resumed_job_shows_no_phase_or_eta_of_the_attempt_before(service: Service) -> None:
    job = _cancelled(service)
    # As a real worker leaves it: its last progress line is of the phase "done".
    store = JobStore(service.data_dir / "towerboard.db")
    try:
        record = store.get(job["id"])
        assert record is not None
        ended = {
            **(record.progress or {}),
            "phase": "done",
            "eta_seconds": 0.0,
            "examples_per_sec": 900.0,
        }
        store.record_progress(
            job["id"], offset=record.progress_offset, progress=ended, eval=record.eval, points=[]
        )
    finally:
        store.close()

    resumed = _resume(service, job["id"]).json()

    assert resumed["progress"]["step"] == job["progress"]["step"]
    assert resumed["progress"]["phase"] is None and resumed["progress"]["eta_seconds"] is None
    assert resumed["progress"]["examples_per_sec"] is None  # no speed while it waits


def test_resume_admits_the_spec_again(service: Service) -> None:
    data = service.data_dir / "datasets" / "digits.npz"
    data.parent.mkdir(exist_ok=True)
    np.savez(data, x=np.zeros((2, 4, 4), np.uint8), y=np.zeros(2, np.int64))
    job = _cancelled(service, job_spec(name="wait", data={"format": "npz", "path": str(data)}))
    data.unlink()

    response = _resume(service, job["id"])

    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert error["field"] == "data.path" and str(data) in error["message"]
    assert service.job(job["id"])["state"] == "cancelled"


def test_resumed_job_waits_behind_jobs_queued_before_it(service: Service) -> None:
    earlier = _cancelled(service)  # submitted first, so the oldest of the three
    blocker = service.submit(job_spec(name="wait"))
    service.wait_state(blocker["id"], "running")
    waiting = service.submit(job_spec(name="wait"))
    assert _resume(service, earlier["id"]).status_code == 200

    service.client.post(f"/api/v1/jobs/{blocker['id']}/cancel")

    assert service.wait_state(waiting["id"], "running")["state"] == "running"
    assert service.job(earlier["id"])["state"] == "queued"


def test_export_is_served_only_while_the_job_has_succeeded(service: Service) -> None:
    job = service.submit(job_spec(name="quick"))
    _worker_gone(service, service.wait_state(job["id"], "succeeded"))
    export = service.data_dir / "runs" / job["id"] / "export"
    export.mkdir()
    (export / "saved_model.pb").write_bytes(b"model")
    assert service.client.head(f"/api/v1/jobs/{job['id']}/export").status_code == 200
    # Resumed to train longer: the export on disk is the shorter run's, not the spec's.
    # (The stand-in's next attempt may already be running or done, so ask at once.)
    blocker = service.submit(job_spec(name="wait"))
    service.wait_state(blocker["id"], "running")
    _resume(service, job["id"], {"steps": 80})

    stale = service.client.get(f"/api/v1/jobs/{job['id']}/export")

    assert stale.status_code == 404
    assert stale.json()["detail"] == (
        f"Job {job['id']!r} has no exported model (a job exports its model as it succeeds; "
        "it is queued)."
    )


def test_cancel_before_the_attempt_starts_takes_the_resume_back(service: Service) -> None:
    # A "train longer" with a mistyped length, cancelled while it waits: the succeeded job
    # was left cancelled, its spec's length replaced and its model no longer served. A
    # failed job resumed and cancelled so lost its failure's reason.
    done = _worker_gone(service, service.wait_state(service.submit(job_spec(name="quick"))["id"],
                                                    "succeeded"))  # fmt: skip
    export = service.data_dir / "runs" / done["id"] / "export"
    export.mkdir()
    (export / "saved_model.pb").write_bytes(b"model")
    failed = service.submit(job_spec(name="fail"))
    failed = _worker_gone(service, service.wait_state(failed["id"], "failed"))
    blocker = service.submit(job_spec(name="wait"))  # holds the one slot: both stay queued
    service.wait_state(blocker["id"], "running")
    for job in (done, failed):
        body = {"steps": 100_000_000} if job is done else None
        assert _resume(service, job["id"], body).json()["state"] == "queued"
        answer = service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
        assert answer.status_code == 200, answer.text
        back = answer.json()
        assert back == {**service.job(job["id"]), "updated_at": back["updated_at"]}
        for key in ("state", "spec", "attempts", "result", "error", "started_at",
                    "finished_at", "progress"):  # fmt: skip
            assert back[key] == job[key], key
    assert service.client.head(f"/api/v1/jobs/{done['id']}/export").status_code == 200
    # Said by the CLI too; and once an attempt has started, a cancel stops it as ever.
    assert _resume(service, done["id"], {"steps": 80}).status_code == 200
    cli = towerboard("cancel", done["id"], url=service.base_url)
    assert cli.stdout == f"{done['id']} succeeded\n"
    assert cli.stderr == (
        f"job {done['id']} was resumed and had not started again: it is succeeded again, "
        "as it was\n"
    )
    assert _resume(service, done["id"], {"steps": 80}).status_code == 200
    service.client.post(f"/api/v1/jobs/{blocker['id']}/cancel")
    service.wait_state(done["id"], "running", "succeeded")
    service.wait_exited(blocker["id"])
    assert service.job(done["id"])["attempts"] == 2


def test_cli_resume(service: Service) -> None:
    # The service's hint, said as this command's options rather than the API's body.
    done = _worker_gone(
        service, service.wait_state(service.submit(job_spec(name="quick"))["id"], "succeeded")
    )
    longer = towerboard("resume", done["id"], url=service.base_url)
    assert longer.returncode == 1
    assert one_error_line(longer).endswith("give a larger total, e.g. --steps N or --epochs N.")
    longer = towerboard("resume", done["id"], "--steps", "80", url=service.base_url)
    assert longer.returncode == 0, longer.stderr
    # Where it stops too: "it trains on from step 0" alone left the new total unsaid.
    assert longer.stderr == (
        f"resumed job {done['id']} as attempt 2 (queued): it trains on to step 80 from step 0: "
        "it has no checkpoint\n"
    )
    service.wait_state(done["id"], "succeeded")
    job = _cancelled(service)
    url = service.base_url

    result = towerboard("resume", job["id"], url=url)

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{job['id']}\n"
    # The stand-in writes no checkpoint: it said "from its latest checkpoint" all the same.
    assert result.stderr == (
        f"resumed job {job['id']} as attempt 2 (queued): it trains on from step 0: it has no "
        "checkpoint\n"
    )
    refused = towerboard("resume", job["id"], "--steps", "9", url=url)
    assert refused.returncode == 1
    # The service's route said as the verb that cancels it and waits for its end.
    assert one_error_line(refused).endswith(
        f"only an ended job can be resumed. Cancel it first (towerboard cancel {job['id']} "
        "--wait), then resume it once it has ended."
    )
    usage = towerboard("resume", job["id"], "--steps", "9", "--epochs", "2", url=url)
    assert usage.returncode == 2 and "not allowed with argument" in usage.stderr


def test_cli_resume_finish(service: Service) -> None:
    # `--finish`: --steps of the latest checkpoint's step, read from the service; said
    # clearly where there is nothing to finish.
    url = service.base_url
    done = _worker_gone(
        service, service.wait_state(service.submit(job_spec(name="quick"))["id"], "succeeded")
    )
    refused = towerboard("resume", done["id"], "--finish", url=url)
    assert refused.returncode == 1
    assert one_error_line(refused) == (
        f"towerboard: error: job {done['id']} has succeeded: --finish ends a cancelled or failed "
        f"job at its latest checkpoint; its model is exported already (`towerboard export "
        f"{done['id']}`)"
    )
    job = _cancelled(service)
    none = towerboard("resume", job["id"], "--finish", url=url)
    assert none.returncode == 1
    assert one_error_line(none) == (
        f"towerboard: error: job {job['id']} has no checkpoint to finish at: `towerboard resume "
        f"{job['id']}` trains it again from step 0"
    )
    usage = towerboard("resume", job["id"], "--finish", "--steps", "9", url=url)
    assert usage.returncode == 2 and "not allowed with argument" in usage.stderr
    # A job cancelled as it started, before its first step, has ckpt-0: nothing to finish
    # at. It was sent no steps, resumed as it is to train in full, "finishing at step None".
    stand_in_checkpoint(service, job["id"], 0)
    start = towerboard("resume", job["id"], "--finish", url=url)
    assert start.returncode == 1
    assert one_error_line(start) == (
        f"towerboard: error: job {job['id']} has no checkpoint past step 0 to finish at: "
        f"`towerboard resume {job['id']}` trains it again from step 0"
    )
    assert service.job(job["id"])["state"] == "cancelled"  # nothing changed
    stand_in_checkpoint(service, job["id"], 10)
    stand_in_checkpoint(service, job["id"], 20)

    result = towerboard("resume", job["id"], "--finish", url=url)

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{job['id']}\n"
    assert result.stderr == (
        f"resumed job {job['id']} as attempt 2 (queued): it finishes at step 20, its latest "
        "checkpoint: no step trained, its final eval and export\n"
    )
    assert service.job(job["id"])["spec"]["steps"] == 20
    running = service.wait_state(job["id"], "running")
    again = towerboard("resume", job["id"], "--finish", url=url)
    assert again.returncode == 1
    assert one_error_line(again) == (
        f"towerboard: error: job {job['id']} is running: --finish ends a cancelled or failed "
        f"job at its latest checkpoint; `towerboard cancel {job['id']} --wait` stops it at a "
        "checkpoint first"
    )
    assert service.job(job["id"])["attempts"] == running["attempts"] == 2


@pytest.mark.slow
def test_resume_real_job_trains_on_from_its_checkpoint_and_longer(
    make_service: Callable[..., Service],
) -> None:
    # The real trainer: cancelled after its first checkpoint, resumed to a step past it,
    # and once it has succeeded resumed again with more steps. Each attempt restores the
    # last checkpoint. (It trains until cancelled: a job of 150 steps, at 600 steps/s
    # here, could finish before its cancel landed.)
    service = make_service()
    service.start()
    spec = long_job(checkpoint={"every_steps": 25, "every_seconds": 0, "keep": 2})
    job_id = service.submit(spec)["id"]
    service.wait_checkpoint(job_id)
    assert service.client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 202
    cancelled = _worker_gone(service, service.wait_state(job_id, "cancelled"))
    stopped_at = checkpoint_step(cancelled)  # SIGTERM checkpoints the step it stopped at
    assert stopped_at > 0

    assert _resume(service, job_id, {"steps": stopped_at + 50}).status_code == 200
    done = service.wait_state(job_id, "succeeded")
    assert done["result"]["step"] == stopped_at + 50 and done["attempts"] == 2
    _worker_gone(service, done)
    # Too few epochs for where it stands, though it was a job of steps: refused here from
    # the epoch length its worker reported, where the worker failed it (and its export
    # went unserved) before.
    per_epoch = done["progress"]["steps_per_epoch"]
    assert isinstance(per_epoch, int) and 0 < per_epoch < stopped_at + 50
    too_few = _resume(service, job_id, {"epochs": 1})
    assert too_few.status_code == 422, too_few.text
    assert too_few.json()["errors"][0]["message"] == (
        f"Expected more than {(stopped_at + 50) // per_epoch}: the job's latest checkpoint, "
        f"where it resumes, is at step {stopped_at + 50}, and an epoch is {per_epoch} steps. "
        "Received: 1"
    )
    assert service.job(job_id)["state"] == "succeeded"
    assert service.client.head(f"/api/v1/jobs/{job_id}/export").status_code == 200
    assert _resume(service, job_id, {"steps": stopped_at + 80}).status_code == 200
    longer = service.wait_state(job_id, "succeeded")

    assert longer["attempts"] == 3 and longer["result"]["step"] == stopped_at + 80
    starts = [line["step"] for line in progress_lines(service, job_id) if line["event"] == "start"]
    assert starts == [0, stopped_at, stopped_at + 50]
    assert service.client.head(f"/api/v1/jobs/{job_id}/export").status_code == 200


@pytest.mark.slow
def test_finish_real_job_at_its_checkpoint_exports_it_there(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # The real trainer: cancelled after a checkpoint, then finished there with the CLI's
    # --finish. Its worker restores that checkpoint, trains no step, evaluates and exports:
    # the job succeeds at that step with its eval and a SavedModel that loads.
    service = make_service()
    service.start()
    # An eval due only at the job's end: the attempt cancelled never ran one. A warm-up
    # into a decay, whose state the optimizer's checkpoint holds, restored with a changed
    # total.
    spec = long_job(
        eval={"every_steps": 1_000_000, "batches": 2},
        optimizer={
            "name": "adam",
            "warmup_steps": 10,
            "schedule": {"name": "cosine", "decay_steps": 1000},
        },
    )
    job_id = service.submit(spec)["id"]
    service.wait_checkpoint(job_id)
    assert service.client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 202
    cancelled = _worker_gone(service, service.wait_state(job_id, "cancelled"))
    stopped_at = checkpoint_step(cancelled)  # SIGTERM checkpoints the step it stopped at
    assert stopped_at > 0 and cancelled["result"]["eval"] is None
    assert service.client.head(f"/api/v1/jobs/{job_id}/export").status_code == 404

    finish = towerboard("resume", job_id, "--finish", url=service.base_url)

    assert finish.returncode == 0, finish.stderr
    assert f"it finishes at step {stopped_at}, its latest checkpoint" in finish.stderr
    done = service.wait_state(job_id, "succeeded")
    result = done["result"]
    assert (result["step"], result["total"], done["attempts"]) == (stopped_at, stopped_at, 2)
    assert done["spec"]["steps"] == stopped_at
    # The numbers of the step it stopped at, as the cancelled attempt's result had them.
    assert result["metrics"]["loss"] == cancelled["result"]["metrics"]["loss"]
    assert result["metrics"]["accuracy"] == cancelled["result"]["metrics"]["accuracy"]
    assert result["eval"]["step"] == stopped_at and result["eval"]["examples"] > 0
    assert 0.0 <= result["eval"]["accuracy"] <= 1.0
    assert done["eval"]["step"] == stopped_at
    assert done["eval"]["accuracy"] == pytest.approx(result["eval"]["accuracy"], abs=1e-6)
    progress = done["progress"]
    assert (progress["step"], progress["total"], progress["percent"]) == (
        stopped_at, stopped_at, 100.0
    )  # fmt: skip
    assert progress["phase"] == "done" and progress["eta_seconds"] == 0.0
    assert progress["loss"] == pytest.approx(cancelled["result"]["metrics"]["loss"])
    lines = progress_lines(service, job_id)
    starts = [i for i, line in enumerate(lines) if line["event"] == "start"]
    assert [lines[i]["step"] for i in starts] == [0, stopped_at]
    assert not [line for line in lines[starts[1] :] if line["event"] == "progress"]  # no step

    response = service.client.get(f"/api/v1/jobs/{job_id}/export")
    assert response.status_code == 200, response.text
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as archive:
        archive.extractall(tmp_path / "export", filter="data")
    import tensorflow as tf

    model = tf.saved_model.load(str(tmp_path / "export"))
    images = np.zeros((2, *spec["data"]["params"]["shape"], 1), np.float32)
    assert model.signatures["serving_default"](images=tf.constant(images))["classes"].shape == (2,)
