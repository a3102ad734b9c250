"""Per-tower step times on a job page opened after a trace asked for later than the
spec's trace_steps: the page names the trace they are from, not the spec's steps."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import Session
from tests.service.harness import Service, job_spec, stand_in_service

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)]

# `python -m trace_worker run --job-dir DIR`: the trace of its spec's trace_steps (5, 6),
# then one asked for (ending at step 81), each later line repeating the times as the
# trainer does; then it succeeds.
TRACE_WORKER = """\
import json, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])


def progress(**line):
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), "total": 100, **line}) + "\\n")


progress(event="start", step=0, phase="starting")
progress(event="trace", step=6, tower_ms=[1.0, 2.0])
progress(event="progress", step=10, loss=0.5, tower_ms=[1.0, 2.0])
progress(event="trace", step=81, tower_ms=[3.0, 4.0])
progress(event="progress", step=90, loss=0.4, tower_ms=[3.0, 4.0])
(job_dir / "result.json").write_text(json.dumps({"outcome": "succeeded", "message": "ok"}))
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(
        tmp_path_factory.mktemp("stand-in"), ("trace_worker", TRACE_WORKER)
    ) as svc:
        yield svc


def test_tower_times_name_the_trace_they_are_from(session: Session, service: Service) -> None:
    job = service.submit(job_spec(name="traced", towers=2, summaries={"trace_steps": [5, 6]}))
    ended = service.wait_state(job["id"], "succeeded", "failed", "cancelled")
    assert ended["progress"]["tower_ms"] == [3.0, 4.0], ended
    page = session.page
    page.goto(f"/#/jobs/{job['id']}")
    towers = page.locator("#towers")
    expect(towers).to_contain_text("4.00 ms")
    expect(towers).to_contain_text("from the device trace that ended at step 81.")
    assert session.errors == []
