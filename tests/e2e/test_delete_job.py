"""Deleting ended jobs from the dashboard, in headless Chromium against a real service whose
worker is the harness's stand-in (jobs end in a blink): Delete job on an ended job's page
(confirmed like Cancel, by keyboard too), the service's refusal said in its status line,
the jobs table dropping a row another user deleted (counts and paging kept), a job page
saying its job was deleted elsewhere, contrast and a phone's width. No model is trained
here, so none of it is marked slow."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, Request, Route, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.contrast import assert_contrast
from tests.e2e.lossy import pump_until
from tests.e2e.test_dashboard import (
    LIST_READ,
    LOG_POLL_MS,
    PHONE,
    TERMINAL,
    Session,
    after_list_read,
    no_overflow,
    open_session,
    record_list_reads,
)
from tests.service.harness import Service, job_spec, stand_in_service

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)

ARMED = (
    "Press Confirm delete within 4 s to delete this job for good: its metrics, log, "
    "checkpoints and model."
)
ARMED_MS = 4_000  # a first press of Delete job stays armed this long (job.js's CONFIRM_MS)
STILL_EXITING = "has ended but its worker process is still exiting; try again in a few seconds."
# What a job page says while its ended job's worker is still exiting (job.js's exitingHint).
EXITING = (
    "The job has ended but its worker is still exiting… Resume, Finish, Train longer and "
    "Delete job wait until it has gone."
)
DEVICES = "**/api/v1/devices"
# Run before the page's own scripts: each read of the devices list the page makes, kept on
# `window.devicesReads` with the page's script that made it ("job.js", the job's page, or
# "app.js", the devices panel), from the stack of its `fetch`.
TRACK_DEVICES_READS = r"""(() => {
  window.devicesReads = [];
  const fetchBefore = window.fetch;
  window.fetch = function (input, init) {
    if (String(input).endsWith("/api/v1/devices")) {
      const by = (new Error().stack || "").match(/\/static\/js\/(job|app)\.js/);
      window.devicesReads.push(by ? `${by[1]}.js` : "?");
    }
    return fetchBefore.call(this, input, init);
  };
})();"""
# Run before the page's own scripts: its EventSources kept on `window.eventSources`, so a
# test can wait until one is open (the service subscribes a stream as it opens it).
TRACK_EVENT_SOURCES = """
window.eventSources = [];
window.EventSource = class extends window.EventSource {
  constructor(...args) {
    super(...args);
    window.eventSources.push(this);
  }
};
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    # Four slots: a "linger" job holds its slot after it ends, and others run beside it.
    with stand_in_service(tmp_path_factory.mktemp("stand-in"), TOWERBOARD_CPU_JOBS="4") as svc:
        yield svc


def ended(service: Service, name: str = "quick") -> dict[str, Any]:
    """A job the stand-in ran to its end, whose worker has exited: deletable."""
    job = service.submit(job_spec(name=name))
    done = service.wait_state(job["id"], *TERMINAL)
    service.wait_exited(job["id"])
    return done


def delete_elsewhere(service: Service, job_id: str) -> None:
    """Delete the job through the API, as another user or the CLI would."""
    response = service.client.delete(f"/api/v1/jobs/{job_id}")
    assert response.status_code == 204, response.text


def total(service: Service, state: str | None = None) -> int:
    params: dict[str, str | int] = {"limit": 1}
    if state:
        params["state"] = state
    count: int = service.client.get("/api/v1/jobs", params=params).json()["count"]
    return count


def summary(shown: int, count: int, state: str = "") -> str:
    """The jobs table's summary line, as jobs.js writes it."""
    return f"{shown} of {count} job{'' if count == 1 else 's'}{f' {state}' if state else ''}"


def open_job(page: Page, job_id: str, state: str) -> None:
    page.goto(f"/#/jobs/{job_id}")
    expect(page.locator(".job-heading .state")).to_have_text(state)


