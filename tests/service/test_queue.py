"""The queue's view: GET /api/v1/queue and `towerboard queue`, and the place `status ID`
gives a queued job, against a real service whose workers are stand-ins (no TensorFlow)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from service.store import JobStore
from tests.service.harness import (
    STEPPING_WORKER,
    Service,
    job_spec,
    queue_in_bulk,
    stand_in_service,
)
from tests.service.test_client import towerboard
from trainer.spec import JobSpec


def _queue(service: Service, **params: Any) -> dict[str, Any]:
    response = service.client.get("/api/v1/queue", params=params)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _wait_queue(service: Service, predicate: Any, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while not predicate(answer := _queue(service)):
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {answer}"
        time.sleep(0.05)
    return answer


def _row(stdout: str, key: str) -> str | None:
    """The value of `status ID`'s row `key`, or None when it has none."""
    found = re.search(rf"^{key}\s{{2,}}(.*)$", stdout, re.M)
    return found[1] if found else None


def test_queue_in_run_order_with_places_and_what_the_first_waits_for(tmp_path: Path) -> None:
    gpus = {"TOWERBOARD_GPUS": "0,1"}  # whole GPUs, so a job's towers are its devices
    with stand_in_service(tmp_path, ("stepping_worker", STEPPING_WORKER), **gpus) as service:
        empty = _queue(service)
        assert empty == {
            "data": [], "count": 0, "free_devices": 2, "devices": 2, "waiting_for": None
        }  # fmt: skip
        assert towerboard("queue", url=service.base_url).stdout == "no jobs queued\n"

        running = service.submit(job_spec(name="running"))  # gpu:0; gpu:1 stays free
        service.wait_state(running["id"], "running")
        # The first in line needs both GPUs: it, and in a strict queue every job behind it
        # (one-GPU jobs too), waits for the running one.
        big = service.submit(job_spec(name="big", towers=2, priority=5))
        resumed = service.submit(job_spec(name="resumed"))
        assert service.client.post(f"/api/v1/jobs/{resumed['id']}/cancel").status_code == 200
        small = service.submit(job_spec(name="small"))
        wide = service.submit(job_spec(name="wide", towers=2))
        # Submitted before `small`, resumed after `wide`: placed by its resume.
        again = service.client.post(f"/api/v1/jobs/{resumed['id']}/resume")
        assert again.status_code == 200, again.text

        answer = _queue(service)
        order = [big, small, wide, resumed]
        assert [
            (row["position"], row["id"], row["name"], row["priority"], row["towers"])
            for row in answer["data"]
        ] == [
            (1, big["id"], "big", 5, 2),
            (2, small["id"], "small", 0, 1),
            (3, wide["id"], "wide", 0, 2),
            (4, resumed["id"], "resumed", 0, 1),
        ]
        assert [row["devices_needed"] for row in answer["data"]] == [2, 1, 2, 1]
        assert answer["count"] == 4 and answer["devices"] == 2
        assert answer["free_devices"] == 1
        assert answer["waiting_for"] == "2 GPUs; 1 free"
        # When each joined the queue: its submission, or for the resumed one its resume.
        queued_at = {row["id"]: row["queued_at"] for row in answer["data"]}
        for job in order[:3]:
            assert queued_at[job["id"]] == job["created_at"]
        assert queued_at[resumed["id"]] > wide["created_at"] > resumed["created_at"]

        # A page: the first jobs, and the count of all.
        page = _queue(service, limit=2)
        assert [row["id"] for row in page["data"]] == [big["id"], small["id"]]
        assert page["count"] == 4
        for limit in (0, 1001):
            refused = service.client.get("/api/v1/queue", params={"limit": limit})
            assert refused.status_code == 422, refused.text
        unknown = service.client.get("/api/v1/queue", params={"state": "queued"})
        assert unknown.status_code == 422, unknown.text

        table = towerboard("queue", url=service.base_url)
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0].split() == ["POS", "ID", "NAME", "PRIORITY", "TOWERS", "WAITING"]
        rows = [line.split() for line in lines[1:5]]
        assert [row[:5] for row in rows] == [
            ["1", big["id"], "big", "5", "2"],
            ["2", small["id"], "small", "0", "1"],
            ["3", wide["id"], "wide", "0", "2"],
            ["4", resumed["id"], "resumed", "0", "1"],
        ]
        assert all(re.fullmatch(r"\d+[smhd]", row[5]) for row in rows), rows
        assert lines[5:] == ["the first waits for 2 GPUs; 1 free (4 queued in all)"]

        limited = towerboard("queue", "--limit", "2", url=service.base_url)
        assert limited.returncode == 0, limited.stderr
        assert [line.split()[1] for line in limited.stdout.splitlines()[1:3]] == [
            big["id"],
            small["id"],
        ]
        assert limited.stdout.splitlines()[3:] == [
            "... 2 more (use --limit)",
            "the first waits for 2 GPUs; 1 free (4 queued in all)",
        ]
        as_json = towerboard("queue", "--json", url=service.base_url)
        assert as_json.returncode == 0, as_json.stderr
        assert json.loads(as_json.stdout) == _queue(service)

        places = {
            big["id"]: "1st of 4 (next to start; it waits for 2 GPUs; 1 free)",
            small["id"]: "2nd of 4 (1 job ahead)",
            resumed["id"]: "4th of 4 (3 jobs ahead)",
            running["id"]: None,  # running: no place in the queue
        }
        # What each holds, or waits for: in the units its place says it, a GPU a tower.
        held = {
            big["id"]: "waiting for 2 GPUs (2 towers)",
            small["id"]: "waiting for 1 GPU (1 tower)",
            resumed["id"]: "waiting for 1 GPU (1 tower)",
            running["id"]: "gpu:0 (1 tower)",
        }
        for job_id, place in places.items():
            shown = towerboard("status", job_id, url=service.base_url)
            assert shown.returncode == 0, shown.stderr
            assert _row(shown.stdout, "queue") == place, shown.stdout
            assert _row(shown.stdout, "devices") == held[job_id], shown.stdout

        # The running job cancelled, the first starts on both GPUs: every device is held.
        assert service.client.post(f"/api/v1/jobs/{running['id']}/cancel").status_code == 202
        service.wait_state(big["id"], "running")
        after = _queue(service)
        assert [row["id"] for row in after["data"]] == [small["id"], wide["id"], resumed["id"]]
        assert [row["position"] for row in after["data"]] == [1, 2, 3]
        assert after["free_devices"] == 0 and after["waiting_for"] == "1 GPU; 0 free"

        for job in (small, wide, resumed):
            assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
        drained = _queue(service)
        assert drained["data"] == [] and drained["count"] == 0
        assert drained["waiting_for"] is None


