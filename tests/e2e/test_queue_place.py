"""A queued job's page says its place in the queue, as `towerboard status ID` does, and
keeps it current as the jobs ahead start, end or are cancelled: headless Chromium against
a real service with one job slot (CPU-only) whose worker is the harness's stand-in, which
runs until cancelled. No model is trained here, so none of it is marked slow."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import LAPTOP, Session, open_session
from tests.e2e.test_dashboard_details import IN_LIVE_REGION
from tests.e2e.test_jobs_table_live import cancel, record
from tests.service.harness import Service, job_spec, queue_in_bulk, stand_in_service

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)

QUEUE_READ = re.compile(r"/api/v1/queue\?limit=1000$")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(tmp_path_factory.mktemp("stand-in")) as svc:
        yield svc


def test_queued_job_page_says_its_place_until_it_starts(session: Session, service: Service) -> None:
    """The page of a queued job said only "queued". It says where the job stands, changes
    that as the job ahead is cancelled (no reload), and says nothing of the queue, and
    reads it no more, once the job has started."""
    running = service.submit(job_spec(name="holds-the-slot"))  # runs until cancelled
    service.wait_state(running["id"], "running")
    ahead = service.submit(job_spec(name="first-in-line"))
    mine = service.submit(job_spec(name="second-in-line"))
    page = session.page
    try:
        page.goto(f"/#/jobs/{mine['id']}")
        expect(page.locator(".job-heading .state")).to_have_text("queued")
        place = page.locator("#queue-place")
        expect(place).to_have_text("2nd of 2 in the queue (1 job ahead)")
        expect(place).to_be_visible()
        # It changes with other people's jobs: a live region would read each change out.
        assert page.evaluate(IN_LIVE_REGION, "#queue-place") == []

        cancel(service, ahead)  # cancelled elsewhere: the all-jobs stream says so
        expect(place).to_have_text("Next to start: it waits for 1 job slot; 0 free")

        cancel(service, running)  # its slot frees: this job starts
        expect(page.locator(".job-heading .state")).to_have_text("running")
        expect(place).to_be_hidden()
        reads = record(page, QUEUE_READ)
        other = service.submit(job_spec(name="queued-behind-it"))  # a state change: no read
        cancel(service, other)
        page.wait_for_timeout(1500)  # the page reads the queue within 1 s of a change
        assert reads == []
        expect(place).to_be_hidden()
        assert session.errors == []
    finally:
        cancel(service, running, ahead, mine)


def test_a_failed_queue_read_hides_the_place(session: Session, service: Service) -> None:
    """A read of the queue that fails hides the line (a place from before may be wrong by
    now) and says nothing else; the next read that succeeds shows it again."""
    running = service.submit(job_spec(name="holds-the-slot"))
    service.wait_state(running["id"], "running")
    mine = service.submit(job_spec(name="waits"))
    page = session.page
    try:
        page.goto(f"/#/jobs/{mine['id']}")
        place = page.locator("#queue-place")
        expect(place).to_have_text("Next to start: it waits for 1 job slot; 0 free")
        page.route(QUEUE_READ, lambda route: route.fulfill(status=503, json={"detail": "down"}))
        behind = service.submit(job_spec(name="behind"))  # a state change: a read, refused
        expect(place).to_be_hidden()
        expect(page.locator(".job-heading .state")).to_have_text("queued")
        page.unroute(QUEUE_READ)
        cancel(service, behind)  # another change: read again, and answered
        expect(place).to_have_text("Next to start: it waits for 1 job slot; 0 free")
        assert session.errors == []
    finally:
        page.unroute(QUEUE_READ)
        cancel(service, running, mine)


def test_a_job_past_the_first_1000_says_so(browser: Browser, tmp_path: Path) -> None:
    """The queue is read 1,000 jobs at most (the API's largest page): a job further back
    is said to be after those, of how many, as `towerboard status ID` says it."""
    from service.store import JobStore
    from trainer.spec import JobSpec

    data = tmp_path / "data"
    data.mkdir()
    store = JobStore(data / "towerboard.db")
    spec = JobSpec.model_validate(job_spec(name="holds-the-slot")).model_dump(mode="json")
    head = store.create({**spec, "priority": 2})  # starts first, runs until the service stops
    last = store.create({**spec, "name": "last", "priority": 0})
    store.close()
    queue_in_bulk(data / "towerboard.db", spec, 1000, priority=1)
    with stand_in_service(tmp_path) as service:
        service.wait_state(head.id, "running")  # 1,001 queued from now on
        session = open_session(browser, service, LAPTOP)
        try:
            page = session.page
            page.goto(f"/#/jobs/{last.id}")
            expect(page.locator("#queue-place")).to_have_text(
                "after the first 1000 of 1001 in the queue"
            )
            assert session.errors == []
        finally:
            session.context.close()
