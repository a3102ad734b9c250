"""Comparing jobs from the jobs list, in headless Chromium against a real service whose
worker is a stand-in (it writes a TensorBoard event file and its progress lines at once)
and a real TensorBoard: a box per row picks a job, by keyboard or by mouse, and "Compare
in TensorBoard (N)" adds the picked jobs to the shared TensorBoard and opens it filtered
to them; what is picked stays through the list's live updates, re-reads, filters and a
reload, and a deleted job leaves it (one deleted unseen is said as such when pressed, and
the rest compared)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from playwright.sync_api import Browser, Locator, Page, Request, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import PHONE, Session, list_read_now, no_overflow, open_session
from tests.service.harness import Service, job_spec, stand_in_head, stand_in_service

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)]

# `python -m compare_worker run --job-dir DIR`. A job named "live…" steps every 0.2 s,
# saying so, until SIGTERM cancels it (as the trainer stops). Any other writes a loss at
# steps 100 and 300 to `tb/train` (an event file framed as TensorFlow's, by TensorBoard's
# own writer: no TensorFlow to import), reports them, and succeeds.
COMPARE_WORKER = (
    stand_in_head(
        1000,
        "\nfrom tensorboard.compat.proto import event_pb2, summary_pb2\n"
        "from tensorboard.summary.writer.record_writer import RecordWriter\n",
    )
    + """\


progress(event="start", step=0, phase="starting", towers=1)
if name.startswith("live"):
    step = 0
    while not stopped:
        time.sleep(0.2)
        step += 1
        progress(event="progress", step=step, phase="training", loss=1 / step)
    result = {"outcome": "cancelled", "message": "Stopped by SIGTERM.", "step": step}
    (job_dir / "result.json").write_text(json.dumps(result))
    sys.exit(3)
folder = job_dir / "tb" / "train"
folder.mkdir(parents=True)
with open(folder / f"events.out.tfevents.{int(time.time())}.stand-in", "wb") as f:
    writer = RecordWriter(f)
    writer.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
                 .SerializeToString())
    for step, loss in ((100, 0.9), (300, 0.4)):
        value = summary_pb2.Summary.Value(tag="loss", simple_value=loss)
        event = event_pb2.Event(wall_time=time.time(), step=step,
                                summary=summary_pb2.Summary(value=[value]))
        writer.write(event.SerializeToString())
        progress(event="progress", step=step, loss=loss, accuracy=0.5, examples_per_sec=100.0)
    writer.flush()
