"""The dashboard's order and wording as a phone or keyboard user meets them, in headless
Chromium against a real service whose worker is the harness's stand-in (it runs until
cancelled): the page comes before the devices panel at every width, in the page, on the
screen and to the keyboard; "Skip to content" is the keyboard's first stop and takes it
to the page; a queued job's wait is said in one unit (a CPU host's job slot, a GPU host's
GPUs) in the jobs table, on its page and by `towerboard status ID`. No model is trained
here, so none of it is marked slow."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import LAPTOP, PHONE, Session, open_session
from tests.e2e.test_jobs_table_live import cancel
from tests.service.harness import Service, job_spec, stand_in_service
from tests.service.test_client import towerboard

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)

TABLET: ViewportSize = {"width": 1000, "height": 800}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(tmp_path_factory.mktemp("stand-in")) as svc:
        yield svc


@pytest.fixture(scope="module")
def jobs(service: Service) -> Iterator[dict[str, dict[str, Any]]]:
    """A running job, which holds the one job slot (so the devices panel has a link, to
    the keyboard a stop of its own), and a job of two towers queued behind it."""
    running = service.submit(job_spec(name="holds-the-slot"))
    service.wait_state(running["id"], "running")
    queued = service.submit(job_spec(name="two-towers", towers=2))
    yield {"running": running, "queued": queued}
    cancel(service, queued, running)


# Where each of the page's regions is: its place in the page (DOM order) and its box.
REGIONS = """() => {
  const regions = [...document.querySelectorAll(".layout > main, .layout > aside")]
    .filter((el) => el.getClientRects().length);
  const [first, second] = regions;
  const box = (el) => el.getBoundingClientRect();
  return {
    names: regions.map((el) => el.localName),
    domFirst: Boolean(first.compareDocumentPosition(second) & Node.DOCUMENT_POSITION_FOLLOWING),
    boxes: regions.map((el) => ({ top: box(el).top + scrollY, bottom: box(el).bottom + scrollY,
                                  left: box(el).left, right: box(el).right })),
  };
}"""

# The element the keyboard is on: its region, and where it is on the page.
FOCUSED = """() => {
  const el = document.activeElement;
  const region = el.closest("#skip-link") ? "skip" : el.closest(".topbar") ? "header"
    : el.closest("#view") ? "main" : el.closest(".side") ? "aside" : el.localName;
  const box = el.getBoundingClientRect();
  return { region, id: el.id, top: box.top + scrollY, left: box.left };
}"""

RANK = {"skip": 0, "header": 1, "main": 2, "aside": 3}


def tab_through(page: Page, most: int = 60) -> list[dict[str, Any]]:
    """Every stop of the keyboard from the page's top, in order, once round."""
    page.evaluate("document.activeElement.blur()")
    stops: list[dict[str, Any]] = []
    for _ in range(most):
        page.keyboard.press("Tab")
        stop = page.evaluate(FOCUSED)
        if stop["region"] == "body" or (stops and stop == stops[0]):
            break
        stops.append(stop)
    return stops


def order_agrees(page: Page, stacked: bool) -> None:
    """The view comes before the devices panel in the page, on the screen (above it when
    `stacked`, else to its left) and to the keyboard (every stop in the view before any
    in the panel, and from the skip link down)."""
    regions = page.evaluate(REGIONS)
    assert regions["names"] == ["main", "aside"] and regions["domFirst"], regions
    main, aside = regions["boxes"]
    if stacked:
        assert main["bottom"] <= aside["top"], regions  # the panel under the page
    else:
        assert main["right"] <= aside["left"] and aside["top"] < main["bottom"], regions
    stops = tab_through(page)
    ranks = [RANK[stop["region"]] for stop in stops]
    assert ranks == sorted(ranks), stops
    assert {"skip", "main", "aside"} <= {stop["region"] for stop in stops}, stops
    if stacked:  # the keyboard goes down the screen, region by region
        last_in_main = max(stop["top"] for stop in stops if stop["region"] == "main")
        first_in_aside = min(stop["top"] for stop in stops if stop["region"] == "aside")
        assert last_in_main < first_in_aside, stops


@pytest.mark.parametrize(
    ("viewport", "stacked"), [(PHONE, True), (TABLET, True), (LAPTOP, False)],
    ids=["phone", "tablet", "laptop"],
)  # fmt: skip
def test_the_page_comes_before_the_devices_panel(
    browser: Browser,
    service: Service,
    jobs: dict[str, dict[str, Any]],
    viewport: ViewportSize,
    stacked: bool,
    screenshots: Path,
) -> None:
    """On a phone the devices panel came first on every page (`order: -1`), the job or the
    form a screen below it, and last to the keyboard: after the page's last control the
    focus jumped back up to it. The page comes first and the panel after it, in the page,
    on the screen and to the keyboard, at every width."""
    session = open_session(browser, service, viewport)
    page = session.page
    running = jobs["running"]["id"]
    name = viewport["width"]
    try:
        page.goto("/#/")
        expect(page.locator(f'tr[data-job="{jobs["queued"]["id"]}"]')).to_be_visible()
        expect(page.locator('.device[data-device="cpu:0"] .device-job-id')).to_have_text(running)
        order_agrees(page, stacked)
        page.screenshot(path=screenshots / f"order-{name}-jobs.png", full_page=True)

        page.goto(f"/#/jobs/{running}")
        expect(page.locator(".job-heading .state")).to_have_text("running")
        order_agrees(page, stacked)
        page.screenshot(path=screenshots / f"order-{name}-job.png", full_page=True)

        page.goto("/#/submit")
        expect(page.locator("#spec")).to_be_visible()
        order_agrees(page, stacked)
        # The form's errors and hints come after it (beside it on a laptop): under Submit
        # job on a narrow screen, where they came above the form.
        page.fill("#spec", "{")
        page.locator("#submit-job").click()
        errors = page.locator("#form-errors")
        expect(errors).to_contain_text("The spec is not valid JSON")
        main_box = page.locator(".form-main").bounding_box()
        errors_box = errors.bounding_box()
        assert main_box is not None and errors_box is not None
        if viewport["width"] <= 1000:
            assert errors_box["y"] >= main_box["y"] + main_box["height"], (main_box, errors_box)
        else:
            assert errors_box["x"] >= main_box["x"] + main_box["width"], (main_box, errors_box)
        page.screenshot(path=screenshots / f"order-{name}-submit.png", full_page=True)
        assert session.errors == []
    finally:
        session.context.close()


