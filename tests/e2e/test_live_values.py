"""What a job's numbers look like as they come, in headless Chromium against a real service
whose worker is LIVE_WORKER below (no model is trained here): a job id selected to copy
stays selected while the job reports, a worker's odd line stops none of the page's
updates, and the charts' axis labels fit at millions of steps and a loss near 1e-5."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import Session
from tests.service.harness import Service, job_spec, stand_in_service

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)

# `python -m live_worker run --job-dir DIR`, by its spec's name: "millions" reports steps
# 9,000,000 to 9,800,000 with a loss falling from 1e-5 and a million examples a second,
# then succeeds; any other takes a step every 0.1 s (loss 1/step) until SIGTERM, and
# "bad-tower" at step 3 writes a trace line whose tower times hold a null (the trainer
# never does; the service keeps no such list).
LIVE_WORKER = """\
import json, signal, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
name = json.loads((job_dir / "spec.json").read_text())["name"]
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))


def progress(**line):
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), **line}) + "\\n")


def end(outcome, code):
    (job_dir / "result.json").write_text(json.dumps({"outcome": outcome, "message": name}))
    sys.exit(code)


if name == "millions":
    progress(event="start", step=9_000_000, total=10_000_000, phase="starting")
    for k in range(9):
        progress(event="progress", step=9_000_000 + 100_000 * k, total=10_000_000,
                 loss=1e-5 / (k + 1), accuracy=0.5, examples_per_sec=1234567.0)
    end("succeeded", 0)
progress(event="start", step=0, total=1000, phase="starting")
step = 0
while not stopped:
    time.sleep(0.1)
    step += 1
    progress(event="progress", step=step, total=1000, phase="training", loss=1 / step)
    if name == "bad-tower" and step == 3:
        progress(event="trace", step=step, total=1000, tower_ms=[1.5, None])
end("cancelled", 3)
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(
        tmp_path_factory.mktemp("live"), ("live_worker", LIVE_WORKER), TOWERBOARD_CPU_JOBS="4"
    ) as svc:
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
