"""Each tower's peak device memory on a job's page: beside its time, in a line of its own
where there are no times or the towers share the host's allocator, none where the worker
said none, and updated from the event stream on a page left open."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import PHONE, Session, open_session
from tests.service.harness import Service, job_spec, stand_in_service

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)

# `python -m memory_worker run --job-dir DIR`, by its spec's name: "traced" has a trace's
# times and each GPU's peak, "host" the host's allocator the towers share, "older" no
# memory (as an older worker writes), each then succeeding; "live" reports a peak, and a
# higher one once a `go` file is in its run directory, until SIGTERM stops it.
MEMORY_WORKER = """\
import json, signal, sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
name = json.loads((job_dir / "spec.json").read_text())["name"]
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))


def progress(**line):
    with open(job_dir / "progress.jsonl", "a") as f:
        f.write(json.dumps({"time": time.time(), "total": 100, **line}) + "\\n")


def end(outcome, code):
    (job_dir / "result.json").write_text(json.dumps({"outcome": outcome, "message": name}))
    sys.exit(code)


progress(event="start", step=0, phase="starting", towers=2)
if name == "traced":
    progress(event="trace", step=6, tower_ms=[1.0, 2.0])
    progress(event="progress", step=10, loss=0.5, tower_ms=[1.0, 2.0],
             memory_mb=[812.4, 790.1], memory_shared=False)
    end("succeeded", 0)
if name == "host":
    progress(event="progress", step=10, loss=0.5, memory_mb=[2048.0, 2048.0],
             memory_shared=True)
    end("succeeded", 0)
if name == "older":
    progress(event="progress", step=10, loss=0.5)
    end("succeeded", 0)
step, peak = 0, [100.0, 90.0]
while not stopped:
    step += 1
    if (job_dir / "go").exists():
        peak = [300.0, 290.0]
    progress(event="progress", step=step, loss=1 / step, memory_mb=peak, memory_shared=False)
    time.sleep(0.1)
end("cancelled", 3)
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(
        tmp_path_factory.mktemp("stand-in"), ("memory_worker", MEMORY_WORKER)
    ) as svc:
        yield svc


def ended(service: Service, name: str) -> str:
    job = service.submit(job_spec(name=name, towers=2, summaries={"trace_steps": [5, 6]}))
    done = service.wait_state(job["id"], "succeeded", "failed", "cancelled")
    assert done["state"] == "succeeded", done
    return str(job["id"])


def test_each_towers_peak_memory_is_beside_its_time(session: Session, service: Service) -> None:
    """Beside each time, and none on the page of a job whose worker said none."""
    page = session.page
    page.goto(f"/#/jobs/{ended(service, 'traced')}")
    towers = page.locator("#towers")
    expect(towers.locator(".tower-value")).to_have_text(["1.00 ms", "2.00 ms"])
    expect(towers.locator(".tower-memory")).to_have_text(["812.4 MiB", "790.1 MiB"])
    expect(page.locator("#tower-memory")).to_have_text(
        "Beside each tower's time, the most memory TensorFlow's allocator has held on its "
        "device since the job's worker started."
    )
    # Nothing where the worker said none (an older one, or one that could not read it).
    page.goto(f"/#/jobs/{ended(service, 'older')}")
    expect(towers).to_contain_text("The job ended before the device trace")
    expect(page.locator("#tower-memory")).to_be_hidden()
    expect(towers.locator(".tower-memory")).to_have_count(0)
    assert session.errors == []


def test_a_shared_host_allocator_is_one_line(session: Session, service: Service) -> None:
    page = session.page
    page.goto(f"/#/jobs/{ended(service, 'host')}")
    expect(page.locator("#towers")).to_have_text(
        "The job ended before the device trace of steps 5, 6 was taken."
    )
    # The host's whole once, not as if each tower had 2 GiB of its own.
    expect(page.locator("#tower-memory")).to_have_text(
        "Peak memory: 2048.0 MiB, the most TensorFlow's allocator on the host, which the "
        "towers share, has held since the job's worker started."
    )
    assert session.errors == []


def test_a_page_left_open_shows_the_new_peak(browser: Browser, service: Service) -> None:
    """The stream's progress events carry the peak: the page, read once, follows it (on a
    phone, whose rows are narrower)."""
    session = open_session(browser, service, PHONE)
    job = service.submit(job_spec(name="live", towers=2, summaries={"trace_steps": []}))
    try:
        page = session.page
        page.goto(f"/#/jobs/{job['id']}")
        memory = page.locator("#tower-memory")
        expect(memory).to_contain_text(": tower 0 100.0 MiB, tower 1 90.0 MiB.")
        (service.data_dir / "runs" / job["id"] / "go").touch()
        expect(memory).to_contain_text(": tower 0 300.0 MiB, tower 1 290.0 MiB.")
        assert service.job(job["id"])["state"] == "running"  # from the stream, not its end
        assert session.errors == []
    finally:
        service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
        service.wait_state(job["id"], "cancelled", "failed", "succeeded")
        session.context.close()