(job_dir / "result.json").write_text(json.dumps({"outcome": "succeeded", "message": name}))
"""
)
STARTING = re.compile(r"^(Starting TensorBoard…|TensorBoard is starting: open it\.)$")
RUNNING = "TensorBoard is running: open it."


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(
        tmp_path_factory.mktemp("compare"), ("compare_worker", COMPARE_WORKER)
    ) as svc:
        yield svc


def finished(service: Service, name: str) -> str:
    """A job run to success by the stand-in worker; its id."""
    job = service.submit(job_spec(name=name))
    ended = service.wait_state(job["id"], "succeeded", "failed", "cancelled")
    assert ended["state"] == "succeeded", ended
    return str(job["id"])


def runs(service: Service) -> list[str]:
    """TensorBoard's runs, as its own page reads them: through the service's proxy."""
    response = service.client.get("/tensorboard/data/runs")
    assert response.status_code == 200, response.text
    listed: list[str] = response.json()
    return listed


def pick_box(page: Page, name: str, job_id: str) -> Locator:
    """A row's box, found as a screen reader names it: by the job's name and id."""
    return page.get_by_role("checkbox", name=f"Compare {name} ({job_id})", exact=True)


def compare_button(page: Page) -> Locator:
    return page.get_by_role("button", name=re.compile(r"^Compare in TensorBoard \(\d+\)$"))


def test_compare_two_of_three_jobs_in_tensorboard(
    session: Session, service: Service, screenshots: Path
) -> None:
    """Two of three jobs picked, one by keyboard and one by mouse: the button adds just
    those to TensorBoard, opens it in a new tab filtered to their runs, and says how it
    goes as a job page's Open in TensorBoard does; the jobs stay picked."""
    service.client.delete("/api/v1/tensorboard")
    first, second, third = (finished(service, f"cmp-{n}") for n in ("a", "b", "c"))
    page = session.page
    page.goto("/#/")
    for job_id in (first, second, third):
        expect(page.locator(f'tr[data-job="{job_id}"] .state')).to_have_text("succeeded")
    button = compare_button(page)
    expect(button).to_have_text("Compare in TensorBoard (0)")
    expect(button).to_have_attribute("aria-disabled", "true")  # none picked: it does nothing
    expect(page.locator("#compare-clear")).to_be_hidden()

    # By keyboard: from the search box, the first row's box (the newest job: the third),
    # ticked with Space.
    third_box = pick_box(page, "cmp-c", third)
    page.locator("#jobs-search").focus()
    page.keyboard.press("Tab")
    expect(third_box).to_be_focused()
    page.keyboard.press("Space")
    expect(third_box).to_be_checked()
    expect(button).to_have_text("Compare in TensorBoard (1)")
    expect(button).not_to_have_attribute("aria-disabled", "true")
    # By mouse, the first job's.
    first_box = pick_box(page, "cmp-a", first)
    first_box.click()
    expect(first_box).to_be_checked()
    expect(pick_box(page, "cmp-b", second)).not_to_be_checked()
    expect(button).to_have_text("Compare in TensorBoard (2)")
    expect(page.locator("#jobs-summary")).to_contain_text("; 2 picked to compare")
    page.screenshot(path=screenshots / "dashboard-compare-picked.png")

    status = page.locator("#compare-status")
    with session.context.expect_page() as popup:
        button.click()
    expect(status).to_have_text(STARTING)  # it imports TensorFlow first: seconds
    board = popup.value
    # The tab is pointed at TensorBoard once the service answers, its run filter the two
    # jobs' runs alone (`(id|id)(/|$)`, a regular expression as TensorBoard reads it).
    board.wait_for_url(re.compile(r"/tensorboard/\?runFilter="), timeout=180_000)
    run_filter = parse_qs(urlparse(board.url).query)["runFilter"]
    assert run_filter == [f"({third}|{first})(/|$)"], board.url
    expect(status).to_have_text(RUNNING, timeout=120_000)
    expect(status.get_by_role("link", name="open it")).to_have_attribute(
        "href", re.compile(r"^/tensorboard/\?runFilter=")
    )
    shared = service.client.get("/api/v1/tensorboard").json()
    assert sorted(shared["job_ids"]) == sorted([first, third]), shared
    # TensorBoard's runs, through the proxy: the two jobs', named by name then id.
    wanted = sorted([f"cmp-a · {first}/train", f"cmp-c · {third}/train"])
    deadline = time.monotonic() + 60
    while (listed := sorted(runs(service))) != wanted:
        assert time.monotonic() < deadline, listed
        time.sleep(0.5)
    # Nothing cleared: the same two stay picked, to compare again or change.
    expect(first_box).to_be_checked()
    expect(third_box).to_be_checked()
    expect(button).to_have_text("Compare in TensorBoard (2)")
    expect(page.locator("#compare-notice")).to_be_hidden()
    board.close()

    # Clear selection unticks them all; the keyboard goes on from the button beside it.
    page.locator("#compare-clear").click()
    expect(first_box).not_to_be_checked()
    expect(third_box).not_to_be_checked()
    expect(button).to_have_text("Compare in TensorBoard (0)")
    expect(button).to_be_focused()
    assert session.errors == []


