"""The dashboard as a person uses it, in headless Chromium against a real service: submit
through the form, watch the job run to success, download a checkpoint, open TensorBoard
through the proxy, read a 422, act on a job with no metrics yet, page through many jobs,
lose the event stream to a changed token, on a phone too."""

from __future__ import annotations

import io
import json
import re
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Request, ViewportSize, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.slow import slow_down
from tests.service.harness import (
    Service,
    fake_worker_env,
    job_spec,
    long_job,
    processes_under,
    wait_catching_sigterm,
)

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)]

# Trains on two towers for a few seconds once TensorFlow has loaded: the worker reports
# progress every 2 s, evaluates and checkpoints every 500 steps, so the bar and the charts
# move; the device trace of step 5 gives each tower's step time.
MOVING_JOB = job_spec(
    name="dashboard-mlp",
    towers=2,
    steps=1500,
    eval={"every_steps": 500, "batches": 2},
    summaries={"trace_steps": [5]},
    checkpoint={"every_steps": 500, "every_seconds": 0, "keep": 3},
)
LAPTOP: ViewportSize = {"width": 1280, "height": 860}
PHONE: ViewportSize = {"width": 390, "height": 844}
TERMINAL = ("succeeded", "failed", "cancelled")
LIST_READ = re.compile(r"/api/v1/jobs\?")  # the jobs table's list reads (and "Show more")


@dataclass
class Session:
    context: BrowserContext
    page: Page
    errors: list[str] = field(default_factory=list)


def open_session(
    browser: Browser, service: Service, viewport: ViewportSize, *, touch: bool = False
) -> Session:
    """A page of its own at `viewport`; with `touch`, a touch screen's (`has_touch`)."""
    context = browser.new_context(
        viewport=viewport, base_url=service.base_url, accept_downloads=True, has_touch=touch
    )
    context.set_default_timeout(30_000)
    slow_down(context)  # TOWERBOARD_SLOW_BROWSER: off unless asked for
    session = Session(context, context.new_page())
    # Uncaught exceptions in the page's scripts: none is acceptable.
    context.on("page", lambda page: page.on("pageerror", lambda e: session.errors.append(str(e))))
    session.page.on("pageerror", lambda error: session.errors.append(str(error)))
    return session


@pytest.fixture(scope="module")
def session(browser: Browser, service: Service) -> Iterator[Session]:
    session = open_session(browser, service, LAPTOP)
    yield session
    session.context.close()


@pytest.fixture
def clocked(browser: Browser, service: Service) -> Iterator[Session]:
    """A page of its own whose clock a test can move on (`page.clock.fast_forward`) to
    have a poll now instead of waiting seconds for it; otherwise its clock runs as the real
    one does."""
    session = open_session(browser, service, LAPTOP)
    session.page.clock.install()  # before the page loads: its timers are the clock's
    yield session
    session.context.close()


def record_list_reads(page: Page) -> tuple[list[str], Callable[[Request], None]]:
    """The URLs of the jobs table's list reads from now on, and the listener to remove."""
    reads: list[str] = []

    def on_request(request: Request) -> None:
        if LIST_READ.search(request.url):
            reads.append(request.url)

    page.on("request", on_request)
    return reads, on_request


def after_list_read(page: Page) -> None:
    """Wait for the table's next list read: its next poll is then 15 s away."""
    with page.expect_response(lambda r: LIST_READ.search(r.url) is not None, timeout=30_000):
        pass


LIST_POLL_MS = 15_000  # static/js/jobs.js's POLL_MS
DEVICES_POLL_MS = 5_000  # static/js/app.js's DEVICES_POLL_MS
LOG_POLL_MS = 3_000  # static/js/job.js's LOG_POLL_MS


def list_read_now(page: Page) -> None:
    """Have the table's next list read now, and wait for it: its next poll is then 15 s of
    the page's time away. The page's clock jumps a poll's interval ahead to fire it, so it
    must have been installed (`page.clock.install()`) before the page loaded (waiting
    for the poll as after_list_read does took up to 15 s)."""
    with page.expect_response(lambda r: LIST_READ.search(r.url) is not None, timeout=30_000):
        page.clock.fast_forward(LIST_POLL_MS)


def no_overflow(page: Page) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"))


@dataclass
class Sample:
    state: str
    percent: float | None
    loss_points: int


def compact(samples: list[Sample]) -> list[Sample]:
    """The samples where something changed, for a readable failure."""
    return [s for i, s in enumerate(samples) if i == 0 or s != samples[i - 1]]


# Records, in the page, every change of the job page's state badge, progress bar and
# loss-chart point count into window.jobPageSamples: nothing is missed between polls.
WATCH_JOB_PAGE = """() => {
  const samples = [];
  const take = () => {
    const value = document.querySelector(".bar-large")?.getAttribute("aria-valuenow");
    const sample = {
      state: document.querySelector(".job-heading .state")?.textContent ?? "",
      percent: value === null || value === undefined ? null : Number(value),
      loss_points: Number(document.querySelector('figure[data-chart="loss"]')?.dataset.points || 0),
    };
    const last = samples[samples.length - 1];
    if (!last || last.state !== sample.state || last.percent !== sample.percent ||
        last.loss_points !== sample.loss_points) samples.push(sample);
  };
  take();
  window.jobPageSamples = samples;
  new MutationObserver(take).observe(document.getElementById("view"),
    { subtree: true, childList: true, attributes: true, characterData: true });
}"""
PAGE_STATE = "document.querySelector('.job-heading .state')?.textContent"
ENDED = f"() => {list(TERMINAL)}.includes({PAGE_STATE})"
RUNNING_PAST_40_OR_ENDED = (
    f"() => {list(TERMINAL)}.includes({PAGE_STATE}) || ({PAGE_STATE} === 'running' && "
    "Number(document.querySelector('.bar-large').getAttribute('aria-valuenow')) >= 40)"
)


