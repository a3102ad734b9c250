"""POST /jobs/{id}/profile: a device trace of a running job's next steps, on demand."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.service.harness import Service, fake_worker_env, job_spec, long_job
from tests.service.test_supervisor import progress_lines

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
        "detail": "A trace of the next 2 steps was requested from the worker. Follow "
        f"GET /api/v1/jobs/{job['id']}/events for its `trace` event (none comes if the job "
        "ends first); the trace then shows in TensorBoard's profile plugin.",
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
    # Its line says it answers a request (the job page waits for that, not for any trace).
    traces = [line for line in progress_lines(service, job["id"]) if line["event"] == "trace"]
    assert [line.get("requested") for line in traces] == [True]
    service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
    service.wait_state(job["id"], "cancelled")


def test_profile_job_not_running_409(make_service: Callable[..., Service], tmp_path: Path) -> None:
    # The state decides, not the job's files: a stand-in worker that succeeds at once is
    # enough (a real one took a TensorFlow start-up and a training).
    service = make_service(env=fake_worker_env(tmp_path))
    service.start()
    job = service.submit(job_spec(name="quick"))
    done = service.wait_state(job["id"], "succeeded")
    response = service.client.post(f"/api/v1/jobs/{done['id']}/profile")
    assert response.status_code == 409
    assert response.json()["detail"] == (
        f"Job {done['id']!r} has ended (succeeded); only a running job can be traced."
    )


def test_profile_bad_steps_422_and_unknown_job_404(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # The steps are checked before the job's state: its worker is a stand-in, not a real
    # one loading TensorFlow beside the test for nothing.
    service = make_service(env=fake_worker_env(tmp_path))
    service.start()
    response = httpx.post(f"{service.base_url}/api/v1/jobs/nosuchjob/profile")
    assert response.status_code == 404
    job = service.submit(job_spec(name="waits"))
    response = service.client.post(f"/api/v1/jobs/{job['id']}/profile", json={"steps": 0})
    assert response.status_code == 422
    assert response.json()["errors"] == [
        {"field": "steps", "message": "Input should be greater than or equal to 1. Received: 0"}
    ]
    # A number, as in a job spec: true was read as 1.
    response = service.client.post(f"/api/v1/jobs/{job['id']}/profile", json={"steps": True})
    assert response.status_code == 422
    assert response.json()["errors"] == [
        {"field": "steps", "message": "Input should be a valid integer. Received: true"}
    ]


def test_profile_twice_before_worker_takes_it_traces_the_larger(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # The stand-in worker never takes a request, so the first one stays pending.
    service = make_service(env=fake_worker_env(tmp_path))
    service.start()
    job = service.submit(job_spec(name="waits"))
    service.wait_state(job["id"], "running")
    path = f"/api/v1/jobs/{job['id']}/profile"
    first = service.client.post(path, json={"steps": 50})
    assert first.status_code == 202
    assert first.json()["steps"] == 50
    second = service.client.post(path, json={"steps": 2})
    assert second.status_code == 202
    assert second.json()["steps"] == 50  # not cut to 2 behind the first caller's back
    assert second.json()["detail"].startswith(
        "A trace of the next 50 steps was already waiting for the worker; the trace now "
        "covers the next 50 steps. Follow "
    )
    request = service.data_dir / "runs" / job["id"] / "profile_request.json"
    assert json.loads(request.read_text()) == {"steps": 50}
    third = service.client.post(path, json={"steps": 80})
    assert third.json()["steps"] == 80
    assert json.loads(request.read_text()) == {"steps": 80}
    # One the service did not write (a custom model's code runs in the run directory):
    # brackets nested thousands deep raised a RecursionError, a 500.
    request.write_text('{"steps": ' + "[" * 100_000)
    fourth = service.client.post(path, json={"steps": 3})
    assert fourth.status_code == 202 and fourth.json()["steps"] == 3


def test_profile_job_stopping_409(make_service: Callable[..., Service], tmp_path: Path) -> None:
    service = make_service(env=fake_worker_env(tmp_path))
    service.start()
    job = service.submit(job_spec(name="deaf"))  # ignores SIGTERM: stays running, stopping
    service.wait_reported(job["id"])  # it ignores SIGTERM from then on
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    response = service.client.post(f"/api/v1/jobs/{job['id']}/profile")
    assert response.status_code == 409
    assert response.json() == {
        "detail": f"Job {job['id']!r} is stopping (cancel requested); only a running job can "
        "be traced.",
        "errors": [],
    }
    assert not (service.data_dir / "runs" / job["id"] / "profile_request.json").exists()


def test_profile_request_left_by_an_ended_attempt_is_not_the_next_ones(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # Cancelled before its worker took the request (the route says no trace comes then),
    # then resumed: the next attempt traced it and said it answered a request.
    service = make_service(env=fake_worker_env(tmp_path))  # takes no request
    service.start()
    job = service.submit(job_spec(name="waits"))
    service.wait_state(job["id"], "running")
    assert service.client.post(f"/api/v1/jobs/{job['id']}/profile").status_code == 202
    request = service.data_dir / "runs" / job["id"] / "profile_request.json"
    assert request.exists()
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    service.wait_state(job["id"], "cancelled")
    assert service.client.post(f"/api/v1/jobs/{job['id']}/resume").status_code == 200
    service.wait_for(job["id"], lambda j: j["state"] == "running" and j["attempts"] == 2,
                     what="its second attempt")  # fmt: skip
    assert not request.exists()
    # One asked of the running attempt is its own.
    assert service.client.post(f"/api/v1/jobs/{job['id']}/profile").status_code == 202
    assert request.exists()
