"""A job's charts by keyboard and by mouse, in headless Chromium against a real service whose
worker is ZOOM_WORKER below: each legend entry is a toggle button (Tab, Enter, Space,
`aria-pressed`) that hides its series; a chart's steps zoom and pan by keys while its plot
has the focus, and by a drag; "Reset zoom" shows while zoomed and undoes it, by keyboard or
mouse; the zoom stays through new reports, a change of scheme and of scale. uPlot's legend
toggled a series on a click alone, nothing said how to undo a zoom but a double-click, and
a running job's next report undid it. No model is trained here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, CDPSession, Locator, Page, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dark_theme import CANVAS, CHART_COLOURS
from tests.e2e.test_dashboard import PHONE, TERMINAL, Session, open_session
from tests.service.harness import Service, job_spec, stand_in_head, stand_in_service

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)

# `python -m zoom_worker run --job-dir DIR`: steps 1 to 100 of a falling loss at once, an
# eval every 10, then a step every 0.3 s until SIGTERM.
ZOOM_WORKER = (
    stand_in_head(100_000)
    + """\

progress(event="start", step=0, phase="starting")
step = 0
while not stopped:
    step += 1
    progress(event="progress", step=step, loss=2.3 / step**0.5, accuracy=min(0.97, step / 120),
             examples_per_sec=900.0 + 40 * (step % 5))
    if step % 10 == 0:
        progress(event="eval", step=step, eval_loss=2.5 / step**0.5, eval_accuracy=step / 150)
    if step >= 100:
        time.sleep(0.3)
(job_dir / "result.json").write_text(json.dumps({"outcome": "cancelled", "message": "stopped"}))
sys.exit(3)
"""
)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(tmp_path_factory.mktemp("zoom"), ("zoom_worker", ZOOM_WORKER)) as svc:
        yield svc


@pytest.fixture(scope="module")
def running(service: Service) -> Iterator[str]:
    job = service.submit(job_spec(name="zoom"))
    service.wait_for(
        job["id"], lambda job: ((job["progress"] or {}).get("step") or 0) >= 100, what="step 100"
    )
    yield str(job["id"])
    service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
    service.wait_state(job["id"], *TERMINAL)


def open_loss(page: Page, job_id: str) -> Locator:
    """The job's page, its loss chart drawn; the loss chart."""
    page.emulate_media(color_scheme="light")
    page.goto(f"/#/jobs/{job_id}")
    loss = page.get_by_role("figure", name="Loss", exact=True)
    expect(loss.locator("canvas").first).to_be_visible()
    expect(loss).to_have_attribute("data-points", re.compile(r"^\d{3,}$"))
    return loss


def x_range(chart: Locator) -> tuple[float, float]:
    low, high = (chart.get_attribute("data-x-range") or "").split("..")
    return float(low), float(high)


def train_pixels(page: Page) -> int:
    """How many of the loss chart's pixels are the train line's colour."""
    colours = page.evaluate(CHART_COLOURS)
    return int(page.evaluate(CANVAS, [[colours[1]]])["counts"][0])


def test_legend_entries_are_toggle_buttons(session: Session, running: str) -> None:
    """Tab reaches each series' legend button after the plot; Enter hides its line (the
    button says so with aria-pressed, and the pointer's readout leaves it out), Space shows
    it again. The summary still says every series' values: it is of the data, not the view."""
    page = session.page
    loss = open_loss(page, running)
    plot = loss.get_by_role("img", name="Loss plot")
    train = loss.get_by_role("button", name="train", exact=True)
    eval_ = loss.get_by_role("button", name="eval", exact=True)
    expect(train).to_have_attribute("aria-pressed", "true")
    expect(eval_).to_have_attribute("aria-pressed", "true")
    summary = loss.locator(".chart-summary")
    expect(summary).to_contain_text("train ")
    plot.focus()
    page.keyboard.press("Tab")  # not kept by the plot: on to the legend
    expect(train).to_be_focused()
    assert train_pixels(page) > 20
    page.keyboard.press("Enter")
    expect(train).to_have_attribute("aria-pressed", "false")
    page.wait_for_function(f"() => ({CANVAS})([({CHART_COLOURS})().slice(1, 2)]).counts[0] === 0")
    loss.locator(".u-over").hover()
    readout = loss.locator(".chart-readout")
    expect(readout).to_contain_text("eval")
    expect(readout).not_to_contain_text("train")
    expect(summary).to_contain_text(re.compile(r"^train .*; eval "))
    page.keyboard.press("Shift+Tab")
    expect(plot).to_be_focused()
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    expect(eval_).to_be_focused()
    page.keyboard.press("Shift+Tab")
    expect(train).to_be_focused()
    page.keyboard.press("Space")
    expect(train).to_have_attribute("aria-pressed", "true")
    page.wait_for_function(f"() => ({CANVAS})([({CHART_COLOURS})().slice(1, 2)]).counts[0] > 20")
    # A click toggles it too, as uPlot's legend did.
    eval_.click()
    expect(eval_).to_have_attribute("aria-pressed", "false")
    eval_.click()
    expect(eval_).to_have_attribute("aria-pressed", "true")
    assert session.errors == []


