"""A failed job's log tail (the last lines of its worker's log, in the red box on its page)
stays at its end through a turn of a phone that wraps its long lines again, in headless
Chromium against a real service whose worker is TAIL_WORKER below. Scrolled to its end
once alone, the box was left mid-log. (Through a full-page screenshot too: test_dark_theme,
whose failed job's page showed it.) No model is trained here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Locator, Page, ViewportSize, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import open_session
from tests.service.harness import Service, job_spec, stand_in_head, stand_in_service

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)

# `python -m tail_worker run --job-dir DIR`: a few steps, then 40 log lines as long as
# TensorFlow's (they wrap in the box), the last one LAST, and it fails.
TAIL_WORKER = (
    stand_in_head(10)
    + """\

progress(event="start", step=0, phase="starting")
for step in range(1, 11):
    progress(event="progress", step=step, loss=1.0 / step, accuracy=0.5)
for i in range(40):
    print(f"line {i}: " + "op_kernel.cc:1830 OP_REQUIRES failed at conv_ops.cc " * (1 + i % 3))
print("LAST: ValueError: the cause, at the very end", flush=True)
(job_dir / "result.json").write_text(json.dumps({"outcome": "failed", "message": "boom"}))
sys.exit(1)
"""
)

LANDSCAPE: ViewportSize = {"width": 844, "height": 390}
PORTRAIT: ViewportSize = {"width": 390, "height": 844}

# How far the box's last line lies below what it shows (px; 0 or less: in sight).
LAST_LINE_HIDDEN = """(pre) => {
  const text = pre.firstChild;
  const range = document.createRange();
  range.setStart(text, text.length - 1);
  range.setEnd(text, text.length);
  const line = range.getBoundingClientRect();
  const box = pre.getBoundingClientRect();
  const style = getComputedStyle(pre);
  return line.bottom - (box.bottom - parseFloat(style.borderBottomWidth));
}"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(tmp_path_factory.mktemp("tail"), ("tail_worker", TAIL_WORKER)) as svc:
        yield svc


@pytest.fixture(scope="module")
def failed(service: Service) -> str:
    job = service.submit(job_spec(name="tail"))
    ended = service.wait_state(job["id"], "failed", "succeeded", "cancelled")
    assert ended["state"] == "failed", ended
    assert ended["error"]["log_tail"][-1].startswith("LAST: "), ended["error"]
    return str(job["id"])


def open_tail(page: Page, job_id: str) -> Locator:
    page.goto(f"/#/jobs/{job_id}")
    tail = page.locator(".job-error").get_by_label("Last lines of the worker's log", exact=True)
    expect(tail).to_be_visible()
    assert_at_end(tail, "opened")
    return tail


def assert_at_end(tail: Locator, when: str, last: str = "LAST: ValueError") -> None:
    """`tail`, a log box, shows its last line (`last`) whole."""
    expect(tail).to_contain_text(last)
    hidden = tail.evaluate(LAST_LINE_HIDDEN)
    assert hidden <= 0.5, f"{when}: the last line is {hidden:.1f}px out of sight"


def test_log_tail_stays_at_its_last_line_as_a_phone_turns(
    browser: Browser, service: Service, failed: str
) -> None:
    """Turned from landscape to portrait, the box's long lines wrap into many more: it was
    left some lines short of its end, with the cause out of sight."""
    session = open_session(browser, service, LANDSCAPE)
    try:
        page = session.page
        tail = open_tail(page, failed)
        page.set_viewport_size(PORTRAIT)
        page.wait_for_timeout(300)  # the resize, and the box's answer to it
        assert_at_end(tail, "turned")
        # Scrolled up by the reader, it stays where they put it through a resize.
        tail.evaluate("(pre) => { pre.scrollTop = 0; }")
        page.wait_for_timeout(100)  # the scroll event
        page.set_viewport_size(LANDSCAPE)
        page.wait_for_timeout(300)
        assert tail.evaluate("(pre) => pre.scrollTop") == 0
        assert session.errors == []
    finally:
        session.context.close()