def page_samples(page: Page) -> list[Sample]:
    return [Sample(**sample) for sample in page.evaluate("window.jobPageSamples")]


@pytest.fixture(scope="module")
def submitted(session: Session, service: Service, screenshots: Path) -> dict[str, Any]:
    """MOVING_JOB submitted through the form and watched on its page until it ends."""
    page = session.page
    page.goto("/")
    page.get_by_role("link", name="New job").click()
    expect(page.locator("#spec")).to_be_visible()
    page.select_option("#preset", "smoke")
    page.fill("#spec", json.dumps(MOVING_JOB, indent=2))
    page.click("#submit-job")
    page.wait_for_url(re.compile(r"#/jobs/[a-z0-9]+$"))
    job_id = page.url.rsplit("/", 1)[1]
    page.evaluate(WATCH_JOB_PAGE)

    try:
        page.wait_for_function(RUNNING_PAST_40_OR_ENDED, timeout=180_000)
        if page.evaluate(PAGE_STATE) == "running":
            page.screenshot(path=screenshots / "dashboard-job-running.png")
        page.wait_for_function(ENDED, timeout=180_000)
    except PlaywrightTimeoutError:
        pytest.fail(
            f"job {job_id} did not end on its page within 180 s; the service says "
            f"{service.job(job_id)['state']!r}; the page showed {page_samples(page)}"
        )
    samples = page_samples(page)
    # The last reports (final metrics, checkpoints) arrive right after the state.
    expect(page.locator('a.download[data-step="1500"]')).to_be_visible()
    expect(page.locator("#log")).not_to_be_empty()
    page.wait_for_timeout(500)
    page.screenshot(path=screenshots / "dashboard-job.png")
    return {"id": job_id, "samples": samples, "job": service.job(job_id)}


def test_submit_job_through_form_until_succeeded(
    session: Session, submitted: dict[str, Any]
) -> None:
    page = session.page
    assert submitted["job"]["state"] == "succeeded", submitted["job"]
    assert submitted["job"]["spec"]["steps"] == 1500
    expect(page.locator(".job-heading .state")).to_have_text("succeeded")
    expect(page.locator(".bar-large")).to_have_attribute("aria-valuenow", "100.0")
    expect(page.locator("#job-progress-text")).to_contain_text("1500 / 1500")
    expect(page.locator('[data-stat="eval_accuracy"]')).to_have_text(
        re.compile(r"^\d+\.\d% on [\d,]+ examples$")  # over how many examples
    )
    expect(page.locator("#spec")).to_contain_text('"steps": 1500')
    expect(page.locator("#cancel-job")).to_be_hidden()
    # Its devices were freed when it ended: the card says what it ran on, not what it holds.
    expect(page.locator('[data-stat="devices"]')).to_have_text("ran on cpu:0")
    # What it trained on, as its worker loaded it (it was in the log alone).
    expect(page.locator('[data-stat="data"]')).to_have_text(
        "205 train · 51 eval · 4 classes · 8×8×1"
    )
    expect(page.locator(".job-error")).to_be_hidden()
    expect(page.locator(".live-notice")).to_be_hidden()
    towers = page.locator("#towers .tower")
    expect(towers).to_have_count(2)
    expect(towers.nth(1)).to_contain_text(re.compile(r"tower 1\s*[\d.]+ ms"))
    assert session.errors == []


def test_progress_bar_moves_while_running(submitted: dict[str, Any]) -> None:
    running = [s.percent for s in submitted["samples"] if s.state == "running" and s.percent]
    assert any(0 < p < 100 for p in running), compact(submitted["samples"])
    assert running == sorted(running)
    assert len(set(running)) >= 2, running


def test_charts_grow_while_running(session: Session, submitted: dict[str, Any]) -> None:
    while_running = [s.loss_points for s in submitted["samples"] if s.state == "running"]
    assert len({n for n in while_running if n > 0}) >= 2, compact(submitted["samples"])
    loss = session.page.locator('figure[data-chart="loss"]')
    # Three evals (every 500 steps) on both eval series, beside the train reports: waited
    # for, as the last eval may be drawn after the state that ended the job.
    accuracy = session.page.locator('figure[data-chart="accuracy"]')
    expect(loss).to_have_attribute("data-points-eval_loss", "3")
    expect(accuracy).to_have_attribute("data-points-eval_accuracy", "3")
    two_or_more = re.compile(r"^([2-9]|[1-9]\d+)$")
    expect(loss).to_have_attribute("data-points-loss", two_or_more)
    expect(accuracy).to_have_attribute("data-points-accuracy", two_or_more)
    final = int(loss.get_attribute("data-points") or 0)
    assert final >= max(while_running)
    for chart in ("loss", "accuracy", "examples/s"):
        expect(session.page.locator(f'figure[data-chart="{chart}"] canvas')).to_be_visible()


def test_download_checkpoint(session: Session, submitted: dict[str, Any]) -> None:
    page = session.page
    job_id = submitted["id"]
    links = page.locator("a.download")
    expect(links).to_have_count(3)  # keep: 3
    with page.expect_download() as download_info:
        page.locator('a.download[data-step="1500"]').click()
    download = download_info.value
    assert download.suggested_filename == f"{job_id}-ckpt-1500.tar.gz"
    with tarfile.open(fileobj=io.BytesIO(Path(download.path()).read_bytes()), mode="r:gz") as tar:
        names = set(tar.getnames())
        spec = json.loads(tar.extractfile("spec.json").read())  # type: ignore[union-attr]
    assert {"ckpt-1500.index", "checkpoint", "spec.json"} <= names
    assert spec["name"] == "dashboard-mlp"


