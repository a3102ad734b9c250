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
