"""What a job's numbers look like as they come, in headless Chromium against a real service
whose worker is test_job_page_a11y's READER_WORKER (no model is trained here): a job id selected to copy
stays selected while the job reports, a worker's odd line stops none of the page's
updates, and the charts' axis labels fit at millions of steps and a loss near 1e-5."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import Session
from tests.e2e.test_job_page_a11y import READER_WORKER
from tests.service.harness import Service, job_spec, stand_in_service

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)

# Every text the charts draw on their canvases, from now on: window.drawnText, each
# {chart, text, x, width, align, canvasWidth} in CSS pixels (the page's pixel ratio is 1).
RECORD_CHART_TEXT = """
window.drawnText = [];
const fillText = CanvasRenderingContext2D.prototype.fillText;
CanvasRenderingContext2D.prototype.fillText = function (text, x, y, ...rest) {
  const figure = this.canvas.closest("figure");
  if (figure) {
    window.drawnText.push({ chart: figure.dataset.chart, text: String(text), x,
      width: this.measureText(String(text)).width, align: this.textAlign,
      canvasWidth: this.canvas.width });
  }
  return fillText.call(this, text, x, y, ...rest);
};
"""


def reader_service(factory: pytest.TempPathFactory) -> contextlib.AbstractContextManager[Service]:
    """A service whose workers are READER_WORKER, four jobs at a time."""
    return stand_in_service(
        factory.mktemp("reader"), ("reader_worker", READER_WORKER), TOWERBOARD_CPU_JOBS="4"
    )


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with reader_service(tmp_path_factory) as svc:
        yield svc


def live_job(service: Service, name: str) -> dict[str, Any]:
    job = service.submit(job_spec(name=name))
    service.wait_reported(job["id"])
    return job


def stop(service: Service, job: dict[str, Any]) -> None:
    service.client.post(f"/api/v1/jobs/{job['id']}/cancel").raise_for_status()
    service.wait_state(job["id"], "cancelled", "failed", "succeeded")


SELECT = """([selector, text]) => {
  // The characters of `text` in the first text node under `selector` that holds them.
  const root = document.querySelector(selector);
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const at = node.data.indexOf(text);
    if (at < 0) continue;
    const range = document.createRange();
    range.setStart(node, at);
    range.setEnd(node, at + text.length);
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    return getSelection().toString();
  }
  return null;
}"""
SELECTED = "() => getSelection().toString()"
CHARTS = ("loss", "accuracy", "examples/s")


def steps_on(page: Page, selector: str, steps: int) -> None:
    """Wait until the step shown in `selector` ("12 / 1000") has gone on by `steps`, and
    past a tick of the page's 1 s timers."""
    shown = "(s) => Number((document.querySelector(s).textContent.match(/\\d+/) || [0])[0])"
    start = page.evaluate(shown, selector)
    page.wait_for_function(f"([s, n]) => ({shown})(s) >= n", arg=[selector, start + steps])
    page.wait_for_timeout(1100)


def test_a_selected_id_or_name_stays_selected_while_the_job_reports(
    session: Session, service: Service
) -> None:
    """A running job's id (for `towerboard status ID`) or name, selected to copy in the
    jobs table or on its page: each was written anew at every report of the job, or every
    second with the page's age, and the selection went within a second."""
    job = live_job(service, "copied")
    page = session.page
    page.goto("/#/")
    row = f'tr[data-job="{job["id"]}"]'
    expect(page.locator(f"{row} .step")).to_contain_text("/ 1000")
    for part, text in ((".job-id", job["id"]), (".job-name", "copied")):
        assert page.evaluate(SELECT, [f"{row} {part}", text]) == text
        steps_on(page, f"{row} .step", 5)
        assert page.evaluate(SELECTED) == text, f"the table's {part} lost its selection"

    page.goto(f"/#/jobs/{job['id']}")
    expect(page.locator("#job-progress-text")).to_contain_text("/ 1000")
    for part, text in ((".meta", job["id"]), (".job-title", "copied")):
        assert page.evaluate(SELECT, [part, text]) == text
        steps_on(page, "#job-progress-text", 5)
        assert page.evaluate(SELECTED) == text, f"the page's {part} lost its selection"
    stop(service, job)
    assert session.errors == []


def test_a_worker_line_with_a_null_tower_time_stops_no_update(
    session: Session, service: Service
) -> None:
    """A trace line whose tower times hold a null is not taken, as the service does not
    take it: taken, every later event threw as the page drew the towers, and its charts
    and checkpoints stopped there."""
    job = live_job(service, "bad-tower")
    page = session.page
    page.goto(f"/#/jobs/{job['id']}")
    loss = page.locator('figure[data-chart="loss"]')
    page.wait_for_function(
        "() => Number(document.querySelector('figure[data-chart=\"loss\"]').dataset.points) >= 20"
    )
    expect(loss).to_be_visible()
    expect(page.locator("#towers")).not_to_contain_text("tower 1")
    stop(service, job)
    assert session.errors == []


def test_axis_labels_fit_at_millions_of_steps(session: Session, service: Service) -> None:
    """No step label runs into the next or off the chart's right edge, and no value label
    off its left edge, for a job at 9 million steps, a loss of 1e-5 and a million
    examples a second. At uPlot's fixed sizes "9,200,000" ran over "9,300,000" and "0.000005"
    read "000005"."""
    job = service.submit(job_spec(name="millions"))
    service.wait_state(job["id"], "succeeded")
    page = session.context.new_page()  # its own: the script below records from its start
    page.add_init_script(RECORD_CHART_TEXT)
    page.set_viewport_size({"width": 1300, "height": 860})
    page.goto(f"/#/jobs/{job['id']}")
    for chart in CHARTS:
        expect(page.locator(f'figure[data-chart="{chart}"]')).to_have_attribute("data-points", "9")
    for width in (1280, 900):  # three charts a row, then two
        page.wait_for_timeout(300)  # the last drawing at the width before
        page.evaluate("window.drawnText = []")
        page.set_viewport_size({"width": width, "height": 860})  # each chart is drawn again
        page.wait_for_function("new Set(window.drawnText.map((t) => t.chart)).size === 3")
        page.wait_for_timeout(300)
        drawn: list[dict[str, Any]] = page.evaluate("window.drawnText")
        for chart in CHARTS:
            texts = [t for t in drawn if t["chart"] == chart]
            steps = [t for t in texts if t["align"] == "center"]
            values = [t for t in texts if t["align"] == "right"]
            assert steps and values, (chart, texts)
            last = {t["text"]: t for t in steps}  # a redraw at one width writes the same
            labels = sorted(last.values(), key=lambda t: t["x"])
            # Two at least, each a step in the millions ("9,400,000"), written whole.
            assert len(labels) >= 2, (chart, labels)
            assert all(re.fullmatch(r"9,\d00,000", t["text"]) for t in labels), (chart, labels)
            for left, right in zip(labels, labels[1:], strict=False):
                assert left["x"] + left["width"] / 2 <= right["x"] - right["width"] / 2, (
                    f"{chart} at {width}px: {left['text']} runs into {right['text']}"
                )
            edge = labels[-1]
            assert edge["x"] + edge["width"] / 2 <= edge["canvasWidth"], (
                f"{chart} at {width}px: {edge['text']} is cut at the right edge"
            )
            for value in {t["text"]: t for t in values}.values():
                assert value["x"] - value["width"] >= 0, (
                    f"{chart} at {width}px: {value['text']} is cut at the left edge"
                )
    page.close()
    assert session.errors == []