def test_skip_to_content_is_the_first_stop_and_takes_the_keyboard_to_the_page(
    session: Session, jobs: dict[str, dict[str, Any]], screenshots: Path
) -> None:
    """The keyboard went through the top bar's links on every page. "Skip to content" is
    its first stop, unseen until it is there; pressed, it puts the focus on the page (the
    address stays: it is the router's), and the next Tab goes to the page's first control."""
    page = session.page
    running = jobs["running"]["id"]
    page.goto(f"/#/jobs/{running}")
    expect(page.locator(".job-heading .state")).to_have_text("running")
    skip = page.locator("#skip-link")
    hidden = skip.bounding_box()
    assert hidden is not None and hidden["width"] <= 1 and hidden["height"] <= 1, hidden

    page.keyboard.press("Tab")
    expect(skip).to_be_focused()
    expect(skip).to_have_text("Skip to content")
    shown = skip.bounding_box()
    assert shown is not None and shown["width"] > 50 and shown["height"] > 15, shown
    assert shown["x"] >= 0 and shown["y"] >= 0  # on the screen
    page.screenshot(path=screenshots / "skip-link-laptop.png")

    page.keyboard.press("Enter")
    expect(page.locator("#view")).to_be_focused()
    assert page.evaluate("location.hash") == f"#/jobs/{running}"
    expect(page.locator(".job-heading .state")).to_have_text("running")
    page.keyboard.press("Tab")
    expect(page.locator(".crumbs a")).to_be_focused()  # "← Jobs", the page's first link
    # Gone on: the page takes the focus from the skip link alone, not from a click.
    assert page.locator("#view").get_attribute("tabindex") is None

    # On the jobs list too (opened anew), and from a click as from Enter.
    page.goto("/#/")
    page.reload()
    expect(page.locator(f'tr[data-job="{running}"]')).to_be_visible()
    page.keyboard.press("Tab")
    expect(skip).to_be_focused()
    skip.click()
    expect(page.locator("#view")).to_be_focused()
    assert page.evaluate("location.hash") == "#/"
    page.keyboard.press("Tab")
    # The page's first control: Compare in TensorBoard, dimmed with no job picked (Clear
    # selection, before it, is unseen then).
    expect(page.get_by_role("button", name="Compare in TensorBoard (0)")).to_be_focused()
    assert session.errors == []


def status_row(job_id: str, url: str, key: str) -> str:
    shown = towerboard("status", job_id, url=url)
    assert shown.returncode == 0, shown.stderr
    found = re.search(rf"^{key}\s{{2,}}(.*)$", shown.stdout, re.M)
    assert found, shown.stdout
    return found[1]


def says_the_wait(
    page: Page, service: Service, queued: dict[str, Any], wait: str, place: str
) -> None:
    """The queued job's wait is `wait` in the jobs table, on its page's Devices card and in
    `towerboard status ID`'s devices row, and its page's queue line says `place`, in the
    same unit."""
    page.goto("/#/")
    expect(page.locator(f'tr[data-job="{queued["id"]}"] .col-devices')).to_have_text(wait)
    page.goto(f"/#/jobs/{queued['id']}")
    expect(page.locator('[data-stat="devices"]')).to_have_text(wait)
    expect(page.locator("#queue-place")).to_have_text(place)
    assert status_row(queued["id"], service.base_url, "devices") == wait


def test_a_queued_jobs_wait_is_said_in_job_slots_on_a_cpu_host(
    session: Session, service: Service, jobs: dict[str, dict[str, Any]]
) -> None:
    """On a CPU-only host a queued job's Devices said "waiting for devices (2 towers)" and
    its queue line "1 job slot; 0 free" on the same page: it waits for one job slot,
    whatever its towers, and both say so, as `towerboard status ID` does."""
    says_the_wait(
        session.page, service, jobs["queued"], "waiting for 1 job slot (2 towers)",
        "Next to start: it waits for 1 job slot; 0 free",
    )  # fmt: skip
    assert session.errors == []


def test_a_queued_jobs_wait_is_said_in_gpus_on_a_gpu_host(browser: Browser, tmp_path: Path) -> None:
    """On a GPU host (two stand-in GPUs: the worker touches none) a job holds a GPU a
    tower: the queued job of two towers waits for two, said so everywhere."""
    with stand_in_service(tmp_path, TOWERBOARD_GPUS="0,1") as service:
        running = service.submit(job_spec(name="holds-gpu-0"))
        service.wait_state(running["id"], "running")
        queued = service.submit(job_spec(name="two-towers", towers=2))
        session = open_session(browser, service, LAPTOP)
        try:
            says_the_wait(
                session.page, service, queued, "waiting for 2 GPUs (2 towers)",
                "Next to start: it waits for 2 GPUs; 1 free",
            )  # fmt: skip
            assert session.errors == []
        finally:
            session.context.close()
            cancel(service, queued, running)
