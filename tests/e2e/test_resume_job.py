"""Resuming ended jobs from the dashboard, in headless Chromium against a real service:
Resume on a cancelled or failed job's page, Finish at step N there where it has a
checkpoint (the job ends at it, with its export), Train longer on any ended job's (a labelled
"To step" field, by keyboard too), the service's refusals said beside the field (422) or
in the action status line (409, a spec that no longer passes admission), the controls
hidden while the job is queued or running, a job resumed elsewhere followed live again,
and the charts and progress of the resumed attempt going on. Contrast and a phone's width.

The workers are stand-ins that end in a blink (tests/service/harness.py) or train a few
steps a second, checkpointing as the trainer does (STEPS_WORKER below): no model is
trained here, so none of it is marked slow."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from playwright.sync_api import Browser, Page, Route, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.contrast import assert_contrast
from tests.e2e.test_dashboard import LAPTOP, PHONE, TERMINAL, Session, no_overflow, open_session
from tests.e2e.test_delete_job import DEVICES, EXITING, STILL_EXITING, ended, open_exiting_job
from tests.service.harness import Service, fake_index, job_spec, stand_in_service

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)

# `python -m steps_worker run --job-dir DIR`: trains its spec's `steps` as the trainer does,
# from its latest checkpoint (the files a CheckpointManager writes, which the service
# lists), a step every 0.1 s, reporting each (loss 1/step) and checkpointing every 10. It
# stops on SIGTERM (cancelled, exit 3). "fail-at-N" fails at step N when it started at
# step 0. A run that starts past step 0 (a resume) waits 5 s before its first step, so
# the page is seen between the start line and the next report (a slowed browser,
# TOWERBOARD_SLOW_BROWSER=net, may take 4.5 s to learn of the resume and read the charts).
STEPS_WORKER = """\
import json, signal, sys, time
from pathlib import Path

from service.checkpoints import INDEX_END

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
spec = json.loads((job_dir / "spec.json").read_text())
total, name = spec["steps"], spec["name"]
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
checkpoints = job_dir / "checkpoints"
checkpoints.mkdir(exist_ok=True)
step = max((int(p.name[5:-6]) for p in checkpoints.glob("ckpt-*.index")), default=0)


def progress(**line):
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), "step": step, "total": total, **line}) + "\\n")


def end(outcome, code, message=name):
    (job_dir / "result.json").write_text(json.dumps({"outcome": outcome, "message": message}))
    sys.exit(code)


fail_at = int(name[8:]) if name.startswith("fail-at-") and step == 0 else None
started_at = step
progress(event="start", phase="starting")
if step:
    time.sleep(5)
while step < total:
    if stopped:
        end("cancelled", 3)
    time.sleep(0.1)
    step += 1
    progress(event="progress", loss=1 / step, accuracy=step / (step + 1), examples_per_sec=900.0)
    if step == fail_at:
        end("failed", 1)
    if step % 10 == 0:
        (checkpoints / f"ckpt-{step}.data-00000-of-00001").write_bytes(b"d")
        (checkpoints / f"ckpt-{step}.index").write_bytes(b"i" + INDEX_END)
        progress(event="checkpoint", checkpoint=str(checkpoints / f"ckpt-{step}"))