def open_exiting_job(page: Page, service: Service, job_id: str) -> list[str]:
    """Open the page of a job that has ended while its worker is still exiting, and wait
    until it shows the wait and follows the stream of every job (where `exited` comes),
    and its own read of the job has been answered (the view no longer `aria-busy`): each
    asks the devices once. On a slow network the job's stream can say the job ended first,
    and the read's ask came after the others. From then on every read of the devices list
    gets the answer it had then, the job's device still `exiting`, however often the page
    asks: only the stream's `exited` can end the wait. Returns the URLs of those reads, as
    they come."""
    page.add_init_script(TRACK_EVENT_SOURCES)
    open_job(page, job_id, "succeeded")
    expect(page.locator("#exiting-hint")).to_have_text(EXITING)
    expect(page.locator("#view")).not_to_have_attribute("aria-busy", "true")
    page.wait_for_function(
        """() => window.eventSources.some((source) =>
             source.url.endsWith("/api/v1/events") && source.readyState === EventSource.OPEN)"""
    )
    stale = service.client.get("/api/v1/devices")
    assert [d["exiting"] for d in stale.json()["data"] if d["job_id"] == job_id] == [True]
    reads: list[str] = []

    def answer(route: Route) -> None:
        reads.append(route.request.url)
        route.fulfill(status=200, content_type="application/json", body=stale.text)

    page.route(DEVICES, answer)
    return reads


def test_delete_from_the_job_page_by_keyboard(session: Session, service: Service) -> None:
    """Delete job on an ended job's page asks for a second press (announced in the status
    line), deletes, and goes back to the list it came from, which says so and has the
    focus; the row and its count are gone. By keyboard alone."""
    job = ended(service)
    page = session.page
    page.goto("/#/?state=succeeded")
    row = page.locator(f'tr[data-job="{job["id"]}"]')
    before = total(service, "succeeded")
    expect(page.locator("#jobs-summary")).to_have_text(summary(before, before, "succeeded"))
    row.locator("a.job-name").focus()
    page.keyboard.press("Enter")
    expect(page.locator(".job-heading .state")).to_have_text("succeeded")
    expect(page.locator("#cancel-job")).to_be_hidden()
    button = page.get_by_role("button", name="Delete job", exact=True)
    button.focus()
    page.keyboard.press("Enter")
    expect(page.get_by_role("button", name="Confirm delete", exact=True)).to_be_focused()
    expect(page.get_by_role("status").filter(has_text=ARMED)).to_have_count(1)
    assert service.job(job["id"])["state"] == "succeeded"  # one press deletes nothing
    page.keyboard.press("Enter")

    page.wait_for_url(re.compile(r"#/\?state=succeeded$"))
    notice = page.locator("#jobs-notice")
    expect(notice).to_have_text(f"Job quick ({job['id']}) deleted.")
    expect(notice).to_have_attribute("role", "status")
    expect(notice).to_be_focused()
    expect(page.locator("#jobs-summary")).to_have_text(summary(before - 1, before - 1, "succeeded"))
    expect(row).to_have_count(0)
    assert service.client.get(f"/api/v1/jobs/{job['id']}").status_code == 404
    # Said once: the list shown again later does not repeat it.
    page.goto("/#/submit")
    page.goto("/#/?state=succeeded")
    expect(page.locator("#jobs-summary")).to_contain_text(" succeeded")
    expect(page.locator("#jobs-notice")).to_be_hidden()
    assert session.errors == []


def test_armed_delete_lapses(session: Session, service: Service) -> None:
    """One press and no second within 4 s: the button and the line go back, nothing is
    deleted."""
    job = ended(service)
    page = session.page
    page.clock.install()  # before the page loads: its 4 s is the clock's, moved on below
    open_job(page, job["id"], "succeeded")
    page.locator("#delete-job").click()
    line = page.locator("#action-status")
    expect(line).to_have_text(ARMED)
    expect(page.locator("#delete-job")).to_have_attribute("data-armed", "1")
    page.clock.fast_forward(ARMED_MS)  # the 4 s pass, without waiting them out
    expect(page.locator("#delete-job")).to_have_text("Delete job", timeout=6_000)
    expect(line).to_have_text("")
    page.wait_for_timeout(300)
    assert service.job(job["id"])["state"] == "succeeded"
    assert session.errors == []


