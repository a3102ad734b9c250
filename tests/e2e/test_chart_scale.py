"""A job's loss chart on a log scale, and the words the dashboard shares with the CLI, in
headless Chromium against a real service whose worker is SCALE_WORKER below (it writes the
progress lines a test needs, at once): the Log scale switch by the loss chart changes its
value axis to powers of ten, is remembered across a reload, and leaves out (and says so) a
value a log scale has no place for; the speed chart is "Examples/s" as the rest of the
dashboard says it, and an ended job's ETA is none, as `towerboard status` says."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, expect

from service.client import display
from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import Session
from tests.service.harness import Service, job_spec, stand_in_service

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)

# `python -m scale_worker run --job-dir DIR`, by its spec's name: "falling" reports 400
# steps with a loss falling from 2 to 5e-7 by a constant ratio a step (as a loss trained
# well does, by decades) and an ETA counting down; "zero" reports losses 1, 0.1, 0, 0.01 at
# steps 1 to 4, and "negative" 0 and -0.5 (a loss of the job's own code may be). Each then writes the trainer's `end` line (succeeded) and its result.
SCALE_WORKER = """\
import json, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
name = json.loads((job_dir / "spec.json").read_text())["name"]
lines = []


def progress(**line):
    lines.append(json.dumps({"time": time.time(), **line}))


if name == "falling":
    progress(event="start", step=0, total=400, phase="starting", towers=1)
    for step in range(1, 401):
        loss = 2 * (2.5e-7) ** (step / 400)
        progress(event="progress", step=step, total=400, loss=loss, accuracy=0.9,
                 examples_per_sec=1234.0, eta_seconds=(400 - step) * 0.1)
else:
    losses = [1.0, 0.1, 0.0, 0.01] if name == "zero" else [0.0, -0.5]
    progress(event="start", step=0, total=len(losses), phase="starting", towers=1)
    for step, loss in enumerate(losses, 1):
        progress(event="progress", step=step, total=len(losses), loss=loss, eta_seconds=1.0)
progress(event="end", step=step, outcome="succeeded", loss=loss)
with open(job_dir / "progress.jsonl", "a") as f:
    f.write("\\n".join(lines) + "\\n")
(job_dir / "result.json").write_text(json.dumps({"outcome": "succeeded", "message": name}))
"""
# A log axis's labels: powers of ten, below 1e-3 in exponent form as the pointer's readout
# writes a value (1e-6, not 0.000001).
POWER_OF_TEN = re.compile(r"^(1e-\d+|0\.0*1|1|10+)$")
# The "falling" loss's linear axis, 2 to 5e-7: its labels, all but 0 at the top.
LINEAR = ["0", "1", "2"]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(
        tmp_path_factory.mktemp("scale"), ("scale_worker", SCALE_WORKER)
    ) as service:
        yield service


@pytest.fixture(scope="module")
def falling(service: Service) -> str:
    return finished(service, "falling")


def finished(service: Service, name: str) -> str:
    """A job run to success by the stand-in worker; its id."""
    job = service.submit(job_spec(name=name))
    ended = service.wait_state(job["id"], "succeeded", "failed", "cancelled")
    assert ended["state"] == "succeeded", ended
    return str(job["id"])


def open_job(page: Page, job_id: str, points: int) -> Locator:
    """The job's page, its loss chart drawn with all `points`; the loss chart."""
    page.goto(f"/#/jobs/{job_id}")
    expect(page.locator(".job-heading .state")).to_have_text("succeeded")
    loss = page.locator('figure[data-chart="loss"]')
    expect(loss).to_have_attribute("data-points", str(points))
    expect(loss.locator("canvas").first).to_be_visible()
    return loss


def ticks(chart: Locator) -> list[str]:
    """The value axis's labels, as drawn, bottom up."""
    return (chart.get_attribute("data-y-ticks") or "").split()