def test_download_model(session: Session, submitted: dict[str, Any]) -> None:
    page = session.page
    job_id = submitted["id"]
    link = page.locator("#download-model")
    expect(link).to_be_visible()
    with page.expect_download() as download_info:
        link.click()
    download = download_info.value
    assert download.suggested_filename == f"{job_id}-export.tar.gz"
    with tarfile.open(fileobj=io.BytesIO(Path(download.path()).read_bytes()), mode="r:gz") as tar:
        names = set(tar.getnames())
    assert {"saved_model.pb", "spec.json", "result.json"} <= names


def test_open_tensorboard_through_proxy(
    session: Session, submitted: dict[str, Any], screenshots: Path
) -> None:
    page = session.page
    job_id = submitted["id"]
    with session.context.expect_page() as popup:
        page.click("#open-tensorboard")
    board = popup.value
    # TensorBoard imports TensorFlow before it answers: tens of seconds on a busy host.
    board.wait_for_url(re.compile(r"/tensorboard/\?runFilter="), timeout=180_000)
    board.wait_for_load_state("domcontentloaded", timeout=180_000)
    expect(board).to_have_title("TensorBoard", timeout=180_000)
    assert board.url.startswith(f"{page.url.split('#')[0].rstrip('/')}/tensorboard/")
    # The job's runs, listed by TensorBoard's own page, read through the proxy: named by
    # the job's name, then its id.
    run = f"dashboard-mlp · {job_id}/train"
    expect(board.get_by_text(run).first).to_be_visible(timeout=120_000)
    expect(page.locator("#tensorboard-status")).to_have_text("TensorBoard is running: open it.")
    board.wait_for_timeout(1000)
    board.screenshot(path=screenshots / "dashboard-tensorboard.png")
    # Its HParams tab, whose data come by POST through the proxy: the job's spec as a row.
    board.goto(board.url.split("#")[0] + "#hparams")
    expect(board.get_by_text("optimizer.learning_rate").first).to_be_visible(timeout=60_000)
    # The trial, by the job's id (the time series' hidden run list names it too).
    expect(board.locator(f"text={job_id} >> visible=true").first).to_be_visible()
    board.wait_for_timeout(1000)
    board.screenshot(path=screenshots / "dashboard-tensorboard-hparams.png")
    board.close()
    assert session.errors == []


def test_jobs_table_shows_job_and_filters(
    session: Session, submitted: dict[str, Any], screenshots: Path
) -> None:
    page = session.page
    job_id = submitted["id"]
    page.goto("/#/")
    row = page.locator(f'tr[data-job="{job_id}"]')
    expect(row.locator(".state")).to_have_text("succeeded")
    expect(row.locator('[role="progressbar"]')).to_have_attribute("aria-valuenow", "100.0")
    expect(row.locator(".col-progress")).to_contain_text("1500 / 1500")
    expect(row.locator(".col-loss .value")).to_have_text(re.compile(r"^\d"))
    expect(row.locator(".col-loss .kind")).to_have_text("train")
    # Its eval's accuracy, said as that: the last training batch's read as the model's.
    evaluation, progress = submitted["job"]["eval"], submitted["job"]["progress"]
    expect(row.locator(".col-accuracy .value")).to_have_text(f"{100 * evaluation['accuracy']:.1f}%")
    expect(row.locator(".col-accuracy .kind")).to_have_text("eval")
    expect(row.locator(".col-accuracy")).to_have_attribute(
        "title",
        f"Eval accuracy at step {evaluation['step']} on {evaluation['examples']:,} held-out "
        f"examples; the last training batch's: {100 * progress['accuracy']:.1f}%",
    )
    expect(page.locator("th.col-accuracy")).to_have_attribute("title", re.compile(r"latest eval"))
    expect(page.locator('.device[data-device="cpu:0"]')).to_contain_text("free")

    page.locator('.chip[data-state="failed"]').click()
    expect(page).to_have_url(re.compile(r"#/\?state=failed$"))
    expect(row).to_have_count(0)
    page.locator('.chip[data-state="succeeded"]').click()
    expect(row).to_have_count(1)
    page.locator('.chip[data-state=""]').click()
    expect(row).to_have_count(1)
    row.locator("a.job-name").click()
    expect(page).to_have_url(re.compile(f"#/jobs/{job_id}$"))
    assert session.errors == []


def test_bad_spec_shows_422_field_errors(session: Session, screenshots: Path) -> None:
    page = session.page
    page.goto("/#/submit")
    bad = {"data": {"format": "synthetic"}, "towers": 0, "batch_size": 32, "bogus": 1, "tower": 1}
    page.fill("#spec", json.dumps(bad, indent=2))
    page.click("#submit-job")
    errors = page.locator("#form-errors")
    expect(errors).to_be_visible()
    expect(errors).to_contain_text("The service rejected this spec")
    expect(errors.locator('li[data-field="towers"]')).to_contain_text(
        "Input should be greater than or equal to 1. Received: 0"
    )
    expect(errors.locator('li[data-field="bogus"]')).to_contain_text("Unknown key")
    # The key it suggests reads as code, not between literal backticks.
    suggestion = errors.locator('li[data-field="tower"]')
    expect(suggestion).to_contain_text("Unknown key. Did you mean towers?")
    expect(suggestion.locator("code:not(.field-name)")).to_have_text("towers")
    expect(page).to_have_url(re.compile(r"#/submit$"))
    page.screenshot(path=screenshots / "dashboard-submit-422.png")

    page.fill("#spec", '{"towers": 2,')
    page.click("#submit-job")
    expect(errors.locator('li[data-field="(json)"]')).to_be_visible()
    assert session.errors == []