def test_zoom_by_keys_kept_through_reports_and_reset_by_keyboard(
    session: Session, running: str, screenshots: Path
) -> None:
    """With the plot focused, + halves the steps shown, → moves them on, − widens them
    again; Reset zoom shows with the steps it shows while zoomed, and stays through new
    reports, a change of scheme, of scale, and a series hidden; pressed by the keyboard it
    shows every step, and the focus goes back to the plot."""
    page = session.page
    loss = open_loss(page, running)
    plot = loss.get_by_role("img", name="Loss plot")
    reset = loss.get_by_role("button", name="Reset zoom")
    expect(reset).to_be_hidden()
    expect(plot).to_have_attribute("aria-describedby", "chart-keys")
    expect(page.locator("#chart-keys")).to_contain_text("+ and − zoom")
    low, high = x_range(loss)
    plot.focus()
    page.keyboard.press("+")
    expect(loss).to_have_attribute("data-zoom", re.compile(r"\.\."))
    zoomed = x_range(loss)
    # Half of the steps shown at the press: the job reports a step every 0.3 s, so one may
    # have come between reading the range and the press (each adds half a step here).
    assert (high - low) / 2 <= zoomed[1] - zoomed[0] <= (high - low) / 2 + 2
    expect(reset).to_be_visible()
    expect(loss.locator(".chart-zoom-text")).to_have_text(
        re.compile(r"^Steps [\d,]+–[\d,]+ shown$")
    )
    expect(loss.locator(".chart-zoom-text")).to_have_attribute("role", "status")
    page.keyboard.press("ArrowRight")
    moved = x_range(loss)
    assert moved[0] > zoomed[0] and moved[1] - moved[0] == pytest.approx(zoomed[1] - zoomed[0])
    page.keyboard.press("Home")
    assert x_range(loss)[0] == low
    page.keyboard.press("+")
    kept = x_range(loss)
    # New reports come: the steps shown stay those zoomed to (they were all shown again).
    points = int(loss.get_attribute("data-points") or 0)
    page.wait_for_function(
        "n => Number(document.querySelector('figure[data-chart=\"loss\"]').dataset.points) > n",
        arg=points,
    )
    assert x_range(loss) == kept
    # A change of scheme and of scale, with a series hidden: the plot is made again, zoomed,
    # and its status line (a live region) is not rewritten, to be spoken again.
    loss.get_by_role("button", name="eval", exact=True).click()
    loss.locator(".chart-zoom-text").evaluate(
        """(line) => { window.zoomSaid = 0; new MutationObserver(() => window.zoomSaid++)
          .observe(line, { childList: true, characterData: true, subtree: true }); }"""
    )
    page.emulate_media(color_scheme="dark")
    page.wait_for_function(f"() => ({CANVAS})([({CHART_COLOURS})().slice(1, 2)]).counts[0] > 20")
    assert x_range(loss) == kept
    assert page.evaluate("window.zoomSaid") == 0
    loss.get_by_role("checkbox", name="Log scale").check()
    expect(loss).to_have_attribute("data-scale", "log")
    assert x_range(loss) == kept
    expect(loss.get_by_role("button", name="eval", exact=True)).to_have_attribute(
        "aria-pressed", "false"
    )
    loss.get_by_role("checkbox", name="Log scale").uncheck()
    loss.get_by_role("button", name="eval", exact=True).click()
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        loss.screenshot(path=screenshots / f"chart-zoomed-{scheme}.png")
    page.emulate_media(color_scheme="light")
    # − widens until every step shows: not zoomed then, and Reset zoom gone.
    plot.focus()
    for _ in range(12):
        page.keyboard.press("-")
    expect(reset).to_be_hidden()
    expect(loss).not_to_have_attribute("data-zoom", re.compile("."))
    page.keyboard.press("+")
    expect(reset).to_be_visible()
    # Tab from the plot: the legend's two buttons, then Reset zoom; Enter on it.
    for _ in range(3):
        page.keyboard.press("Tab")
    expect(reset).to_be_focused()
    page.keyboard.press("Enter")
    expect(reset).to_be_hidden()
    expect(plot).to_be_focused()  # not lost to the page's top
    expect(loss.locator(".chart-zoom-text")).to_have_text("")
    low2, high2 = x_range(loss)
    assert low2 == low and high2 >= high
    assert session.errors == []


