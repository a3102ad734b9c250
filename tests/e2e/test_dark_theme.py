"""The dashboard in the browser's light scheme and in its dark one (`prefers-color-scheme`,
as Playwright emulates it), in headless Chromium against a real service whose worker is
THEME_WORKER below: every visible text reads at WCAG AA on what it sits on, on the jobs
list, a running job's page, a failed one's and the submit form with the service's errors;
the keyboard's ring shows; and the charts are drawn in the scheme's colours, again when it
changes while the page is open. Screenshots of each page in each scheme are saved
(`theme-dark-job-running.png`, ...). No model is trained here, so none of it is slow."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.contrast import assert_contrast
from tests.e2e.test_dashboard import LAPTOP, Session, open_session
from tests.e2e.test_dashboard_details import tab_through
from tests.e2e.test_error_tail import assert_at_end
from tests.service.harness import Service, job_spec, stand_in_head, stand_in_service

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)

Scheme = Literal["light", "dark"]
SCHEMES: tuple[Scheme, ...] = ("light", "dark")

# `python -m theme_worker run --job-dir DIR`: 40 steps of loss, accuracy and examples/s at
# once, an eval every 10 and a log line each; then "failed" fails as a run that diverged
# (the job page's red box, its log tail and its hint), and any other name runs on until
# SIGTERM.
THEME_WORKER = (
    stand_in_head(100)
    + """\


def end(outcome, code, message):
    (job_dir / "result.json").write_text(json.dumps({"outcome": outcome, "message": message}))
    sys.exit(code)


progress(event="start", step=0, phase="starting")
for step in range(1, 41):
    loss = 2.3 / step**0.5
    progress(event="progress", step=step, loss=loss, accuracy=min(0.97, 0.1 + step / 45),
             examples_per_sec=900.0 + 40 * (step % 5))
    if step % 10 == 0:
        progress(event="eval", step=step, eval_loss=2.5 / step**0.5, eval_accuracy=step / 50)
    print(f"step {step}: loss {loss:.4f}", flush=True)
if name == "failed":
    end("failed", 1, "Loss became non-finite (nan) at step 41.")
while not stopped:
    time.sleep(0.05)
end("cancelled", 3, "stopped")
"""
)

# The page's boxes that take a lost stream, a replaced TensorBoard or a deletion to show:
# put on the jobs list as the page makes them (its own classes), to be read in each scheme.
RARE_BOXES = """async () => {
  const { h, stateBadge } = await import("/static/js/format.js");
  const { STATES } = await import("/static/js/api.js");
  document.getElementById("view").prepend(
    h("p", { class: "flash" }, "Job theme-gone (abc123) deleted."),
    h("div", { class: "live-notice" }, "Live updates interrupted; reconnecting… ",
      h("button", { class: "link", type: "button" }, "Reload")),
    h("div", { class: "tb-notice" }, "Another start replaced this TensorBoard. ",
      h("button", { class: "link", type: "button" }, "Open it again")),
    h("p", { id: "badges" }, STATES.map(stateBadge)));
  document.getElementById("token-bar").hidden = false;
  document.getElementById("token-message").textContent = "That token was refused.";
  const toggle = document.getElementById("token-toggle");
  toggle.hidden = false;
  toggle.classList.add("refused");
}"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("theme")
    # Two jobs at once on a CPU-only host: the failed one ends beside the running one.
    with stand_in_service(folder, ("theme_worker", THEME_WORKER), TOWERBOARD_CPU_JOBS="2") as svc:
        yield svc


@pytest.fixture(scope="module")
def jobs(service: Service) -> dict[str, dict[str, Any]]:
    """A job running with its charts drawn, and one that failed."""
    running = service.submit(job_spec(name="theme-running"))
    failed = service.submit(job_spec(name="failed"))
    service.wait_for(
        running["id"], lambda job: (job["progress"] or {}).get("step") == 40, what="step 40"
    )
    service.wait_state(failed["id"], "failed")
    return {"running": running, "failed": failed}


@pytest.fixture
def themed(browser: Browser, service: Service, scheme: Scheme) -> Iterator[Session]:
    """A laptop-wide page in `scheme`, as the browser says it prefers."""
    session = open_session(browser, service, LAPTOP)
    session.page.emulate_media(color_scheme=scheme)
    yield session
    session.context.close()


