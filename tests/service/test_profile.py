"""POST /jobs/{id}/profile: a device trace of a running job's next steps, on demand."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.service.harness import Service, job_spec, long_job

pytestmark = pytest.mark.slow  # real TensorFlow workers, like its siblings


def test_profile_running_job_traces_next_steps(make_service: Callable[..., Service]) -> None:
    service = make_service()
    service.start()
    job = service.submit(long_job(towers=2))
    service.wait_checkpoint(job["id"])
    assert (service.job(job["id"])["progress"] or {}).get("tower_ms") is None

    response = service.client.post(f"/api/v1/jobs/{job['id']}/profile", json={"steps": 2})
    assert response.status_code == 202
    assert response.json() == {
        "job_id": job["id"],
        "steps": 2,
        "detail": "A trace of the next 2 steps was requested from the worker.",
    }
    traced = service.wait_for(
        job["id"],
        lambda j: (j["progress"] or {}).get("tower_ms") is not None,
        timeout=60,
        what="per-tower times from the requested trace",
    )
    assert len(traced["progress"]["tower_ms"]) == 2
    run = service.data_dir / "runs" / job["id"]
    assert list(run.glob("tb/plugins/profile/*/*.xplane.pb"))
    assert not (run / "profile_request.json").exists()  # the worker took it
    service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
    service.wait_state(job["id"], "cancelled")


def test_profile_job_not_running_409(make_service: Callable[..., Service]) -> None:
    service = make_service()
    service.start()
    job = service.submit(job_spec())
    done = service.wait_state(job["id"], "succeeded")
    response = service.client.post(f"/api/v1/jobs/{done['id']}/profile")
    assert response.status_code == 409
    assert response.json()["detail"] == (
        f"Job {done['id']!r} is succeeded; only a running job can be traced."
    )


def test_profile_bad_steps_422_and_unknown_job_404(make_service: Callable[..., Service]) -> None:
    service = make_service()
    service.start()
    response = httpx.post(f"{service.base_url}/api/v1/jobs/nosuchjob/profile")
    assert response.status_code == 404
    job = service.submit(job_spec())
    response = service.client.post(f"/api/v1/jobs/{job['id']}/profile", json={"steps": 0})
    assert response.status_code == 422
    assert response.json()["errors"] == [
        {"field": "steps", "message": "Input should be greater than or equal to 1. Received: 0"}
    ]
