"""The dashboard on a lossy, slow network, in headless Chromium against a real service whose
worker is a stand-in that steps until it is cancelled: an ended job's log, checkpoints and
series are read again after a read that got no answer (nothing else reads them again); a
read of the log answered late, after a later one, does not take its place; a submit
answered after the user left the form does not take them off the page they went to."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Response, Route, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.lossy import answers_lost, pump_until
from tests.e2e.test_dashboard import Session
from tests.service.harness import Service, long_job, stepping_worker_env

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)]

LOG_READ = re.compile(r"/api/v1/jobs/[^/]+/logs\?")
LIST_READ = re.compile(r"/api/v1/jobs\?")
# A page's init script, run after its context's (tests/e2e/slow.py's among them): each
# event of the page's EventSources kept on `window.handedEvents` as it is handed to the
# page's listener, after any delay TOWERBOARD_SLOW_BROWSER=net puts in. A test can then wait
# until the page has had an event, not only until the browser has.
HANDED_EVENTS = """
window.handedEvents = [];
window.EventSource = class HandedEventSource extends window.EventSource {
  addEventListener(type, listener, options) {
    if (typeof listener !== "function") return super.addEventListener(type, listener, options);
    return super.addEventListener(type, function (event) {
      window.handedEvents.push({ type, data: event.data });
      return listener.call(this, event);
    }, options);
  }
};
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("stepping")
    svc = Service(folder / "data", stepping_worker_env(folder))
    svc.start()
    yield svc
    svc.close()


def cancelled_job(service: Service, name: str) -> str:
    """A job of the stepping stand-in that reported some steps, then was cancelled; its id."""
    job_id = str(service.submit(long_job(name=name))["id"])
    service.wait_for(job_id, lambda job: ((job["progress"] or {}).get("step") or 0) >= 3)
    assert service.client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 202
    assert service.wait_state(job_id, "succeeded", "failed", "cancelled")["state"] == "cancelled"
    return job_id


def test_ended_job_reads_again_what_got_no_answer(
    session: Session, service: Service, screenshots: Path
) -> None:
    """The first reads of an ended job's series, checkpoints and log get no answer (a lossy
    network): each is read again, and the page shows them once the network is back. The
    charts said "No data reported." and the log and checkpoints their failures until the
    page was reloaded."""
    job_id = cancelled_job(service, "lossy-reads")
    page = session.page
    failed: list[str] = []

    def fail_first(route: Route) -> None:
        kind = re.sub(r"\?.*", "", route.request.url).rsplit("/", 1)[-1]
        if kind not in failed:
            failed.append(kind)
            route.abort()
        else:
            route.continue_()

    page.route(re.compile(r"/api/v1/jobs/[^/]+/(metrics|checkpoints|logs)(\?.*)?$"), fail_first)
    try:
        page.goto(f"/#/jobs/{job_id}")
        expect(page.locator(".job-heading .state")).to_have_text("cancelled")
        figure = page.locator('figure[data-chart="loss"]')
        expect(figure).not_to_have_attribute("data-points", "0")
        expect(page.locator("#checkpoints p")).to_have_text("No checkpoint was saved.")
        expect(page.locator("#checkpoints p")).not_to_have_class(re.compile(r"\berror\b"))
        expect(page.locator("#log-error")).to_be_hidden()
        expect(page.locator("#log")).to_contain_text(f"attempt 1 of job {job_id}")
        assert sorted(failed) == ["checkpoints", "logs", "metrics"]
        page.screenshot(path=screenshots / "dashboard-reads-again.png")
    finally:
        page.unroute("**/*")
    assert session.errors == []