def test_delete_waits_while_the_worker_exits(session: Session, service: Service) -> None:
    """A job that has ended while its worker is still exiting (the stand-in "linger"
    stays after its result until released): Delete job is there but dimmed, named by the
    line that says why, and a press does nothing (it was offered, and the service refused
    it after a 5 s wait). Once the worker has gone it works, with no reload: the stream's
    `exited` says so, where the page read the devices list every 0.5 s until it did. Here
    every read of the list says the worker is still there, and the page reads it no more
    while it waits."""
    job = service.submit(job_spec(name="linger"))
    service.wait_state(job["id"], "succeeded")
    page = session.page
    page.add_init_script(TRACK_DEVICES_READS)
    open_exiting_job(page, service, job["id"])
    made = page.evaluate("() => window.devicesReads")
    assert "job.js" in made, made  # the page's own read as it opened, told from the panel's
    button, line, hint = (
        page.locator("#delete-job"),
        page.locator("#action-status"),
        page.locator("#exiting-hint"),
    )
    expect(hint).to_have_text(EXITING)
    expect(button).to_be_visible()
    expect(button).to_be_disabled()  # aria-disabled: it keeps the focus
    expect(button).to_have_accessible_description(EXITING)
    button.focus()
    page.keyboard.press("Enter")
    expect(button).to_be_focused()
    expect(button).to_have_text("Delete job")  # not armed
    expect(line).to_have_text("")
    assert_contrast(page)
    page.evaluate("() => { window.notReloaded = true; }")
    page.wait_for_timeout(2_000)
    # The page reads the list no more while it waits: its 0.5 s poll read it 4 times in
    # 2 s. (The devices panel may: at its 5 s poll, and as the stream's opening asked it
    # to, once a read still out has been answered: on a slow network, a second or so on.)
    since = page.evaluate("(from) => window.devicesReads.slice(from)", len(made))
    assert "job.js" not in since and "?" not in since, since

    service.release(job["id"])
    service.wait_exited(job["id"])
    expect(hint).to_be_hidden(timeout=10_000)
    expect(button).to_be_enabled()
    expect(button).to_have_accessible_description("")
    assert page.evaluate("() => window.notReloaded") is True
    page.unroute(DEVICES)
    page.keyboard.press("Enter")  # the keyboard is still on it
    expect(line).to_have_text(ARMED)
    page.keyboard.press("Enter")
    expect(page.locator("#jobs-notice")).to_have_text(f"Job linger ({job['id']}) deleted.")
    assert service.client.get(f"/api/v1/jobs/{job['id']}").status_code == 404
    assert session.errors == []


def test_delete_waits_for_the_exit_where_the_event_stream_is_refused(
    session: Session, service: Service
) -> None:
    """Where the stream of every job is refused for good (a proxy's 502 while the service
    restarts: EventSource gives up and reconnects no more), no `exited` can come: the page
    then reads the devices list again every 3 s while it waits, and Delete job works once
    the worker has gone, with no reload."""
    job = service.submit(job_spec(name="linger"))
    service.wait_state(job["id"], "succeeded")
    page = session.page
    page.route("**/api/v1/events", lambda route: route.fulfill(status=502, body="Bad gateway"))
    open_job(page, job["id"], "succeeded")
    button, hint = page.locator("#delete-job"), page.locator("#exiting-hint")
    expect(hint).to_have_text(EXITING)
    expect(button).to_be_disabled()
    page.evaluate("() => { window.notReloaded = true; }")

    service.release(job["id"])
    service.wait_exited(job["id"])
    expect(hint).to_be_hidden(timeout=10_000)
    expect(button).to_be_enabled()
    assert page.evaluate("() => window.notReloaded") is True
    assert session.errors == []