def test_submit_form_keeps_the_draft_and_names_its_start(
    session: Session, submitted: dict[str, Any]
) -> None:
    page = session.page
    spec, start = page.locator("#spec"), page.locator("#preset option:checked")
    page.goto("/#/submit")
    page.fill("#spec", '{"name": "an edit"}')
    # A preset picked after an edit is what comes back, not the edit.
    page.select_option("#preset", "mnist-cnn")
    page.goto("/#/")
    page.goto("/#/submit")
    expect(page.locator("#preset")).to_have_value("mnist-cnn")
    expect(spec).to_have_value(re.compile(r'"name": "mnist-cnn-2towers"'))
    # An edit comes back as the draft, named so (not as the preset it started from).
    page.fill("#spec", '{"name": "my draft"}')
    page.goto("/#/")
    page.goto("/#/submit")
    expect(spec).to_have_value('{"name": "my draft"}')
    expect(start).to_have_text("Draft")
    page.select_option("#preset", "smoke")
    expect(spec).to_have_value(re.compile(r'"name": "smoke-test"'))
    page.select_option("#preset", label="Draft")
    expect(spec).to_have_value('{"name": "my draft"}')
    # Another job's spec says whose it is.
    page.goto(f"/#/submit?from={submitted['id']}")
    expect(start).to_have_text(f"From job {submitted['id']}")
    expect(spec).to_have_value(re.compile(r'"steps": 1500'))
    assert session.errors == []


def test_job_without_metrics_and_cancel(
    clocked: Session, service: Service, screenshots: Path, request: pytest.FixtureRequest
) -> None:
    session = clocked  # its polls are had now with list_read_now and fast_forward
    page = session.page
    # One job slot: the long job holds it, so the second one waits, with no progress.
    running = service.submit(long_job())
    queued = service.submit(job_spec(name="waits"))

    def cancel_both() -> None:
        # Had this test failed with the long job still holding the slot, the module's
        # next tests would each wait for it in vain, and fail too.
        for job in (running, queued):
            service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
        service.wait_state(running["id"], *TERMINAL, timeout=180)

    request.addfinalizer(cancel_both)
    page.goto(f"/#/jobs/{queued['id']}")
    expect(page.locator(".job-heading .state")).to_have_text("queued")
    expect(page.locator(".chart-empty")).to_have_count(3)
    for empty in page.locator(".chart-empty").all():
        expect(empty).to_be_visible()
    expect(page.locator('[data-stat="loss"]')).to_have_text("—")
    expect(page.locator('[data-stat="eta"]')).to_have_text("—")
    expect(page.locator('[data-stat="devices"]')).to_have_text("waiting for 1 job slot (1 tower)")
    expect(page.locator('[data-stat="data"]')).to_have_text("—")  # no worker has loaded it
    expect(page.locator("#checkpoints")).to_contain_text("No checkpoint yet")
    expect(page.locator("#towers")).to_contain_text("No device trace")
    expect(page.locator("#download-model")).to_be_hidden()  # nothing exported yet
    # The log is polled every 3 s; a poll that brings nothing new keeps a selection being
    # copied.
    log = page.locator("#log")
    expect(log).to_have_text("(no output yet)")
    log.evaluate(
        "el => { const range = document.createRange(); range.selectNodeContents(el);"
        " getSelection().removeAllRanges(); getSelection().addRange(range); }"
    )
    with page.expect_response(lambda r: "/logs?tail=" in r.url, timeout=10_000):
        page.clock.fast_forward(LOG_POLL_MS)  # the next poll, now
    page.wait_for_timeout(300)
    assert page.evaluate("getSelection().toString()") == "(no output yet)"

    cancel = page.locator("#cancel-job")
    cancel.click()
    expect(cancel).to_have_text("Confirm cancel")
    cancel.click()
    expect(page.locator(".job-heading .state")).to_have_text("cancelled")
    expect(page.locator('[data-stat="devices"]')).to_have_text("—")
    assert service.job(queued["id"])["state"] == "cancelled"

    # The jobs table follows the running job live: from the stream of every job, with no
    # list read (the table re-reads the list every 15 s) in between.
    page.goto("/#/")
    reads, on_request = record_list_reads(page)
    row = page.locator(f'tr[data-job="{running["id"]}"]')
    expect(row.locator(".state")).to_have_text("running", timeout=180_000)
    expect(page.locator(f'tr[data-job="{queued["id"]}"] .state')).to_have_text("cancelled")
    expect(page.locator('.device[data-device="cpu:0"] .device-job-id')).to_have_text(running["id"])
    expect(row.locator(".col-devices")).to_have_text("cpu:0")
    step = row.locator(".step")
    # Past its first step (the start line says step 0): the next report comes within 2 s,
    # once its worker has imported TensorFlow: a minute and more on a loaded 2-core host.
    expect(step).to_have_text(re.compile(r"^[1-9]\d* / 10000000$"), timeout=180_000)
    list_read_now(page)
    before = len(reads)
    first = step.inner_text()
    # Progress comes every 2 s; under the 15 s to the next list read, which `reads` catches.
    expect(step).not_to_have_text(first, timeout=12_000)
    assert reads[before:] == [], "the step moved with the list's re-read, not the stream"
    page.screenshot(path=screenshots / "dashboard-jobs.png")

    # A job submitted while the table is open shows up, and so does its end, both from the
    # stream: no list read in between either.
    list_read_now(page)
    before = len(reads)
    late = service.submit(job_spec(name="late"))
    late_row = page.locator(f'tr[data-job="{late["id"]}"]')
    expect(late_row.locator(".state")).to_have_text("queued")  # a list read: `reads` says
    expect(late_row.locator(".col-devices")).to_have_text("waiting for 1 job slot (1 tower)")
    expect(page.locator("tbody tr").first).to_have_attribute("data-job", late["id"])
    assert service.client.post(f"/api/v1/jobs/{late['id']}/cancel").status_code == 200
    expect(late_row.locator(".state")).to_have_text("cancelled")
    assert reads[before:] == [], "the new row or its end came from a list read, not the stream"
    page.remove_listener("request", on_request)

    row.locator("a.job-name").click()
    expect(page.locator(".job-heading .state")).to_have_text("running")
    page.locator("#cancel-job").click()
    page.locator("#cancel-job").click()
    line = page.locator("#action-status")
    # While the worker stops, the line says so; an answer that comes after the stream said
    # the job ended (a slow network) has the line say the end at once.
    expect(line).to_have_text(
        re.compile(
            r"^(Cancel requested: the worker checkpoints and stops\.|Cancelled at step \d+\.)$"
        )
    )
    expect(page.locator(".job-heading .state")).to_have_text("cancelled", timeout=60_000)
    expect(page.locator("#cancel-job")).to_be_hidden()
    stopped = service.job(running["id"])
    assert stopped["state"] == "cancelled"
    # Whatever came first, the answer or the end: where the job stopped.
    expect(line).to_have_text(f"Cancelled at step {stopped['progress']['step']}.")
    assert session.errors == []


