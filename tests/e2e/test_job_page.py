"""A job's page in headless Chromium against a real service whose worker is a stand-in
(it writes the progress lines a test needs, at once) and a real TensorBoard: the charts
of a job with one report, and the TensorBoard line following the shared TensorBoard as
it starts, runs, fails or is replaced by another user's start."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Locator, Page, Route, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.lossy import answers_lost
from tests.e2e.test_dashboard import Session
from tests.e2e.test_dashboard_details import COUNT_WRITES
from tests.service.harness import Service, job_spec

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)]

# `python -m points_worker run --job-dir DIR`: reports the steps its spec's name lists
# ("steps-300" reports step 300; "steps-100-300" steps 100 and 300), then succeeds. Its
# start says what it trains on, as a worker's does.
POINTS_WORKER = """\
import json, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
name = json.loads((job_dir / "spec.json").read_text())["name"]


def progress(**line):
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), **line}) + "\\n")


progress(event="start", step=0, total=1000, phase="starting", towers=1,
         data={"train_examples": 3277, "eval_examples": 819, "classes": 10,
               "image_shape": [28, 28, 1]})
for step in name.split("-")[1:]:
    progress(event="progress", step=int(step), total=1000, loss=0.5, accuracy=0.8,
             examples_per_sec=1234.0)
(job_dir / "result.json").write_text(json.dumps({"outcome": "succeeded", "message": name}))
"""
CHARTS = ("loss", "accuracy", "examples/s")
RUNNING_POLL_MS = 5_000  # how often the line asks after a running TensorBoard (tensorboard.js)
STARTING = "TensorBoard is starting: open it."
RUNNING = "TensorBoard is running: open it."


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("stand-in")
    (folder / "points_worker.py").write_text(POINTS_WORKER)
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    svc = Service(
        folder / "data", {"TOWERBOARD_WORKER_MODULE": "points_worker", "PYTHONPATH": path}
    )
    svc.start()
    yield svc
    svc.close()


def finished(service: Service, name: str) -> str:
    """A job run to success by the stand-in worker; its id."""
    job = service.submit(job_spec(name=name))
    ended = service.wait_state(job["id"], "succeeded", "failed", "cancelled")
    assert ended["state"] == "succeeded", ended
    return str(job["id"])


def tensorboard(service: Service) -> dict[str, Any]:
    status: dict[str, Any] = service.client.get("/api/v1/tensorboard").json()
    return status


def wait_tensorboard(service: Service, predicate: Callable[[dict[str, Any]], bool]) -> Any:
    deadline = time.monotonic() + 120
    while not predicate(status := tensorboard(service)):
        assert time.monotonic() < deadline, f"timed out; TensorBoard: {status}"
        time.sleep(0.2)
    return status


def open_job(page: Page, job_id: str) -> None:
    page.goto(f"/#/jobs/{job_id}")
    expect(page.locator(".job-heading .state")).to_have_text("succeeded")


def tensorboard_line(page: Page) -> Locator:
    """The line that says how TensorBoard is doing (found as a reader finds it)."""
    return page.get_by_role("status").filter(has_text="TensorBoard")


def click_open(session: Session, button: str = "#open-tensorboard") -> None:
    """Click what opens TensorBoard; close the tab it opens (another test follows it)."""
    with session.context.expect_page() as popup:
        session.page.click(button)
    popup.value.close()


def test_one_point_chart_centres_its_step(
    session: Session, service: Service, screenshots: Path
) -> None:
    """A job's first report alone: the step axis spans the step, not 0 to twice it."""
    page = session.page
    open_job(page, finished(service, "steps-300"))
    page.screenshot(path=screenshots / "dashboard-one-point.png")
    for chart in CHARTS:
        figure = page.locator(f'figure[data-chart="{chart}"]')
        expect(figure).to_have_attribute("data-points", "1")
        expect(figure.locator("canvas").first).to_be_visible()
        expect(figure).to_have_attribute("data-x-range", "250..350")  # was 0..600
        expect(figure.locator(".chart-note")).to_have_text("One report so far, at step 300.")
    assert session.errors == []


def test_chart_of_two_steps_spans_them(session: Session, service: Service) -> None:
    page = session.page
    open_job(page, finished(service, "steps-100-300"))
    for chart in CHARTS:
        figure = page.locator(f'figure[data-chart="{chart}"]')
        expect(figure).to_have_attribute("data-points", "2")
        expect(figure).to_have_attribute("data-x-range", "100..300")
        expect(figure.locator(".chart-note")).to_be_hidden()
    assert session.errors == []