def test_refused_delete_says_why_and_changes_nothing(session: Session, service: Service) -> None:
    """A delete the service refuses (409: the worker still exiting, where the devices read
    that would have said so failed) has its detail said in the action status line: the
    page stays as it was, and the button works again once the worker has gone."""
    job = service.submit(job_spec(name="linger"))
    service.wait_state(job["id"], "succeeded")
    page = session.page
    page.route("**/api/v1/devices", lambda route: route.abort())
    try:
        open_job(page, job["id"], "succeeded")
        button, line = page.locator("#delete-job"), page.locator("#action-status")
        button.click()
        button.click()
        expect(line).to_have_text(f"Could not delete: Job '{job['id']}' {STILL_EXITING}")
    finally:
        page.unroute("**/api/v1/devices")
    expect(line).to_have_class(re.compile(r"\berror\b"))
    expect(button).to_have_text("Delete job")
    # Dimmed while the request was out, not disabled: the keyboard stays on it.
    expect(button).to_be_focused()
    assert page.url.endswith(f"#/jobs/{job['id']}")
    expect(page.locator(".job-heading .state")).to_have_text("succeeded")
    expect(page.locator("#spec")).to_be_visible()
    expect(page.locator("#job-load-error")).to_be_hidden()
    # The refusal's red line reads as well as the rest, and so does the armed button.
    assert_contrast(page)

    service.release(job["id"])
    service.wait_exited(job["id"])
    expect(button).to_be_enabled()
    button.click()
    expect(line).to_have_text(ARMED)
    expect(line).not_to_have_class(re.compile(r"\berror\b"))
    assert_contrast(page)
    button.click()
    expect(page.locator("#jobs-notice")).to_have_text(f"Job linger ({job['id']}) deleted.")
    assert service.client.get(f"/api/v1/jobs/{job['id']}").status_code == 404
    assert session.errors == []


def test_no_delete_while_the_job_runs(session: Session, service: Service) -> None:
    """A running job cannot be deleted, and its page offers no Delete job; it
    takes Cancel's place once the job has ended. Deleted elsewhere after that, the page
    (which saw the job end) says so."""
    job = service.submit(job_spec(name="runs-until-cancelled"))
    page = session.page
    open_job(page, job["id"], "running")
    expect(page.locator("#cancel-job")).to_be_visible()
    expect(page.locator("#delete-job")).to_be_hidden()
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    expect(page.locator(".job-heading .state")).to_have_text("cancelled", timeout=30_000)
    expect(page.locator("#delete-job")).to_be_visible()
    expect(page.locator("#cancel-job")).to_be_hidden()
    service.wait_exited(job["id"])
    delete_elsewhere(service, job["id"])
    expect(page.locator("#job-load-error")).to_have_text("This job was deleted.")
    assert session.errors == []


def test_job_page_says_its_job_was_deleted_elsewhere(session: Session, service: Service) -> None:
    """A job page open on an ended job that another user (or the CLI) deletes says so
    plainly, shows none of its stale numbers, gives the focus to the message when the
    control that had it is hidden, and asks the service for nothing more."""
    job = ended(service)
    page = session.page
    page.clock.install()  # before the page loads: its polls are the clock's, moved on below
    open_job(page, job["id"], "succeeded")
    expect(page.locator("#spec")).to_contain_text('"name": "quick"')
    page.locator("#delete-job").focus()
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if job["id"] in r.url else None)
    page.wait_for_timeout(500)  # the deletion watch is subscribed
    delete_elsewhere(service, job["id"])

    message = page.locator("#job-load-error")
    expect(message).to_have_text("This job was deleted.")
    expect(message).to_be_visible()
    expect(message).to_be_focused()
    for stale in ("#spec", ".stats", ".job-head", "#action-status", ".bar-large"):
        expect(page.locator(stale)).to_be_hidden()
    expect(page.get_by_role("link", name="← Jobs")).to_be_visible()  # the way back
    assert "deleted" in page.title()
    assert_contrast(page)
    seen = len(asked)
    # Longer than the page's log poll, on its clock: any poll still set fires, and its
    # request would be out well within the real 300 ms after.
    page.clock.fast_forward(LOG_POLL_MS + 500)
    page.wait_for_timeout(300)
    assert asked[seen:] == [], asked
    assert session.errors == []