def test_picked_jobs_stay_through_live_updates_and_a_deleted_one_leaves(
    session: Session, service: Service
) -> None:
    """A running job's row is rewritten at each of its reports, the list is re-read, a
    filter mounts it anew: the picked boxes stay ticked, and the button counts them all.
    A picked job deleted (from the API, as another user would) leaves the pick."""
    done = finished(service, "kept-done")
    live = service.submit(job_spec(name="live-kept"))["id"]
    service.wait_for(live, lambda job: ((job["progress"] or {}).get("step") or 0) >= 1)
    page = session.page
    page.clock.install()  # before the page loads: its list polls are the clock's
    page.goto("/#/")
    live_row = page.locator(f'tr[data-job="{live}"]')
    expect(live_row.locator(".state")).to_have_text("running")
    live_box, done_box = pick_box(page, "live-kept", live), pick_box(page, "kept-done", done)
    live_box.click()
    done_box.focus()
    page.keyboard.press("Space")
    button = compare_button(page)
    expect(button).to_have_text("Compare in TensorBoard (2)")

    # Live updates: the running row's step moves on (its cells rewritten by the stream).
    step = live_row.locator(".step")
    before = step.inner_text()
    expect(step).not_to_have_text(before)
    expect(live_box).to_be_checked()
    expect(done_box).to_be_checked()
    # A re-read of the list (its poll, now).
    list_read_now(page)
    expect(step).not_to_have_text(step.inner_text())  # still live after the read
    expect(live_box).to_be_checked()
    expect(done_box).to_be_checked()
    # A new job (queued behind the running one: one slot), put on top by the stream.
    newer = service.submit(job_spec(name="kept-newer"))["id"]
    expect(page.locator(f'tr[data-job="{newer}"]')).to_be_visible()
    expect(live_box).to_be_checked()
    expect(done_box).to_be_checked()

    # A filter mounts the list anew: the succeeded jobs alone. The running job, not in
    # this list, stays picked and counted.
    page.locator('.chip[data-state="succeeded"]').click()
    expect(live_row).to_have_count(0)
    expect(done_box).to_be_checked()
    expect(button).to_have_text("Compare in TensorBoard (2)")
    expect(page.locator("#jobs-summary")).to_contain_text(
        "; 2 picked to compare (1 not in this list)"
    )
    page.locator('.chip[data-state=""]').click()
    expect(live_box).to_be_checked()
    expect(done_box).to_be_checked()

    # The finished one deleted: its row goes, and the pick with it.
    service.wait_exited(done)
    deleted = service.client.delete(f"/api/v1/jobs/{done}")
    assert deleted.status_code in (200, 204), deleted.text
    expect(page.locator(f'tr[data-job="{done}"]')).to_have_count(0)
    expect(button).to_have_text("Compare in TensorBoard (1)")
    expect(page.locator("#jobs-summary")).to_contain_text("; 1 picked to compare")
    expect(page.locator("#jobs-summary")).not_to_contain_text("not in this list")
    expect(live_box).to_be_checked()
    for job_id in (newer, live):
        service.client.post(f"/api/v1/jobs/{job_id}/cancel")
        service.wait_state(job_id, "cancelled")
    assert session.errors == []


def test_phone_cards_have_the_box(browser: Browser, service: Service, screenshots: Path) -> None:
    """Below 820px each job is a card: its box is at the card's top right, a finger's
    width to press, and picks as on a laptop."""
    job_id = finished(service, "phone-pick")
    phone = open_session(browser, service, PHONE)
    try:
        page = phone.page
        page.goto("/#/")
        box = pick_box(page, "phone-pick", job_id)
        expect(box).to_be_visible()
        card = page.locator(f'tr[data-job="{job_id}"]').bounding_box()
        target = page.locator(f'tr[data-job="{job_id}"] .pick-target').bounding_box()
        assert card is not None and target is not None
        assert target["width"] >= 40 and target["height"] >= 40, target
        assert target["x"] + target["width"] <= card["x"] + card["width"] + 1, (card, target)
        assert target["x"] > card["x"] + card["width"] / 2, (card, target)  # its right half
        assert target["y"] <= card["y"] + 10, (card, target)  # at its top
        box.click()
        expect(box).to_be_checked()
        expect(compare_button(page)).to_have_text(re.compile(r"^Compare in TensorBoard \([1-9]"))
        assert no_overflow(page)
        page.screenshot(path=screenshots / "dashboard-phone-compare.png")
        assert phone.errors == []
    finally:
        phone.context.close()


def delete_unseen(page: Page, service: Service, job_id: str) -> None:
    """Delete a job while the page shows the submit form, which follows no job: the jobs
    list is mounted again, unaware, by the browser's Back."""
    page.get_by_role("link", name="New job").click()
    expect(page.locator("#spec")).to_be_visible()
    service.wait_exited(job_id)
    deleted = service.client.delete(f"/api/v1/jobs/{job_id}")
    assert deleted.status_code in (200, 204), deleted.text
    page.go_back()


def closed(page: Page, tab: Page) -> None:
    deadline = time.monotonic() + 20
    while not tab.is_closed():
        assert time.monotonic() < deadline, tab.url
        page.wait_for_timeout(100)