def test_late_log_read_does_not_replace_a_later_one(session: Session, service: Service) -> None:
    """A poll of a running job's log is answered only after the job has ended and the
    page's read of the ended job's log has been answered (a slow network answers out of
    order): the late answer, older, is dropped. Shown, it hid the log's last lines for good,
    as an ended job's log is read no more."""
    job_id = str(service.submit(long_job(name="late-log"))["id"])
    service.wait_reported(job_id)
    page = session.page
    held: list[Route] = []

    def hold_first(route: Route) -> None:
        if not held:
            held.append(route)  # answered below, with what the log said before the end
        else:
            route.continue_()

    page.goto(f"/#/jobs/{job_id}")
    expect(page.locator(".job-heading .state")).to_have_text("running")
    banner = f"attempt 1 of job {job_id}"  # the service's line atop the log
    expect(page.locator("#log")).to_contain_text(banner)  # the first read's
    page.route(LOG_READ, hold_first)
    answered: list[str] = []  # the log reads answered from now on (the held one is not)

    def on_response(response: Response) -> None:
        if LOG_READ.search(response.url):
            answered.append(response.url)

    page.on("response", on_response)
    try:
        pump_until(page, lambda: bool(held))  # the next poll (every 3 s), held
        assert held, "no poll of the log came to hold"
        assert service.client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 202
        expect(page.locator(".job-heading .state")).to_have_text("cancelled")
        # The ended job's own read, answered (it is not held): the log as it ended.
        pump_until(page, lambda: bool(answered))
        assert answered, "the ended job's log was not read"
        page.wait_for_timeout(500)  # past the page's handling of it
        expect(page.locator("#log")).to_contain_text(banner)
        with page.expect_event("requestfinished"):
            held[0].fulfill(status=200, content_type="text/plain", body="an older read")
        page.wait_for_timeout(500)
        expect(page.locator("#log")).to_contain_text(banner)
        expect(page.locator("#log")).not_to_contain_text("an older read")
    finally:
        page.remove_listener("response", on_response)
        page.unroute(LOG_READ)
    assert session.errors == []


def test_a_late_submit_answer_leaves_the_user_where_they_went(
    session: Session, service: Service
) -> None:
    """Submit job, then the Jobs link before the service answers (a slow network): the
    answer, when it comes, took the user off the jobs list to the new job's page. They stay
    on the list, which shows the job."""
    page = session.page
    held: list[Route] = []
    submits = re.compile(r"/api/v1/jobs$")

    def hold_post(route: Route) -> None:
        if route.request.method == "POST":
            held.append(route)
        else:
            route.continue_()

    page.goto("/#/submit")
    page.fill("#spec", json.dumps(long_job(name="submitted-then-left")))
    page.route(submits, hold_post)
    try:
        page.click("#submit-job")
        pump_until(page, lambda: bool(held))
        assert held, "the submit was not held"
        page.click('a[data-nav="jobs"]')
        expect(page.locator("#jobs-summary")).not_to_have_text("Loading…")
        with page.expect_response(submits) as answer:
            held[0].continue_()
        job = answer.value.json()
        expect(page.locator(f'tr[data-job="{job["id"]}"]')).to_be_visible()  # the stream's
        page.wait_for_timeout(500)  # past the page's handling of the answer
        assert page.evaluate("location.hash") == "#/"
        assert session.errors == []
    finally:
        page.unroute(submits)
        for job in service.client.get("/api/v1/jobs?state=running").json()["data"]:
            service.client.post(f"/api/v1/jobs/{job['id']}/cancel")


def test_jobs_list_reads_again_what_got_no_answer(session: Session, service: Service) -> None:
    """The jobs list's first read and the stream's re-read at its opening get no answer (a
    lossy network): the list is read again 3 s on, as a job's page reads again, and shows
    the jobs. It said "Could not load jobs" over no table until its 15 s poll."""
    job_id = cancelled_job(service, "lossy-list")
    page = session.page
    lost: list[str] = []
    losing = [True]

    def lose(route: Route) -> None:
        if losing[0]:
            lost.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    page.route(LIST_READ, lose)
    try:
        page.goto("/#/")
        error = page.locator("#view p.error[role=alert]")
        expect(error).to_contain_text("Could not load jobs")
        expect(error).to_contain_text("Trying again")
        # The stream's re-read at its opening, lost too.
        pump_until(page, lambda: len(lost) >= 2, every_ms=50)
        assert len(lost) >= 2, lost
        losing[0] = False
        # Within a retry (3 s) and a slow host's margin; the poll would come 15 s on.
        expect(page.locator(f'tr[data-job="{job_id}"]')).to_be_visible(timeout=9_000)
        expect(error).to_be_hidden()
    finally:
        page.unroute(LIST_READ)
    assert session.errors == []