def test_job_cancelled_while_starting_ends_cleanly(session: Session, service: Service) -> None:
    page = session.page
    job = service.submit(long_job(name="stopped-early"))
    service.wait_state(job["id"], "running")
    # Cancelled while its worker still loads TensorFlow (seconds): the worker catches
    # SIGTERM from its first lines, so it stops after a checkpoint (exit 3), with no error
    # to show. Not in the interpreter's first tens of milliseconds, before any line of ours
    # runs: that SIGTERM ends the process, said as "Cancelled: ..." (test_dashboard_details).
    wait_catching_sigterm(lambda: processes_under(service.data_dir / "runs" / job["id"]))
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    ended = service.wait_state(job["id"], *TERMINAL)
    assert ended["state"] == "cancelled" and ended["error"] is None, ended
    assert ended["result"]["outcome"] == "cancelled", ended
    page.goto(f"/#/jobs/{job['id']}")
    expect(page.locator(".job-heading .state")).to_have_text("cancelled")
    expect(page.locator(".job-error")).to_be_hidden()
    expect(page.locator('[data-stat="devices"]')).to_have_text("ran on cpu:0")
    expect(page.locator("#cancel-job")).to_be_hidden()
    expect(page.locator(".live-notice")).to_be_hidden()
    assert session.errors == []


def test_jobs_table_shows_long_names_and_why_jobs_failed(
    browser: Browser, session: Session, service: Service
) -> None:
    page = session.page
    # In a folder with a long name and no space, which the reason names.
    folder = Path(service.env["TOWERBOARD_DATA_ROOTS"]) / ("a_folder_name_with_no_space_" * 5)
    folder.mkdir()
    # Arrays of the right names and shapes (the service checks those from their headers)
    # but a label below 0, which the worker alone reads.
    labels = np.array([0, -1, 1], np.int64)
    np.savez(folder / "negative.npz", x=np.zeros((3, 4, 4), np.uint8), y=labels)
    failing = service.submit(
        job_spec(name="bad-data", data={"format": "npz", "path": str(folder / "negative.npz")})
    )
    long_name = "a-run-name-with-no-space-" + "x" * 175  # the spec's longest: 200 characters
    long_named = service.submit(job_spec(name=long_name))
    ended = service.wait_state(failing["id"], *TERMINAL, timeout=180)
    assert ended["state"] == "failed", ended
    reason = ended["error"]["reason"]
    assert reason.startswith(
        "The worker rejected the spec: data: Expected labels `y` >= 0. Received: a label of -1"
    ), reason

    page.goto("/#/")
    row = page.locator(f'tr[data-job="{failing["id"]}"]')
    expect(row.locator(".state")).to_have_text("failed")
    # Why it failed, in the table: the reason (clamped to two lines; all of it on hover),
    # its `quoted` names as code.
    why = row.locator(".job-reason")
    expect(why).to_be_visible()
    expect(why).to_have_text(reason.replace("`", ""))
    expect(why.locator("code").first).to_have_text("y")
    expect(why).to_have_attribute("title", reason.replace("`", ""))
    expect(page.locator(f'tr[data-job="{long_named["id"]}"] .job-reason')).to_be_hidden()
    # The long name wraps: every column stays in view, with no sideways scrolling.
    expect(page.locator(f'tr[data-job="{long_named["id"]}"] a.job-name')).to_have_text(long_name)
    wrap = page.locator(".table-wrap")
    widths = wrap.evaluate("el => [el.scrollWidth, el.clientWidth]")
    assert widths[0] <= widths[1], f"the table scrolls sideways: {widths}"
    phone = open_session(browser, service, PHONE)
    try:
        phone.page.goto("/#/")
        expect(phone.page.locator(f'tr[data-job="{long_named["id"]}"] a.job-name')).to_be_visible()
        assert no_overflow(phone.page)
        assert phone.errors == []
    finally:
        phone.context.close()

    # The job's page: the log tail under the reason is scrolled to its end, where the
    # cause is (TensorFlow's start-up lines come first).
    row.locator("a.job-name").click()
    error = page.locator(".job-error")
    # Its `quoted` names as code, as the submit form shows a refusal's: no backticks.
    expect(error).to_contain_text(f"Failed: {reason.replace('`', '')} (exit code 2)")
    expect(error.locator("code").first).to_have_text("y")
    assert no_overflow(page), "the reason's long path widens the page"
    tail = error.locator("pre.log")
    expect(tail).to_contain_text("Cannot load the data")
    top, height, full = tail.evaluate("el => [el.scrollTop, el.clientHeight, el.scrollHeight]")
    assert full > height, "the log tail fits its box: this test shows nothing"
    assert top + height >= full - 1, (top, height, full)
    # "submitted … ago" counts on, though the job has ended and nothing more comes.
    meta = page.locator(".meta")
    expect(meta).to_contain_text("submitted")
    expect(meta).not_to_have_text(meta.inner_text(), timeout=5_000)
    assert session.errors == []


