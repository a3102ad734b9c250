"""What a demanding user of the dashboard notices, in headless Chromium against a real
service whose worker is the harness's stand-in (it runs until cancelled, or ends at once):
a mangled link, what the page says once a job has ended, the log through a restart,
contrast, and the submit form's odd inputs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import LAPTOP, Session, open_session
from tests.service.harness import Service, fake_worker_env, job_spec

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("stand-in")
    svc = Service(folder / "data", fake_worker_env(folder))
    svc.start()
    yield svc
    svc.close()


@pytest.fixture
def session(browser: Browser, service: Service) -> Iterator[Session]:
    session = open_session(browser, service, LAPTOP)
    yield session
    session.context.close()


def test_mangled_job_link_says_no_such_job(session: Session) -> None:
    """A job link cut short mid-escape (`%E0%A4%A`, from a truncated copy) names the job
    it could not find, rather than leaving a blank page and an uncaught URIError."""
    page = session.page
    page.goto("/#/jobs/%E0%A4%A")
    expect(page.locator("#job-load-error")).to_have_text("No job %E0%A4%A.")
    expect(page.locator(".crumbs a")).to_be_visible()  # the way back
    assert session.errors == []


def test_cancel_line_follows_the_job_to_its_end(session: Session, service: Service) -> None:
    """Once the cancelled job has stopped, the line under Cancel says so; it went on
    saying "the worker checkpoints and stops" beside the cancelled badge."""
    job = service.submit(job_spec(name="runs-until-cancelled"))
    service.wait_for(job["id"], lambda j: j["progress"] is not None, what="its start line")
    page = session.page
    page.goto(f"/#/jobs/{job['id']}")
    expect(page.locator(".job-heading .state")).to_have_text("running")
    cancel, line = page.locator("#cancel-job"), page.locator("#action-status")
    cancel.click()
    cancel.click()
    expect(page.locator(".job-heading .state")).to_have_text("cancelled", timeout=30_000)
    ended = service.job(job["id"])
    assert ended["state"] == "cancelled", ended
    expect(line).to_have_text(f"Cancelled at step {ended['progress']['step']}.")
    assert session.errors == []


def test_ended_job_says_what_it_never_reported(session: Session, service: Service) -> None:
    """A job that ended without metrics, checkpoints or its device trace says so; the page
    said "No data yet", "No checkpoint yet" and "not taken yet" as if more could come."""
    job = service.submit(job_spec(name="quick", summaries={"trace_steps": [5]}))
    assert service.wait_state(job["id"], "succeeded", "failed")["state"] == "succeeded"
    page = session.page
    page.goto(f"/#/jobs/{job['id']}")
    expect(page.locator(".job-heading .state")).to_have_text("succeeded")
    expect(page.locator(".chart-empty")).to_have_text(["No data reported."] * 3)
    expect(page.locator("#checkpoints")).to_have_text("No checkpoint was saved.")
    expect(page.locator("#towers")).to_have_text(
        "The job ended before the device trace of step 5 was taken."
    )
    expect(page.locator("#view")).not_to_contain_text("yet")
    assert session.errors == []


def test_log_stays_while_the_service_restarts(browser: Browser, tmp_path: Path) -> None:
    """A log read that gets no answer (the service restarting) keeps the lines already
    shown and says the read failed beside them; it replaced the log with the error."""
    restarting = Service(tmp_path / "data", fake_worker_env(tmp_path))
    restarting.start()
    session = open_session(browser, restarting, LAPTOP)
    try:
        page = session.page
        job = restarting.submit(job_spec(name="runs-until-cancelled"))
        restarting.wait_state(job["id"], "running")
        page.goto(f"/#/jobs/{job['id']}")
        log, note = page.locator("#log"), page.locator("#log-error")
        header = f"attempt 1 of job {job['id']} starting"
        expect(log).to_contain_text(header)
        expect(note).to_be_hidden()
        restarting.stop()  # the worker lives on, to be adopted
        # The log is read every 3 s while the job runs.
        expect(note).to_contain_text("Could not read the log: The service did not answer")
        expect(note).to_contain_text("The lines below are from the last read.")
        expect(log).to_contain_text(header)
        restarting.start()
        expect(note).to_be_hidden(timeout=15_000)
        expect(log).to_contain_text(header)
        assert restarting.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
        assert session.errors == []
    finally:
        session.context.close()
        restarting.close()
