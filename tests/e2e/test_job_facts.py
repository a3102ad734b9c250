"""What the dashboard says of a job beyond its numbers, in headless Chromium against a real
service whose workers are stand-ins (they write what the trainer writes, at once): when an
ended job ended, where a cancelled job stopped and what Resume would do, and which job,
by name, holds a device."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.contrast import assert_contrast
from tests.e2e.test_dashboard import Session
from tests.service.harness import Service, job_spec, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)]

# `python -m facts_worker run --job-dir DIR`, by the first word of its spec's name:
# "quick" reports steps 1-3 of 3 and succeeds; "stops" reports steps 1-8 of 100, saves a
# checkpoint of step 8 (files the service lists), and then, as the trainer does on a
# cancel's SIGTERM, ends cancelled at step 8 with the trainer's result (exit 3); "holds"
# reports step 1 and holds its device until cancelled, ending so too; "deaf" saves the same
# checkpoint of step 8, reports steps on to 12 and ignores SIGTERM: a cancel kills it once
# the service's grace (GRACE_S) is past.
FACTS_WORKER = """\
import json, signal, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
behaviour = json.loads((job_dir / "spec.json").read_text())["name"].split("-")[0]
stopped = []
signal.signal(signal.SIGTERM,
              signal.SIG_IGN if behaviour == "deaf" else lambda *_: stopped.append(True))
total = 3 if behaviour == "quick" else 100


def progress(**line):
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), "total": total, **line}) + "\\n")


def result(outcome, message, step, code):
    progress(event="end", step=step, outcome=outcome,
             phase={"succeeded": "done", "cancelled": "stopped"}[outcome])
    (job_dir / "result.json").write_text(json.dumps({
        "outcome": outcome, "message": message, "step": step, "total": total,
        "metrics": {"loss": 0.5}, "eval": None,
        "checkpoint": f"checkpoints/ckpt-{step}" if outcome == "cancelled" else None,
        "export": None}))
    sys.exit(code)


progress(event="start", step=0, phase="starting", towers=1)
last = {"quick": 3, "stops": 8, "holds": 1, "deaf": 12}[behaviour]
for step in range(1, last + 1):
    progress(event="progress", step=step, loss=1 / step, accuracy=0.5, phase="training")
    if step == 8 and behaviour in ("stops", "deaf"):
        folder = job_dir / "checkpoints"
        folder.mkdir(exist_ok=True)
        (folder / "ckpt-8.data-00000-of-00001").write_bytes(b"d" * 64)
        end = (0xDB4775248B80FB57).to_bytes(8, "little")  # a whole index's end (INDEX_END)
        (folder / "ckpt-8.index").write_bytes(b"i" * 92 + end)
        progress(event="checkpoint", step=8, checkpoint="checkpoints/ckpt-8", phase="training")
if behaviour == "quick":
    result("succeeded", "Trained 3 steps.", 3, 0)
while not stopped:
    time.sleep(0.05)
