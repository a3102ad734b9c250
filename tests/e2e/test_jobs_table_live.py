"""The jobs table and the devices panel as they update live, in headless Chromium against
a real service whose worker is the harness's stand-in (it runs until cancelled, or ends
at once for a job named `quick`): a keyboard user keeps their place through every poll
and update, and a queue's churn reads nothing that could not have changed."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Request, Route, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import (
    DEVICES_POLL_MS,
    LAPTOP,
    LIST_POLL_MS,
    LIST_READ,
    Session,
    list_read_now,
    open_session,
)
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


# The jobs list is drawn (its rows, then its summary line, "3 of 3 jobs") at each read's
# answer, and the line is written then whether or not its words change: from now on,
# window.listDraws counts those writes. A count that has gone up says that a read has been
# shown, where a fixed wait passed as well when the page had not yet drawn it.
WATCH_LIST_DRAWS = """() => {
  window.listDraws = 0;
  new MutationObserver(() => { window.listDraws += 1; }).observe(
    document.getElementById("jobs-summary"), { childList: true, characterData: true });
}"""
LIST_DRAWN = "() => window.listDraws > 0"


def list_read_now_and_shown(page: Page) -> None:
    """Have the table's next poll now (list_read_now) and wait until its answer is shown."""
    page.evaluate(WATCH_LIST_DRAWS)
    list_read_now(page)
    page.wait_for_function(LIST_DRAWN)


DEVICES_READ = re.compile(r"/api/v1/devices$")


def devices_read_now(page: Page, towers: int) -> None:
    """Have the devices panel's next poll now, and wait until its answer is shown. A poll
    whose devices have not changed changes nothing in the panel, by design; so its answer
    is the service's own with `max_towers` made `towers`, and the panel's note saying
    "up to `towers` towers a job" is the sign that it has been shown."""

    def answer(route: Route) -> None:
        response = route.fetch()
        route.fulfill(response=response, json={**response.json(), "max_towers": towers})

    page.route(DEVICES_READ, answer)
    try:
        with page.expect_response(lambda r: DEVICES_READ.search(r.url) is not None):
            page.clock.fast_forward(DEVICES_POLL_MS)
        expect(page.locator("#devices-note")).to_have_text(
            re.compile(rf"\bup to {towers} towers a job$")
        )
    finally:
        page.unroute(DEVICES_READ, answer)


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

    list_read_now_and_shown(page)
    assert page.evaluate(SAME_FOCUS), "the table's poll took the focus"
    newer = service.submit(job_spec(name="newcomer"))
    expect(page.locator("#jobs-table tbody tr").first).to_have_attribute("data-job", newer["id"])
    assert page.evaluate(SAME_FOCUS), "a new job's row took the focus"
    service.client.post(f"/api/v1/jobs/{waiting['id']}/cancel").raise_for_status()
    expect(page.locator(f'tr[data-job="{waiting["id"]}"] .state')).to_have_text("cancelled")
    assert page.evaluate(SAME_FOCUS), "a state change took the focus"
    expect(link).to_be_focused()

    device = page.locator('.device[data-device="cpu:0"] a')
    expect(device).to_have_attribute("href", f"#/jobs/{running['id']}")
    device.focus()
    page.evaluate(NOTE_FOCUS)
    for towers in (97, 98):  # two polls, each answer shown
        devices_read_now(page, towers)
        assert page.evaluate(SAME_FOCUS), "the devices poll took the focus"
    expect(device).to_be_focused()
    for job in (newer, running):
        service.client.post(f"/api/v1/jobs/{job['id']}/cancel").raise_for_status()
        service.wait_state(job["id"], "cancelled")
    assert clocked.errors == []


DEVICES_GAP_MS = 1_000  # static/js/app.js's DEVICES_GAP_MS


def pause_after_a_poll(page: Page) -> None:
    """Stop the page's clock (its clock installed before it loaded) after its next list
    read: from then on no timer of the page fires until the test moves the clock on, so
    every request it makes meanwhile was made by an event. Returns once the read's answer
    is shown (the requests of the other timers that the jump fired have gone out before)."""
    now = page.evaluate("Date.now()")
    page.evaluate(WATCH_LIST_DRAWS)
    with page.expect_response(lambda r: LIST_READ.search(r.url) is not None):
        page.clock.pause_at(now + LIST_POLL_MS + 1_000)
    page.wait_for_function(LIST_DRAWN)


def record(page: Page, pattern: re.Pattern[str]) -> list[str]:
    urls: list[str] = []

    def on_request(request: Request) -> None:
        if pattern.search(request.url):
            urls.append(request.url)

    page.on("request", on_request)
    return urls


