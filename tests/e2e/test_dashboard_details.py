"""What a demanding user of the dashboard notices, in headless Chromium against a real
service whose worker is a stand-in (the harness's, which runs until cancelled or ends at
once, or TRACE_WORKER below): a mangled link, what the page says once a job has ended or
was cancelled, the log through a restart, a trace asked for from the job page, contrast
and names for assistive technology, the jobs table at tablet and laptop widths, and the
submit form's odd inputs. No model is trained here, so none of it is marked slow."""

from __future__ import annotations

import contextlib
import math
import re
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, Request, Route, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.contrast import assert_contrast
from tests.e2e.lossy import answers_lost
from tests.e2e.test_dashboard import LAPTOP, LOG_POLL_MS, PHONE, Session, open_session
from tests.service.harness import (
    Service,
    fake_index,
    fake_worker_env,
    job_spec,
    stand_in_service,
)
from tests.service.test_client import towerboard

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)

# The devices panel's reads of the devices list.
DEVICES = re.compile(r"/api/v1/devices$")

# `python -m trace_worker run --job-dir DIR`: a step every 0.2 s until SIGTERM; takes the
# service's profile request as the trainer does (at a report, deleting the file) and
# writes the `trace` event once the asked steps have run, with each tower's time and
# `requested`. A trace of the spec's own comes in between, as one of its trace_steps can.
TRACE_WORKER = """\
import json, signal, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
request = job_dir / "profile_request.json"
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))


def progress(**line):
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), **line}) + "\\n")


progress(event="start", step=0, total=1000, phase="starting")
step, until = 0, None
while not stopped:
    time.sleep(0.2)
    step += 1
    progress(event="progress", step=step, total=1000, loss=0.5)
    if until is None and request.exists():
        until = step + json.loads(request.read_text())["steps"]
        request.unlink()
    if until is not None and step == until - 2:
        progress(event="trace", step=step, tower_ms=[9.0, 9.0], trace_dir="tb/plugins/profile/0")
    if step == until:
        progress(
            event="trace", step=step, tower_ms=[1.5, 2.5], trace_dir="tb/plugins/profile/1",
            requested=True,
        )
        until = None
(job_dir / "result.json").write_text(json.dumps({"outcome": "cancelled", "message": "stopped"}))
sys.exit(3)
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(tmp_path_factory.mktemp("stand-in")) as svc:
        yield svc


def test_mangled_job_link_says_no_such_job(session: Session) -> None:
    """A job link cut short mid-escape (`%E0%A4%A`, from a truncated copy) names the job
    it could not find, rather than leaving a blank page and an uncaught URIError."""
    page = session.page
    page.goto("/#/jobs/%E0%A4%A")
    expect(page.locator("#job-load-error")).to_have_text("No job %E0%A4%A.")
    expect(page.locator(".crumbs a")).to_be_visible()  # the way back
    assert session.errors == []


def test_cancel_line_follows_the_job_to_its_end(session: Session, service: Service) -> None:
    """Once the cancelled job has stopped, the line under Cancel says so; it went on
    saying "the worker checkpoints and stops" beside the cancelled badge."""
    job = service.submit(job_spec(name="runs-until-cancelled"))
    service.wait_reported(job["id"])
    page = session.page
    page.goto(f"/#/jobs/{job['id']}")
    expect(page.locator(".job-heading .state")).to_have_text("running")
    cancel, line = page.locator("#cancel-job"), page.locator("#action-status")
    cancel.click()
    # Armed: said where a screen reader announces it (the status line), not only on the button.
    expect(line).to_have_text("Press Confirm cancel within 4 s to stop this job.")
    cancel.click()
    expect(page.locator(".job-heading .state")).to_have_text("cancelled", timeout=30_000)
    ended = service.job(job["id"])
    assert ended["state"] == "cancelled", ended
    expect(line).to_have_text(f"Cancelled at step {ended['progress']['step']}.")
    assert session.errors == []


CANCEL_ARMED = "Press Confirm cancel within 4 s to stop this job."
CONFIRM_MS = 4_000  # Cancel waits this long for its second press (job.js's CONFIRM_MS)
# Run before the page's own scripts: the timers set for CONFIRM_MS (Cancel's and Delete
# job's wait for a second press) that have neither fired nor been cleared, kept on
# `window.confirmTimers`.
TRACK_CONFIRM_TIMERS = f"""(() => {{
  window.confirmTimers = new Set();
  const set = window.setTimeout, clear = window.clearTimeout;
  window.setTimeout = (fn, ms, ...args) => {{
    if (ms !== {CONFIRM_MS}) return set(fn, ms, ...args);
    const id = set((...more) => {{ window.confirmTimers.delete(id); fn(...more); }}, ms, ...args);
    window.confirmTimers.add(id);
    return id;
  }};
  window.clearTimeout = (id) => {{ window.confirmTimers.delete(id); clear(id); }};
}})();"""


def test_cancel_armed_again_after_a_failed_cancel_waits_its_own_4_s(
    session: Session, service: Service
) -> None:
    """A confirmed press disarms Cancel (as it does Delete job), so after a cancel the
    service refused the next press arms it afresh, for 4 s of its own. The first press's
    timer was neither kept nor cleared: the button stayed armed after the failure (the
    next press sent the cancel again), and armed again, the old timer disarmed it early."""
    job = service.submit(job_spec(name="runs-until-cancelled"))
    cancels: list[str] = []

    def refuse(route: Route) -> None:
        cancels.append(route.request.method)
        route.fulfill(status=503, json={"detail": "Refused by the test."})

    page = session.page
    try:
        service.wait_reported(job["id"])
        page.route(re.compile(r"/cancel$"), refuse)
        page.clock.install()  # before the page loads: its 4 s are the clock's, moved on below
        page.goto(f"/#/jobs/{job['id']}")
        expect(page.locator(".job-heading .state")).to_have_text("running")
        cancel, line = page.locator("#cancel-job"), page.locator("#action-status")
        cancel.click()
        expect(line).to_have_text(CANCEL_ARMED)
        cancel.click()
        expect(line).to_have_text("Could not cancel: Refused by the test.")
        # At once, not once the first press's 4 s have run out.
        assert (cancel.text_content(), cancel.get_attribute("data-armed")) == ("Cancel", "")
        page.clock.fast_forward(CONFIRM_MS // 2)
        cancel.click()  # arms it again: no second cancel is sent
        expect(line).to_have_text(CANCEL_ARMED)
        assert cancels == ["POST"]
        page.clock.fast_forward(CONFIRM_MS // 2 + 500)  # past the first press's 4 s
        assert (cancel.text_content(), line.text_content()) == ("Confirm cancel", CANCEL_ARMED)
        page.clock.fast_forward(CONFIRM_MS // 2)  # past this press's own
        expect(cancel).to_have_text("Cancel", timeout=6_000)
        expect(line).to_have_text("")
        assert cancels == ["POST"]
        assert service.job(job["id"])["state"] == "running"
        assert session.errors == []
    finally:
        service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
        service.wait_state(job["id"], "cancelled", "failed", "succeeded")


def test_cancel_armed_as_the_job_ends_is_not_armed_when_it_is_resumed(
    session: Session, service: Service
) -> None:
    """Cancel armed, then the job ended (cancelled elsewhere) and was resumed within its
    4 s: the button came back as "Confirm cancel", and one press cancelled the new run."""
    job = service.submit(job_spec(name="runs-until-cancelled"))
    service.wait_reported(job["id"])
    page = session.page
    page.clock.install()
    page.goto(f"/#/jobs/{job['id']}")
    heading = page.locator(".job-heading .state")
    expect(heading).to_have_text("running")
    # Stopped: the 4 s do not run out while the job ends, its worker exits and it resumes.
    page.clock.pause_at(page.evaluate("Date.now()") + 100)
    cancel, line = page.locator("#cancel-job"), page.locator("#action-status")
    cancel.click()
    expect(line).to_have_text(CANCEL_ARMED)
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    service.wait_state(job["id"], "cancelled")
    expect(heading).to_have_text("cancelled")
    expect(line).not_to_have_text(CANCEL_ARMED)
    service.wait_exited(job["id"])
    page.locator("#resume-job").click()  # this page's own Resume
    expect(cancel).to_be_visible()
    assert (cancel.text_content(), cancel.get_attribute("data-armed")) == ("Cancel", "")
    service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
    service.wait_state(job["id"], "cancelled", "failed", "succeeded")
    assert session.errors == []


def test_leaving_a_job_page_with_cancel_armed_clears_its_timer(
    session: Session, service: Service
) -> None:
    """Cancel armed, then the page left: its 4 s timer went on, to fire on the page's
    detached nodes (Delete job's was cleared)."""
    job = service.submit(job_spec(name="runs-until-cancelled"))
    page = session.page
    try:
        service.wait_reported(job["id"])
        page.add_init_script(TRACK_CONFIRM_TIMERS)
        page.goto(f"/#/jobs/{job['id']}")
        expect(page.locator(".job-heading .state")).to_have_text("running")
        page.locator("#cancel-job").click()
        expect(page.locator("#action-status")).to_have_text(CANCEL_ARMED)
        assert page.evaluate("window.confirmTimers.size") == 1
        page.locator(".crumbs a").click()
        expect(page.locator("#view h1")).to_have_text("Jobs")
        assert page.evaluate("window.confirmTimers.size") == 0
        assert session.errors == []
    finally:
        service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
        service.wait_state(job["id"], "cancelled", "failed", "succeeded")


def test_a_job_whose_worker_is_preparing_says_so(session: Session, service: Service) -> None:
    """Between its worker's start and first line (TensorFlow's import, the data, the
    model: seconds to minutes) a running job's page and row say `preparing`; they showed
    a bare "—" as if nothing were happening."""
    job = service.submit(job_spec(name="preparing"))  # never writes a line
    service.wait_state(job["id"], "running")
    page = session.page
    page.goto("/#/jobs")
    row = page.locator(f'tr[data-job="{job["id"]}"]')
    expect(row.locator(".col-progress")).to_have_text("preparing")
    page.goto(f"/#/jobs/{job['id']}")
    expect(page.locator("#job-progress-text")).to_have_text("preparing")
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    expect(page.locator(".job-heading .state")).to_have_text("cancelled", timeout=30_000)
    expect(page.locator("#job-progress-text")).to_have_text("—")  # over: no phase
    assert session.errors == []


def test_a_preparing_jobs_row_and_page_say_its_stage_and_how_far(
    session: Session, service: Service
) -> None:
    """A worker that says the stages of its preparation (trainer/preparing.py): the row
    and the page say which, and how far its data load is, as it goes."""
    job = service.submit(job_spec(name="loading"))  # held at 845 of 2000 bytes
    page = session.page
    page.goto("/#/jobs")
    row = page.locator(f'tr[data-job="{job["id"]}"]')
    expect(row.locator(".col-progress")).to_have_text("loading data 42%")
    page.goto(f"/#/jobs/{job['id']}")
    text = page.locator("#job-progress-text")
    expect(text).to_have_text("loading data 42%")
    expect(page.locator(".bar-large")).to_have_attribute("aria-valuetext", "loading data 42%")
    # On its stream: 1999 of 2000, whose `stage_percent` (a tenth, rounded) is 100.0; the
    # page said "loading data 100%" with the load not through.
    service.release(job["id"])
    expect(text).to_have_text("loading data 99%")
    service.release(job["id"])  # the load through, then the model
    expect(text).to_have_text("building the model")
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    expect(page.locator(".job-heading .state")).to_have_text("cancelled", timeout=30_000)
    expect(text).to_have_text("—")  # over: no stage
    assert session.errors == []


def test_devices_panel_frees_a_device_as_its_worker_exits(
    session: Session, service: Service, screenshots: Path
) -> None:
    """An ended job's device is held until its worker has exited (TensorFlow's teardown):
    the panel says `exiting` then, and `free` as the jobs table's stream says `exited`. It
    showed the job's link as if it ran until the next 5 s poll, and then read the devices
    every 0.5 s while one was exiting."""
    job = service.submit(job_spec(name="linger"))  # its result, then waits to be released
    page = session.page
    page.goto("/#/")
    service.wait_state(job["id"], "succeeded")
    held = [d["id"] for d in service.client.get("/api/v1/devices").json()["data"]
            if d["job_id"] == job["id"]]  # fmt: skip
    assert held, "the lingering worker's device is still held"
    item = page.locator(f'.device[data-device="{held[0]}"]')
    expect(item).to_contain_text(f"{job['id']} exiting")
    session.page.locator("aside").screenshot(path=screenshots / "devices-exiting.png")
    reads: list[str] = []

    def on_request(request: Request) -> None:
        if DEVICES.search(request.url):
            reads.append(request.url)

    page.on("request", on_request)
    page.wait_for_timeout(2_000)
    assert len(reads) <= 1, reads  # the 5 s poll's, if any: no 0.5 s poll while it waits
    with page.expect_request(DEVICES, timeout=10_000):
        pass  # the 5 s poll's read: the next is 5 s away
    service.release(job["id"])
    # Well before that next poll: the exit is read as the stream says so.
    expect(item).to_contain_text("free", timeout=4_000)
    assert session.errors == []


def test_log_keeps_to_its_newest_lines_through_a_resize(session: Session, service: Service) -> None:
    """A log followed at its end stays at its end when a resize rewraps its lines (a phone
    turned): the box was left mid-log, judged at the next read as scrolled up by the
    reader, and followed no more."""
    job = service.submit(job_spec(name="chatty"))  # 200 long lines, then runs on
    page = session.page
    page.goto(f"/#/jobs/{job['id']}")
    log = page.locator("#log")
    expect(log).to_contain_text("line 199", timeout=30_000)
    at_end = "el => el.scrollHeight - el.scrollTop - el.clientHeight <= 8"
    assert log.evaluate("el => el.scrollHeight > el.clientHeight"), "the log must overflow"
    page.wait_for_function(f"({at_end})(document.getElementById('log'))")
    try:
        page.set_viewport_size(PHONE)  # the lines wrap more
        page.wait_for_function(f"({at_end})(document.getElementById('log'))", timeout=2_000)
        # Scrolled up by the reader, it stays where they put it.
        log.evaluate("el => { el.scrollTop = 0; }")
        page.wait_for_timeout(LOG_POLL_MS + 500)  # a read comes meanwhile
        assert log.evaluate("el => el.scrollTop") == 0
    finally:
        page.set_viewport_size(LAPTOP)  # the module's other tests share the page
        service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert session.errors == []


def test_ended_job_says_what_it_never_reported(session: Session, service: Service) -> None:
    """A job that ended without metrics, checkpoints or its device trace says so; the page
    said "No data yet", "No checkpoint yet" and "not taken yet" as if more could come."""
    job = service.submit(job_spec(name="quick", summaries={"trace_steps": [5]}))
    assert service.wait_state(job["id"], "succeeded", "failed")["state"] == "succeeded"
    page = session.page
    page.goto(f"/#/jobs/{job['id']}")
    expect(page.locator(".job-heading .state")).to_have_text("succeeded")
    expect(page.locator(".chart-empty")).to_have_text(["No data reported."] * 3)
    expect(page.locator("#checkpoints")).to_have_text("No checkpoint was saved.")
    expect(page.locator("#towers")).to_have_text(
        "The job ended before the device trace of step 5 was taken."
    )
    expect(page.locator("#view")).not_to_contain_text("yet")
    assert session.errors == []


# Counts, in window.writes[name], each change under the element `selector` from now on
# (its text, children or attributes): a live region written again is read out again, even
# with the same words.
COUNT_WRITES = """([name, selector]) => {
  window.writes = window.writes || {};
  window.writes[name] = 0;
  new MutationObserver((records) => { window.writes[name] += records.length; }).observe(
    document.querySelector(selector),
    { subtree: true, childList: true, characterData: true, attributes: true });
}"""


def test_log_stays_while_the_service_restarts(browser: Browser, tmp_path: Path) -> None:
    """A log read that gets no answer (the service restarting) keeps the lines already
    shown and says the read failed beside them; it replaced the log with the error. The
    failure and the "reconnecting" notice, both live regions, are written once: each was
    rewritten at every failed poll and stream retry (every 3 s), and read out again."""
    restarting = Service(tmp_path / "data", fake_worker_env(tmp_path))
    restarting.start()
    session = open_session(browser, restarting, LAPTOP)
    try:
        page = session.page
        page.clock.install()  # before the page loads: its log poll is the clock's, moved on
        job = restarting.submit(job_spec(name="runs-until-cancelled"))
        restarting.wait_state(job["id"], "running")
        page.goto(f"/#/jobs/{job['id']}")
        log, note = page.locator("#log"), page.locator("#log-error")
        header = f"attempt 1 of job {job['id']} starting"
        expect(log).to_contain_text(header)
        expect(note).to_be_hidden()
        restarting.stop()  # the worker lives on, to be adopted
        # The log is read every 3 s while the job runs: the next read, now.
        page.clock.fast_forward(LOG_POLL_MS)
        expect(note).to_contain_text("Could not read the log: The service did not answer")
        expect(note).to_contain_text("The lines below are from the last read.")
        expect(log).to_contain_text(header)
        notice = page.locator(".live-notice")
        expect(notice).to_contain_text("Live updates interrupted; reconnecting…")
        page.evaluate(COUNT_WRITES, ["log", "#log-error"])
        page.evaluate(COUNT_WRITES, ["notice", ".live-notice"])
        for _ in range(2):  # two more failed log reads, and two more of the stream's retries
            with page.expect_event("requestfailed", lambda r: "/logs" in r.url):
                page.clock.fast_forward(LOG_POLL_MS)
        for _ in range(2):
            page.wait_for_event(
                "requestfailed", lambda r: r.url.endswith("/events"), timeout=15_000
            )
        assert page.evaluate("() => window.writes") == {"log": 0, "notice": 0}
        expect(note).to_be_visible()
        expect(notice).to_be_visible()
        restarting.start()
        page.clock.fast_forward(LOG_POLL_MS)
        expect(note).to_be_hidden(timeout=15_000)
        expect(log).to_contain_text(header)
        assert restarting.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
        assert session.errors == []
    finally:
        session.context.close()
        restarting.close()


def test_text_contrast_meets_wcag_aa(session: Session, service: Service) -> None:
    """Every state badge, link and error line reads at 4.5:1 at least: white on the
    succeeded, cancelled and queued badges was 3.6, 3.6 and 3.1:1, and links and errors on
    the page's grey 4.4:1."""
    page = session.page
    page.goto("/#/jobs/none")
    expect(page.locator("#job-load-error")).to_have_text("No job none.")  # an error line
    page.evaluate("""async () => {
      const { h, stateBadge } = await import("/static/js/format.js");
      const { STATES } = await import("/static/js/api.js");
      document.getElementById("view").append(h("p", { id: "badges" }, STATES.map(stateBadge)));
      document.getElementById("token-bar").hidden = false;
      document.getElementById("token-message").textContent = "That token was refused.";
    }""")
    expect(page.locator("#badges .state")).to_have_count(5)
    assert_contrast(page)
    assert session.errors == []


# The focused element's ring, judged as WCAG 2.2's focus appearance asks: a solid outline
# 2px wide at least, set off from the control (so its own fill, the pressed chip's
# near-black, cannot swallow it), at 3:1 at least against what is around it. Returns what
# falls short ("" when nothing does), naming the element.
FOCUS_RING_FAULT = """() => {
  const el = document.activeElement;
  const name = `${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""}` +
    ` "${(el.getAttribute("aria-label") || el.textContent).trim().slice(0, 30)}"`;
  if (!el.matches(":focus-visible")) return `${name}: not :focus-visible`;
  const channel = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
  const luminance = (css) => {
    const [r, g, b] = css.match(/[\\d.]+/g).map(Number);
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b);
  };
  const around = (node) => {
    for (node = node.parentElement; node; node = node.parentElement) {
      const css = getComputedStyle(node).backgroundColor;
      if (css !== "rgba(0, 0, 0, 0)" && css !== "transparent") return css;
    }
    return "rgb(255, 255, 255)";
  };
  const style = getComputedStyle(el);
  const width = parseFloat(style.outlineWidth);
  const offset = parseFloat(style.outlineOffset);
  const [a, b] = [luminance(style.outlineColor), luminance(around(el))];
  const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  const faults = [];
  if (style.outlineStyle !== "solid") faults.push(`outline-style ${style.outlineStyle}`);
  if (!(width >= 2)) faults.push(`outline-width ${style.outlineWidth}`);
  if (!(offset >= 2)) faults.push(`outline-offset ${style.outlineOffset}`);
  if (ratio < 3) faults.push(`${ratio.toFixed(2)}:1, ${style.outlineColor} on ${around(el)}`);
  return faults.length ? `${name}: ${faults.join(", ")}` : "";
}"""


def tab_through(page: Page, stops: int) -> tuple[int, list[str]]:
    """Press Tab up to `stops` times (or until the focus leaves the page's controls): how
    many controls took the focus, and what each one's ring lacks."""
    faults, seen = [], 0
    for _ in range(stops):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement === document.body"):
            break
        seen += 1
        fault = page.evaluate(FOCUS_RING_FAULT)
        if fault:
            faults.append(fault)
    return seen, faults


def test_focus_ring_shows_on_every_control(session: Session, service: Service) -> None:
    """Tabbing through the jobs list and a job's page, each control's focus ring is a solid
    blue (light blue on the dark top bar) 2px outline, 2px off the control, at 3:1 at
    least on what is around it. The pressed state chip's ring was the browser's own, dark
    on its near-black fill: focused or not, it looked the same."""
    job = service.submit(job_spec(name="quick"))
    service.wait_state(job["id"], "succeeded", "failed")
    page = session.page
    page.goto("/#/")
    pressed = page.locator('.chip[aria-pressed="true"]')
    expect(pressed).to_have_text("all")
    expect(page.locator(f'tr[data-job="{job["id"]}"]')).to_have_count(1)
    page.locator("body").click(position={"x": 5, "y": 200})  # no control: Tab starts over
    for _ in range(50):  # bounded: a chip Tab never reached fails, not hangs
        page.keyboard.press("Tab")
        if pressed.evaluate("el => el === document.activeElement"):
            break
    else:
        raise AssertionError("Tab never reached the pressed state chip")
    assert page.evaluate(FOCUS_RING_FAULT) == ""
    # The ring is outside the chip: its own dark fill is no part of what it shows on.
    assert pressed.evaluate("el => getComputedStyle(el).outlineColor") == "rgb(42, 102, 204)"
    seen, faults = tab_through(page, 25)
    assert faults == [] and seen >= 7, (seen, faults)  # the other chips, search, a row
    page.goto(f"/#/jobs/{job['id']}")
    expect(page.locator(".job-heading .state")).to_have_text("succeeded")
    page.locator(".crumbs").click(position={"x": 200, "y": 5})  # beside the link, on none
    seen, faults = tab_through(page, 40)
    # The actions, the log and spec boxes, Edit & resubmit: every control to the page's end.
    assert faults == [] and seen >= 6, (seen, faults)
    assert session.errors == []


def test_spec_that_is_a_json_string_is_sent_as_json(session: Session) -> None:
    """A spec that is valid JSON but no object (a string) gets the service's answer for it;
    the string went out unquoted, and the form said the body was not JSON at all."""
    page = session.page
    page.goto("/#/submit")
    page.locator("#spec").fill('"hello"')
    page.locator("#submit-job").click()
    error = page.locator('#form-errors li[data-field="(spec)"]')
    expect(error).to_contain_text("Input should be a valid dictionary or object")
    expect(error).to_contain_text("Received: 'hello'")
    expect(page.locator("#spec")).to_have_value('"hello"')  # kept, to be fixed
    assert session.errors == []


@contextlib.contextmanager
def trace_service(
    browser: Browser, tmp_path: Path, worker: str
) -> Iterator[tuple[Service, Session]]:
    """A service whose worker is `worker` (TRACE_WORKER or one made from it), and a page's
    session on it; both closed after."""
    (tmp_path / "trace_worker.py").write_text(worker)
    tracing = Service(
        tmp_path / "data", {"TOWERBOARD_WORKER_MODULE": "trace_worker", "PYTHONPATH": str(tmp_path)}
    )
    tracing.start()
    try:
        session = open_session(browser, tracing, LAPTOP)
        try:
            yield tracing, session
        finally:
            session.context.close()
    finally:
        tracing.close()


@contextlib.contextmanager
def traced_from_its_page(
    browser: Browser, tmp_path: Path, worker: str
) -> Iterator[tuple[Service, Session, dict[str, Any], int]]:
    """A service whose worker is `worker` (trace_service), and a running job's page where
    "Trace next 5 steps" was clicked and answered: the service, the page's session, the job
    and the step the answer says. The job is cancelled and the page closed after."""
    with trace_service(browser, tmp_path, worker) as (tracing, session):
        page = session.page
        job = tracing.submit(job_spec(name="traced"))
        page.goto(f"/#/jobs/{job['id']}")
        expect(page.locator(".job-heading .state")).to_have_text("running")
        expect(page.locator("#towers")).to_contain_text("No device trace in this job's spec")
        page.locator("#profile-job").click()
        status = page.locator("#profile-status")
        expect(status).to_have_text(re.compile(r"^(Tracing the next 5 steps|Traced up to)"))
        expect(status).to_have_text(re.compile(r"^Traced up to step \d+[:;] "))
        step = re.search(r"step (\d+)", status.inner_text())
        assert step is not None
        yield tracing, session, job, int(step[1])
        assert tracing.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
        expect(page.locator(".job-heading .state")).to_have_text("cancelled", timeout=30_000)
        expect(page.locator("#profile-job")).to_be_hidden()  # only a running job can be traced
        assert session.errors == []


def test_trace_asked_for_from_the_job_page(browser: Browser, tmp_path: Path) -> None:
    """The job page asks a running job for a device trace (the API's POST /profile had no
    control on the page) and shows each tower's time from it once the worker has taken it."""
    with traced_from_its_page(browser, tmp_path, TRACE_WORKER) as (tracing, session, job, step):
        page = session.page
        expect(page.locator("#profile-status")).to_have_text(
            f"Traced up to step {step}: the per-tower times below are from it, and the trace "
            "is in TensorBoard's profile tab."
        )
        # The requested trace's step, not the spec's trace two steps before it (which the
        # page took for its answer, naming a step the times below were not from).
        assert tracing.job(job["id"])["progress"]["trace_step"] == step
        assert tracing.job(job["id"])["progress"]["tower_ms"] == [1.5, 2.5]
        towers = page.locator("#towers")
        expect(towers.locator(".tower-value")).to_have_text(["1.50 ms", "2.50 ms"])
        expect(towers).to_contain_text(f"from the device trace that ended at step {step}.")


def test_trace_asked_for_whose_answer_is_lost_says_when_it_is_taken(
    browser: Browser, tmp_path: Path
) -> None:
    """Trace next 5 steps: the request reaches the service, its answer is lost (a lossy
    network). The worker takes the trace; the line says so once it has, where it said
    "Could not ask for a trace: The service did not answer" beside the trace's times."""
    with trace_service(browser, tmp_path, TRACE_WORKER) as (tracing, session):
        page = session.page
        job = tracing.submit(job_spec(name="traced-answer-lost"))
        page.goto(f"/#/jobs/{job['id']}")
        expect(page.locator(".job-heading .state")).to_have_text("running")
        with answers_lost(page, re.compile(r"/api/v1/jobs/[^/]+/profile$")) as sent:
            page.locator("#profile-job").click()
            status = page.locator("#profile-status")
            expect(status).to_have_text(re.compile(r"^Traced up to step \d+: "), timeout=30_000)
        assert sent == [202]
        step = tracing.job(job["id"])["progress"]["trace_step"]
        expect(status).to_contain_text(f"Traced up to step {step}: ")
        expect(page.locator("#towers .tower-value")).to_have_text(["1.50 ms", "2.50 ms"])
        assert tracing.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
        expect(page.locator(".job-heading .state")).to_have_text("cancelled", timeout=30_000)
        assert session.errors == []


# Why the trainer's trace gave no times on a GPU host whose profiler could not load CUPTI.
NO_KERNELS = "Expected the trace to hold the towers' GPU kernels. Received: none"


def test_trace_asked_for_whose_times_cannot_be_read_is_answered_with_why(
    browser: Browser, tmp_path: Path
) -> None:
    """A trace written whose times could not be read has a line with why in their place:
    the page that asked is answered (it waited on, and at the job's end said the job ended
    before the trace was taken), the towers panel says why rather than the times of the
    spec's trace before it, and so does `towerboard status ID`."""
    timed = "tower_ms=[1.5, 2.5]"  # the requested trace's times, and no other's
    assert TRACE_WORKER.count(timed) == 1
    worker = TRACE_WORKER.replace(timed, f"tower_ms_error={NO_KERNELS!r}")
    with traced_from_its_page(browser, tmp_path, worker) as (tracing, session, job, step):
        page = session.page
        expect(page.locator("#profile-status")).to_have_text(
            f"Traced up to step {step}; no per-tower times from it: {NO_KERNELS}. The trace "
            "is in TensorBoard's profile tab."
        )
        progress = tracing.job(job["id"])["progress"]
        assert (progress["trace_step"], progress["tower_ms_error"]) == (step, NO_KERNELS)
        assert progress.get("tower_ms") is None and progress["step"] >= step, progress
        towers = page.locator("#towers")
        expect(towers).to_have_text(
            f"The device trace that ended at step {step} gave no per-tower times: "
            f"{NO_KERNELS}. The trace is in TensorBoard's profile tab."
        )
        expect(towers.locator(".tower-value")).to_have_count(0)  # not the spec's [9.0, 9.0]
        shown = towerboard("status", job["id"], url=tracing.base_url)
        assert re.search(
            rf"^tower ms\s+none from the trace that ended at step {step}: {re.escape(NO_KERNELS)}$",
            shown.stdout,
            re.M,
        ), shown.stdout


def test_checkpoint_links_name_their_step(session: Session, service: Service) -> None:
    """Each checkpoint's download link names its step to a screen reader, which read every
    one as the same "Download .tar.gz", and the links' column has a header."""
    job = service.submit(job_spec(name="quick"))
    assert service.wait_state(job["id"], "succeeded", "failed")["state"] == "succeeded"
    folder = service.data_dir / "runs" / job["id"] / "checkpoints"
    folder.mkdir(exist_ok=True)
    for step in (10, 20):  # as tf.train.CheckpointManager names them
        (folder / f"ckpt-{step}.index").write_bytes(fake_index())
        (folder / f"ckpt-{step}.data-00000-of-00001").write_bytes(b"weights" * 100)
    page = session.page
    page.goto(f"/#/jobs/{job['id']}")
    for step in (10, 20):
        link = page.get_by_role("link", name=f"Download .tar.gz of step {step}", exact=True)
        expect(link).to_have_attribute("href", f"/api/v1/jobs/{job['id']}/checkpoints/{step}")
        expect(link).to_have_text("Download .tar.gz")  # what the eye reads is unchanged
    expect(page.get_by_role("columnheader", name="Download", exact=True)).to_have_count(1)
    assert session.errors == []


def test_submit_form_controls_are_named_as_labelled(session: Session) -> None:
    """A screen reader (or voice control, which goes by what is shown) names each control
    by its visible label: the start's select was "Preset" under the label "Start from"."""
    page = session.page
    page.goto("/#/submit")
    expect(page.get_by_role("combobox", name="Start from", exact=True)).to_be_visible()
    expect(page.get_by_role("textbox", name="Job spec (JSON)", exact=True)).to_be_visible()
    assert session.errors == []


def test_what_axe_core_flagged(session: Session, service: Service) -> None:
    """What axe-core 4.14 (run by hand over each view) found serious: progress bars with
    no name, the job's spec scrolling out of a keyboard's reach, a link told from the text
    around it by colour alone, and two "complementary" landmarks on the submit page."""
    job = service.submit(job_spec(name="quick"))
    assert service.wait_state(job["id"], "succeeded", "failed")["state"] == "succeeded"
    page = session.page
    page.goto("/#/")
    row = page.locator(f'tr[data-job="{job["id"]}"]')
    expect(row.get_by_role("progressbar", name="Progress of quick", exact=True)).to_have_attribute(
        "aria-valuetext", "0 / 10"
    )
    page.goto(f"/#/jobs/{job['id']}")
    expect(page.get_by_role("progressbar", name="Progress", exact=True)).to_have_count(1)
    spec = page.locator("pre#spec")
    expect(spec).to_have_attribute("tabindex", "0")  # it scrolls: the keyboard scrolls it
    expect(spec).to_have_accessible_name("Job spec")
    page.goto("/#/submit")
    expect(page.get_by_role("complementary")).to_have_count(1)  # the devices panel
    docs = page.get_by_role("link", name="the API docs")
    assert docs.evaluate("a => getComputedStyle(a).textDecorationLine") == "underline"
    assert session.errors == []


@pytest.mark.parametrize("width", [800, 840, 1024, 1210, 1280])
def test_jobs_table_fits_tablet_and_laptop_widths(
    browser: Browser, service: Service, width: int
) -> None:
    """Every column of the jobs table is in view at any width: between the phone layout's
    cards (now up to 820px) and a wide screen, the table needed 895px or more and scrolled
    its Devices and Age columns out of sight, with nothing to say so (at 1024px, beside the
    devices panel, it had 716)."""
    running = service.submit(job_spec(name="runs-until-cancelled", towers=2))
    service.wait_state(running["id"], "running")
    session = open_session(browser, service, {"width": width, "height": 900})
    try:
        page = session.page
        page.goto("/#/")
        cell = page.locator(f'tr[data-job="{running["id"]}"] .col-devices')
        expect(cell).to_have_text("cpu:0 (2 towers)")
        sizes = page.evaluate("""() => {
          const wrap = document.querySelector(".table-wrap");
          return [wrap.scrollWidth, wrap.clientWidth];
        }""")
        assert sizes[0] <= sizes[1], f"the table is {sizes[0]} px wide in {sizes[1]} px"
        assert session.errors == []
    finally:
        session.context.close()
        service.client.post(f"/api/v1/jobs/{running['id']}/cancel")
        service.wait_state(running["id"], "cancelled")


def test_invalid_json_puts_the_caret_where_it_broke(session: Session) -> None:
    """A spec that is not JSON takes the caret to where parsing stopped, so a long spec's
    typo is found without counting characters to "position 33"."""
    page = session.page
    page.goto("/#/submit")
    editor = page.locator("#spec")
    text = '{\n  "data": {"format": "synthetic"},\n  "steps": 10,,\n  "towers": 1\n}'
    editor.fill(text)
    page.locator("#submit-job").click()
    expect(page.locator("#form-errors")).to_contain_text("The spec is not valid JSON.")
    expect(editor).to_be_focused()
    assert editor.evaluate("el => el.selectionStart") == text.index(",,") + 1
    expect(editor).to_have_value(text)
    assert session.errors == []


def test_a_key_given_twice_in_the_form_is_refused_naming_it(
    session: Session, service: Service
) -> None:
    """The form sent what JSON.parse made of the editor, which keeps a repeated key's last
    value: `steps` 5 and 7 submitted a job of 7 steps. It sends the text as typed, and
    the service names the key and both places."""
    page = session.page
    before = service.client.get("/api/v1/jobs").json()["count"]
    page.goto("/#/submit")
    text = '{\n  "data": {"format": "synthetic"},\n  "steps": 5,\n  "steps": 7\n}'
    page.locator("#spec").fill(text)
    page.locator("#submit-job").click()
    errors = page.locator("#form-errors")
    expect(errors).to_contain_text("The service rejected this spec:")
    expect(errors.locator('li[data-field="steps"]')).to_contain_text(
        "Duplicate key here: given at line 3 column 3 and again at line 4 column 3."
    )
    expect(page).to_have_url(re.compile(r"#/submit$"))
    assert service.client.get("/api/v1/jobs").json()["count"] == before
    assert session.errors == []


def test_eta_is_unknown_once_the_worker_goes_quiet(session: Session) -> None:
    """A stalled worker's ETA counted down to 0 and stayed there, saying "nearly done";
    after a minute without a report it is unknown, and says for how long (as the CLI)."""
    page = session.page
    page.goto("/")
    shown = page.evaluate("""async () => {
      const { eta } = await import("/static/js/format.js");
      const now = Date.now() / 1000;
      const job = (ago) => ({ state: "running", progress: {
        eta_seconds: 300, updated_at: new Date((now - ago) * 1000).toISOString() } });
      return [eta(job(10), now), eta(job(59), now), eta(job(130), now),
              eta({ ...job(130), state: "succeeded" }, now)];
    }""")
    # An ended job has no ETA, as `towerboard status` says ("-"), not "0s".
    assert shown == ["4m 50s", "4m 01s", "? (no report for 2m 10s)", "—"]
    assert session.errors == []


def test_token_bar_opened_by_a_poll_leaves_the_typing_alone(
    browser: Browser, tmp_path: Path
) -> None:
    """The token changed under a page whose user was typing a spec: the next poll's 401
    opened the token bar and took the focus, so the rest of what was typed went into the
    token field. The bar opens without taking the focus from a field being typed in, and
    Escape closes it (as the Token button does), the keyboard going on from that button."""
    secured = Service(tmp_path / "data", {"TOWERBOARD_TOKEN": "right", **fake_worker_env(tmp_path)})
    secured.start()
    session = open_session(browser, secured, LAPTOP)
    try:
        page = session.page
        page.goto("/")
        page.fill("#token-input", "right")
        page.keyboard.press("Enter")
        page.goto("/#/submit")
        editor = page.locator("#spec")
        editor.click()
        page.keyboard.press("Control+End")
        page.keyboard.type(" one")
        # The token changes under the page; a poll is refused (as the devices poll would be).
        page.evaluate("""async () => {
          localStorage.setItem("towerboard.token", "stale");
          const { getJSON } = await import("/static/js/api.js");
          await getJSON("/api/v1/devices").catch(() => {});
        }""")
        bar = page.locator("#token-bar")
        expect(bar).to_be_visible()
        expect(page.locator("#token-message")).to_have_text("That token was refused.")
        expect(editor).to_be_focused()
        page.keyboard.type(" two")
        expect(editor).to_have_value(re.compile(r" one two$"))
        expect(page.locator("#token-input")).to_have_value("")
        page.locator("#token-input").focus()
        page.keyboard.press("Escape")
        expect(bar).to_be_hidden()
        expect(page.locator("#token-toggle")).to_be_focused()
        assert session.errors == []
    finally:
        session.context.close()
        secured.close()


def idx_file(path: Path, shape: tuple[int, ...]) -> None:
    """An IDX file of unsigned bytes (zeros), as MNIST's are written."""
    header = bytes([0, 0, 0x08, len(shape)]) + struct.pack(f">{len(shape)}I", *shape)
    path.write_bytes(header + bytes(math.prod(shape)))


def test_mnist_presets_are_taken_where_mnist_is(browser: Browser, tmp_path: Path) -> None:
    """The MNIST presets named /datasets/mnist, where docker-compose.yml mounts data: on a
    host (data roots: the data dir's datasets/) each was refused (422, outside the data
    roots) with MNIST in place. Their relative path is taken under the roots."""
    mnist = tmp_path / "data" / "datasets" / "mnist"
    mnist.mkdir(parents=True)
    idx_file(mnist / "train-images-idx3-ubyte", (64, 28, 28))
    idx_file(mnist / "train-labels-idx1-ubyte", (64,))
    hosted = Service(tmp_path / "data", fake_worker_env(tmp_path))
    hosted.start()
    session = open_session(browser, hosted, LAPTOP)
    try:
        page = session.page
        for preset in ("mnist-cnn", "mnist-mlp"):
            page.goto(f"/#/submit?preset={preset}")
            page.locator("#submit-job").click()
            expect(page).to_have_url(re.compile(r"#/jobs/\w+$"))
            job_id = page.url.rsplit("/", 1)[1]
            assert hosted.job(job_id)["spec"]["data"]["path"] == str(mnist)
            hosted.client.post(f"/api/v1/jobs/{job_id}/cancel")  # the stand-in waits for it
            hosted.wait_state(job_id, "cancelled", "failed", "succeeded")
        assert session.errors == []
    finally:
        session.context.close()
        hosted.close()


def test_queued_job_cancelled_from_its_page_reads_as_ended(
    session: Session, service: Service
) -> None:
    """A queued job cancelled from its page ends with the answer (200), not with a state
    from the stream: the page then went on saying "No checkpoint yet." as if one might
    come, and never read the job again as an ended one (unless the stream's state came
    first: here the streams are held, so the answer comes first, as it often does)."""
    page = session.page
    page.route(re.compile(r"/events$"), lambda route: None)  # held: no event comes
    holder = service.submit(job_spec(name="holds-the-slot"))  # runs until cancelled
    service.wait_state(holder["id"], "running")
    queued = service.submit(job_spec(name="waits"))
    try:
        page.goto(f"/#/jobs/{queued['id']}")
        expect(page.locator(".job-heading .state")).to_have_text("queued")
        expect(page.locator("#checkpoints")).to_have_text("No checkpoint yet.")
        page.locator("#cancel-job").click()
        page.locator("#cancel-job").click()
        expect(page.locator(".job-heading .state")).to_have_text("cancelled")
        expect(page.locator("#checkpoints")).to_have_text("No checkpoint was saved.")
        expect(page.locator("#log")).to_have_text("(no output)")
        assert session.errors == []
    finally:
        service.client.post(f"/api/v1/jobs/{holder['id']}/cancel")
        service.wait_state(holder["id"], "cancelled", "failed", "succeeded")


def test_ages_and_etas_count_by_the_services_clock(browser: Browser, service: Service) -> None:
    """A browser whose clock is off the service's (a laptop minutes off, a VM that drifted)
    counted the service's times against its own: 90 s ahead, a job reporting every 2 s said
    "? (no report for 1m 30s)"; behind, ages stayed at 0s and ETAs did not count down. The
    page counts by the service's clock, as its answers' `Date` header gives it."""
    for skew in (+90, -90):
        session = open_session(browser, service, LAPTOP)
        page = session.page
        try:
            page.clock.install(time=time.time() + skew)  # runs on from there, as a clock does
            page.goto("/")
            expect(page.locator("#devices .device")).not_to_have_count(0)  # an answer came
            shown = page.evaluate(
                """async (now) => {
                  const { age, eta } = await import("/static/js/format.js");
                  const at = (ago) => new Date((now - ago) * 1000).toISOString();
                  return [eta({ state: "running", progress: { eta_seconds: 300,
                    updated_at: at(10) } }), age(at(30))];
                }""",
                time.time(),  # the service's clock: the same host's
            )
            assert shown[0] in ("4m 49s", "4m 50s", "4m 51s"), (skew, shown)
            assert shown[1] in ("29s", "30s", "31s"), (skew, shown)
            assert session.errors == []
        finally:
            session.context.close()


def test_a_late_answer_does_not_set_the_services_clock_back(
    session: Session, service: Service
) -> None:
    """The page took the service's clock to be an answer's `Date` header as it arrived: an
    answer 3 s in transit (a slow network, a busy page) set it 3 s back, and every age read
    3 s short, every ETA 3 s long. An answer is stamped between its request and its
    arrival, and the page keeps what all its answers say of the clock."""
    page = session.page
    page.goto("/")
    expect(page.locator("#devices .device")).not_to_have_count(0)  # prompt answers came

    def late(route: Route) -> None:
        # Stamped now, by the service (asked without the query that marks the test's read).
        answer = route.fetch(url=route.request.url.removesuffix("?late"))
        time.sleep(3.0)
        route.fulfill(response=answer)

    # Only the test's read: the page's own devices reads go on unheld.
    page.route(re.compile(r"/api/v1/devices\?late$"), late)
    ages = page.evaluate(
        """async () => {
          const { getJSON } = await import("/static/js/api.js");
          const { age } = await import("/static/js/format.js");
          await getJSON("/api/v1/devices?late");  // answered 3 s after the service stamped it
          // The service's clock is this browser's: the same host's.
          const at = (ago) => new Date(Date.now() - ago * 1000).toISOString();
          return [age(at(30))];
        }"""
    )
    # Within 2 s: the estimate is the middle of the narrowest bound the answers allow, as
    # wide as a quick read's round trip, which took 2-3 s on a loaded CI host (28s seen).
    # The late answer alone, as the page once took it, gave 26s.
    assert ages[0] in ("28s", "29s", "30s", "31s", "32s"), ages
    assert session.errors == []


# Parts of the pages that change every second or every few (ages, ETAs, progress, the
# log tail): none may sit in a live region, or a screen reader reads each change out.
TICKING = ".col-age, .col-eta, .col-progress, .meta, [data-stat], #job-progress-text, #log"
IN_LIVE_REGION = """(selector) => [...document.querySelectorAll(selector)]
  .filter((el) => el.closest('[aria-live]:not([aria-live="off"]), [role=status], [role=alert],'
    + ' [role=log], [role=marquee], [role=timer]'))
  .map((el) => el.id || el.className)"""


def test_ticking_parts_are_not_read_out(session: Session, service: Service) -> None:
    """The whole view was a polite live region (`<main aria-live="polite">`): a screen
    reader announced every age and ETA as it ticked, each progress report, and the log
    tail each time it was read again. Only the pages' messages are live regions."""
    page = session.page
    job = service.submit(job_spec(name="ticking"))  # runs until cancelled
    try:
        service.wait_state(job["id"], "running")
        page.goto("/")
        expect(page.locator(f'tr[data-job="{job["id"]}"] .col-age')).not_to_have_text("")
        assert page.evaluate(IN_LIVE_REGION, TICKING) == []
        page.goto(f"/#/jobs/{job['id']}")
        expect(page.locator(".job-heading .state")).to_have_text("running")
        expect(page.locator(".meta")).to_contain_text("submitted")
        assert page.evaluate(IN_LIVE_REGION, TICKING) == []
        assert session.errors == []
    finally:
        service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
        service.wait_state(job["id"], "cancelled", "failed", "succeeded")


def test_edit_of_a_jobs_spec_comes_back_on_reload(session: Session, service: Service) -> None:
    """Edit & resubmit, typed into, then the page reloaded (or left and come back to with
    Back): the form showed the job's spec again, the edit hidden under "Draft", though
    what the editor holds comes back when the form is opened again."""
    page = session.page
    job = service.submit(job_spec(name="quick"))  # succeeds at once
    page.goto(f"/#/submit?from={job['id']}")
    editor = page.locator("#spec")
    expect(editor).to_have_value(re.compile('"name": "quick"'))
    editor.press("Control+Home")
    page.keyboard.type('{"name": "my-edit", "data": {"format": "synthetic"}}')
    expect(page.locator("#preset")).to_have_value("draft")
    typed = editor.input_value()
    for leave in (page.reload, lambda: (page.goto("/#/"), page.go_back())):
        leave()
        expect(page.locator("#preset")).to_have_value("draft")
        expect(editor).to_have_value(typed)
    page.locator("#preset").select_option("from")  # the job's spec is still a start
    expect(editor).to_have_value(re.compile('"name": "quick"'))


def test_back_to_the_jobs_list_keeps_its_rows_and_place(session: Session, service: Service) -> None:
    """Show more, scroll down, open a job, press Back: the list came back with its first
    page at its top, the row that was opened not even shown. Back (and a reload) brings the
    rows shown and the place back; the list opened anew starts at its top."""
    extra = [service.submit(job_spec(name=f"place-{i}")) for i in range(55)]
    for job in extra:  # the first may have started (it runs until cancelled); the rest wait
        service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
    for job in extra:
        service.wait_state(job["id"], "cancelled", "failed", "succeeded")
    page = session.page
    page.goto("/#/")
    rows = page.locator("#jobs-table tbody tr")
    expect(rows).to_have_count(50)
    page.get_by_role("button", name="Show more").click()
    expect(rows).not_to_have_count(50)
    shown = rows.count()
    row = rows.nth(shown - 2)
    row.scroll_into_view_if_needed()
    page.wait_for_timeout(400)  # the place is kept at most 200 ms after a scroll
    scrolled = page.evaluate("scrollY")
    assert scrolled > 1000, scrolled
    opened = row.get_attribute("data-job")
    row.locator("a.job-name").click()
    expect(page.locator("h1.job-title")).to_be_visible()
    for back in (page.go_back, page.reload):
        back()
        expect(rows).to_have_count(shown)
        expect(page.locator(f'tr[data-job="{opened}"]')).to_be_in_viewport()
        assert abs(page.evaluate("scrollY") - scrolled) < 5
    page.locator(f'tr[data-job="{opened}"] a.job-name').click()
    expect(page.locator("h1.job-title")).to_be_visible()
    page.locator('a[data-nav="jobs"]').click()  # the same list, opened anew: its top
    page.wait_for_timeout(300)
    expect(rows).to_have_count(50)
    assert page.evaluate("scrollY") == 0
    assert session.errors == []


def test_a_page_switch_is_said_once_from_its_heading(session: Session, service: Service) -> None:
    """With the view no live region, nothing told a screen reader where a link had led.
    A status line outside the view says the new page's heading, once it has filled in."""
    page = session.page
    job = service.submit(job_spec(name="quick", steps=1))
    service.wait_state(job["id"], "succeeded", "failed", "cancelled")
    page.goto("/")
    announcer = page.locator("#route-announcer")
    expect(page.locator("#view h1")).to_have_text("Jobs")
    expect(announcer).to_have_text("")  # the page a browser opens, it reads out itself
    page.locator('a[data-nav="submit"]').click()
    expect(announcer).to_have_text("Submit a job")
    page.goto(f"/#/jobs/{job['id']}")
    expect(announcer).to_have_text("quick")
    assert session.errors == []


def test_a_page_switch_to_a_missing_job_says_what_the_page_shows(session: Session) -> None:
    """A link to a job that does not exist shows "No job X." in place of the job's page,
    its heading hidden; the page switch was said from that hidden heading (the bare id)."""
    page = session.page
    page.goto("/")
    expect(page.locator("#view h1")).to_have_text("Jobs")
    page.goto("/#/jobs/nosuch")
    expect(page.locator("#job-load-error")).to_have_text("No job nosuch.")
    expect(page.locator("#route-announcer")).to_have_text("No job nosuch.")
    assert session.errors == []


@pytest.mark.parametrize("name", ["quick", None])
def test_a_page_switch_is_said_once_a_slow_read_has_filled_it(
    session: Session, service: Service, name: str | None
) -> None:
    """The page switch was said 400 ms after it, whatever the page showed then: with the
    job's read slower than that (a slow network, a loaded host), a job's page was said by
    its bare id, not its name, and a missing job's by "nosuch", not "No job nosuch."."""
    job_id = "nosuch"
    if name is not None:
        job = service.submit(job_spec(name=name, steps=1))
        service.wait_state(job["id"], "succeeded", "failed", "cancelled")
        job_id = str(job["id"])
    page = session.page
    page.goto("/")
    expect(page.locator("#view h1")).to_have_text("Jobs")
    held: list[Route] = []
    read = re.compile(rf"/api/v1/jobs/{job_id}$")
    # The job's read, answered only when the test says.
    page.route(read, lambda route: held.append(route))
    try:
        with page.expect_request(read):
            page.goto(f"/#/jobs/{job_id}")
        announcer = page.locator("#route-announcer")
        page.wait_for_timeout(1_000)  # well past the 400 ms the page gives itself
        assert held, "the job's read was not held"
        expect(announcer).to_have_text("")  # nothing said while the page is still blank
        expect(page.locator("#view")).to_have_attribute("aria-busy", "true")
        for route in held:  # the page's read, and any the stream's refusal asks for
            route.continue_()
    finally:
        page.unroute(read)
    said = name if name is not None else f"No job {job_id}."
    expect(announcer).to_have_text(said)
    expect(page.locator("#view")).not_to_have_attribute("aria-busy", "true")
    assert session.errors == []


def test_tensorboard_tab_is_closed_when_its_page_goes_first(
    session: Session, service: Service
) -> None:
    """ "Open in TensorBoard" opens its tab at once (inside the click, as a popup blocker
    wants) and points it at TensorBoard once the service answers. The job page left before
    that answer (another page of the dashboard, or the dashboard reloaded) left the tab
    blank for good; it is closed."""
    job = service.submit(job_spec(name="quick", steps=1))
    ended = service.wait_state(job["id"], "succeeded", "failed", "cancelled")
    held: list[Route] = []

    def hold(route: Route) -> None:
        if route.request.method == "POST":
            held.append(route)  # no answer, until the test ends
        else:
            route.continue_()

    page = session.page
    page.route("**/api/v1/tensorboard", hold)
    try:
        for leave in (lambda: page.locator(".crumbs a").click(), page.reload):
            page.goto(f"/#/jobs/{job['id']}")
            expect(page.locator(".job-heading .state")).to_have_text(ended["state"])
            with session.context.expect_page() as popup:
                page.locator("#open-tensorboard").click()
            tab = popup.value
            expect(page.locator("#tensorboard-status")).to_have_text("Starting TensorBoard…")
            with tab.expect_event("close", timeout=5_000):
                leave()
        assert len(held) == 2
        assert session.errors == []
    finally:
        for route in held:
            route.abort()


def test_cancel_that_needed_a_kill_says_why_once(browser: Browser, tmp_path: Path) -> None:
    """A worker that ignores SIGTERM is killed after the grace; the page shows the
    service's reason, which starts "Cancelled: ", under one "Cancelled:" heading, as a
    cancel (not in the failure's box), and where Resume trains from: it saved no
    checkpoint, so from step 0."""
    service = Service(
        tmp_path / "data", {"TOWERBOARD_CANCEL_GRACE_SECONDS": "0.05", **fake_worker_env(tmp_path)}
    )
    service.start()
    session = open_session(browser, service, LAPTOP)
    try:
        job = service.submit(job_spec(name="deaf"))  # ignores SIGTERM
        service.wait_state(job["id"], "running")
        assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
        ended = service.wait_state(job["id"], "cancelled", "failed", "succeeded")
        reason = ended["error"]["reason"]
        assert ended["state"] == "cancelled" and reason.startswith("Cancelled: "), ended
        page = session.page
        page.goto(f"/#/jobs/{job['id']}")
        outcome = page.locator("#job-outcome")
        expect(outcome).to_be_visible()
        expect(outcome.locator("strong")).to_have_text(re.compile(r"^Cancelled:\s*$"))
        # Killed after the grace, or stopped by SIGTERM before it set it aside (the cancel
        # may come first): its last report is said where it made one.
        step = (ended["progress"] or {}).get("step")
        reported = f" Its last report was at step {step} of 10." if step is not None else ""
        expect(outcome).to_have_text(
            f"Cancelled: T{reason.removeprefix('Cancelled: t')}{reported} Resume trains again "
            "from step 0, as no checkpoint was saved."
        )
        expect(page.locator(".job-error")).to_be_hidden()
        assert session.errors == []
    finally:
        session.context.close()
        service.close()


def test_api_docs_need_nothing_from_outside(browser: Browser, service: Service) -> None:
    """The dashboard's "API" link opens /docs, whose Swagger UI (and /redoc's ReDoc) came
    from cdn.jsdelivr.net: a blank page on a host without internet, as GPU hosts often
    are. Both come from the service now: every request elsewhere is refused, and none is
    for what the pages need (ReDoc's "by Redocly" logo, an image, is left to fail)."""
    session = open_session(browser, service, LAPTOP)
    outside: list[str] = []

    def refuse(route: Route) -> None:
        if route.request.resource_type != "image":
            outside.append(route.request.url)
        route.abort()

    page = session.page
    page.route(lambda url: not url.startswith(service.base_url), refuse)
    try:
        page.goto("/docs")
        expect(page.locator(".swagger-ui .info .title")).to_contain_text("Towerboard")
        expect(page.locator(".opblock-summary-path", has_text="/api/v1/jobs").first).to_be_visible()
        page.goto("/redoc")
        expect(page.get_by_role("heading", name=re.compile("^Towerboard"))).to_be_visible()
        expect(page.get_by_text("/api/v1/jobs/{job_id}/cancel").first).to_be_attached()
        assert outside == []
        assert session.errors == []
    finally:
        session.context.close()
