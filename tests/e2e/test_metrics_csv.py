"""A job page's Download CSV: the charted series as the file `towerboard metrics ID
--name ...` prints, byte for byte, saved under the job's name, authorised by the token
cookie, and reached and followed with the keyboard."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import LAPTOP, open_session
from tests.service.harness import Service, job_spec, worker_env
from tests.service.test_client import towerboard

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)]

TOKEN = "csv-secret"
# The series the job page charts, in its order (static/js/job.js's SERIES).
CHARTED = ("loss", "accuracy", "examples_per_sec", "eval_loss", "eval_accuracy")

# `python -m csv_worker run --job-dir DIR`: 30 steps reported, an eval every 10, then done.
CSV_WORKER = """\
import json, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])


def progress(**line):
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), "total": 30, **line}) + "\\n")


progress(event="start", step=0, phase="starting")
for step in range(1, 31):
    progress(event="progress", step=step, phase="training", loss=1 / step,
             accuracy=step / 40, examples_per_sec=1000.0 + step, learning_rate=0.01)
    if step % 10 == 0:
        progress(event="eval", step=step, phase="training", eval_loss=2 / step,
                 eval_accuracy=step / 50, eval_examples=64)
progress(event="end", step=30, outcome="succeeded", phase="done")
(job_dir / "result.json").write_text(json.dumps({"outcome": "succeeded", "message": "done"}))
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("stand-in")
    secured = Service(
        folder / "data", {"TOWERBOARD_TOKEN": TOKEN, **worker_env(folder, "csv_worker", CSV_WORKER)}
    )
    secured.start()
    yield secured
    secured.close()


def test_download_csv_is_the_clis_csv_of_the_charted_series(
    browser: Browser, service: Service
) -> None:
    job_id = service.submit(job_spec(name="csv run ü"))["id"]
    service.wait_state(job_id, "succeeded", timeout=60)
    session = open_session(browser, service, LAPTOP)
    try:
        page = session.page
        page.goto("/")
        page.fill("#token-input", TOKEN)  # kept in localStorage and the cookie (api.js)
        page.keyboard.press("Enter")
        page.goto(f"/#/jobs/{job_id}")
        expect(page.locator('figure[data-chart="loss"]')).to_have_attribute(
            "data-points-eval_loss", "3"
        )
        link = page.get_by_role("link", name="Download CSV of the charted metrics")
        expect(link).to_be_visible()
        # Reached with Tab from the top of the page, and followed with Enter.
        page.evaluate("document.activeElement.blur()")
        for _ in range(60):  # bounded: a link Tab never reaches fails, not hangs
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.id") == "download-metrics":
                break
        else:
            raise AssertionError("Tab never reached Download CSV")
        with page.expect_download() as download_info:
            page.keyboard.press("Enter")
        download = download_info.value
        assert download.failure() is None
        assert download.suggested_filename == f"csv run ü-{job_id}-metrics.csv"
        saved = Path(download.path()).read_bytes()
        options = [word for name in CHARTED for word in ("--name", name)]
        printed = towerboard("metrics", job_id, *options, url=service.base_url,
                             env={"TOWERBOARD_TOKEN": TOKEN})  # fmt: skip
        assert printed.returncode == 0, printed.stderr
        assert saved == printed.stdout.encode()
        lines = saved.decode().splitlines()
        assert lines[0] == "step,loss,accuracy,examples_per_sec,eval_loss,eval_accuracy"
        assert (
            len(lines) == 31
            and lines[-1] == "30,0.03333333333333333,0.75,1030.0,0.06666666666666667,0.6"
        )
        assert lines[1] == "1,1.0,0.025,1001.0,,"
        # Without the token the same address is refused: the cookie is what let it through.
        refused = service.client.get(
            f"/api/v1/jobs/{job_id}/metrics.csv", headers={"Authorization": "Bearer wrong"}
        )
        assert refused.status_code == 401
        assert session.errors == []
    finally:
        session.context.close()
