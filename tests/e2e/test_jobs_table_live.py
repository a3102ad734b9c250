"""The jobs table and the devices panel as they update live, in headless Chromium against
a real service whose worker is the harness's stand-in (it runs until cancelled, or ends
at once for a job named `quick`): a keyboard user keeps their place through every poll
and update."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import DEVICES_POLL_MS, LAPTOP, Session, list_read_now, open_session
from tests.service.harness import Service, job_spec, stand_in_service

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)

# The focused element, noted in the page, is the one focused now: the same node, still in
# the document (a row or item made anew for the same job would be another node).
NOTE_FOCUS = "window.focusedBefore = document.activeElement"
SAME_FOCUS = "document.activeElement === window.focusedBefore && document.activeElement.isConnected"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(tmp_path_factory.mktemp("stand-in")) as svc:
        yield svc


@pytest.fixture
def clocked(browser: Browser, service: Service) -> Iterator[Session]:
    """A page of its own whose clock a test moves on to have a poll now."""
    session = open_session(browser, service, LAPTOP)
    session.page.clock.install()  # before the page loads: its timers are the clock's
    yield session
    session.context.close()


def devices_read_now(page: Page) -> None:
    """Have the devices panel's next poll now, and give the page a moment to show it."""
    with page.expect_response(lambda r: r.url.endswith("/api/v1/devices")):
        page.clock.fast_forward(DEVICES_POLL_MS)
    page.wait_for_timeout(300)


def test_keyboard_focus_stays_through_polls_and_updates(clocked: Session, service: Service) -> None:
    """A job's link focused in the table stays focused through the table's 15 s poll, a
    new job on top and a state change; one in the devices panel through its 5 s poll. Each
    re-drew every row or item, and the focus fell to <body> (a screen reader lost its
    place) within seconds."""
    running = service.submit(job_spec(name="holds-a-device"))  # runs until cancelled
    service.wait_reported(running["id"])
    waiting = service.submit(job_spec(name="waits-its-turn"))  # one job at a time: queued
    page = clocked.page
    page.goto("/#/")
    link = page.locator(f'tr[data-job="{running["id"]}"] a.job-name')
    expect(link).to_be_visible()
    link.focus()
    page.evaluate(NOTE_FOCUS)

    list_read_now(page)
    page.wait_for_timeout(300)
    assert page.evaluate(SAME_FOCUS), "the table's poll took the focus"
    newer = service.submit(job_spec(name="newcomer"))
    expect(page.locator("#jobs-table tbody tr").first).to_have_attribute("data-job", newer["id"])
    assert page.evaluate(SAME_FOCUS), "a new job's row took the focus"
    service.client.post(f"/api/v1/jobs/{waiting['id']}/cancel").raise_for_status()
    expect(page.locator(f'tr[data-job="{waiting["id"]}"] .state')).to_have_text("cancelled")
    assert page.evaluate(SAME_FOCUS), "a state change took the focus"
    expect(link).to_be_focused()

    device = page.locator('.device[data-device="cpu:0"] a')
    expect(device).to_have_text(running["id"])
    device.focus()
    page.evaluate(NOTE_FOCUS)
    devices_read_now(page)
    devices_read_now(page)
    assert page.evaluate(SAME_FOCUS), "the devices poll took the focus"
    expect(device).to_be_focused()
    service.client.post(f"/api/v1/jobs/{running['id']}/cancel").raise_for_status()
    service.wait_state(running["id"], "cancelled")
    assert clocked.errors == []