def test_a_cancel_whose_answer_is_lost_says_the_job_cancelled(
    session: Session, service: Service
) -> None:
    """Cancel, twice, on a running job's page: the cancel reaches the service, its answer
    is lost (a lossy network). The job stops; the line under the buttons says so, not
    "Could not cancel", which stayed beside the cancelled job."""
    job_id = str(service.submit(long_job(name="cancel-answer-lost"))["id"])
    service.wait_reported(job_id)
    page = session.page
    page.goto(f"/#/jobs/{job_id}")
    expect(page.locator(".job-heading .state")).to_have_text("running")
    with answers_lost(page, re.compile(r"/api/v1/jobs/[^/]+/cancel$")) as sent:
        page.click("#cancel-job")
        expect(page.locator("#cancel-job")).to_have_text("Confirm cancel")
        page.click("#cancel-job")
        expect(page.locator(".job-heading .state")).to_have_text("cancelled")
        status = page.locator("#action-status")
        expect(status).to_have_text(re.compile(r"^Cancelled at step \d+\.$"))
        page.wait_for_timeout(500)  # nothing later takes it back
        expect(status).to_have_text(re.compile(r"^Cancelled at step \d+\.$"))
    assert sent == [202]
    assert session.errors == []


def test_a_resume_whose_answer_is_lost_says_the_job_resumed(
    session: Session, service: Service
) -> None:
    """Resume on a cancelled job's page: the resume reaches the service, its answer is
    lost (a lossy network). The job trains on as attempt 2; the line says so, not "Could
    not resume: The service did not answer", in red, which stayed beside it."""
    job_id = cancelled_job(service, "resume-answer-lost")
    page = session.page
    page.goto(f"/#/jobs/{job_id}")
    expect(page.locator(".job-heading .state")).to_have_text("cancelled")
    try:
        with answers_lost(page, re.compile(r"/api/v1/jobs/[^/]+/resume$")) as sent:
            page.click("#resume-job")
            state = page.locator(".job-heading .state")
            expect(state).to_have_text(re.compile("queued|running"))
            status = page.locator("#action-status")
            expect(status).to_have_text("Resumed as attempt 2.")
            expect(status).not_to_have_class(re.compile(r"\berror\b"))
        assert sent == [200]
    finally:
        service.client.post(f"/api/v1/jobs/{job_id}/cancel")
    assert session.errors == []


def test_devices_panel_keeps_its_devices_through_a_lost_read(session: Session) -> None:
    """A read of the devices gets no answer (a lossy network): the panel keeps the devices
    it showed, says they are not up to date, and reads them again. One lost read replaced
    them with "Unavailable: The service did not answer" until the next poll."""
    page = session.page
    devices = re.compile(r"/api/v1/devices$")
    lost: list[str] = []

    def lose_one(route: Route) -> None:
        if not lost:
            lost.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    page.goto("/#/")
    items = page.locator("#devices li[data-device]")
    note = page.locator("#devices-note")
    expect(items.first).to_be_visible()
    shown = items.count()
    expect(note).to_contain_text("host · up to")
    page.route(devices, lose_one)
    try:
        for _ in range(150):  # the panel's next read (a poll every 5 s), lost
            if lost:
                break
            page.wait_for_timeout(100)
        assert lost, "no read of the devices came to lose"
        expect(note).to_contain_text("Not up to date: The service did not answer")
        expect(items).to_have_count(shown)
        expect(page.locator("#devices")).not_to_contain_text("Unavailable")
        expect(note).to_contain_text("host · up to")  # read again, answered
    finally:
        page.unroute(devices)
    assert session.errors == []


