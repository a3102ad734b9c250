"""The dashboard at volume, in headless Chromium against a real service: a job page of a job
that reported tens of thousands of times draws a bounded number of points (every point, as
it was, froze the page for seconds at every progress event), and a page left open on a job
as it reports them holds a bounded number (every point, as it was, grew without end)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import Session
from tests.service.harness import Service, job_spec, stand_in_service

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)]

REPORTS = 5_000
LIVE_REPORTS = 20_000
SPIKE, DIP = 12_345, 6_789  # the live job's highest and lowest loss
# 2,000 reports a second: a stream that falls 1,024 events behind is ended (service/
# events.py), and at 5,000 a second a page or a service held up for 0.2 s on a loaded host
# fell that far behind (towerboard_event_streams_lagged_total 1); now it takes 0.5 s.
LIVE_BATCH = 200
# `python -m many_worker run --job-dir DIR`, by its spec's name: "many" writes REPORTS
# progress lines at once, an eval every 500 steps, then succeeds; "live" writes its start
# line, waits for a `go` file in its run directory, then reports steps 1 to LIVE_REPORTS,
# LIVE_BATCH lines every 0.1 s (a read of the service's takes them a few hundred at a time,
# and its event stream sends them on as they come), its loss a wave with one spike and one
# dip, an eval every 1,000 steps, then succeeds.
MANY_WORKER = f"""\
import json, math, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
name = json.loads((job_dir / "spec.json").read_text())["name"]
now = time.time()
if name == "live":
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write(json.dumps(dict(event="start", step=0, total={LIVE_REPORTS}, time=now)) + "\\n")
    while not (job_dir / "go").exists():
        time.sleep(0.05)
    for first in range(1, {LIVE_REPORTS} + 1, {LIVE_BATCH}):
        lines = []
        for step in range(first, first + {LIVE_BATCH}):
            loss = {{{SPIKE}: 50.0, {DIP}: 0.001}}.get(step, 1.0 + 0.5 * math.sin(step / 50))
            lines.append(dict(event="progress", step=step, total={LIVE_REPORTS}, time=now,
                              loss=loss, accuracy=0.5 + 0.4 * math.sin(step / 70),
                              examples_per_sec=1000.0 + step % 7, phase="training"))
            if step % 1000 == 0:
                lines.append(dict(event="eval", step=step, total={LIVE_REPORTS}, time=now,
                                  eval_loss=1.0, eval_accuracy=0.8))
        with open(job_dir / "progress.jsonl", "a") as f:
            f.write("".join(json.dumps(line) + "\\n" for line in lines))
        time.sleep(0.1)
    (job_dir / "result.json").write_text(json.dumps({{"outcome": "succeeded", "message": "ok"}}))
    sys.exit(0)
lines = [dict(event="start", step=0, total={2 * REPORTS}, phase="starting", time=now)]
for k in range(1, {REPORTS} + 1):
    step = 2 * k
    lines.append(dict(event="progress", step=step, total={2 * REPORTS}, time=now,
                      loss=1.0 / k, accuracy=1.0 - 1.0 / (k + 1),
                      examples_per_sec=1000.0 + k % 7, learning_rate=0.01, phase="training"))
    if step % 500 == 0:
        lines.append(dict(event="eval", step=step, total={2 * REPORTS}, time=now,
                          eval_loss=0.5, eval_accuracy=0.8))