def open_job(page: Page, job_id: str, state: str) -> None:
    page.goto(f"/#/jobs/{job_id}")
    expect(page.locator(".job-heading .state")).to_have_text(state)
    expect(page.locator('.chart[data-chart="loss"] canvas')).to_be_visible()
    expect(page.locator("#log")).to_contain_text("step 40: loss")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_text_reads_in_each_scheme(
    scheme: Scheme, themed: Session, jobs: dict[str, dict[str, Any]], screenshots: Path
) -> None:
    """On the jobs list (hovered row, state badges, notices, the token bar), a running job's
    page (charts, the pointer's readout, spec, log), a failed one's (its red box and log
    tail) and the submit form with the service's field errors, every text reads at 4.5:1
    (3:1 large) and every field's edge at 3:1, on what it sits on, in either scheme; and
    the keyboard's ring reads at 3:1 through the job page. With the page's greys alone made
    dark, the token bar's light yellow stayed under the light text (1.15:1), as did a
    hovered row's near-white (1.17:1), and links kept a blue of 3.1:1 on the dark panel;
    in the light scheme the search field's edge was 2.86:1 on the page's grey."""
    page = themed.page
    page.goto("/#/")
    dark = page.evaluate("matchMedia('(prefers-color-scheme: dark)').matches")
    assert dark == (scheme == "dark")
    tag = scheme
    rows = page.locator(".jobs tbody tr")
    expect(rows).to_have_count(2)
    page.evaluate(RARE_BOXES)
    expect(page.locator("#badges .state")).to_have_count(5)
    rows.first.hover()
    assert_contrast(page, f"jobs list, {tag}")
    page.screenshot(path=screenshots / f"theme-{tag}-jobs.png")

    open_job(page, jobs["running"]["id"], "running")
    plot = page.locator('.chart[data-chart="loss"] .u-over')
    plot.hover()  # the readout, beside the pointer
    expect(page.locator('.chart[data-chart="loss"] .chart-readout')).to_be_visible()
    assert_contrast(page, f"running job, {tag}")
    page.screenshot(path=screenshots / f"theme-{tag}-job-running.png", full_page=True)
    page.locator(".crumbs a").focus()
    seen, faults = tab_through(page, 12)
    assert seen >= 8, seen
    assert faults == [], "\n".join(faults)

    open_job(page, jobs["failed"]["id"], "failed")
    expect(page.locator(".job-error")).to_contain_text("Loss became non-finite")
    expect(page.locator("#diverged-hint")).to_be_visible()
    assert_contrast(page, f"failed job, {tag}")
    page.screenshot(path=screenshots / f"theme-{tag}-job-failed.png", full_page=True)
    # Its log tail's last line whole, after the screenshot as in it: it was cut in half (the
    # screenshot's layout of the page at 1×1 had clamped the box's scroll).
    assert_at_end(page.locator(".job-error pre"), f"failed job, {tag}", "step 40: loss")

    page.goto("/#/submit")
    bad = {"data": {"format": "synthetic"}, "towers": 0, "batch_size": 32, "tower": 1}
    page.fill("#spec", json.dumps(bad, indent=2))
    page.click("#submit-job")
    expect(page.locator("#form-errors")).to_contain_text("Did you mean towers?")
    assert_contrast(page, f"submit form, {tag}")
    page.screenshot(path=screenshots / f"theme-{tag}-submit.png")
    assert themed.errors == []


# The loss chart's canvas, as drawn: how many of its pixels are each of `colours` ("rgb(r,
# g, b)"), and the highest contrast any pixel left of the plot (the value axis's labels
# and ticks) has with the panel.
CANVAS = """([colours]) => {
  const figure = document.querySelector('.chart[data-chart="loss"]');
  const canvas = figure.querySelector("canvas");
  const over = figure.querySelector(".u-over");
  const ratio = canvas.width / canvas.getBoundingClientRect().width;
  const { data } = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
  const wanted = colours.map((c) => c.match(/\\d+/g).map(Number));
  const counts = wanted.map(() => 0);
  const channel = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
  const luminance = (r, g, b) => 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b);
  const panel = getComputedStyle(figure.closest(".section")).backgroundColor.match(/\\d+/g).map(Number);
  const pl = luminance(...panel);
  const axisRight = over.offsetLeft * ratio - 2; // left of the plot's edge and its ticks
  let axis = 1;
  for (let i = 0; i < data.length; i += 4) {
    const [r, g, b, a] = [data[i], data[i + 1], data[i + 2], data[i + 3]];
    wanted.forEach(([R, G, B], k) => { if (a === 255 && r === R && g === G && b === B) counts[k]++; });
    if (a === 255 && (i / 4) % canvas.width < axisRight) {
      const l = luminance(r, g, b);
      axis = Math.max(axis, (Math.max(l, pl) + 0.05) / (Math.min(l, pl) + 0.05));
    }
  }
  return { counts, axis };
}"""

# Each scheme's chart colours, as app.css sets them.
CHART_COLOURS = """() => ["--chart-grid", "--chart-train", "--chart-axis"].map((name) => {
  const probe = document.createElement("span");
  probe.style.color = `var(${name})`;
  document.body.append(probe);
  const colour = getComputedStyle(probe).color;
  probe.remove();
  return colour;
})"""


def test_charts_follow_the_scheme_as_it_changes(
    session: Session, jobs: dict[str, dict[str, Any]]
) -> None:
    """The loss chart's grid and line are drawn in the light scheme's colours, and once the
    browser turns dark, with the page open, in the dark one's (none of the light grid's
    pixels left: its near-white lines had glared on the dark panel), and back; its axis
    labels read at 4.5:1 on the panel in both, and its legend's markers change too."""
    page = session.page
    page.emulate_media(color_scheme="light")
    open_job(page, jobs["running"]["id"], "running")
    light = page.evaluate(CHART_COLOURS)
    page.emulate_media(color_scheme="dark")
    dark = page.evaluate(CHART_COLOURS)
    assert light != dark and all(a != b for a, b in zip(light, dark, strict=True))
    # Light as opened, then dark and light again with the page open.
    page.emulate_media(color_scheme="light")
    turns: list[tuple[Scheme, list[str], list[str]]] = [
        ("light", light, dark),
        ("dark", dark, light),
        ("light", light, dark),
    ]
    for scheme, own, other in turns:
        page.emulate_media(color_scheme=scheme)
        # Redrawn at the change: this scheme's grid and train line, none of the other's grid.
        page.wait_for_function(
            f"() => ({CANVAS})([{json.dumps(own[:2] + other[:1])}])"
            ".counts.every((n, k) => (k < 2 ? n > 20 : n === 0))"
        )
        drawn = page.evaluate(CANVAS, [own])
        assert drawn["axis"] >= 4.5, (scheme, drawn)
        marker = page.locator('.chart[data-chart="loss"] .chart-key-line').first
        expect(marker).to_have_css("border-top-color", own[1])
    assert session.errors == []