# As the trainer's end line, with its last step's numbers (the charts keep one point a step).
progress(event="end", outcome="succeeded", loss=1 / step, accuracy=step / (step + 1))
# Resumed at its total ("Finish at step N"), as the trainer says it: no step trained.
finished = f"Finished at step {step}, its checkpoint: no step trained."
end("succeeded", 0, finished if step == started_at else name)
"""

# Records, in the page, each text the action status line is given from now on (the page
# sets its textContent: a new text node each time) into window.lineSaid: a line said only
# for a moment, before the stream's news replaced it, is not missed.
RECORD_LINE = """() => {
  const line = document.getElementById("action-status");
  window.lineSaid = [];
  new MutationObserver((records) => {
    for (const record of records) {
      for (const node of record.addedNodes) window.lineSaid.push(node.textContent);
    }
  }).observe(line, { childList: true });
}"""

RESUME_TITLE = "Queue the job again: it trains on from its latest checkpoint"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """Stand-in workers: "quick" succeeds at once, "linger" stays after it succeeds until released,
    any other name runs until cancelled. Four slots, so a lingering one blocks no other."""
    with stand_in_service(tmp_path_factory.mktemp("stand-in"), TOWERBOARD_CPU_JOBS="4") as svc:
        yield svc


@pytest.fixture(scope="module")
def stepping(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """A service whose worker is STEPS_WORKER."""
    folder = tmp_path_factory.mktemp("steps")
    (folder / "steps_worker.py").write_text(STEPS_WORKER)
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    svc = Service(
        folder / "data",
        {
            "TOWERBOARD_CPU_JOBS": "2",
            "TOWERBOARD_WORKER_MODULE": "steps_worker",
            "PYTHONPATH": path,
        },
    )
    svc.start()
    yield svc
    svc.close()


def cancelled(service: Service, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """A stand-in job that ran, was cancelled, and whose worker has exited: resumable."""
    job = service.submit(spec or job_spec(name="wait"))
    # Its start line: the stand-in stops on SIGTERM from then on.
    service.wait_reported(job["id"])
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    service.wait_state(job["id"], "cancelled")
    service.wait_exited(job["id"])
    return service.job(job["id"])


def fake_checkpoint(service: Service, job_id: str, step: int) -> None:
    """The files a CheckpointManager writes for `step` (the service only lists them)."""
    folder = service.data_dir / "runs" / job_id / "checkpoints"
    folder.mkdir(exist_ok=True)
    (folder / f"ckpt-{step}.data-00000-of-00001").write_bytes(b"d")
    (folder / f"ckpt-{step}.index").write_bytes(fake_index())


def open_job(page: Page, job_id: str, state: str) -> None:
    page.goto(f"/#/jobs/{job_id}")
    expect(page.locator(".job-heading .state")).to_have_text(state)


def badge(page: Page) -> Any:
    return page.locator(".job-heading .state")


def no_resume_controls(page: Page) -> None:
    """Neither Resume nor Finish nor Train longer nor its form: the job is queued or running."""
    for control in ("#resume-job", "#finish-job", "#train-longer", "#resume-form", "#delete-job"):
        expect(page.locator(control)).to_be_hidden()


def low_contrast(page: Page) -> None:
    assert_contrast(page)


def test_resume_a_cancelled_job_by_keyboard(session: Session, service: Service) -> None:
    """A running job's page offers no Resume. Cancelled, it offers Resume beside Delete job,
    and Finish at step N once it has a checkpoint;
    one press (no confirm) queues it again as attempt 2, said in the status line, which
    takes the focus from the hidden button; the page follows the new attempt live: its
    state, its log, its end when it is cancelled again from the page."""
    job = service.submit(job_spec(name="wait"))
    service.wait_reported(job["id"])
    page = session.page
    open_job(page, job["id"], "running")
    expect(page.locator("#cancel-job")).to_be_visible()
    no_resume_controls(page)
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    expect(badge(page)).to_have_text("cancelled")
    service.wait_exited(job["id"])
    # With no checkpoint, nothing to finish at.
    expect(page.locator("#checkpoints")).to_contain_text("No checkpoint was saved.")
    expect(page.locator("#resume-job")).to_be_visible()
    expect(page.locator("#finish-job")).to_be_hidden()
    fake_checkpoint(service, job["id"], 5)
    page.reload()  # the checkpoint is read with the page
    expect(badge(page)).to_have_text("cancelled")

    button = page.get_by_role("button", name="Resume", exact=True)
    expect(button).to_be_visible()
    expect(button).to_have_attribute("title", RESUME_TITLE)
    # Beside it, ending the job at that checkpoint instead, named by its step.
    finish = page.get_by_role("button", name="Finish at step 5", exact=True)
    expect(finish).to_be_visible()
    expect(finish).to_have_accessible_description(
        "Export the model at step 5, its latest checkpoint: the job ends there, with its final "
        "eval and no step trained"
    )
    expect(page.locator("#delete-job")).to_be_visible()
    expect(page.locator("#cancel-job")).to_be_hidden()
    expect(page.locator(".meta")).to_contain_text("attempt 1")
    button.focus()
    page.keyboard.press("Enter")  # once: nothing is lost, so nothing to confirm

    line = page.locator("#action-status")
    expect(line).to_have_text("Resumed as attempt 2: it trains on from its latest checkpoint.")
    expect(line).to_be_focused()
    expect(line).not_to_have_class(re.compile(r"\berror\b"))
    expect(badge(page)).to_have_text(re.compile(r"^(queued|running)$"))
    no_resume_controls(page)
    expect(page.locator("#cancel-job")).to_be_visible()
    expect(page.locator(".meta")).to_contain_text("attempt 2")
    # Live again: the job's own stream (its state) and the log poll (attempt 2's line).
    expect(badge(page)).to_have_text("running")
    expect(page.locator("#log")).to_contain_text(f"attempt 2 of job {job['id']}", timeout=10_000)
    assert service.job(job["id"])["attempts"] == 2

    cancel = page.locator("#cancel-job")
    cancel.click()
    cancel.click()
    expect(badge(page)).to_have_text("cancelled")
    expect(line).to_have_text("Cancelled at step 0.")
    expect(page.locator("#resume-job")).to_be_visible()
    assert session.errors == []


def test_train_a_succeeded_job_longer(
    session: Session, service: Service, screenshots: Path
) -> None:
    """A succeeded job has no Resume but Train longer, which opens a labelled "To step"
    field with twice its total in it (the keyboard goes there); a step at or below the
    latest checkpoint gets the service's reason beside the field, and a good one queues
    the job to that total. Escape closes the form."""
    job = ended(service)  # "quick": a total of 10 steps, succeeded
    fake_checkpoint(service, job["id"], 10)
    page = session.page
    open_job(page, job["id"], "succeeded")
    expect(page.locator("#resume-job")).to_be_hidden()
    expect(page.locator("#download-model")).to_be_visible()
    expect(page.locator("#finish-job")).to_be_hidden()  # it has ended there, exported
    toggle = page.get_by_role("button", name="Train longer", exact=True)
    expect(toggle).to_have_attribute("aria-expanded", "false")
    toggle.focus()
    page.keyboard.press("Enter")
    expect(toggle).to_have_attribute("aria-expanded", "true")
    form = page.get_by_role("form", name="Train longer")
    expect(form).to_be_visible()
    field = page.get_by_label("To step", exact=True)
    expect(field).to_be_focused()
    expect(field).to_have_value("20")
    hint = page.locator("#resume-steps-hint")
    expect(hint).to_have_text(
        "It trains on from step 10, its latest checkpoint: give a step past it."
    )
    expect(field).to_have_attribute("min", "11")
    page.keyboard.press("Escape")
    expect(form).to_be_hidden()
    expect(toggle).to_be_focused()
    expect(toggle).to_have_attribute("aria-expanded", "false")

    page.keyboard.press("Enter")
    field.fill("10")
    page.keyboard.press("Enter")
    error = page.locator("#resume-steps-error")
    expect(error).to_have_text(
        "Expected more than 10, the step of the job's latest checkpoint, where it resumes. "
        "Received: 10"
    )
    expect(field).to_have_attribute("aria-invalid", "true")
    expect(field).to_be_focused()
    # Read out with the field: its description names the error first.
    described = field.get_attribute("aria-describedby") or ""
    assert described.split()[0] == "resume-steps-error"
    expect(page.locator("#action-status")).to_have_text("")
    assert service.job(job["id"])["state"] == "succeeded"
    low_contrast(page)
    page.screenshot(path=screenshots / "dashboard-train-longer.png")

    field.fill("")
    page.keyboard.press("Enter")
    expect(error).to_have_text("Enter the step to train it to.")
    field.fill("30")
    page.evaluate(RECORD_LINE)
    page.keyboard.press("Enter")
    line = page.locator("#action-status")
    # The stand-in succeeds at once: the attempt's end is said in the line, which a slow
    # page (TOWERBOARD_SLOW_BROWSER=cpu=8) says in the same moment as the resume's answer.
    expect(line).to_have_text(re.compile(r"^Attempt 2 succeeded"))
    said = page.evaluate("window.lineSaid")
    assert said[-3:-1] == [
        "Resuming…",
        "Resumed as attempt 2: it trains on to step 30 from its latest checkpoint.",
    ], said
    expect(line).to_be_focused()
    expect(form).to_be_hidden()
    expect(page.locator("#spec")).to_contain_text('"steps": 30')
    expect(badge(page)).to_have_text("succeeded")
    expect(toggle).to_be_visible()
    assert service.job(job["id"])["spec"]["steps"] == 30
    assert session.errors == []


def test_train_longer_cancelled_before_it_starts_is_taken_back(
    browser: Browser, tmp_path: Path
) -> None:
    """A "train longer" cancelled while it waits for a device (a mistyped length, say)
    leaves the job as it was: succeeded, its spec's length and its model. It was left
    cancelled, the length replaced, the model no longer served; the line said "Cancelled."."""
    with stand_in_service(tmp_path, TOWERBOARD_CPU_JOBS="1") as one_slot:
        job = ended(one_slot)  # "quick": succeeded
        blocker = one_slot.submit(job_spec(name="wait"))  # holds the slot: the job waits
        one_slot.wait_state(blocker["id"], "running")
        session = open_session(browser, one_slot, LAPTOP)
        page = session.page
        open_job(page, job["id"], "succeeded")
        page.locator("#train-longer").click()
        page.get_by_label("To step", exact=True).fill("100000000")
        page.locator("#resume-submit").click()
        expect(badge(page)).to_have_text("queued")
        # Its start is the first attempt's, not this one's, which has not started.
        meta = page.locator("p.meta")
        expect(meta).to_contain_text("attempt 2")
        expect(meta).not_to_contain_text("started")
        cancel = page.locator("#cancel-job")
        cancel.click()
        cancel.click()
        expect(page.locator("#action-status")).to_have_text(
            "Resume taken back (its attempt had not started): the job is succeeded again."
        )
        expect(badge(page)).to_have_text("succeeded")
        expect(meta).to_contain_text(re.compile(r"started .* · ran .* · attempt 1$"))
        # Its own length again, not the one it was resumed to.
        expect(page.locator("#spec")).to_contain_text(f'"steps": {job["spec"]["steps"]},')
        expect(page.locator("#train-longer")).to_be_visible()
        back = one_slot.job(job["id"])
        assert back["state"] == "succeeded" and back["spec"] == job["spec"], back
        assert back["attempts"] == 1
        assert session.errors == []
        session.context.close()


def test_train_longer_waits_while_the_worker_exits(session: Session, service: Service) -> None:
    """While an ended job's worker is still exiting, Train longer is there but dimmed, named
    by the line that says why, and a press opens nothing: it was offered, and the service
    refused it (409) after a 5 s wait. It works as soon as the worker has gone, with no
    reload: the stream of every job says `exited`. Every read of the devices list here
    says the worker is still there (the page read it every 0.5 s until it did not)."""
    lingering = service.submit(job_spec(name="linger"))  # its worker stays until released
    service.wait_state(lingering["id"], "succeeded")
    page = session.page
    open_exiting_job(page, service, lingering["id"])
    button, hint = page.locator("#train-longer"), page.locator("#exiting-hint")
    expect(hint).to_have_text(EXITING)
    expect(button).to_be_visible()
    expect(button).to_be_disabled()
    expect(button).to_have_accessible_description(EXITING)
    button.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#resume-form")).to_be_hidden()
    expect(button).to_be_focused()
    low_contrast(page)
    page.evaluate("() => { window.notReloaded = true; }")

    service.release(lingering["id"])
    service.wait_exited(lingering["id"])
    expect(hint).to_be_hidden(timeout=10_000)
    expect(button).to_be_enabled()
    expect(button).to_have_accessible_description("")
    assert page.evaluate("() => window.notReloaded") is True
    page.unroute(DEVICES)
    page.keyboard.press("Enter")
    expect(page.get_by_label("To step", exact=True)).to_be_focused()
    expect(page.locator("#resume-submit")).to_be_enabled()
    assert session.errors == []


def test_refusals_are_said_and_change_nothing(session: Session, service: Service) -> None:
    """A job whose worker is still exiting, where the devices read that says so failed,
    gets the service's 409 detail in the status line; a job whose data file was removed
    since gets its field error there (it is no step's): each red, the job as it was, and
    the controls still there to try again."""
    lingering = service.submit(job_spec(name="linger"))  # its worker stays until released
    service.wait_state(lingering["id"], "succeeded")
    page = session.page
    page.route("**/api/v1/devices", lambda route: route.abort())
    try:
        open_job(page, lingering["id"], "succeeded")
        page.locator("#train-longer").click()
        page.get_by_label("To step", exact=True).fill("40")
        page.locator("#resume-submit").click()
        line = page.locator("#action-status")
        expect(line).to_have_text(f"Could not resume: Job '{lingering['id']}' {STILL_EXITING}")
        expect(line).to_have_class(re.compile(r"\berror\b"))
        expect(page.locator("#resume-steps-error")).to_be_hidden()
        expect(page.locator("#resume-form")).to_be_visible()  # to try again in a few seconds
        expect(page.locator("#resume-submit")).to_be_enabled()
        expect(badge(page)).to_have_text("succeeded")
        low_contrast(page)
    finally:
        page.unroute("**/api/v1/devices")
    service.release(lingering["id"])

    data = service.data_dir / "datasets" / "digits.npz"
    data.parent.mkdir(exist_ok=True)
    np.savez(data, x=np.zeros((2, 4, 4), np.uint8), y=np.zeros(2, np.int64))
    job = cancelled(service, job_spec(name="wait", data={"format": "npz", "path": str(data)}))
    data.unlink()
    open_job(page, job["id"], "cancelled")
    page.locator("#resume-job").click()
    expect(line).to_have_text(re.compile(r"^Could not resume: data\.path: .*digits\.npz"))
    expect(line).to_have_class(re.compile(r"\berror\b"))
    expect(page.locator("#resume-job")).to_be_enabled()
    expect(badge(page)).to_have_text("cancelled")
    assert service.job(job["id"])["state"] == "cancelled"
    low_contrast(page)
    assert session.errors == []


def test_job_resumed_elsewhere_is_followed_again(session: Session, service: Service) -> None:
    """A page open on a cancelled job that another user (or the CLI) resumes shows the
    new attempt without a reload, hides Resume, and follows it to its next end."""
    job = cancelled(service)
    page = session.page
    open_job(page, job["id"], "cancelled")
    expect(page.locator("#resume-job")).to_be_visible()
    page.wait_for_timeout(500)  # the ended job's watch is subscribed
    resumed = service.client.post(f"/api/v1/jobs/{job['id']}/resume")
    assert resumed.status_code == 200, resumed.text

    expect(badge(page)).to_have_text("running")
    expect(page.locator(".meta")).to_contain_text("attempt 2")
    no_resume_controls(page)
    expect(page.locator("#cancel-job")).to_be_visible()
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    expect(badge(page)).to_have_text("cancelled")
    expect(page.locator("#resume-job")).to_be_visible()
    assert session.errors == []


def failed_at_25(
    browser: Browser, stepping: Service, before: Callable[[Page], None] | None = None
) -> tuple[dict[str, Any], Session]:
    """A STEPS_WORKER job of 30 steps that failed at step 25 (its checkpoints at 10 and 20),
    its worker gone, and a session open on its page (`before(page)` run before it opens)."""
    job = stepping.submit(job_spec(name="fail-at-25", steps=30))
    failed = stepping.wait_state(job["id"], *TERMINAL)
    assert failed["state"] == "failed" and failed["progress"]["step"] == 25, failed
    stepping.wait_exited(job["id"])
    session = open_session(browser, stepping, LAPTOP)
    try:
        if before is not None:
            before(session.page)
        open_job(session.page, job["id"], "failed")
    except BaseException:
        session.context.close()
        raise
    return job, session


# Every loss point count the job page's chart shows from now on, in order, in
# window.lossCounts.
COUNT_LOSS_POINTS = """() => {
  const figure = document.querySelector('figure[data-chart="loss"]');
  window.lossCounts = [];
  new MutationObserver(() => window.lossCounts.push(Number(figure.dataset.pointsLoss)))
    .observe(figure, { attributes: true, attributeFilter: ["data-points-loss"] });
}"""


def test_resumed_attempt_charts_and_progress_go_on(browser: Browser, stepping: Service) -> None:
    """A job that failed at step 25 (its checkpoint at 20) resumed from its page: the
    charts drop the lost attempt's steps past 20 when the new one starts there (as the
    service drops them), then grow to its end at 30; trained longer to 60 after that,
    the bar, the charts and the checkpoints go on to 60."""
    job, session = failed_at_25(browser, stepping)
    try:
        page = session.page
        loss = page.locator('figure[data-chart="loss"]')
        expect(loss).to_have_attribute("data-points-loss", "25")
        expect(page.locator("#checkpoints a.download")).to_have_count(2)  # steps 10 and 20
        expect(page.locator(".job-error")).to_be_visible()  # "Failed: …"
        page.evaluate(COUNT_LOSS_POINTS)
        page.locator("#resume-job").click()
        expect(page.locator("#action-status")).to_have_text(
            "Resumed as attempt 2: it trains on from its latest checkpoint."
        )
        expect(page.locator(".job-error")).to_be_hidden()  # the last attempt's end is past
        expect(badge(page)).to_have_text("succeeded", timeout=30_000)
        expect(loss).to_have_attribute("data-points-loss", "30")
        expect(page.locator("#action-status")).to_have_text("Attempt 2 succeeded at step 30.")
        expect(page.locator(".meta")).not_to_contain_text("trained no step")  # it trained 21-30
        counts = page.evaluate("window.lossCounts")
        # The start at step 20 took the lost 21-25 away before 21-30 came again.
        assert 20 in counts and counts.index(20) < counts.index(30), counts
        assert max(counts) <= 30, counts

        page.locator("#train-longer").click()
        field = page.get_by_label("To step", exact=True)
        expect(field).to_have_value("60")
        expect(page.locator("#resume-steps-hint")).to_contain_text("from step 30")
        page.locator("#resume-submit").click()
        bar = page.locator(".bar-large")
        # Mid-way: the bar and its text count towards the new total.
        expect(page.locator("#job-progress-text")).to_contain_text(
            re.compile(r"^(3\d|4\d|5\d) / 60")
        )
        expect(badge(page)).to_have_text("running")
        expect(badge(page)).to_have_text("succeeded", timeout=30_000)
        expect(page.locator("#job-progress-text")).to_have_text("60 / 60 · 100.0%")
        expect(bar).to_have_attribute("aria-valuenow", "100.0")
        expect(loss).to_have_attribute("data-points-loss", "60")
        expect(loss).to_have_attribute("data-x-range", re.compile(r"\.\.60$"))
        expect(page.locator('#checkpoints a.download[data-step="60"]')).to_have_count(1)
        expect(page.locator(".meta")).to_contain_text("attempt 3")
        assert session.errors == []
    finally:
        session.context.close()


def test_finish_a_failed_job_at_its_latest_checkpoint(browser: Browser, stepping: Service) -> None:
    """A job that failed at step 25 (its checkpoint at 20), finished there from its page by
    keyboard: queued to end at step 20, said in the line; its worker trains no step; the
    job succeeds at 20 of 20, its charts drop the lost steps past 20, and its model is
    there to download."""
    job, session = failed_at_25(browser, stepping)
    try:
        page = session.page
        expect(page.locator("#checkpoints a.download")).to_have_count(2)  # steps 10 and 20
        expect(page.locator("#download-model")).to_be_hidden()
        finish = page.get_by_role("button", name="Finish at step 20", exact=True)
        expect(finish).to_be_visible()
        low_contrast(page)
        finish.focus()
        page.keyboard.press("Enter")

        line = page.locator("#action-status")
        expect(line).to_have_text(
            "Resumed as attempt 2: it finishes at step 20, its latest checkpoint, with its final "
            "eval and export."
        )
        expect(line).to_be_focused()
        no_resume_controls(page)
        expect(badge(page)).to_have_text("succeeded", timeout=30_000)
        expect(line).to_have_text("Attempt 2 succeeded at step 20.")
        expect(page.locator("#job-progress-text")).to_have_text("20 / 20 · 100.0%")
        # Its "20 / 20" alone read as trained by this attempt: the meta line says it was not.
        expect(page.locator(".meta")).to_contain_text(
            " · attempt 2 (trained no step: finished at step 20's checkpoint)"
        )
        expect(page.locator('figure[data-chart="loss"]')).to_have_attribute(
            "data-points-loss", "20"
        )
        expect(page.locator("#download-model")).to_be_visible()
        expect(page.locator("#finish-job")).to_be_hidden()
        done = stepping.job(job["id"])
        assert done["spec"]["steps"] == 20 and done["result"]["outcome"] == "succeeded"
        assert session.errors == []
    finally:
        session.context.close()


def loss_steps(service: Service, job_id: str) -> list[int]:
    """The steps of the job's loss series as the service holds them."""
    answer = service.client.get(f"/api/v1/jobs/{job_id}/metrics", params={"name": "loss"})
    assert answer.status_code == 200, answer.text
    return [point["step"] for point in answer.json()["series"].get("loss", [])]