(job_dir / "progress.jsonl").write_text("".join(json.dumps(line) + "\\n" for line in lines))
(job_dir / "result.json").write_text(json.dumps({{"outcome": "succeeded", "message": "ok"}}))
"""
# thin(): at most about 2 x 600 points a series, and what the other series add at theirs.
MOST_DRAWN_A_SERIES = 2 * 600 + 2


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(tmp_path_factory.mktemp("stand-in"), ("many_worker", MANY_WORKER)) as svc:
        yield svc


def test_a_job_of_many_reports_draws_a_bounded_chart(
    session: Session, service: Service, screenshots: Path
) -> None:
    job = service.submit(job_spec(name="many"))
    assert service.wait_state(job["id"], "succeeded", "failed")["state"] == "succeeded"
    page = session.page
    page.goto(f"/#/jobs/{job['id']}")
    # Every report, or the service's thinned series (GET /metrics?points=): either way more
    # than a chart draws.
    page.wait_for_function(
        "Number(document.querySelector('figure[data-chart=\"loss\"]')"
        "?.getAttribute('data-points-loss')) >= 1500",
        timeout=60_000,
    )
    for chart in ("loss", "accuracy", "examples/s"):
        figure = page.locator(f'figure[data-chart="{chart}"]')
        assert int(figure.get_attribute("data-points") or 0) >= 1500
        drawn = int(figure.get_attribute("data-drawn") or 0)
        assert 0 < drawn <= 2 * MOST_DRAWN_A_SERIES
    loss = page.locator('figure[data-chart="loss"]')
    expect(loss).to_have_attribute("data-points-eval_loss", str(2 * REPORTS // 500))
    page.screenshot(path=screenshots / "dashboard-many-reports.png")
    assert session.errors == []


THIN = """async () => {
  const { align, thin, thinPoints } = await import("/static/js/charts.js");
  const n = 100000;
  const loss = Array.from({ length: n }, (_, i) => ({ step: i + 1, value: i === 54321 ? 9 : -i }));
  const evals = Array.from({ length: 200 }, (_, i) => ({ step: 500 * (i + 1), value: 0.5 }));
  const data = align(["loss", "eval"], { loss, eval: evals });
  const out = thin(data);
  const kept = (k) => out[k].filter((y) => y !== null).length;
  // A series as the job page holds it, thinned where it is: thin()'s steps, its own points.
  const held = thinPoints(loss, 600);
  const alone = thin(align(["loss"], { loss }))[0];
  const given = new Set(loss);
  return {
    held: held.length === alone.length && held.every((p, i) => p.step === alone[i] && given.has(p)),
    aligned: data[0].length, steps: out[0].length, loss: kept(1), eval: kept(2),
    spike: out[0][out[1].indexOf(9)], first: out[0][0], last: out[0].at(-1),
    lastLoss: out[1].at(-1), ordered: out[0].every((x, i) => i === 0 || out[0][i - 1] < x),
  };
}"""


def test_thinning_keeps_extremes_ends_and_every_sparse_point(session: Session) -> None:
    page = session.page
    page.goto("/#/")
    result = page.evaluate(THIN)
    assert result["aligned"] == 100_000
    assert result["loss"] <= MOST_DRAWN_A_SERIES + 200  # plus its values at the eval steps
    assert result["eval"] == 200  # sparse: every point stays
    assert result["spike"] == 54_322  # a bucket's highest point
    assert (result["first"], result["last"], result["lastLoss"]) == (1, 100_000, -99_999)
    assert result["ordered"]
    assert result["held"]


# static/js/job.js: the most points a job page holds a series, and what it reads of one.
HELD_POINTS = 8_000
CHART_POINTS = 2_000
# Every uPlot chart the page makes, into window.plots (what one draws is its `data`): the
# vendored script's `var uPlot = ...` assigns the global, which this wraps.
KEEP_PLOTS = """
let made;
Object.defineProperty(window, "uPlot", { configurable: true, get: () => made, set: (real) => {
  made = function (...args) {
    const plot = new real(...args);
    (window.plots ||= []).push(plot);
    return plot;
  };
  Object.setPrototypeOf(made, real); // its statics (pxRatio) read through
} });
"""
# Every count of loss points the loss chart says it holds, in order, into window.held.
WATCH_HELD = """() => {
  const figure = document.querySelector('figure[data-chart="loss"]');
  window.held = [];
  new MutationObserver(() => window.held.push(Number(figure.dataset.pointsLoss)))
    .observe(figure, { attributes: true, attributeFilter: ["data-points-loss"] });
}"""
DRAWN_LOSS = """() => {
  const plot = window.plots.filter((p) => p.root.closest('figure[data-chart="loss"]')).at(-1);
  return { steps: Array.from(plot.data[0]), loss: Array.from(plot.data[1]),
           eval: Array.from(plot.data[2]) };
}"""


def test_a_page_left_open_on_a_long_job_holds_a_bounded_series(
    session: Session, service: Service
) -> None:
    """A job page open while its job reports LIVE_REPORTS times (on its event stream, none
    missed) holds at most HELD_POINTS points a series, and its loss chart still draws the
    first and the last step, the spike and the dip, and every eval point."""
    job = service.submit(job_spec(name="live"))
    service.wait_reported(job["id"])  # its start line: it waits for `go`
    page = session.page
    page.add_init_script(KEEP_PLOTS)
    page.goto(f"/#/jobs/{job['id']}")
    expect(page.locator(".job-heading .state")).to_have_text("running")
    page.evaluate(WATCH_HELD)
    # The page's own stream is open (it follows no other while its job runs): every line
    # from here on comes to it live.
    deadline = time.monotonic() + 30
    while "towerboard_event_streams 1\n" not in service.client.get("/metrics").text:
        assert time.monotonic() < deadline, "the job page's event stream did not open"
        time.sleep(0.05)
    (service.data_dir / "runs" / job["id"] / "go").touch()
    assert service.wait_state(job["id"], "succeeded", "failed")["state"] == "succeeded"
    expect(page.locator(".job-heading .state")).to_have_text("succeeded", timeout=60_000)
    loss = page.locator('figure[data-chart="loss"]')
    expect(loss.locator(".chart-summary")).to_contain_text(f"at step {LIVE_REPORTS} (first ")
    metrics = service.client.get("/metrics").text
    assert "towerboard_event_streams_lagged_total 0\n" in metrics, metrics
    held: list[int] = page.evaluate("window.held")
    # It took in more live than it reads, and thinned what it held as it passed the cap.
    assert max(held) > 2 * CHART_POINTS, held
    assert max(held) <= HELD_POINTS, max(held)
    assert any(later < earlier for earlier, later in zip(held, held[1:], strict=False)), held
    for chart in ("loss", "accuracy", "examples/s"):
        figure = page.locator(f'figure[data-chart="{chart}"]')
        assert 0 < int(figure.get_attribute("data-points") or 0) <= 2 * HELD_POINTS
    drawn = page.evaluate(DRAWN_LOSS)
    steps, values = drawn["steps"], drawn["loss"]
    assert (steps[0], steps[-1]) == (1, LIVE_REPORTS)
    assert values[steps.index(SPIKE)] == 50.0 and max(v for v in values if v is not None) == 50.0
    assert values[steps.index(DIP)] == 0.001
    assert min(v for v in values if v is not None) == 0.001
    eval_steps = [step for step, y in zip(steps, drawn["eval"], strict=True) if y is not None]
    assert eval_steps == list(range(1000, LIVE_REPORTS + 1, 1000))
    assert session.errors == []
