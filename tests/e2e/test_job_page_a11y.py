"""A job's page as a keyboard or screen-reader user meets it, in headless Chromium against
a real service whose worker is READER_WORKER below: the focus kept on a checkpoint's
Download link as checkpoints come in, the charts said in words, and a failure's `quoted`
names shown as code. No model is trained here, so none of it is marked slow."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import TERMINAL, Session
from tests.service.harness import Service, job_spec, stand_in_head, stand_in_service

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)

# `python -m reader_worker run --job-dir DIR`, by its spec's name: "checkpoints" takes a
# step every 0.1 s and checkpoints every 5 (the files a CheckpointManager writes, which the
# service lists, and the progress line) until SIGTERM, and once a `drop` file is in its
# run directory deletes its two oldest checkpoints at once (retention); "points" reports loss 1, 0.5, 0.25
# at steps 1, 2, 4 and eval loss 0.75 at step 2, then succeeds; "quoted" fails with a
# reason that quotes a name, as the trainer's data checks do; "diverged" fails as the
# trainer's divergence check does. For test_live_values:
# "millions" reports steps 9,000,000 to 9,800,000 with a loss falling from 1e-5 and a
# million examples a second, then succeeds; "bad-tower" runs as "checkpoints" does and at
# step 3 writes a trace line whose tower times hold a null (the trainer never does; the
# service keeps no such list). For test_keyboard_stays: "stops-when-released" runs as
# "checkpoints" does, and after SIGTERM ends cancelled only once released (Service.release).
READER_WORKER = (
    stand_in_head(1000, "\nfrom service.checkpoints import INDEX_END\n")
    + """\


def end(outcome, code, message=name):
    (job_dir / "result.json").write_text(json.dumps({"outcome": outcome, "message": message}))
    sys.exit(code)


progress(event="start", step=0, phase="starting")
if name == "points":
    for step, loss in ((1, 1.0), (2, 0.5), (4, 0.25)):
        progress(event="progress", step=step, loss=loss)
        if step == 2:
            progress(event="eval", step=step, eval_loss=0.75)
    end("succeeded", 0)
if name == "quoted":
    end("failed", 1, "The worker rejected the spec: data: Expected float pixels `x` in [0, 1]. "
        "Received: 1 NaN.")
if name == "diverged":
    progress(event="progress", step=1, loss=2.3)
    end("failed", 1, "Loss became non-finite (nan) at step 3.")
if name == "millions":
    for k in range(9):
        progress(event="progress", step=9_000_000 + 100_000 * k, total=10_000_000,
                 loss=1e-5 / (k + 1), accuracy=0.5, examples_per_sec=1234567.0)
    end("succeeded", 0)
checkpoints = job_dir / "checkpoints"
checkpoints.mkdir(exist_ok=True)
step = 0
while not stopped:
    time.sleep(0.1)
    step += 1
    progress(event="progress", step=step, loss=1 / step)
    if name == "bad-tower" and step == 3:
        progress(event="trace", step=step, tower_ms=[1.5, None])
    if step % 5 == 0:
        (checkpoints / f"ckpt-{step}.data-00000-of-00001").write_bytes(b"weights")
        (checkpoints / f"ckpt-{step}.index").write_bytes(b"index" + INDEX_END)
        progress(event="checkpoint", step=step, checkpoint=str(checkpoints / f"ckpt-{step}"))
    if (job_dir / "drop").exists():
        (job_dir / "drop").unlink()
        kept = sorted(int(p.name[5:-6]) for p in checkpoints.glob("ckpt-*.index"))
        for old in kept[:2]:
            for part in checkpoints.glob(f"ckpt-{old}.*"):
                part.unlink()
if name == "stops-when-released":  # as a trainer slow to checkpoint; 120 s at most
    until = time.time() + 120
    while time.time() < until and not (job_dir / "release").exists():
        time.sleep(0.05)
end("cancelled", 3)
"""
)

# The newest checkpoint's step on the page (0 before any).
NEWEST_STEP = """() => Math.max(0, ...[...document.querySelectorAll("#checkpoints a.download")]
  .map((a) => Number(a.dataset.step)))"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(
        tmp_path_factory.mktemp("reader"), ("reader_worker", READER_WORKER)
    ) as svc:
        yield svc


def test_focus_stays_on_a_checkpoint_link_as_checkpoints_come(
    session: Session, service: Service
) -> None:
    """The keyboard on a checkpoint's Download link stays there while new checkpoints come
    in above it: the table was rebuilt at each one, and the focus went back to the page's
    top (on <body>) within half a second. The same link node, still in the page."""
    job = service.submit(job_spec(name="checkpoints"))
    try:
        page = session.page
        page.goto(f"/#/jobs/{job['id']}")
        expect(page.locator(".job-heading .state")).to_have_text("running")
        first = page.locator("#checkpoints a.download").first
        expect(first).to_be_visible()
        step = first.get_attribute("data-step")
        # By its step: `.first` is looked up again at each use, and a newer row comes
        # every half second.
        link = page.locator(f'#checkpoints a.download[data-step="{step}"]')
        link.focus()
        page.evaluate("() => { window.focusedLink = document.activeElement; }")
        assert page.evaluate("() => window.focusedLink.dataset.step") == step
        # Three newer checkpoints listed, each read from the service as it came.
        page.wait_for_function(f"() => ({NEWEST_STEP})() >= {int(step or 0) + 15}")
        kept = page.evaluate(
            "() => [document.activeElement === window.focusedLink, window.focusedLink.isConnected]"
        )
        assert kept == [True, True], "the focus left the Download link"
        expect(page.get_by_role("link", name=f"Download .tar.gz of step {step}")).to_be_focused()
        # Newest first, each step once.
        steps = page.eval_on_selector_all(
            "#checkpoints a.download", "links => links.map((a) => Number(a.dataset.step))"
        )
        assert steps == sorted(set(steps), reverse=True), steps
        assert session.errors == []
    finally:
        service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
        service.wait_state(job["id"], *TERMINAL)