@pytest.mark.parametrize("button", ["#resume-job", "#finish-job"])
def test_charts_drop_lost_steps_when_the_resume_is_learnt_late(
    browser: Browser, stepping: Service, button: str
) -> None:
    """A page that learns of the resume only after its attempt has started (its answer
    held here until the service has dropped the steps past 20, the stream of every job held
    too, as a slow network or a loaded host may have it) opens the job's stream past the
    new attempt's `start`: its charts, read whole again, drop the lost steps 21-25 all the
    same (they kept them, the read only adding points), then go on to the attempt's end."""
    held: list[Route] = []

    def hold(page: Page) -> None:
        page.route(re.compile(r"/api/v1/events$"), lambda route: None)  # no `state` comes
        page.route(re.compile(r"/resume$"), lambda route: held.append(route))

    job, session = failed_at_25(browser, stepping, hold)
    try:
        page = session.page
        loss = page.locator('figure[data-chart="loss"]')
        expect(loss).to_have_attribute("data-points-loss", "25")
        page.evaluate(COUNT_LOSS_POINTS)
        page.locator(button).click()
        for _ in range(200):
            if held:
                break
            page.wait_for_timeout(50)
        assert len(held) == 1, held
        answer = held[0].fetch()  # the resume, made; its answer not yet given to the page
        assert answer.status == 200, answer.text()
        deadline = time.monotonic() + 30
        while max(loss_steps(stepping, job["id"])) != 20:  # the new attempt has started
            assert time.monotonic() < deadline, loss_steps(stepping, job["id"])
            time.sleep(0.05)
        expect(badge(page)).to_have_text("failed")  # it knows nothing of it yet
        held[0].fulfill(response=answer)

        expect(page.locator(".meta")).to_contain_text("attempt 2")
        expect(badge(page)).to_have_text("succeeded", timeout=30_000)
        end = 30 if button == "#resume-job" else 20
        expect(loss).to_have_attribute("data-points-loss", str(end))
        assert loss_steps(stepping, job["id"]) == list(range(1, end + 1))
        counts = page.evaluate("window.lossCounts")
        # The lost 21-25 went (before 21-30 came again; a finish trains none).
        assert 20 in counts, counts
        if end == 20:
            assert set(counts[counts.index(20) :]) == {20}, counts
        else:
            assert counts.index(20) < counts.index(30) and max(counts) <= 30, counts
        assert session.errors == []
    finally:
        session.context.close()