def test_loss_chart_log_scale_is_switched_by_keyboard_and_remembered(
    session: Session, service: Service, falling: str, screenshots: Path
) -> None:
    """A loss from 2 to 5e-7 lay on the floor of a linear chart after its first steps: the
    Log scale switch by its caption spreads its decades, labelled as powers of ten, and the
    page opens on the scale last chosen."""
    page = session.page
    loss = open_job(page, falling, 400)
    switch = loss.get_by_role("checkbox", name="Log scale")
    expect(switch).not_to_be_checked()
    expect(loss).to_have_attribute("data-scale", "linear")
    assert ticks(loss) == LINEAR
    # The charts with no switch: accuracy's range is 0 to 1, a speed's changes little.
    for chart in ("accuracy", "examples/s"):
        expect(page.locator(f'figure[data-chart="{chart}"] input')).to_have_count(0)

    switch.focus()  # a checkbox: reached by Tab, switched by Space
    page.keyboard.press("Space")
    expect(switch).to_be_checked()
    expect(switch).to_be_focused()  # the plot is made anew; the focus stays on the switch
    expect(loss).to_have_attribute("data-scale", "log")
    # Powers of ten, bottom up, from the one below 5e-7 to the one above 2: every decade,
    # or every other (down from the top) where they are too short for a label each.
    expect(loss).to_have_attribute("data-y-ticks", re.compile(r"^1e-7 .* 10$"))
    labels = ticks(loss)
    assert all(POWER_OF_TEN.match(label) for label in labels), labels
    exponents = [round(math.log10(float(label))) for label in labels]
    steps = {b - a for a, b in zip(exponents, exponents[1:], strict=False)}
    assert len(steps) == 1 and min(steps) in (1, 2), labels
    assert "1e-5" in labels and "0.001" in labels, labels  # written as the readout writes
    expect(loss).to_have_attribute("data-drawn", "400")  # every value is above 0
    expect(loss.locator(".chart-unplotted")).to_be_hidden()
    page.screenshot(path=screenshots / "dashboard-loss-log-scale.png")

    page.reload()
    loss = open_job(page, falling, 400)
    expect(loss.get_by_role("checkbox", name="Log scale")).to_be_checked()
    expect(loss).to_have_attribute("data-scale", "log")
    expect(loss).to_have_attribute("data-y-ticks", " ".join(labels))

    loss.get_by_role("checkbox", name="Log scale").uncheck()
    expect(loss).to_have_attribute("data-scale", "linear")
    expect(loss).to_have_attribute("data-y-ticks", " ".join(LINEAR))
    page.reload()
    loss = open_job(page, falling, 400)
    expect(loss.get_by_role("checkbox", name="Log scale")).not_to_be_checked()
    expect(loss).to_have_attribute("data-y-ticks", " ".join(LINEAR))
    assert session.errors == []


def test_log_scale_leaves_out_a_loss_at_or_below_zero(
    session: Session, service: Service, screenshots: Path
) -> None:
    """A log scale has no place for 0: the line spans it, the chart says it left it out,
    and the pointer on its step still reads it."""
    page = session.page
    loss = open_job(page, finished(service, "zero"), 4)
    note = loss.locator(".chart-unplotted")
    expect(loss).to_have_attribute("data-drawn", "4")
    expect(note).to_be_hidden()
    loss.get_by_role("checkbox", name="Log scale").check()
    expect(loss).to_have_attribute("data-drawn", "3")
    expect(note).to_have_text("1 value at or below 0 not drawn on the log scale.")
    labels = ticks(loss)  # three decades, tall enough for 2 and 5 in each
    assert [label for label in labels if POWER_OF_TEN.match(label)] == ["0.01", "0.1", "1"]
    assert all(re.match(r"^0\.0?[125]$|^1$", label) for label in labels), labels
    expect(loss).to_have_attribute("data-x-range", "1..4")
    over = loss.locator(".u-over").bounding_box()
    assert over is not None
    page.mouse.move(over["x"] + over["width"] * 2 / 3, over["y"] + over["height"] / 2)  # step 3
    expect(loss.locator(".chart-readout")).to_have_text("step 3\ntrain 0")
    page.mouse.move(1, 1)
    page.screenshot(path=screenshots / "dashboard-loss-log-zero.png")
    # To a screen reader the chart says the values as reported, whatever the scale.
    expect(loss.locator(".chart-summary")).to_have_text("train 0.01 at step 4 (first 1 at step 1).")
    loss.get_by_role("checkbox", name="Log scale").uncheck()
    expect(loss).to_have_attribute("data-drawn", "4")
    expect(note).to_be_hidden()

    # On another job's page the chart opens on a log scale still; with no value above 0
    # it draws none, and says so.
    loss.get_by_role("checkbox", name="Log scale").check()
    loss = open_job(page, finished(service, "negative"), 2)
    expect(loss.get_by_role("checkbox", name="Log scale")).to_be_checked()
    expect(loss).to_have_attribute("data-drawn", "0")
    expect(loss.locator(".chart-unplotted")).to_have_text(
        "2 values at or below 0 not drawn on the log scale."
    )
    expect(loss.locator("canvas").first).to_be_visible()
    assert session.errors == []


def test_speed_and_eta_say_what_the_cli_says(
    session: Session, service: Service, falling: str
) -> None:
    """The speed chart was "Examples/sec" beside the "Examples/s" of the stats and the jobs
    table; an ended job's ETA said "0s" where `towerboard status` says "-": it has none."""
    page = session.page
    open_job(page, falling, 400)
    expect(page.get_by_role("figure", name="Examples/s", exact=True)).to_be_visible()
    expect(
        page.locator(".stat", has=page.locator('[data-stat="examples_per_sec"]'))
    ).to_contain_text("Examples/s")
    expect(page.locator("body")).not_to_contain_text("Examples/sec")
    job = service.client.get(f"/api/v1/jobs/{falling}").json()
    assert job["progress"]["eta_seconds"] == 0  # as the service folds a succeeded end
    assert display.eta(job) == "-"  # the CLI: no ETA
    expect(page.locator('[data-stat="eta"]')).to_have_text("—")

    page.goto("/#/")
    row = page.locator("tr", has=page.get_by_role("link", name="falling"))
    expect(row.locator("td.col-eta")).to_have_text("—")
    expect(page.get_by_role("columnheader", name="Examples/s")).to_be_visible()
    assert session.errors == []
