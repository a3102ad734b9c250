"""A running job's eval, as its page shows it live: the accuracy and the examples it is
over ("97.3% on 640 examples"), from the event stream, as a read of the job shows them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import Session
from tests.service.harness import Service, job_spec, stand_in_service

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)]

# `python -m eval_worker run --job-dir DIR`: starts, waits for a file `go` in its job dir
# (the page is open by then), reports an eval over 640 examples and runs on until SIGTERM.
EVAL_WORKER = """\
import json, signal, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))


def progress(**line):
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), "total": 1000, **line}) + "\\n")


progress(event="start", step=0, phase="starting")
progress(event="progress", step=10, phase="training", loss=0.5, accuracy=0.8)
while not (job_dir / "go").exists() and not stopped:
    time.sleep(0.05)
progress(event="eval", step=10, phase="eval", eval_loss=0.1, eval_accuracy=0.973,
         eval_examples=640)
while not stopped:
    time.sleep(0.05)
(job_dir / "result.json").write_text(json.dumps({"outcome": "cancelled", "message": "stop"}))
sys.exit(3)
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(tmp_path_factory.mktemp("stand-in"), ("eval_worker", EVAL_WORKER)) as svc:
        yield svc


def test_live_eval_says_how_many_examples(session: Session, service: Service) -> None:
    job = service.submit(job_spec(name="live-eval"))
    page = session.page
    page.goto(f"/#/jobs/{job['id']}")
    expect(page.locator("#job-progress-text")).to_contain_text("10 / 1000")
    # The page follows the stream now: the eval comes on it, not in the read it made.
    (Path(service.data_dir) / "runs" / job["id"] / "go").touch()
    stat = page.locator('[data-stat="eval_accuracy"]')
    expect(stat).to_have_text("97.3% on 640 examples")
    assert service.job(job["id"])["eval"]["examples"] == 640
    service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
    service.wait_state(job["id"], "cancelled", "failed", "succeeded")
    assert session.errors == []