def test_resume_at_phone_width(browser: Browser, service: Service, screenshots: Path) -> None:
    """At a phone's width the actions (Resume, Train longer, Delete job) wrap within the
    screen, and so does the open form with a refusal beside its field; all of it reads at
    AA contrast."""
    job = cancelled(service)
    fake_checkpoint(service, job["id"], 10)
    phone = open_session(browser, service, PHONE)
    try:
        page = phone.page
        open_job(page, job["id"], "cancelled")
        for control in ("#resume-job", "#finish-job", "#train-longer", "#delete-job"):
            button = page.locator(control)
            expect(button).to_be_visible()
            box = button.bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
        assert no_overflow(page)
        page.locator("#train-longer").click()
        field = page.get_by_label("To step", exact=True)
        field.fill("7")
        page.locator("#resume-submit").click()
        expect(page.locator("#resume-steps-error")).to_contain_text("Expected at least 10")
        assert no_overflow(page)
        page.screenshot(path=screenshots / "dashboard-train-longer-phone.png")
        form = page.locator("#resume-form").bounding_box()
        assert form is not None and form["x"] + form["width"] <= PHONE["width"]
        low_contrast(page)
        field.fill("25")
        page.locator("#resume-submit").click()
        expect(page.locator("#action-status")).to_have_text(
            "Resumed as attempt 2: it trains on to step 25 from its latest checkpoint."
        )
        expect(badge(page)).to_have_text(re.compile(r"^(queued|running)$"))
        assert no_overflow(page)
        low_contrast(page)
        assert phone.errors == []
    finally:
        phone.context.close()