result("cancelled", f"Stopped by SIGTERM at step {last}, after a checkpoint.", last, 3)
"""


# The cancel's grace before SIGKILL: long enough for the stand-ins that stop on SIGTERM
# (50 ms, niced on a busy host), short for the test that waits it out.
GRACE_S = 5


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("facts")
    svc = Service(
        folder / "data",
        {
            "TOWERBOARD_CPU_JOBS": "2",
            "TOWERBOARD_CANCEL_GRACE_SECONDS": str(GRACE_S),
            **worker_env(folder, "facts_worker", FACTS_WORKER),
        },
    )
    svc.start()
    yield svc
    svc.close()


def local_time(page: Page, iso: str) -> str:
    """`iso` as the page writes a time (format.js's localTime), in its locale and zone."""
    return str(page.evaluate("iso => new Date(iso).toLocaleString()", iso))


def cancelled_at_its_checkpoint(service: Service, name: str) -> dict[str, Any]:
    """A "stops" job, cancelled once its checkpoint of step 8 is saved."""
    job = service.submit(job_spec(name=name))
    service.wait_checkpoint(job["id"])
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    ended = service.wait_state(job["id"], "cancelled", "failed", "succeeded")
    assert ended["state"] == "cancelled" and ended["error"] is None, ended
    assert ended["result"]["message"] == "Stopped by SIGTERM at step 8, after a checkpoint."
    return ended


def test_an_ended_jobs_header_says_when_it_ended(session: Session, service: Service) -> None:
    """The header, "submitted 3d 5h ago · started … · ran 20s", said when the job began
    and how long it ran, never when it ended."""
    job = service.submit(job_spec(name="quick"))
    done = service.wait_state(job["id"], "succeeded", "failed", "cancelled")
    assert done["state"] == "succeeded" and done["finished_at"], done
    page = session.page
    page.goto(f"/#/jobs/{job['id']}")
    expect(page.locator(".job-heading .state")).to_have_text("succeeded")
    started = local_time(page, done["started_at"])
    ended = local_time(page, done["finished_at"])
    expect(page.locator("p.meta")).to_contain_text(
        re.compile(rf" · started {re.escape(started)} · ended {re.escape(ended)} · ran \d+s · ")
    )
    assert session.errors == []


def test_a_cancelled_job_says_where_it_stopped_and_what_resume_does(
    session: Session, service: Service
) -> None:
    """A failed job's row and page say why; a job cancelled as asked said nothing of
    where it stopped (its result does) or of what Resume, beside it, would do."""
    job = cancelled_at_its_checkpoint(service, "stops")
    page = session.page
    page.goto("/#/")
    why = page.locator(f'tr[data-job="{job["id"]}"] .job-reason')
    expect(why).to_have_text("Stopped at step 8 of 100, after a checkpoint.")
    # In grey (--muted, #667085), as any note; a failed job's is red: nothing failed.
    assert why.evaluate("el => getComputedStyle(el).color") == "rgb(102, 112, 133)"

    page.locator(f'tr[data-job="{job["id"]}"] a.job-name').click()
    outcome = page.locator("#job-outcome")
    expect(outcome).to_have_text(
        "Cancelled: Stopped at step 8 of 100, after a checkpoint. "
        "Resume trains on from step 8's checkpoint."
    )
    expect(page.locator(".job-error")).to_be_hidden()
    # No alert, no red: a screen reader is not interrupted for it.
    assert outcome.get_attribute("role") is None
    assert outcome.evaluate("el => getComputedStyle(el).backgroundColor") == "rgb(255, 255, 255)"
    expect(page.locator("#resume-job")).to_be_visible()
    assert session.errors == []


def test_a_cancel_that_ended_in_a_kill_says_so_as_a_cancel(
    session: Session, service: Service
) -> None:
    """A worker that did not checkpoint and exit within the grace after a cancel's SIGTERM
    is killed. Its page showed the service's reason in the red failure box, an alert, and
    said nothing of where Resume would train on from. It is a cancel, said as one: in the
    outcome's box, with the step the worker last reported and the checkpoint Resume
    restores; `towerboard status ID` says the same (tests/service/test_client.py)."""
    job = service.submit(job_spec(name="deaf"))
    service.wait_for(
        job["id"], lambda job: (job["progress"] or {}).get("step") == 12, what="step 12"
    )
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    ended = service.wait_state(job["id"], "cancelled", "failed", "succeeded")
    assert ended["state"] == "cancelled" and ended["error"]["signal"] == "SIGKILL", ended
    killed = f"the worker did not exit within {GRACE_S} s of SIGTERM and was killed with SIGKILL."
    assert ended["error"]["reason"] == f"Cancelled: {killed}"
    page = session.page
    page.goto("/#/")
    why = page.locator(f'tr[data-job="{job["id"]}"] .job-reason')
    expect(why).to_have_text(f"T{killed[1:]}")  # from a capital, as every reason there
    assert why.evaluate("el => getComputedStyle(el).color") == "rgb(102, 112, 133)"  # grey

    page.locator(f'tr[data-job="{job["id"]}"] a.job-name').click()
    outcome = page.locator("#job-outcome")
    expect(outcome).to_have_text(
        f"Cancelled: T{killed[1:]} Its last report was at step 12 of 100. "
        "Resume trains on from step 8's checkpoint."
    )
    expect(page.locator(".job-error")).to_be_hidden()
    assert outcome.get_attribute("role") is None
    assert outcome.evaluate("el => getComputedStyle(el).backgroundColor") == "rgb(255, 255, 255)"
    expect(page.locator("#resume-job")).to_be_visible()
    expect(page.locator("#finish-job")).to_have_text("Finish at step 8")
    for scheme in ("dark", "light"):
        page.emulate_media(color_scheme=scheme)
        assert_contrast(page, f"a killed cancel's page ({scheme})")
    assert session.errors == []


def test_the_devices_panel_names_the_job_holding_a_device(
    session: Session, service: Service
) -> None:
    """The panel named a device's job by its id alone, which said nothing to someone
    looking for their job: its name is the link now, the id beside it."""
    job = service.submit(job_spec(name="holds-mnist-sweep"))
    service.wait_reported(job["id"])
    devices = service.client.get("/api/v1/devices").json()["data"]
    held = [d for d in devices if d["job_id"] == job["id"]]
    assert [d["job_name"] for d in held] == ["holds-mnist-sweep"], devices
    page = session.page
    page.goto("/#/")
    item = page.locator(f'.device[data-device="{held[0]["id"]}"]')
    link = item.locator("a")
    expect(link).to_have_text("holds-mnist-sweep")
    expect(link).to_have_attribute("href", f"#/jobs/{job['id']}")
    expect(item.locator(".device-job-id")).to_have_text(job["id"])
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    service.wait_state(job["id"], "cancelled")
    expect(item).to_contain_text("free")
    expect(item.locator(".device-job-id")).to_have_count(0)
    assert session.errors == []