def test_pointer_on_a_chart_reads_its_values(session: Session, service: Service) -> None:
    """The legend says no values: the pointer over a plot shows the step under it and each
    series' value there, beside it, and nothing once it has left."""
    page = session.page
    open_job(page, finished(service, "steps-100-300"))
    for chart, value in (("loss", "train 0.5"), ("examples/s", "examples/s 1234")):
        figure = page.locator(f'figure[data-chart="{chart}"]')
        readout = figure.locator(".chart-readout")
        over = figure.locator(".u-over")
        box = over.bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)
        expect(readout).to_be_visible()
        expect(readout).to_have_text(f"step 300\n{value}")
        page.mouse.move(box["x"] + 2, box["y"] + box["height"] / 2)
        expect(readout).to_have_text(f"step 100\n{value}")
        tip = readout.bounding_box()
        assert tip is not None  # inside the plot, whichever side of the pointer it took
        assert box["x"] <= tip["x"] and tip["x"] + tip["width"] <= box["x"] + box["width"] + 1
        page.mouse.move(1, 1)
        expect(readout).to_be_hidden()
    assert session.errors == []


def test_data_card_is_two_cards_wide(session: Session, service: Service) -> None:
    """What a job trains on is a long line: in one card's width it took four lines."""
    page = session.page
    open_job(page, finished(service, "steps-100"))
    value = page.locator('[data-stat="data"]')
    expect(value).to_have_text("3,277 train · 819 eval · 10 classes · 28×28×1")
    data = page.locator(".stat", has=value).bounding_box()
    loss = page.locator(".stat", has=page.locator('[data-stat="loss"]')).bounding_box()
    assert data is not None and loss is not None
    assert data["width"] > 1.9 * loss["width"], (data, loss)
    assert session.errors == []


def test_stat_labels_say_train_or_eval(session: Session, service: Service) -> None:
    """The training batch's loss and accuracy are marked train, as the jobs table marks
    them: a bare "Accuracy" beside "Eval accuracy" read as the model's."""
    page = session.page
    open_job(page, finished(service, "steps-100"))
    expect(page.locator('[data-stat="loss"]')).to_have_text("0.5")
    for key, label in (
        ("loss", "Train loss"),
        ("accuracy", "Train accuracy"),
        ("eval_loss", "Eval loss"),
        ("eval_accuracy", "Eval accuracy"),
    ):
        box = page.locator(".stat", has=page.locator(f'[data-stat="{key}"]'))
        expect(box.locator(".stat-label")).to_have_text(label)
    assert session.errors == []


def test_tensorboard_line_says_when_it_runs(session: Session, service: Service) -> None:
    """The line says TensorBoard starts, then runs, with a link to it; then it is left
    alone while that stays so. It is a live region, and was rewritten with the same words
    at each 5 s look, which a screen reader read out each time."""
    service.client.delete("/api/v1/tensorboard")
    job_id = finished(service, "steps-300")
    page = session.page
    page.clock.install()  # before the page loads: its polls are the clock's, moved on below
    open_job(page, job_id)
    status = tensorboard_line(page)
    click_open(session)
    expect(status).to_have_text(STARTING)  # it imports TensorFlow first: seconds
    expect(status).to_have_text(RUNNING, timeout=120_000)
    expect(status).to_have_attribute("data-state", "running")
    assert tensorboard(service)["state"] == "running"
    # The run filter is a regular expression, as TensorBoard reads it: the id, then `/` or
    # the end (its runs are `<name> · <id>/train`), encoded.
    run_filter = f"{job_id}(%2F%7C%24)"
    expect(status.get_by_role("link", name="open it")).to_have_attribute(
        "href", f"/tensorboard/?runFilter={run_filter}#timeseries"
    )
    expect(page.locator("#tensorboard-notice")).to_be_hidden()
    page.evaluate(COUNT_WRITES, ["tensorboard", "#tensorboard-status"])
    for _ in range(3):  # the line's next three looks, now
        with page.expect_response(lambda r: r.url.endswith("/api/v1/tensorboard")):
            page.clock.fast_forward(RUNNING_POLL_MS)
    page.wait_for_timeout(100)  # the last answer is taken (a task after its response)
    assert page.evaluate("() => window.writes") == {"tensorboard": 0}
    expect(status).to_have_text(RUNNING)
    assert session.errors == []