def in_both_schemes(page: Page) -> None:
    """Every text on the page reads at AA in the light scheme and in the dark one."""
    for scheme in ("dark", "light"):
        page.emulate_media(color_scheme=scheme)
        assert_contrast(page, f"{page.url} ({scheme})")


def test_resume_at_another_priority(session: Session, service: Service) -> None:
    """The Train longer form has a labelled Priority field holding the job's own, reached
    by Tab; a value the service refuses is said beside it, the field marked and focused,
    nothing typed lost and the job as it was; one it takes is the job's stored priority,
    said in the line. While the form is open, a plain Resume takes its priority too; with
    it closed, none is sent (the job keeps its own)."""
    job = cancelled(service)
    fake_checkpoint(service, job["id"], 10)
    page = session.page
    open_job(page, job["id"], "cancelled")
    page.locator("#train-longer").focus()
    page.keyboard.press("Enter")
    steps = page.get_by_label("To step", exact=True)
    expect(steps).to_be_focused()
    page.keyboard.press("Tab")
    # The form's: the one beside a queued or running job's place is hidden (ended).
    priority = page.get_by_role("form", name="Train longer").get_by_label("Priority", exact=True)
    expect(priority).to_be_focused()
    expect(priority).to_have_value("0")
    expect(priority).to_have_attribute("min", "-1000")
    expect(priority).to_have_attribute("max", "1000")
    expect(priority).to_have_accessible_description(
        "The highest priority starts first; while this form is open, Resume and Finish take "
        "this priority too."
    )

    # Neither field holds a number: both refusals are said at once, the first focused.
    steps.fill("")
    priority.fill("")
    page.keyboard.press("Enter")
    expect(page.locator("#resume-steps-error")).to_have_text("Enter the step to train it to.")
    expect(page.locator("#resume-priority-error")).to_have_text(
        "Enter a whole number from -1000 to 1000."
    )
    expect(priority).to_have_attribute("aria-invalid", "true")
    expect(steps).to_be_focused()

    steps.fill("40")
    priority.fill("1001")
    page.keyboard.press("Enter")
    error = page.locator("#resume-priority-error")
    expect(error).to_have_text("Input should be less than or equal to 1000. Received: 1001")
    expect(priority).to_have_attribute("aria-invalid", "true")
    expect(priority).to_be_focused()
    assert (priority.get_attribute("aria-describedby") or "").split()[0] == error.get_attribute(
        "id"
    )
    expect(page.locator("#resume-steps-error")).to_be_hidden()
    expect(steps).to_have_value("40")  # nothing typed is lost
    expect(priority).to_have_value("1001")
    expect(page.locator("#action-status")).to_have_text("")
    refused = service.job(job["id"])
    assert (refused["state"], refused["priority"], refused["attempts"]) == ("cancelled", 0, 1)
    in_both_schemes(page)

    priority.fill("7")
    page.keyboard.press("Enter")
    line = page.locator("#action-status")
    expect(line).to_have_text(
        "Resumed as attempt 2 at priority 7: it trains on to step 40 from its latest checkpoint."
    )
    resumed = service.job(job["id"])
    assert (resumed["priority"], resumed["spec"]["priority"]) == (7, 7), resumed
    assert resumed["spec"]["steps"] == 40
    expect(page.locator(".meta")).to_contain_text("priority 7")

    # Cancelled again: Resume, with the form open at another priority, takes it.
    expect(badge(page)).to_have_text("running")
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    expect(badge(page)).to_have_text("cancelled")
    service.wait_exited(job["id"])
    page.locator("#train-longer").click()
    expect(priority).to_have_value("7")
    priority.fill("-5")
    page.get_by_role("button", name="Resume", exact=True).click()
    expect(line).to_have_text(
        "Resumed as attempt 3 at priority -5: it trains on from its latest checkpoint."
    )
    again = service.job(job["id"])
    assert (again["priority"], again["spec"]["steps"]) == (-5, 40), again

    # With the form closed, a Resume keeps the job's own priority.
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    expect(badge(page)).to_have_text("cancelled")
    service.wait_exited(job["id"])
    expect(page.locator("#resume-form")).to_be_hidden()
    page.get_by_role("button", name="Resume", exact=True).click()
    expect(line).to_have_text("Resumed as attempt 4: it trains on from its latest checkpoint.")
    assert service.job(job["id"])["priority"] == -5
    service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
    service.wait_state(job["id"], *TERMINAL)
    assert session.errors == []
