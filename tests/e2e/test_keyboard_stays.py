"""Where the keyboard is after a button that waits for the service is pressed, in headless
Chromium against a real service whose worker is test_job_page_a11y's READER_WORKER (no model is
trained here): Show more, Cancel, Trace next 5 steps and Submit job each keep the focus,
or hand it on to what replaced them. Each was `disabled` while its request was out, which
dropped the focus to <body>: a keyboard or screen-reader user was sent back to the page's
top."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, Route, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import LIST_POLL_MS, LIST_READ, Session
from tests.e2e.test_live_values import live_job, reader_service, stop
from tests.service.harness import Service, job_spec

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)

PAGE = 50  # static/js/jobs.js's PAGE: rows a read shows before Show more


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with reader_service(tmp_path_factory) as svc:
        yield svc


def press(page: Page, selector: str) -> None:
    """Press the control with the keyboard, as a keyboard user does. A control the page
    shows only once the job's state is read (Trace next 5 steps is hidden until the job is
    read as running) cannot take the focus before then, and page.focus waits only for the
    element, not for it to be shown: focusing it early left the focus on <body> and the
    Enter went nowhere."""
    control = page.locator(selector)
    expect(control).to_be_visible()
    control.focus()
    expect(control).to_be_focused()
    page.keyboard.press("Enter")


def test_show_more_hands_the_keyboard_to_the_rows_it_brought(
    session: Session, service: Service
) -> None:
    for i in range(PAGE + 1):
        job = service.submit(job_spec(name=f"row-{i}"))
        service.client.post(f"/api/v1/jobs/{job['id']}/cancel").raise_for_status()
    page = session.page
    page.goto("/#/")
    more = page.locator("button.more")
    expect(more).to_be_visible()
    press(page, "button.more")
    expect(page.locator("#jobs-table tbody tr")).to_have_count(PAGE + 1)
    expect(more).to_be_hidden()  # every job is shown
    # The one row it brought (the oldest job): the keyboard goes on from there.
    expect(page.locator("#jobs-table tbody tr").last.locator("a.job-name")).to_be_focused()
    assert session.errors == []


def test_show_more_overlapped_by_a_poll_hands_the_keyboard_to_the_rows_it_brought(
    session: Session, service: Service
) -> None:
    """A re-read of the list (its 15 s poll, the stream reconnecting) that started while
    Show more's read was out dropped that read, and showed its rows itself: the button hid
    under the keyboard, and the focus fell to <body>. Seen with the dashboard's answers
    slowed (TOWERBOARD_SLOW_BROWSER=net); here Show more's read is held until the poll has
    answered."""
    for i in range(PAGE + 1):
        job = service.submit(job_spec(name=f"overlap-{i}"))
        service.client.post(f"/api/v1/jobs/{job['id']}/cancel").raise_for_status()
    page = session.page
    page.clock.install()  # before the page loads: its poll is the clock's, had below
    page.goto("/#/?name=overlap-")
    rows = page.locator("#jobs-table tbody tr")
    expect(rows).to_have_count(PAGE)
    more_read = re.compile(r"/api/v1/jobs\?.*cursor=")
    held: list[Route] = []
    page.route(more_read, lambda route: held.append(route))
    try:
        with page.expect_request(more_read):
            press(page, "button.more")
        with page.expect_response(
            lambda r: LIST_READ.search(r.url) is not None and "cursor=" not in r.url
        ):
            page.clock.fast_forward(LIST_POLL_MS)  # the list's poll, now
        expect(rows).to_have_count(PAGE + 1)
        expect(page.locator("button.more")).to_be_hidden()
        for route in held:
            route.continue_()  # answered late: dropped, a newer read having begun
    finally:
        page.unroute(more_read)
    expect(rows.last.locator("a.job-name")).to_be_focused()
    assert session.errors == []


def test_cancel_keeps_the_keyboard_until_the_line_says_where_the_job_stopped(
    session: Session, service: Service
) -> None:
    # Its worker stops once released, as a trainer stops after its last checkpoint: the
    # line says "Cancel requested" until then. One that stopped at once could end before a
    # slow page (TOWERBOARD_SLOW_BROWSER=cpu=8) handled the cancel's answer: the line then
    # said where the job stopped at once, the button gone, and the test saw neither.
    job = live_job(service, "stops-when-released")
    page = session.page
    page.goto(f"/#/jobs/{job['id']}")
    cancel = page.locator("#cancel-job")
    press(page, "#cancel-job")
    expect(cancel).to_have_text("Confirm cancel")
    page.keyboard.press("Enter")
    expect(page.locator("#action-status")).to_contain_text("Cancel requested")
    expect(cancel).to_be_focused()
    expect(cancel).to_be_disabled()  # aria-disabled: a third press sends nothing
    service.release(job["id"])
    # Ended, the button is hidden: the keyboard goes on from the line that says so.
    expect(page.locator("#action-status")).to_contain_text("Cancelled at step", timeout=30_000)
    expect(page.locator("#action-status")).to_be_focused()
    assert session.errors == []


def test_trace_keeps_the_keyboard(session: Session, service: Service) -> None:
    job = live_job(service, "traced-by-keyboard")
    page = session.page
    page.goto(f"/#/jobs/{job['id']}")
    press(page, "#profile-job")
    expect(page.locator("#profile-status")).to_contain_text("Tracing the next 5 steps")
    expect(page.locator("#profile-job")).to_be_focused()
    stop(service, job)
    assert session.errors == []


def test_a_refused_submit_keeps_the_keyboard(session: Session) -> None:
    page = session.page
    page.goto("/#/submit")
    page.fill("#spec", '{"name": "no-model"}')
    press(page, "#submit-job")
    expect(page.locator("#form-errors")).to_contain_text("The service rejected this spec")
    expect(page.locator("#submit-job")).to_be_focused()
    expect(page.locator("#submit-job")).to_have_text("Submit job")
    assert session.errors == []