def test_a_delete_whose_answer_is_lost_goes_back_to_the_list(
    session: Session, service: Service
) -> None:
    """Delete job, twice, on an ended job's page: the delete is done, the stream says the
    job was deleted, and then the answer is lost (a lossy network). The page goes back to
    the list, which says the job was deleted; it said "Could not delete: The service did
    not answer" beside a job that was gone, and nothing more came to say otherwise. The
    loss waits until the page has had the `deleted`: lost before (a slow network hands
    events on late), the page reads the job, and its 404 says "This job was deleted." in
    the job's place, as true but not what this test is about."""
    job_id = cancelled_job(service, "delete-answer-lost")
    page = session.page
    page.add_init_script(HANDED_EVENTS)
    job_url = re.compile(r"/api/v1/jobs/[^/?]+$")
    held: list[Route] = []

    def hold_answer(route: Route) -> None:
        if route.request.method != "DELETE":
            route.continue_()
            return
        assert route.fetch().status == 204  # done
        held.append(route)

    page.goto(f"/#/jobs/{job_id}")
    expect(page.locator(".job-heading .state")).to_have_text("cancelled")
    expect(page.locator("#delete-job")).not_to_have_attribute("aria-disabled", "true")
    # The page's listeners get the events through it (no init script ran after it).
    assert page.evaluate("window.EventSource.name") == "HandedEventSource"
    page.route(job_url, hold_answer)
    try:
        page.click("#delete-job")
        expect(page.locator("#delete-job")).to_have_text("Confirm delete")
        page.click("#delete-job")
        pump_until(page, lambda: bool(held))
        assert held, "the delete was not held"
        assert service.client.get(f"/api/v1/jobs/{job_id}").status_code == 404
        # The stream's `deleted`, had by the page (late on a slow network), then the loss.
        page.wait_for_function(
            """(id) => window.handedEvents.some((event) =>
                 event.type === "deleted" && JSON.parse(event.data).job_id === id)""",
            arg=job_id,
        )
        held[0].abort()
        expect(page.locator("#jobs-notice")).to_have_text(
            f"Job delete-answer-lost ({job_id}) deleted."
        )
        assert page.evaluate("location.hash") == "#/"
    finally:
        page.unroute(job_url)
    assert session.errors == []


def test_a_cancel_confirmed_says_so_while_its_answer_is_out(
    session: Session, service: Service
) -> None:
    """Cancel, twice, on a slow network: until the answer comes the line says the cancel
    is out. It said "Press Confirm cancel within 4 s to stop this job." after it was."""
    job_id = str(service.submit(long_job(name="cancel-slow"))["id"])
    service.wait_reported(job_id)
    page = session.page
    cancels = re.compile(r"/api/v1/jobs/[^/]+/cancel$")
    held: list[Route] = []
    page.goto(f"/#/jobs/{job_id}")
    expect(page.locator(".job-heading .state")).to_have_text("running")

    def hold(route: Route) -> None:
        held.append(route)

    page.route(cancels, hold)
    try:
        page.click("#cancel-job")
        page.click("#cancel-job")
        pump_until(page, lambda: bool(held))
        assert held, "the cancel was not held"
        expect(page.locator("#action-status")).to_have_text("Cancelling…")
        held[0].continue_()
        expect(page.locator(".job-heading .state")).to_have_text("cancelled")
        expect(page.locator("#action-status")).to_have_text(
            re.compile(r"^Cancelled at step \d+\.$")
        )
    finally:
        page.unroute(cancels)
    assert session.errors == []


def test_a_job_page_read_again_after_no_answer_is_said_by_its_name(
    session: Session, service: Service
) -> None:
    """A link to a job's page whose first read of the job gets no answer (a lossy network):
    the page switch is said by what the page shows, that it could not load the job and
    tries again; once the read again is answered, it is said again, by the job's name. The
    name was never said: the switch had been said, by the failure, and the read again that
    filled the heading said nothing."""
    job_id = cancelled_job(service, "read-again-said")
    page = session.page
    page.goto("/")
    expect(page.locator("#view h1")).to_have_text("Jobs")
    lost: list[str] = []

    def lose_first(route: Route) -> None:
        if not lost and route.request.method == "GET":
            lost.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    job_read = re.compile(rf"/api/v1/jobs/{job_id}$")
    page.route(job_read, lose_first)
    try:
        page.goto(f"/#/jobs/{job_id}")
        announcer = page.locator("#route-announcer")
        failed = re.compile(
            rf"^Could not load job {job_id}: The service did not answer .* Trying again…$"
        )
        expect(page.locator("#job-load-error")).to_have_text(failed)
        expect(announcer).to_have_text(failed)
        assert lost, "the job's first read was not lost"
        # Read again 3 s on (RETRY_MS), answered.
        expect(page.locator(".job-heading .state")).to_have_text("cancelled", timeout=10_000)
        expect(page.locator("#job-load-error")).to_be_hidden()
        expect(announcer).to_have_text("read-again-said")
        expect(page.locator("#view")).not_to_have_attribute("aria-busy", "true")
    finally:
        page.unroute(job_read)
    assert session.errors == []