def cancel(service: Service, *jobs: dict[str, object]) -> None:
    for job in jobs:
        status = service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code
        assert status in (200, 202, 409), status  # 409: it had ended
    for job in jobs:
        service.wait_state(str(job["id"]), "succeeded", "failed", "cancelled")


def test_state_changes_below_the_rows_shown_read_nothing(
    clocked: Session, service: Service
) -> None:
    """A job below the rows shown that starts, ends or is cancelled changes nothing shown,
    nor the count, in the unfiltered list: no list read for it (each such event re-read
    the whole list, 50 rows, while a queue drained). A job submitted elsewhere still comes
    on top, and a filtered list still takes in an older job that enters its filter."""
    jobs = [service.submit(job_spec(name=f"backlog-{i}")) for i in range(53)]  # one runs
    service.wait_state(jobs[0]["id"], "running")
    newcomer: dict[str, object] = {}
    try:
        page = clocked.page
        page.goto("/#/")
        rows = page.locator("#jobs-table tbody tr")
        expect(rows).to_have_count(50)
        below = page.locator(f'tr[data-job="{jobs[0]["id"]}"]')
        expect(below).to_have_count(0)
        pause_after_a_poll(page)
        summary = page.locator("#jobs-summary").inner_text()
        reads = record(page, LIST_READ)

        # The running job below the rows ends and the next (also below) starts; a queued
        # one below is cancelled.
        cancel(service, jobs[0], jobs[2])
        service.wait_state(jobs[1]["id"], "running")
        newcomer = service.submit(job_spec(name="newcomer-on-top"))
        # Events come in order: once the newcomer is shown, the others have been seen.
        expect(rows.first).to_have_attribute("data-job", str(newcomer["id"]))
        page.clock.fast_forward(2 * DEVICES_GAP_MS)  # any re-read asked for is due
        page.wait_for_timeout(500)
        assert reads == [], f"state changes below the rows shown re-read the list: {reads}"
        expect(rows).to_have_count(51)
        total = int(re.sub(r"\D+", " ", summary).split()[1]) + 1
        expect(page.locator("#jobs-summary")).to_have_text(f"51 of {total} jobs")

        # Filtered: an older job that enters the filter is read into its place.
        page.goto("/#/?state=cancelled")
        expect(page.locator(f'tr[data-job="{jobs[0]["id"]}"]')).to_be_visible()
        cancel(service, jobs[3])
        page.clock.fast_forward(2 * DEVICES_GAP_MS)
        expect(page.locator(f'tr[data-job="{jobs[3]["id"]}"]')).to_be_visible()
        assert clocked.errors == []
    finally:
        # A failure before the newcomer was submitted is not hidden by its name unbound.
        cancel(service, *jobs, *([newcomer] if newcomer else []))


def test_a_filtered_count_takes_in_a_job_entering_below_the_rows_shown(
    clocked: Session, service: Service
) -> None:
    """A job that enters the filter below the rows shown is counted at once (the list is
    read again, as for one entering among them): the count said one too few until the
    next 15 s poll. The page's clock stands still but for the second or two a re-read
    waits, so no poll comes meanwhile."""
    holder = service.submit(job_spec(name="holds-the-device"))  # runs: the rest wait
    service.wait_state(holder["id"], "running")
    older = service.submit(job_spec(name="enters-below"))  # queued, below the rows to be
    newer = [service.submit(job_spec(name=f"cancelled-{i}")) for i in range(51)]
    cancel(service, *newer)  # queued, so cancelled at once
    late: dict[str, object] = {}
    try:
        page = clocked.page
        page.goto("/#/?state=cancelled")
        rows = page.locator("#jobs-table tbody tr")
        expect(rows).to_have_count(50)
        expect(page.get_by_role("button", name="Show more")).to_be_visible()
        pause_after_a_poll(page)
        summary = page.locator("#jobs-summary")
        before = int(re.sub(r"\D+", " ", summary.inner_text()).split()[1])

        cancel(service, older)  # enters the filter, older than every row shown
        late = service.submit(job_spec(name="comes-on-top"))
        cancel(service, late)
        # Events come in order: once the later job is on top, the older one's was had.
        expect(rows.first).to_have_attribute("data-job", str(late["id"]))
        page.clock.fast_forward(2 * DEVICES_GAP_MS)  # any re-read asked for is due
        expect(summary).to_have_text(f"50 of {before + 2} jobs cancelled")
        expect(page.locator(f'tr[data-job="{older["id"]}"]')).to_have_count(0)
        assert clocked.errors == []
    finally:
        cancel(service, holder, older, *([late] if late else []))


