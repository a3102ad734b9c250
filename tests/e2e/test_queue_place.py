"""A queued job's page says its place in the queue, as `towerboard status ID` does, and
keeps it current as the jobs ahead start, end or are cancelled; the jobs table's Queued
filter lists the queued jobs in the order they start, each with its place: headless Chromium against
a real service with one job slot (CPU-only) whose worker is the harness's stand-in, which
runs until cancelled. No model is trained here, so none of it is marked slow."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

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


def slot_held(service: Service) -> dict[str, Any]:
    """A job that holds the stand-in service's one job slot, running until cancelled, so
    the jobs submitted next wait in the queue."""
    running = service.submit(job_spec(name="holds-the-slot"))
    service.wait_state(running["id"], "running")
    return running


def two_in_line(service: Service) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The job holding the slot (`slot_held`), then two queued behind it: "first-in-line"
    and "second-in-line", whose page shows a place behind another job."""
    running = slot_held(service)
    ahead = service.submit(job_spec(name="first-in-line"))
    mine = service.submit(job_spec(name="second-in-line"))
    return running, ahead, mine


def test_queued_job_page_says_its_place_until_it_starts(session: Session, service: Service) -> None:
    """The page of a queued job said only "queued". It says where the job stands, changes
    that as the job ahead is cancelled (no reload), and says nothing of the queue, and
    reads it no more, once the job has started."""
    running, ahead, mine = two_in_line(service)
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
    running = slot_held(service)
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


# The jobs table's rows, top down: each one's job id and its place ("-" for none shown).
ROWS = """() => [...document.querySelectorAll("#jobs-table tbody tr")].map((tr) => {
  const place = tr.querySelector(".queue-place");
  return `${tr.dataset.job} ${place.hidden ? "-" : place.textContent}`;
})"""


# From now on, window.rowOrders holds the rows (as ROWS gives them) after each change to
# the table's body: an order shown for a moment, and put right by a later read, is in it.
WATCH_ROWS = f"""() => {{
  const rows = {ROWS};
  window.rowOrders = [rows()];
  new MutationObserver(() => window.rowOrders.push(rows())).observe(
    document.querySelector("#jobs-table tbody"),
    {{ childList: true, subtree: true, characterData: true, attributes: true }});
}}"""


def ordinal(n: int) -> str:
    return f"{n}" + ("th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th"))


def rows_become(page: Page, *want: str, timeout: float = 20.0) -> None:
    """Wait until the table's rows are `want` ("ID PLACE"), in that order."""
    deadline = time.monotonic() + timeout
    while (rows := page.evaluate(ROWS)) != list(want):
        assert time.monotonic() < deadline, f"rows {rows}, expected {list(want)}"
        page.wait_for_timeout(100)


def test_the_queued_filter_lists_jobs_in_the_order_they_start(
    session: Session, service: Service
) -> None:
    """The Queued filter listed the queued jobs newest first: its top row was the last to
    start. Its rows are in the order they start, each with its place, and stay so as jobs
    join the queue (at its end, or ahead of those of a lower priority), leave it and start."""
    running = slot_held(service)
    first = service.submit(job_spec(name="first-in"))
    urgent = service.submit(job_spec(name="urgent", priority=5))
    second = service.submit(job_spec(name="second-in"))
    later: list[dict[str, object]] = []
    page = session.page
    try:
        page.goto("/#/?state=queued")
        rows_become(page, f"{urgent['id']} 1st", f"{first['id']} 2nd", f"{second['id']} 3rd")
        expect(page.locator("#jobs-summary")).to_have_text(
            "3 of 3 jobs queued, in the order they start"
        )
        expect(page.locator(f'tr[data-job="{urgent["id"]}"] td.col-state')).to_have_text(
            "queued1st"
        )

        # Submitted now: last in line (it went on top), and one of priority 3 ahead of
        # the jobs of priority 0. Neither is shown anywhere else, even for a moment.
        page.evaluate(WATCH_ROWS)
        later.append(last := service.submit(job_spec(name="last-in")))
        rows_become(
            page, f"{urgent['id']} 1st", f"{first['id']} 2nd", f"{second['id']} 3rd",
            f"{last['id']} 4th",
        )  # fmt: skip
        later.append(soon := service.submit(job_spec(name="soon", priority=3)))
        rows_become(
            page, f"{urgent['id']} 1st", f"{soon['id']} 2nd", f"{first['id']} 3rd",
            f"{second['id']} 4th", f"{last['id']} 5th",
        )  # fmt: skip
        shown = [[row.split()[0] for row in rows] for rows in page.evaluate("window.rowOrders")]
        assert all(
            rows[:3] == [urgent["id"], first["id"], second["id"]]
            or rows[:2] == [urgent["id"], soon["id"]]
            for rows in shown
        ), shown

        cancel(service, first)  # leaves the queue: those behind it move up
        rows_become(
            page, f"{urgent['id']} 1st", f"{soon['id']} 2nd", f"{second['id']} 3rd",
            f"{last['id']} 4th",
        )  # fmt: skip
        cancel(service, running)  # the slot frees: the first in line starts
        service.wait_state(urgent["id"], "running")
        rows_become(page, f"{soon['id']} 1st", f"{second['id']} 2nd", f"{last['id']} 3rd")

        # A search leaves jobs out: the order stays the queue's, and no place is said.
        page.fill("#jobs-search", "in")
        rows_become(page, f"{second['id']} -", f"{last['id']} -")
        # Every job, and any other filter: newest first, no place.
        page.locator('.chip[data-state=""]').click()
        # The list mounted anew for the chip (its hash change comes after the click): the
        # search cleared before that was the old list's, and the new one kept "in".
        expect(page.locator('.chip[data-state=""]')).to_have_attribute("aria-pressed", "true")
        page.fill("#jobs-search", "")
        expect(page.locator("#jobs-table tbody tr").first).to_have_attribute("data-job", soon["id"])
        expect(page.locator("#jobs-table tbody tr").first.locator(".queue-place")).to_be_hidden()
        assert session.errors == []
    finally:
        cancel(service, running, first, urgent, second, *later)


