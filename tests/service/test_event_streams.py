"""Event streams (Server-Sent Events) as the service stops: each open stream is ended
cleanly, and the stop logs no error for them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.service.harness import Service, fake_worker_env, job_spec


def test_stop_ends_open_streams_cleanly(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # A dashboard keeps /api/v1/events open, and a job page its job's stream: every
    # ordinary restart logged "ERROR: ASGI callable returned without completing response."
    # for each, and the client saw the connection cut mid-stream.
    service = make_service(env=fake_worker_env(tmp_path))
    service.start()
    job = service.submit(job_spec(name="sleepy"))  # the stand-in runs until stopped
    service.wait_state(job["id"], "running")
    ends: dict[str, str] = {}
    opened = threading.Barrier(3)

    def follow(path: str) -> None:
        try:
            with httpx.stream("GET", f"{service.base_url}{path}", timeout=30.0) as response:
                assert response.status_code == 200
                opened.wait(10)
                for _ in response.iter_lines():
                    pass
            ends[path] = "ended"
        except httpx.HTTPError as error:
            ends[path] = f"{type(error).__name__}: {error}"

    paths = ["/api/v1/events", f"/api/v1/jobs/{job['id']}/events"]
    readers = [threading.Thread(target=follow, args=(path,)) for path in paths]
    for reader in readers:
        reader.start()
    opened.wait(10)
    service.stop()
    for reader in readers:
        reader.join(30)
    assert ends == {path: "ended" for path in paths}
    log = service.log.read_text()
    assert "ASGI callable returned without completing response" not in log, log
    assert "Finished server process" in log
