"""The dashboard at volume, in headless Chromium against a real service: a job page of a job
that reported tens of thousands of times draws a bounded number of points (every point, as
it was, froze the page for seconds at every progress event)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import Session
from tests.service.harness import Service, job_spec, stand_in_service

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)]

REPORTS = 5_000
# `python -m many_worker run --job-dir DIR`: REPORTS progress lines at once, an eval every
# 500 steps, then success.
MANY_WORKER = f"""\
import json, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
now = time.time()
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
    for chart in ("loss", "accuracy", "examples/sec"):
        figure = page.locator(f'figure[data-chart="{chart}"]')
        assert int(figure.get_attribute("data-points") or 0) >= 1500
        drawn = int(figure.get_attribute("data-drawn") or 0)
        assert 0 < drawn <= 2 * MOST_DRAWN_A_SERIES
    loss = page.locator('figure[data-chart="loss"]')
    expect(loss).to_have_attribute("data-points-eval_loss", str(2 * REPORTS // 500))
    page.screenshot(path=screenshots / "dashboard-many-reports.png")
    assert session.errors == []


THIN = """async () => {
  const { align, thin } = await import("/static/js/charts.js");
  const n = 100000;
  const loss = Array.from({ length: n }, (_, i) => ({ step: i + 1, value: i === 54321 ? 9 : -i }));
  const evals = Array.from({ length: 200 }, (_, i) => ({ step: 500 * (i + 1), value: 0.5 }));
  const data = align(["loss", "eval"], { loss, eval: evals });
  const out = thin(data);
  const kept = (k) => out[k].filter((y) => y !== null).length;
  return {
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