def test_jobs_table_drops_a_row_deleted_elsewhere(session: Session, service: Service) -> None:
    """The table drops a row at the stream's `deleted`, without waiting for its 15 s
    re-read, and its count goes down with it."""
    kept, gone = ended(service), ended(service)
    page = session.page
    page.goto("/#/")
    rows = page.locator("#jobs-table tbody tr")
    expect(page.locator(f'tr[data-job="{gone["id"]}"]')).to_have_count(1)
    after_list_read(page)
    shown = rows.count()
    everything = total(service)
    expect(page.locator("#jobs-summary")).to_have_text(summary(shown, everything))
    reads, listener = record_list_reads(page)
    page.locator(f'tr[data-job="{gone["id"]}"] a.job-name').focus()
    delete_elsewhere(service, gone["id"])
    expect(page.locator(f'tr[data-job="{gone["id"]}"]')).to_have_count(0, timeout=5_000)
    expect(page.locator("#jobs-summary")).to_have_text(summary(shown - 1, everything - 1))
    expect(page.locator(f'tr[data-job="{kept["id"]}"]')).to_have_count(1)
    # The keyboard goes on from a row beside the one that went, not from the page's top.
    expect(page.locator("#jobs-table a.job-name:focus")).to_have_count(1)
    page.remove_listener("request", listener)
    assert reads == [], reads  # the stream said it: no re-read was needed
    assert session.errors == []


def test_deleted_jobs_keep_paging_whole(session: Session, service: Service) -> None:
    """With more jobs than a page: a shown row deleted leaves the count one less, one
    further down (not shown) is counted out too, and Show more reads on with no row twice
    and none deleted."""
    extra = [service.submit(job_spec(name=f"page-{i}")) for i in range(55)]
    for job in extra:  # each runs until cancelled, or is cancelled while still queued
        status = service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code
        assert status in (200, 202), status
    for job in extra:
        service.wait_state(job["id"], *TERMINAL)
    everything = total(service)
    assert everything >= 55
    page = session.page
    answered: list[str] = []  # the list reads the service has answered

    def on_finished(request: Request) -> None:
        if LIST_READ.search(request.url):
            answered.append(request.url)

    page.on("requestfinished", on_finished)
    page.goto("/#/")
    rows = page.locator("#jobs-table tbody tr")
    expect(rows).to_have_count(50)
    expect(page.locator("#jobs-summary")).to_have_text(f"50 of {everything} jobs")
    # The table reads the list as it opens and again as its stream opens (up to 1 s on):
    # both answered before the delete, so that only the stream says it below. A read the
    # service answered after the delete fills the page back to 50 rows, as true.
    pump_until(page, lambda: len(answered) >= 2)
    page.remove_listener("requestfinished", on_finished)
    assert len(answered) >= 2, answered

    shown_id = rows.nth(2).get_attribute("data-job")
    assert shown_id is not None
    service.wait_exited(shown_id)
    delete_elsewhere(service, shown_id)
    expect(rows).to_have_count(49)
    expect(page.locator("#jobs-summary")).to_have_text(f"49 of {everything - 1} jobs")

    oldest = service.client.get("/api/v1/jobs", params={"limit": 200}).json()["data"][-1]["id"]
    assert page.locator(f'tr[data-job="{oldest}"]').count() == 0
    service.wait_exited(oldest)
    delete_elsewhere(service, oldest)
    # Not a row here, but counted: the table reads the list again and has it right.
    expect(page.locator("#jobs-summary")).to_have_text(
        re.compile(rf"^(49|50) of {everything - 2} jobs$")
    )
    page.get_by_role("button", name="Show more").click()
    expect(rows).to_have_count(everything - 2)
    expect(page.locator("#jobs-summary")).to_have_text(summary(everything - 2, everything - 2))
    ids = [row.get_attribute("data-job") for row in rows.all()]
    assert len(set(ids)) == len(ids)
    assert shown_id not in ids and oldest not in ids
    assert session.errors == []


def test_delete_at_phone_width(browser: Browser, service: Service) -> None:
    """At a phone's width the job page's actions, Delete job among them, wrap within the
    screen, and the list's notice after a delete does too; both read at AA contrast."""
    job = ended(service)
    phone = open_session(browser, service, PHONE)
    try:
        page = phone.page
        open_job(page, job["id"], "succeeded")
        button = page.locator("#delete-job")
        expect(button).to_be_visible()
        assert no_overflow(page)
        box = button.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
        button.click()
        expect(page.locator("#action-status")).to_have_text(ARMED)
        assert no_overflow(page)
        button.click()
        notice = page.locator("#jobs-notice")
        expect(notice).to_have_text(f"Job quick ({job['id']}) deleted.")
        assert no_overflow(page)
        assert_contrast(page)
        assert phone.errors == []
    finally:
        phone.context.close()