def test_a_queue_draining_reads_the_devices_once_a_second(
    clocked: Session, service: Service
) -> None:
    """Quick jobs starting and ending one after another read the devices once for the
    burst, not once per state event (9 reads a second with 120 such jobs), and a queued
    job's events none."""
    page = clocked.page
    page.goto("/#/")
    expect(page.locator('.device[data-device="cpu:0"]')).to_contain_text("free")
    pause_after_a_poll(page)
    reads = record(page, DEVICES_READ)
    quick = [service.submit(job_spec(name="quick")) for _ in range(8)]
    for job in quick:
        service.wait_state(job["id"], "succeeded")
    # Every row shows its job's end: the page has had, and handled, each start and end
    # (each asks for a devices read then and there, in the handler that changes the row).
    for job in quick:
        expect(page.locator(f'tr[data-job="{job["id"]}"] .state')).to_have_text("succeeded")
    # Time stands still in the page: every read asked for waits in one timer.
    assert reads == [], f"{len(reads)} devices reads for {len(quick)} jobs' starts and ends"
    with page.expect_request(lambda r: DEVICES_READ.search(r.url) is not None):
        page.clock.fast_forward(DEVICES_GAP_MS)
    page.wait_for_timeout(500)
    assert len(reads) == 1, reads
    assert clocked.errors == []


# `python -m reason_worker run --job-dir DIR`: fails at once, saying why as the trainer
# does, with `quoted` names.
REASON = "Expected labels `y` >= 0. Received: a label of -1 in `data/train.npz`."
REASON_WORKER = f"""\
import json, sys
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
result = {{"outcome": "failed", "message": {REASON!r}}}
(job_dir / "result.json").write_text(json.dumps(result))
sys.exit(1)
"""


def test_a_failure_reason_shows_its_names_as_code(browser: Browser, tmp_path: Path) -> None:
    """The table's reason shows its `quoted` names as code, as the job's page and the
    submit form do: it showed the backticks."""
    with stand_in_service(tmp_path, ("reason_worker", REASON_WORKER)) as failing:
        job = failing.submit(job_spec(name="bad-labels"))
        assert failing.wait_state(job["id"], "failed")["error"]["reason"] == REASON
        session = open_session(browser, failing, LAPTOP)
        try:
            page = session.page
            page.goto("/#/")
            why = page.locator(f'tr[data-job="{job["id"]}"] .job-reason')
            plain = REASON.replace("`", "")
            expect(why).to_have_text(plain)
            expect(why.locator("code")).to_have_text(["y", "data/train.npz"])
            expect(why).to_have_attribute("title", plain)
            assert session.errors == []
        finally:
            session.context.close()


def test_each_progress_bar_is_named_by_its_job(session: Session, service: Service) -> None:
    """Every row's progress bar was named "Progress": a screen reader's list of them could
    not tell the jobs apart."""
    jobs = [service.submit(job_spec(name=name)) for name in ("first-bar", "second-bar")]
    try:
        page = session.page
        page.goto("/#/")
        for job in jobs:
            bar = page.get_by_role("progressbar", name=f"Progress of {job['name']}", exact=True)
            expect(bar).to_have_count(1)
            expect(
                page.locator(f'tr[data-job="{job["id"]}"] [role="progressbar"]')
            ).to_have_attribute("aria-label", f"Progress of {job['name']}")
        assert session.errors == []
    finally:
        cancel(service, *jobs)


def test_a_rows_accuracy_is_its_evals_once_it_has_one(session: Session, service: Service) -> None:
    """A row's accuracy was its last training batch's, which read as the model's (98.4% for
    a job whose eval said 94.9%): it is the latest eval's once the job has one, marked
    "eval", live and on a fresh read alike; before that the batch's, marked "train"."""
    job = service.submit(job_spec(name="evaluates"))
    try:
        page = session.page
        page.goto("/#/")
        row = page.locator(f'tr[data-job="{job["id"]}"]')
        accuracy = row.locator(".col-accuracy")
        expect(accuracy.locator(".value")).to_have_text("98.4%")
        expect(accuracy.locator(".kind")).to_have_text("train")
        expect(row.locator(".col-loss .value")).to_have_text("0.05")
        expect(row.locator(".col-loss .kind")).to_have_text("train")
        service.release(job["id"])
        said = (
            "Eval accuracy at step 2 on 1,280 held-out examples; the last training batch's: 98.4%"
        )
        for shown in ("live", "read anew"):
            if shown == "read anew":
                page.reload()
            expect(accuracy.locator(".value")).to_have_text("94.9%")
            expect(accuracy.locator(".kind")).to_have_text("eval")
            expect(accuracy).to_have_attribute("title", said)
            expect(row.locator(".col-loss .kind")).to_have_text("train")
        header = page.locator("th.col-accuracy")
        expect(header).to_have_attribute(
            "title", re.compile(r"^The accuracy of the job's latest eval")
        )
        assert session.errors == []
    finally:
        cancel(service, job)
