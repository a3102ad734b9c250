"""A queued or running job's page changes its priority (PATCH /api/v1/jobs/{id}) from the
keyboard, beside its place in the queue, which follows; a refusal is said under it; and
the jobs table's Queued filter re-orders live when a job's priority changes elsewhere:
headless Chromium against a real service with one job slot (CPU-only) whose worker is the
harness's stand-in, which runs until cancelled. No model is trained: not slow."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import Session
from tests.e2e.test_jobs_table_live import cancel
from tests.e2e.test_queue_place import rows_become, two_in_line
from tests.service.harness import Service, stand_in_service

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(tmp_path_factory.mktemp("stand-in")) as svc:
        yield svc


def test_a_jobs_priority_is_changed_on_its_page_and_the_queue_follows(
    session: Session, service: Service
) -> None:
    running, ahead, mine = two_in_line(service)
    page = session.page
    try:
        page.goto(f"/#/jobs/{mine['id']}")
        place = page.locator("#queue-place")
        expect(place).to_have_text("2nd of 2 in the queue (1 job ahead)")
        field = page.locator("#job-priority")
        expect(field).to_have_value("0")
        status = page.locator("#priority-status")

        # From the keyboard alone: Tab from the page's top reaches the field, an arrow key
        # steps it, Enter sends it.
        page.locator("h1.job-title").focus()
        for _ in range(20):
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.id") == "job-priority":
                break
        assert page.evaluate("document.activeElement.id") == "job-priority"
        page.keyboard.press("ArrowUp")
        page.keyboard.press("ArrowUp")
        expect(field).to_have_value("2")
        page.keyboard.press("Enter")
        expect(status).to_have_text(
            "Priority set to 2: it moved in the queue, placed among the jobs of that priority "
            "by when it joined the queue."
        )
        expect(place).to_have_text("Next to start: it waits for 1 job slot; 0 free")
        expect(page.locator(".meta")).to_contain_text("priority 2")
        expect(page.locator("#spec")).to_contain_text('"priority": 2')
        assert service.job(mine["id"])["priority"] == 2
        assert page.evaluate("document.activeElement.id") == "job-priority"  # kept

        # Refused: the service's reason under it, the field marked, nothing changed.
        field.fill("1001")
        page.keyboard.press("Enter")
        expect(status).to_have_text(
            "Not changed: Input should be less than or equal to 1000. Received: 1001"
        )
        expect(field).to_have_attribute("aria-invalid", "true")
        assert service.job(mine["id"])["priority"] == 2
        page.keyboard.press("Escape")  # the job's own back
        expect(field).to_have_value("2")

        # The Queued filter re-orders as a priority changes elsewhere (the CLI, say).
        page.goto("/#/?state=queued")
        rows_become(page, f"{mine['id']} 1st", f"{ahead['id']} 2nd")
        page.wait_for_timeout(1500)  # the read its stream's opening asks for is done
        changed = service.client.patch(f"/api/v1/jobs/{ahead['id']}", json={"priority": 5})
        assert changed.status_code == 200, changed.text
        # Within seconds: not by the list's 15 s poll.
        rows_become(page, f"{ahead['id']} 1st", f"{mine['id']} 2nd", timeout=5)

        # A running job's page has it too; an ended job's has none.
        page.goto(f"/#/jobs/{running['id']}")
        expect(page.locator("#job-priority")).to_have_value("0")
        page.locator("#job-priority").fill("-3")
        page.locator("#set-priority").click()
        expect(page.locator("#priority-status")).to_have_text(
            "Priority set to -3: the job runs on, and the new priority counts if it is "
            "requeued or resumed."
        )
        cancel(service, running)
        expect(page.locator(".job-heading .state")).to_have_text("cancelled")
        expect(page.locator("#priority-form")).to_be_hidden()
        assert session.errors == []
    finally:
        cancel(service, running, ahead, mine)