def test_tensorboard_line_says_why_it_failed(session: Session, service: Service) -> None:
    service.client.delete("/api/v1/tensorboard")
    page = session.page
    started: list[dict[str, Any]] = []

    def kill_as_it_starts(route: Route) -> None:
        # Killed before the page has the start's answer: still starting, for sure. Killed
        # once the page said so, it had at times run already (a slow page, or a quick
        # TensorBoard), and this test had nothing to show.
        if route.request.method != "POST":
            route.continue_()
            return
        response = route.fetch()
        started.append(response.json())
        os.kill(started[0]["pid"], signal.SIGKILL)
        route.fulfill(response=response)

    open_job(page, finished(service, "steps-300"))
    status = tensorboard_line(page)
    page.route("**/api/v1/tensorboard", kill_as_it_starts)
    try:
        with page.expect_response(
            lambda r: r.url.endswith("/api/v1/tensorboard") and r.request.method == "POST"
        ):
            click_open(session)
    finally:
        page.unroute("**/api/v1/tensorboard")
    assert [tb["state"] for tb in started] == ["starting"], started
    stopped = wait_tensorboard(service, lambda tb: tb["state"] == "stopped")
    assert stopped["last_error"], stopped
    expect(status).to_have_text(f"TensorBoard failed to start: {stopped['last_error']}")
    expect(status).to_have_attribute("data-state", "failed")
    expect(status).to_have_class(re.compile(r"\berror\b"))
    assert session.errors == []


def test_tensorboard_replaced_by_another_start_says_so(
    session: Session, service: Service, screenshots: Path
) -> None:
    """Another user starts TensorBoard over other jobs only: this page says its job is no
    longer shown, and showing it again adds it without taking theirs away."""
    service.client.delete("/api/v1/tensorboard")
    mine, theirs = finished(service, "steps-300"), finished(service, "steps-300")
    page = session.page
    page.clock.install()  # before the page loads: its polls are the clock's, moved on below
    open_job(page, mine)
    status, notice = tensorboard_line(page), page.locator("#tensorboard-notice")
    click_open(session)
    expect(status).to_have_text(RUNNING, timeout=120_000)

    other = service.client.post("/api/v1/tensorboard", json={"job_ids": [theirs]})
    assert other.status_code == 201, other.text
    assert other.json()["replaced"]["job_ids"] == [mine]
    page.clock.fast_forward(RUNNING_POLL_MS)  # the line's next look, now
    expect(notice).to_be_visible(timeout=15_000)
    expect(notice).to_contain_text(
        f"TensorBoard was restarted by another start over job {theirs}, "
        "and no longer shows this job."
    )
    expect(page.locator("#tensorboard-status")).to_have_attribute("data-state", "replaced")
    page.screenshot(path=screenshots / "dashboard-tensorboard-replaced.png")

    click_open(session, "#tensorboard-notice button")
    expect(status).to_have_text(RUNNING, timeout=120_000)
    expect(notice).to_be_hidden()
    shared = tensorboard(service)
    # Added to theirs in place: the same process, showing both jobs.
    assert shared["pid"] == other.json()["pid"]
    assert shared["job_ids"] == sorted([mine, theirs])
    assert session.errors == []


def test_tensorboard_start_whose_answer_is_lost_says_it_runs(
    session: Session, service: Service
) -> None:
    """Open in TensorBoard: the start reaches the service, its answer is lost (a lossy
    network). TensorBoard runs, showing this job, and the line says so with its link; it
    said "Could not start TensorBoard: The service did not answer" beside it."""
    service.client.delete("/api/v1/tensorboard")
    page = session.page
    open_job(page, finished(service, "steps-300"))
    status = tensorboard_line(page)
    try:
        with answers_lost(page, "**/api/v1/tensorboard") as sent:
            with page.expect_event("requestfailed"):
                page.click("#open-tensorboard")  # its tab, waiting, is closed on the failure
            expect(status).to_have_text(re.compile(f"^({STARTING}|{RUNNING})$"))
            expect(status).not_to_have_class(re.compile(r"\berror\b"))
            expect(status).to_have_text(RUNNING, timeout=120_000)
        assert sent == [201]
    finally:
        service.client.delete("/api/v1/tensorboard")
    assert session.errors == []