def test_submit_form_keeps_an_edit_when_another_start_is_picked(
    session: Session, submitted: dict[str, Any]
) -> None:
    page = session.page
    spec, start = page.locator("#spec"), page.locator("#preset option:checked")
    page.goto("/#/submit?preset=mnist-cnn")
    edit = '{"name": "an hour of edits", "data": {"format": "synthetic"}}'
    page.fill("#spec", edit)
    # Typed into, the editor holds the user's draft, and the form says so.
    expect(start).to_have_text("Draft")
    page.select_option("#preset", "smoke")
    expect(spec).to_have_value(re.compile(r'"name": "smoke-test"'))
    page.select_option("#preset", label="Draft")
    expect(spec).to_have_value(edit)
    # Edit & resubmit another job keeps it too.
    page.goto(f"/#/submit?from={submitted['id']}")
    expect(start).to_have_text(f"From job {submitted['id']}")
    expect(spec).to_have_value(re.compile(r'"steps": 1500'))
    page.select_option("#preset", label="Draft")
    expect(spec).to_have_value(edit)
    page.select_option("#preset", label=f"From job {submitted['id']}")
    expect(spec).to_have_value(re.compile(r'"steps": 1500'))
    # Back later, the form shows what it held, named by where it came from.
    page.goto("/#/")
    page.goto("/#/submit")
    expect(start).to_have_text(f"From job {submitted['id']}")
    page.select_option("#preset", label="Draft")
    expect(spec).to_have_value(edit)
    assert session.errors == []


def test_api_error_names_the_field_errors(session: Session) -> None:
    """A refused request's message says what was wrong, not only "see `errors`" (what
    Could not start TensorBoard / Could not cancel show)."""
    page = session.page
    page.goto("/#/")
    message = page.evaluate("""async () => {
      const { api } = await import("/static/js/api.js");
      try {
        await api("/api/v1/tensorboard", { method: "POST", body: { job_ids: ["nosuch"] } });
        return "no error";
      } catch (error) {
        return error.message;
      }
    }""")
    assert message == (
        "Invalid request: 1 error; see `errors`. job_ids.0: Unknown job. Received: 'nosuch'"
    )


def test_job_page_waits_out_a_service_restart(browser: Browser, tmp_path: Path) -> None:
    """A job opened while the service is down (a restart) shows once it answers again."""
    restarting = Service(tmp_path / "data", fake_worker_env(tmp_path))
    restarting.start()
    session = open_session(browser, restarting, LAPTOP)
    try:
        page = session.page
        job = restarting.submit(job_spec(name="quick"))
        restarting.wait_state(job["id"], "succeeded")
        page.goto("/#/")
        expect(page.locator(f'tr[data-job="{job["id"]}"] .state')).to_have_text("succeeded")
        restarting.stop()
        page.locator(f'tr[data-job="{job["id"]}"] a.job-name').click()
        message = page.locator("#job-load-error")
        expect(message).to_have_text(
            re.compile(
                rf"^Could not load job {job['id']}: The service did not answer .* Trying again…$"
            )
        )
        restarting.start()
        expect(page.locator(".job-heading .state")).to_have_text("succeeded", timeout=15_000)
        expect(message).to_be_hidden()
        expect(page.locator("#spec")).to_be_visible()
        expect(page.locator(".live-notice")).to_be_hidden()
        assert session.errors == []
    finally:
        session.context.close()
        restarting.close()


def test_older_snapshot_never_undoes_the_stream(session: Session) -> None:
    """The rule both views use to merge a list or job read with the stream (a real race
    cannot be staged here without mocking the network)."""
    page = session.page
    page.goto("/#/")
    verdicts = page.evaluate("""async () => {
      const { fresher, mark } = await import("/static/js/jobs.js");
      const at = (second) => `2026-11-27T08:00:0${second}Z`;  // updated_at
      const running = { id: "a", state: "running", attempts: 1, updated_at: at(2) };
      const ended = { id: "a", state: "succeeded", attempts: 1, updated_at: at(3) };
      const older = { id: "a", state: "running", attempts: 1, updated_at: at(1) };
      // Resumed: the ended job queued again as its next attempt.
      const resumed = { id: "a", state: "queued", attempts: 2, updated_at: at(4) };
      // The resume cancelled before its attempt started: the ended attempt again, half a
      // second after the resume (which, on the second, the service writes with no
      // fraction: as text, "04Z" sorts after "04.500000Z").
      const takenBack = { ...ended, updated_at: "2026-11-27T08:00:04.500000Z" };
      const asked = mark();  // a read starts...
      const streamed = mark();  // ...the stream changes the job while it is out
      const later = mark();  // a read that starts after that
      return {
        streamNewer: fresher(running, streamed, older, asked) === running,
        endStays: fresher(ended, streamed - 10, older, later) === ended,
        endedSnapshotWins: fresher(running, streamed, ended, asked) === ended,
        newerSnapshotWins: fresher(running, streamed, older, later) === older,
        firstRead: fresher(undefined, undefined, older, asked) === older,
        resumeWins: fresher(ended, streamed, resumed, asked) === resumed,
        resumeStays: fresher(resumed, streamed - 10, ended, later) === resumed,
        takenBackWins: fresher(resumed, streamed, takenBack, asked) === takenBack,
        takenBackStays: fresher(takenBack, streamed - 10, resumed, later) === takenBack,
      };
    }""")
    assert all(verdicts.values()), verdicts