def test_focus_goes_to_the_nearest_row_that_stays_when_retention_drops_rows(
    session: Session, service: Service
) -> None:
    """The keyboard on one of the two oldest checkpoints' links, and retention drops both
    at once: the focus goes on from the nearest row that stays. It went to the row beside,
    which was going too, and fell to the page's top (<body>). Both rows are tried: which
    of the two the page lets go first depends on the order it listed them in."""
    job = service.submit(job_spec(name="checkpoints"))
    run = service.data_dir / "runs" / job["id"]
    links = "#checkpoints a.download"
    try:
        page = session.page
        page.goto(f"/#/jobs/{job['id']}")
        expect(page.locator(".job-heading .state")).to_have_text("running")
        page.wait_for_function(f"() => document.querySelectorAll('{links}').length >= 5")
        for focused in (0, 1):  # the oldest, then the second oldest
            steps = sorted(
                page.eval_on_selector_all(links, "a => a.map((l) => Number(l.dataset.step))")
            )
            page.locator(f'{links}[data-step="{steps[focused]}"]').focus()
            (run / "drop").write_text("")
            for gone in steps[:2]:
                expect(page.locator(f'{links}[data-step="{gone}"]')).to_have_count(0)
            expect(page.locator(f'{links}[data-step="{steps[2]}"]')).to_be_focused()
        assert session.errors == []
    finally:
        service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
        service.wait_state(job["id"], *TERMINAL)


def test_charts_say_their_latest_values_in_words(session: Session, service: Service) -> None:
    """Each chart is a figure named by its caption that says each series' latest value and
    its first, with their steps. A screen reader got only the legend's table of series
    names (no values); the canvas is an image named by the caption now, and the legend
    a row of toggle buttons."""
    job = service.submit(job_spec(name="points"))
    assert service.wait_state(job["id"], *TERMINAL)["state"] == "succeeded"
    page = session.page
    page.goto(f"/#/jobs/{job['id']}")
    loss = page.get_by_role("figure", name="Loss", exact=True)
    expect(loss).to_have_attribute("data-points", "4")  # three train points and one eval
    expect(loss.get_by_text("train 0.25 at step 4", exact=False)).to_have_text(
        "train 0.25 at step 4 (first 1 at step 1); eval 0.75 at step 2."
    )
    # The plot is an image named by the caption, the legend a toggle button a series (not
    # uPlot's table of names).
    expect(loss.get_by_role("img", name="Loss plot", exact=True)).to_be_visible()
    expect(loss.get_by_role("button", name="train", exact=True)).to_have_attribute(
        "aria-pressed", "true"
    )
    expect(loss.get_by_role("table")).to_have_count(0)
    expect(loss.get_by_role("columnheader")).to_have_count(0)
    # A chart with no point says so, and no summary.
    accuracy = page.get_by_role("figure", name="Accuracy", exact=True)
    expect(accuracy.locator(".chart-summary")).to_have_text("")
    expect(accuracy.locator(".chart-empty")).to_have_text("No data reported.")
    assert session.errors == []


def test_failure_reason_shows_quoted_names_as_code(session: Session, service: Service) -> None:
    """A failure's reason quotes names as Markdown does (`x`): the page shows them as code,
    as the submit form does a refusal's, not with the backticks."""
    job = service.submit(job_spec(name="quoted"))
    ended = service.wait_state(job["id"], *TERMINAL)
    assert ended["state"] == "failed", ended
    assert "`x`" in ended["error"]["reason"], ended["error"]
    page = session.page
    page.goto(f"/#/jobs/{job['id']}")
    box = page.locator(".job-error")
    expect(box).to_contain_text(
        "Failed: The worker rejected the spec: data: Expected float pixels x in [0, 1]. "
        "Received: 1 NaN. (exit code 1)"
    )
    expect(box.locator("code")).to_have_text("x")
    assert "`" not in box.inner_text()
    # The log's last lines under it, focusable to scroll, named as the Log section's is.
    tail = box.get_by_label("Last lines of the worker's log", exact=True)
    expect(tail).to_contain_text(f"attempt 1 of job {job['id']}")
    expect(tail).to_have_attribute("tabindex", "0")
    expect(page.locator("#diverged-hint")).to_have_count(0)  # not a run that diverged
    assert session.errors == []


def test_a_diverged_run_says_what_to_change(session: Session, service: Service) -> None:
    """A run whose loss became NaN: the box says that Resume, as it is, would most likely
    diverge again, what to change, and links to Edit & resubmit."""
    job = service.submit(job_spec(name="diverged"))
    ended = service.wait_state(job["id"], *TERMINAL)
    assert ended["state"] == "failed", ended
    page = session.page
    page.goto(f"/#/jobs/{job['id']}")
    box = page.locator(".job-error")
    expect(box).to_contain_text("Failed: Loss became non-finite (nan) at step 3. (exit code 1)")
    hint = box.locator("#diverged-hint")
    expect(hint).to_have_text(
        "The run diverged: resumed as it is, it would most likely diverge again. Lower "
        "optimizer.learning_rate or set clip_norm, then Edit & resubmit."
    )
    expect(hint.locator("code")).to_have_text(["optimizer.learning_rate", "clip_norm"])
    hint.get_by_role("link", name="Edit & resubmit").click()
    expect(page).to_have_url(f"{service.base_url}/#/submit?from={job['id']}")
    expect(page.locator("#spec")).to_have_value(re.compile(r'"name": "diverged"'))
    assert session.errors == []
