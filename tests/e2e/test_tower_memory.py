"""Each tower's GPU's peak memory on a job's page: beside its time, in a line of its own
where there are no times, none where the worker said none (towers on CPUs), and updated
from the event stream on a page left open."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.e2e.chromium import CHROMIUM, NO_CHROMIUM
from tests.e2e.test_dashboard import PHONE, Session, open_session
from tests.service.harness import Service, job_spec, stand_in_service
from tests.service.test_memory import MEMORY_WORKER
from tests.service.test_memory import ended as ended_job

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with stand_in_service(
        tmp_path_factory.mktemp("stand-in"), ("memory_worker", MEMORY_WORKER)
    ) as svc:
        yield svc


def ended(service: Service, name: str) -> str:
    """The page of a job MEMORY_WORKER ran as `name` to its end: its spec's trace_steps
    (5, 6) were never traced ("gpus" writes a trace of its own, of step 1)."""
    return str(ended_job(service, name, summaries={"trace_steps": [5, 6]})["id"])


def test_each_towers_peak_memory_is_beside_its_time(session: Session, service: Service) -> None:
    """Beside each time, and none on the page of a job whose worker said none."""
    page = session.page
    page.goto(f"/#/jobs/{ended(service, 'gpus')}")
    towers = page.locator("#towers")
    expect(towers.locator(".tower-value")).to_have_text(["1.00 ms", "2.00 ms"])
    expect(towers.locator(".tower-memory")).to_have_text(["812.4 MiB", "790.1 MiB"])
    heading = page.get_by_role("heading", name=re.compile("^Per-tower step time"))
    expect(heading).to_have_text("Per-tower step time and memory")
    expect(page.locator("#tower-memory")).to_have_text(
        "Beside each tower's time, the most memory TensorFlow's allocator has held on its "
        "GPU since the job's worker started."
    )
    # Nothing where the worker said none (towers on CPUs, or an older worker).
    page.goto(f"/#/jobs/{ended(service, 'cpus')}")
    expect(towers).to_contain_text("The job ended before the device trace")
    expect(page.locator("#tower-memory")).to_be_hidden()
    expect(towers.locator(".tower-memory")).to_have_count(0)
    expect(heading).to_have_text("Per-tower step time")
    assert session.errors == []


def test_a_page_left_open_shows_the_new_peak(browser: Browser, service: Service) -> None:
    """Without a trace's times, each tower's peak is said in a line; the stream's progress
    events carry it, and the page, read once, follows it (on a phone, as narrow as any)."""
    session = open_session(browser, service, PHONE)
    job = service.submit(job_spec(name="live", towers=2, summaries={"trace_steps": []}))
    try:
        page = session.page
        page.goto(f"/#/jobs/{job['id']}")
        memory = page.locator("#tower-memory")
        expect(memory).to_have_text(
            "Peak GPU memory, the most TensorFlow's allocator has held on each tower's GPU "
            "since the job's worker started: tower 0 100.0 MiB, tower 1 90.0 MiB."
        )
        (service.data_dir / "runs" / job["id"] / "go").touch()
        expect(memory).to_contain_text(": tower 0 300.0 MiB, tower 1 290.0 MiB.")
        assert service.job(job["id"])["state"] == "running"  # from the stream, not its end
        assert session.errors == []
    finally:
        service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
        service.wait_state(job["id"], "cancelled", "failed", "succeeded")
        session.context.close()