def test_an_end_event_folds_as_the_service_folds_it(session: Session) -> None:
    """What the views apply from a job's `end` event before its state event comes: as
    `service/progress.py` folds it (no ETA unless it succeeded; a cancelled run's loss and
    accuracy of the step it stopped at)."""
    page = session.page
    page.goto("/#/")
    folded = page.evaluate("""async () => {
      const { applyProgressEvent } = await import("/static/js/jobs.js");
      const job = { id: "a", state: "running",
                    progress: { step: 30, total: 40, loss: 0.5, accuracy: 0.75, eta_seconds: 9 } };
      const end = { event: "end", outcome: "cancelled", phase: "done", step: 34, total: 40,
                    loss: 0.25, accuracy: 0.875 };
      const { progress: p } = applyProgressEvent(job, end);
      const bare = applyProgressEvent(job, { event: "end", outcome: "succeeded", step: 40 });
      return [p.step, p.loss, p.accuracy, p.eta_seconds, bare.progress.loss,
              bare.progress.eta_seconds];
    }""")
    assert folded == [34, 0.25, 0.875, None, 0.5, 0]


@pytest.mark.parametrize(
    ("at", "total", "traced", "folded"),
    [(30, 100, 22, [30, 30, 22, [3.0, 4.0]]), (330, 1000, 335, [335, 33.5, 335, [3.0, 4.0]])],
    ids=["after reports of later steps", "before the report of its step"],
)
def test_a_trace_event_takes_the_job_forward_never_back(
    session: Session, at: int, total: int, traced: int, folded: list
) -> None:
    """A worker writes a trace's line once the trace is read, off its loop: after reports
    of later steps, the views keep the job where those put it; before the report of its
    own step, the job is at least there (it showed trace_step 335 at step 330). As the
    service folds it."""
    page = session.page
    page.goto("/#/")
    got = page.evaluate(
        """async ([at, total, traced]) => {
      const { applyProgressEvent } = await import("/static/js/jobs.js");
      const job = { id: "a", state: "running", progress: { step: at, total } };
      const trace = { event: "trace", step: traced, tower_ms: [3.0, 4.0] };
      const { progress: p } = applyProgressEvent(job, trace);
      return [p.step, p.percent, p.trace_step, p.tower_ms];
    }""",
        [at, total, traced],
    )
    assert got == folded


def test_a_trace_event_without_times_says_why_in_their_place(session: Session) -> None:
    """A trace whose times could not be read (no CUPTI on a GPU host): the older trace's
    times go and why stays, until a trace with times, as the service folds it."""
    page = session.page
    page.goto("/#/")
    folded = page.evaluate("""async () => {
      const { applyProgressEvent } = await import("/static/js/jobs.js");
      let job = { id: "a", state: "running",
        progress: { step: 30, total: 100, tower_ms: [1.0, 2.0], trace_step: 6 } };
      job = applyProgressEvent(job, { event: "trace", step: 22, tower_ms_error: "no kernels" });
      const untimed = { ...job.progress };
      job = applyProgressEvent(job, { event: "progress", step: 31 });
      const reported = { ...job.progress };
      job = applyProgressEvent(job, { event: "trace", step: 40, tower_ms: [3.0, 4.0] });
      const p = job.progress;
      return [[untimed.step, untimed.trace_step, untimed.tower_ms, untimed.tower_ms_error],
              [reported.tower_ms, reported.tower_ms_error],
              [p.step, p.trace_step, p.tower_ms, p.tower_ms_error]];
    }""")
    assert folded == [
        [30, 22, None, "no kernels"],
        [None, "no kernels"],
        [40, 40, [3.0, 4.0], None],
    ]


def test_phone_width_layout(
    browser: Browser, service: Service, submitted: dict[str, Any], screenshots: Path
) -> None:
    phone = open_session(browser, service, PHONE)
    try:
        page = phone.page
        page.goto("/#/")
        row = page.locator(f'tr[data-job="{submitted["id"]}"]')
        expect(row.locator(".state")).to_have_text("succeeded")
        assert no_overflow(page)
        page.screenshot(path=screenshots / "dashboard-phone-jobs.png")
        page.goto(f"/#/jobs/{submitted['id']}")
        expect(page.locator('figure[data-chart="loss"] canvas')).to_be_visible()
        expect(page.locator("a.download")).to_have_count(3)
        assert no_overflow(page)
        page.screenshot(path=screenshots / "dashboard-phone-job.png")
        page.goto("/#/submit")
        expect(page.locator("#spec")).to_be_visible()
        assert no_overflow(page)
        assert phone.errors == []
    finally:
        phone.context.close()


def refused_again(page: Page) -> None:
    """Have the page's devices poll now (its clock, installed before the page loaded,
    jumps the poll's 5 s interval ahead) and wait until it has had, and handled, another
    401 from it."""
    with page.expect_response(
        lambda r: r.url.endswith("/api/v1/devices") and r.status == 401, timeout=15_000
    ):
        page.clock.fast_forward(DEVICES_POLL_MS)
    page.wait_for_timeout(300)


def stream_refused(page: Page, responses: list[tuple[str, int]]) -> None:
    """Wait until the page's event stream has been refused (401) and a list read after
    that refused too (the one the stream's end asks for), and the page has handled it."""
    deadline = time.monotonic() + 20

    def seen() -> bool:
        kinds = ["events" if "/api/v1/events" in url else "jobs" if LIST_READ.search(url) else ""
                 for url, status in responses if status == 401]  # fmt: skip
        return "events" in kinds and "jobs" in kinds[kinds.index("events") :]

    while not seen():
        assert time.monotonic() < deadline, f"no refused stream, then list read: {responses}"
        page.wait_for_timeout(100)
    page.wait_for_timeout(300)