def test_a_picked_job_deleted_unseen_is_said_and_the_rest_compared(
    session: Session, service: Service
) -> None:
    """A picked job deleted while no list was open to see it (the submit page was): the
    list says it is not in this list; pressed, the service refuses it (422, an unknown
    job), and the line says so in plain words, by the job's name, takes it out of the pick
    and compares the rest in the tab it opened. With none left, the tab is closed."""
    gone, kept = finished(service, "deleted-unseen"), finished(service, "kept-unseen")
    page = session.page
    page.goto("/#/")
    pick_box(page, "deleted-unseen", gone).click()
    pick_box(page, "kept-unseen", kept).click()
    button = compare_button(page)
    expect(button).to_have_text("Compare in TensorBoard (2)")
    delete_unseen(page, service, gone)
    expect(pick_box(page, "kept-unseen", kept)).to_be_checked()
    expect(button).to_have_text("Compare in TensorBoard (2)")
    expect(page.locator("#jobs-summary")).to_contain_text(
        "; 2 picked to compare (1 not in this list)"
    )
    asked: list[list[str]] = []  # the job_ids of each start the page asks for

    def on_request(request: Request) -> None:
        if request.method == "POST" and request.url.endswith("/api/v1/tensorboard"):
            body = request.post_data_json
            assert isinstance(body, dict), request.post_data
            asked.append(body["job_ids"])

    page.on("request", on_request)
    status = page.locator("#compare-status")
    with session.context.expect_page() as popup:
        button.click()
    said = rf"^Job deleted-unseen \({gone}\) was deleted\. "
    expect(status).to_have_text(
        re.compile(said + r"(Starting TensorBoard…|TensorBoard is (starting|running): open it\.)$")
    )
    expect(status).not_to_contain_text("Unknown job")
    # The rest, in the tab the press opened: its run filter the kept job's runs alone.
    board = popup.value
    board.wait_for_url(re.compile(r"/tensorboard/\?runFilter="), timeout=60_000)
    assert parse_qs(urlparse(board.url).query)["runFilter"] == [f"{kept}(/|$)"], board.url
    assert asked == [[gone, kept], [kept]], asked
    expect(button).to_have_text("Compare in TensorBoard (1)")
    expect(page.locator("#jobs-summary")).not_to_contain_text("not in this list")
    board.close()

    # The one left deleted unseen too: nothing to compare, said, and the tab closed.
    delete_unseen(page, service, kept)
    with session.context.expect_page() as popup:
        button.click()
    expect(status).to_have_text(
        f"Job kept-unseen ({kept}) was deleted. Nothing left to open in TensorBoard."
    )
    expect(status).to_have_attribute("data-state", "failed")
    closed(page, popup.value)
    expect(button).to_have_text("Compare in TensorBoard (0)")
    assert session.errors == []


def test_picked_jobs_stay_through_a_reload_and_a_deleted_one_drops_out(
    session: Session, service: Service
) -> None:
    """The jobs picked stay picked through a reload of the tab (kept in its
    sessionStorage). One deleted while the tab was elsewhere, and an id no service knows,
    drop out quietly at the next load: no box, no count, no error said."""
    kept, gone = finished(service, "reload-kept"), finished(service, "reload-gone")
    page = session.page
    page.goto("/#/")
    kept_box, gone_box = pick_box(page, "reload-kept", kept), pick_box(page, "reload-gone", gone)
    kept_box.click()
    gone_box.click()
    button = compare_button(page)
    expect(button).to_have_text("Compare in TensorBoard (2)")

    page.reload()
    expect(kept_box).to_be_checked()
    expect(gone_box).to_be_checked()
    expect(button).to_have_text("Compare in TensorBoard (2)")
    expect(page.locator("#jobs-summary")).to_contain_text("; 2 picked to compare")
    expect(page.locator("#compare-clear")).to_be_visible()

    # An id of no job, as a tab kept from another service's data dir would hold.
    page.evaluate(
        """() => {
        const key = "towerboard.compare";
        const picks = JSON.parse(sessionStorage.getItem(key));
        sessionStorage.setItem(key, JSON.stringify([...picks, ["nosuchjob0", "ghost"]]));
    }"""
    )
    # The tab elsewhere while one picked job is deleted: no list sees it go.
    page.goto("about:blank")
    service.wait_exited(gone)
    deleted = service.client.delete(f"/api/v1/jobs/{gone}")
    assert deleted.status_code in (200, 204), deleted.text
    page.goto("/#/")
    expect(kept_box).to_be_checked()
    expect(page.locator(f'tr[data-job="{gone}"]')).to_have_count(0)
    expect(button).to_have_text("Compare in TensorBoard (1)")
    summary = page.locator("#jobs-summary")
    expect(summary).to_contain_text("; 1 picked to compare")
    expect(summary).not_to_contain_text("not in this list")
    expect(page.locator(".error")).to_be_hidden()
    expect(page.locator("#compare-status")).to_have_text("")
    # And so the next reload holds the one left.
    page.reload()
    expect(kept_box).to_be_checked()
    expect(button).to_have_text("Compare in TensorBoard (1)")
    assert page.evaluate("() => sessionStorage.getItem('towerboard.compare')") == (
        f'[["{kept}","reload-kept"]]'
    )
    page.locator("#compare-clear").click()
    assert page.evaluate("() => sessionStorage.getItem('towerboard.compare')") is None
    assert session.errors == []