def test_a_worker_still_exiting_holds_its_device_and_a_job_past_the_page(
    tmp_path: Path,
) -> None:
    # 1,001 jobs queued behind one whose worker, its job over, is slow to exit ("linger"):
    # its GPU is not free until it has, and the last job is past the queue's largest page.
    data = tmp_path / "data"
    store = JobStore(data / "towerboard.db")
    spec = JobSpec.model_validate(job_spec(name="linger")).model_dump(mode="json")
    head = store.create({**spec, "priority": 2})
    last = store.create({**spec, "name": "last", "priority": 0})
    store.close()
    queue_in_bulk(data / "towerboard.db", spec, 1000, priority=1)
    with stand_in_service(tmp_path, TOWERBOARD_GPUS="0") as service:
        service.wait_state(head.id, "succeeded")
        devices = service.client.get("/api/v1/devices").json()["data"]
        assert devices == [
            {"id": "gpu:0", "kind": "gpu", "job_id": head.id, "job_name": "linger",
             "exiting": True, "configured": True}
        ]  # fmt: skip
        answer = _queue(service)
        assert answer["count"] == 1001 and len(answer["data"]) == 100  # the default page
        assert answer["data"][0]["id"] == "q000000000"
        assert answer["free_devices"] == 0 and answer["devices"] == 1
        assert answer["waiting_for"] == "1 GPU; 0 free"

        shown = towerboard("status", last.id, url=service.base_url)
        assert shown.returncode == 0, shown.stderr
        assert _row(shown.stdout, "queue") == "after the first 1000 of 1001", shown.stdout

        service.release(head.id)  # its worker exits: the next job starts on its GPU
        _wait_queue(service, lambda queue: queue["count"] == 1000, "the next job's start")


def _listed(service: Service, **params: Any) -> dict[str, Any]:
    response = service.client.get("/api/v1/jobs", params=params)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _ids(answer: dict[str, Any]) -> list[str]:
    return [job["id"] for job in answer["data"]]