def test_a_job_that_starts_loses_its_place_before_the_list_is_read(
    session: Session, service: Service
) -> None:
    """Under the Queued filter, the job at the head of the queue starts while the list's
    reads fail (a lossy network): its row says it runs, with no place, and the one behind
    it is 1st, from the stream alone. It read "running 1st", the next "queued 2nd", until a
    read got through (the next poll, 15 s on)."""
    running = slot_held(service)
    first = service.submit(job_spec(name="first-in"))
    second = service.submit(job_spec(name="second-in"))
    page = session.page
    list_read = re.compile(r"/api/v1/jobs\?")
    try:
        page.goto("/#/?state=queued")
        rows_become(page, f"{first['id']} 1st", f"{second['id']} 2nd")
        page.route(list_read, lambda route: route.abort())
        cancel(service, running)  # the slot frees: the first in line starts
        service.wait_state(first["id"], "running")
        expect(page.locator(f'tr[data-job="{first["id"]}"] .state')).to_have_text("running")
        rows_become(page, f"{first['id']} -", f"{second['id']} 1st")
        assert session.errors == []
    finally:
        page.unroute(list_read)
        cancel(service, running, first, second)


def test_show_more_reads_on_down_the_queue(browser: Browser, tmp_path: Path) -> None:
    """Past its first page (50 rows), the Queued filter's Show more reads on in the queue's
    order, the places counting on: the API's cursor of a page of the queue."""
    from service.store import JobStore
    from trainer.spec import JobSpec

    data = tmp_path / "data"
    data.mkdir()
    store = JobStore(data / "towerboard.db")
    spec = JobSpec.model_validate(job_spec(name="holds-the-slot")).model_dump(mode="json")
    head = store.create({**spec, "priority": 2})  # starts first, runs until the service stops
    store.close()
    queue_in_bulk(data / "towerboard.db", spec, 55)  # q000000000 ... q000000054, one time
    store = JobStore(data / "towerboard.db")
    ahead = store.create({**spec, "name": "ahead", "priority": 1})  # the newest, first in line
    store.close()
    with stand_in_service(tmp_path) as service:
        service.wait_state(head.id, "running")
        session = open_session(browser, service, LAPTOP)
        try:
            page = session.page
            page.goto("/#/?state=queued")
            bulk = [f"q{n:09d}" for n in range(55)]
            order = [f"{job} {ordinal(n)}" for n, job in enumerate([ahead.id, *bulk], 1)]
            rows_become(page, *order[:50])
            expect(page.locator("#jobs-summary")).to_have_text(
                "50 of 56 jobs queued, in the order they start"
            )
            page.get_by_role("button", name="Show more").click()
            rows_become(page, *order)
            expect(page.get_by_role("button", name="Show more")).to_be_hidden()
            assert session.errors == []
        finally:
            session.context.close()