def asks_only_for_the_token(page: Page) -> None:
    """One line says to enter the token; nothing says that something broke or offers a
    Reload (which could not help), and no bare table header stands for the jobs."""
    expect(page.locator("#token-bar")).to_be_visible()
    expect(page.locator("#view .error")).to_have_text(
        "Enter the service's token above to see its jobs."
    )
    expect(page.locator(".live-notice")).to_be_hidden()
    expect(page.locator("#devices")).not_to_contain_text("Unavailable")
    expect(page.locator("#devices")).not_to_contain_text("Missing bearer token")


def test_token_field_when_service_needs_one(browser: Browser, tmp_path: Path) -> None:
    token = "e2e-token"
    secured = Service(tmp_path / "data", {"TOWERBOARD_TOKEN": token})
    secured.start()
    session = open_session(browser, secured, LAPTOP)
    try:
        page = session.page
        page.clock.install()  # for refused_again
        responses: list[tuple[str, int]] = []
        page.on("response", lambda r: responses.append((r.url, r.status)))
        # The API is behind the token; the page is not, so a first visit can ask for it.
        assert httpx.get(f"{secured.base_url}/api/v1/jobs").status_code == 401
        assert httpx.get(f"{secured.base_url}/").status_code == 200
        page.goto("/")
        stream_refused(page, responses)
        # It said "Could not load jobs: Missing bearer token…", "Live updates stopped…
        # Reload", "Unavailable: Missing bearer token…" and showed an empty table header.
        asks_only_for_the_token(page)
        expect(page.locator("#jobs-table")).to_be_hidden()
        expect(page.locator("#jobs-summary")).to_have_text("")  # not "Loading…" for ever
        page.fill("#token-input", token)
        page.get_by_role("button", name="Use token").click()
        expect(page.locator("#token-bar")).to_be_hidden()
        expect(page.locator("#jobs-summary")).to_have_text("0 of 0 jobs")
        expect(page.locator("#view .error")).to_be_hidden()
        expect(page.locator('.device[data-device="cpu:0"]')).to_be_visible()

        # The token changes under the page: the API answers 401 and the page asks for it.
        page.evaluate(
            "document.cookie = 'towerboard_token=stale; Path=/';"
            "localStorage.setItem('towerboard.token', 'stale')"
        )
        page.goto("/#/submit")
        responses.clear()
        page.goto("/#/")
        bar, field = page.locator("#token-bar"), page.locator("#token-input")
        expect(bar).to_be_visible()
        expect(page.locator("#token-message")).to_have_text("That token was refused.")
        expect(field).to_be_focused()
        # The event stream was refused too, which ends an EventSource for good: the list
        # read after it says why, and the table asks for the token alone (it said its live
        # updates stopped and offered a Reload that was refused again).
        stream_refused(page, responses)
        asks_only_for_the_token(page)
        notice = page.locator(".live-notice")
        # A job's page says the same (it showed the 401's own "Expected header …").
        page.goto("/#/jobs/nosuchjob")
        expect(page.locator("#job-load-error")).to_have_text(
            "Enter the service's token above to see this job."
        )
        expect(page.locator(".live-notice")).to_be_hidden()
        page.goto("/#/")
        asks_only_for_the_token(page)

        # The devices poll keeps answering 401 (every 5 s); the field does not take the
        # focus back from elsewhere, and a closed bar stays closed.
        nav = page.locator('a[data-nav="submit"]')
        nav.focus()
        refused_again(page)
        expect(nav).to_be_focused()
        page.locator("#token-toggle").click()
        expect(bar).to_be_hidden()
        refused_again(page)
        expect(bar).to_be_hidden()
        expect(page.locator("#token-toggle")).to_have_class(re.compile(r"\brefused\b"))
        page.locator("#token-toggle").click()
        expect(bar).to_be_visible()
        expect(field).to_be_focused()

        page.fill("#token-input", token)
        page.get_by_role("button", name="Use token").click()
        expect(bar).to_be_hidden()
        expect(page.locator("#jobs-summary")).to_have_text("0 of 0 jobs")
        expect(page.locator('.device[data-device="cpu:0"]')).to_be_visible()
        expect(notice).to_be_hidden()
        expect(page.locator("#view .error")).to_be_hidden()
        assert session.errors == []
    finally:
        session.context.close()
        secured.close()


def test_jobs_table_pages_on_with_the_cursor(session: Session, service: Service) -> None:
    """More jobs than a page (50): 'Show more' reads on from the API's next_cursor."""
    extra = [service.submit(job_spec(name=f"many-{i}")) for i in range(50)]
    for job in extra:  # the first may have started; the rest are still queued
        status = service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code
        assert status in (200, 202, 409), status
    for job in extra:
        service.wait_state(job["id"], *TERMINAL)
    total = service.client.get("/api/v1/jobs", params={"limit": 1}).json()["count"]
    assert total > 50

    page = session.page
    page.goto("/#/")
    rows = page.locator("#jobs-table tbody tr")
    expect(rows).to_have_count(50)
    expect(page.locator("#jobs-summary")).to_have_text(f"50 of {total} jobs")
    with page.expect_request(lambda r: LIST_READ.search(r.url) is not None) as more:
        page.get_by_role("button", name="Show more").click()
    assert "cursor=" in more.value.url, more.value.url
    expect(rows).to_have_count(total)
    expect(page.locator("#jobs-summary")).to_have_text(f"{total} of {total} jobs")
    expect(page.get_by_role("button", name="Show more")).to_be_hidden()
    ids = [row.get_attribute("data-job") for row in rows.all()]
    assert len(set(ids)) == total  # no row twice across the pages
    assert session.errors == []