def test_queued_jobs_are_listed_in_the_order_they_start(tmp_path: Path) -> None:
    # `GET /api/v1/jobs?state=queued` and `towerboard status --state queued` listed the
    # queued jobs newest first: the top row was the last to start.
    with stand_in_service(tmp_path) as service:  # one job slot (CPU-only)
        running = service.submit(job_spec(name="holds-the-slot"))  # runs until cancelled
        service.wait_state(running["id"], "running")
        resumed = service.submit(job_spec(name="resumed-late"))
        urgent = service.submit(job_spec(name="urgent", priority=5))
        plain = service.submit(job_spec(name="plain"))
        assert service.client.post(f"/api/v1/jobs/{resumed['id']}/cancel").status_code == 200
        assert service.client.post(f"/api/v1/jobs/{resumed['id']}/resume").status_code == 200
        last = service.submit(job_spec(name="last-in"))
        order = [urgent["id"], plain["id"], resumed["id"], last["id"]]
        newest_first = [last["id"], plain["id"], urgent["id"], resumed["id"]]
        assert [row["id"] for row in _queue(service)["data"]] == order

        listed = _listed(service, state="queued")
        assert _ids(listed) == order
        assert listed["count"] == 4 and listed["next_cursor"] is None
        assert _ids(_listed(service, state=["queued", "queued"])) == order
        # A page at a time, each from the last one's `next_cursor`.
        read: list[str] = []
        cursor = None
        while True:
            after: dict[str, str] = {"cursor": cursor} if cursor else {}
            page = _listed(service, state="queued", limit=1, **after)
            assert page["count"] == 4
            read += _ids(page)
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert read == order
        # With a name, the queued jobs whose names hold it, in the same order.
        named_l = _listed(service, state="queued", name="L")
        assert _ids(named_l) == [plain["id"], resumed["id"], last["id"]]
        # Every other listing is as it was: newest first, its cursor a job's seq.
        assert _ids(_listed(service, state=["queued", "running"])) == [*newest_first, running["id"]]
        assert _ids(_listed(service))[:5] == [*newest_first, running["id"]]
        newest = _listed(service, limit=2)
        assert re.fullmatch(r"[0-9]+", newest["next_cursor"]), newest
        # One listing's cursor is no cursor of the other.
        first = _listed(service, state="queued", limit=2)
        assert re.fullmatch(r"0_[0-9]+\.[0-9]+_[0-9]+", first["next_cursor"]), first  # `plain`
        for params in (
            {"state": "queued", "cursor": newest["next_cursor"]},
            {"state": "running", "cursor": first["next_cursor"]},
            {"cursor": first["next_cursor"]},
            # Nor is a place that no page of the queue writes.
            {"state": "queued", "cursor": "0_1e999_1"},  # past a float: infinity
            {"state": "queued", "cursor": "0_nan_1"},
            {"state": "queued", "cursor": "12345_1.5_1"},  # no priority is that high
            {"state": "queued", "cursor": "0_1.5"},
        ):
            refused = service.client.get("/api/v1/jobs", params=params)
            assert refused.status_code == 422, (params, refused.text)
            assert refused.json()["errors"][0]["field"] == "query.cursor"

        table = towerboard("status", "--state", "queued", url=service.base_url)
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0].split()[:4] == ["POS", "ID", "NAME", "STATE"]
        assert [line.split()[:3] for line in lines[1:]] == [
            ["1", urgent["id"], "urgent"],
            ["2", plain["id"], "plain"],
            ["3", resumed["id"], "resumed-late"],
            ["4", last["id"], "last-in"],
        ]
        limited = towerboard("status", "--state", "queued", "--limit", "3", url=service.base_url)
        assert [line.split()[:2] for line in limited.stdout.splitlines()[1:4]] == [
            ["1", urgent["id"]], ["2", plain["id"]], ["3", resumed["id"]]
        ]  # fmt: skip
        assert limited.stdout.splitlines()[4:] == ["... 1 more (use --limit)"]
        # A name leaves jobs out, so no place is given; the order is the queue's.
        named = towerboard("status", "--state", "queued", "--name", "L", url=service.base_url)
        assert named.stdout.splitlines()[0].split()[0] == "ID"
        assert [line.split()[0] for line in named.stdout.splitlines()[1:]] == order[1:]
        every = towerboard("status", url=service.base_url)
        assert every.stdout.splitlines()[0].split()[0] == "ID"
        listed_ids = [line.split()[0] for line in every.stdout.splitlines()[1:6]]
        assert listed_ids == [*newest_first, running["id"]]

        # Past the first page, the head of the queue starts: the next page reads on after
        # the last job read, skipping none and repeating none.
        first = _listed(service, state="queued", limit=2)
        assert _ids(first) == order[:2]
        assert service.client.post(f"/api/v1/jobs/{running['id']}/cancel").status_code == 202
        service.wait_state(urgent["id"], "running")
        rest = _listed(service, state="queued", cursor=first["next_cursor"])
        assert _ids(rest) == order[2:] and rest["count"] == 3
        for job in (urgent, plain, resumed, last):
            service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