def test_drag_zoom_shows_reset_zoom_and_a_double_click_undoes_it(
    session: Session, running: str
) -> None:
    """A drag across the plot zooms its steps, and Reset zoom shows; a click on it, or a
    double-click on the plot, shows every step again."""
    page = session.page
    loss = open_loss(page, running)
    reset = loss.get_by_role("button", name="Reset zoom")
    over = loss.locator(".u-over")

    def drag() -> None:
        box = over.bounding_box()
        assert box is not None
        y = box["y"] + box["height"] / 2
        page.mouse.move(box["x"] + box["width"] * 0.3, y)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.6, y, steps=5)
        page.mouse.up()
        expect(reset).to_be_visible()
        low, high = x_range(loss)
        steps = int(loss.get_attribute("data-points-loss") or 0)
        assert 0 < high - low < steps / 2, (low, high, steps)

    drag()
    reset.click()
    expect(reset).to_be_hidden()
    expect(loss).not_to_have_attribute("data-zoom", re.compile("."))
    drag()
    over.dblclick()
    expect(reset).to_be_hidden()
    expect(loss).not_to_have_attribute("data-zoom", re.compile("."))
    assert session.errors == []


def test_keys_left_to_the_page_when_they_zoom_nothing(session: Session, running: str) -> None:
    """Not zoomed, ← and → move no steps, so the page has them (it scrolls, as it did); Ctrl
    with + is the browser's own zoom, never the chart's."""
    page = session.page
    loss = open_loss(page, running)
    plot = loss.get_by_role("img", name="Loss plot")
    plot.focus()
    prevented = page.evaluate(
        """() => {
          const plot = document.querySelector('figure[data-chart="loss"] .chart-plot');
          const press = (key, ctrlKey = false) => !plot.dispatchEvent(new KeyboardEvent(
            "keydown", { key, ctrlKey, bubbles: true, cancelable: true }));
          return [press("ArrowLeft"), press("ArrowRight"), press("+", true), press("x")];
        }"""
    )
    assert prevented == [False, False, False, False]
    expect(loss).not_to_have_attribute("data-zoom", re.compile("."))
    assert session.errors == []


def swipe(cdp: CDPSession, start: tuple[float, float], end: tuple[float, float]) -> None:
    """A finger down at `start`, moved to `end` in 10 steps, and lifted: touch events as a
    touch screen sends them (CDP `Input.dispatchTouchEvent`), through Chromium's own
    handling of them (pointer events, `touch-action`, a scroll)."""
    cdp.send("Input.dispatchTouchEvent", {"type": "touchStart", "touchPoints": [
        {"x": start[0], "y": start[1]}]})  # fmt: skip
    for i in range(1, 11):
        x = start[0] + (end[0] - start[0]) * i / 10
        y = start[1] + (end[1] - start[1]) * i / 10
        cdp.send("Input.dispatchTouchEvent", {"type": "touchMove", "touchPoints": [
            {"x": x, "y": y}]})  # fmt: skip
    cdp.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []})


def test_a_finger_drag_zooms_and_an_upward_swipe_scrolls(
    browser: Browser, service: Service, running: str
) -> None:
    """On a phone a finger's drag across a chart did nothing (uPlot's drag is the
    mouse's): a sideways one zooms its steps as a mouse drag does, Reset zoom shows, and an
    upward swipe on the plot still scrolls the page, zooming nothing."""
    phone = open_session(browser, service, PHONE, touch=True)
    try:
        page = phone.page
        loss = open_loss(page, running)
        over = loss.locator(".u-over")
        assert over.evaluate("el => getComputedStyle(el).touchAction") == "pan-y pinch-zoom"
        over.scroll_into_view_if_needed()
        cdp = page.context.new_cdp_session(page)
        box = over.bounding_box()
        assert box is not None
        middle = box["y"] + box["height"] / 2

        # Up the screen: the page scrolls, the chart is as it was.
        scrolled = page.evaluate("window.scrollY")
        swipe(
            cdp,
            (box["x"] + box["width"] * 0.5, middle + 60),
            (box["x"] + box["width"] * 0.5, middle - 60),
        )
        page.wait_for_function(f"window.scrollY > {scrolled}")
        expect(loss).not_to_have_attribute("data-zoom", re.compile("."))

        box = over.bounding_box()
        assert box is not None
        middle = box["y"] + box["height"] / 2
        before = x_range(loss)
        swipe(cdp, (box["x"] + box["width"] * 0.2, middle), (box["x"] + box["width"] * 0.6, middle))
        reset = loss.get_by_role("button", name="Reset zoom")
        expect(reset).to_be_visible()
        expect(loss).to_have_attribute("data-zoom", re.compile("."))
        low, high = x_range(loss)
        assert before[0] < low < high < before[1], (before, low, high)
        # About the 20% to 60% of the steps it spanned.
        span = before[1] - before[0]
        assert abs((low - before[0]) / span - 0.2) < 0.05, (before, low)
        assert abs((high - before[0]) / span - 0.6) < 0.05, (before, high)
        expect(loss.locator(".chart-zoom-text")).to_have_text(re.compile(r"^Steps \d+–\d+ shown$"))
        expect(loss.locator(".u-select")).to_have_css("width", "0px")  # the selection gone
        # Clicked, not tapped: a tap soon after a swipe may only stop the page's fling.
        reset.click()
        expect(reset).to_be_hidden()
        expect(loss).not_to_have_attribute("data-zoom", re.compile("."))
        assert phone.errors == []
    finally:
        phone.context.close()
