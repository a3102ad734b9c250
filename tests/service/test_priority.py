"""Changing a job's priority after it was submitted: PATCH /api/v1/jobs/{id}, a resume's
`priority`, and `towerboard priority ID N`, against a real service whose workers are
stand-ins (no TensorFlow) on one CPU job slot."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.service.harness import Service, job_spec, stand_in_service
from tests.service.test_client import one_error_line, towerboard


def _patch(service: Service, job_id: str, body: Any = None, **kwargs: Any) -> httpx.Response:
    if body is not None:
        kwargs["json"] = body
    return service.client.patch(f"/api/v1/jobs/{job_id}", **kwargs)


def _queue_ids(service: Service) -> list[str]:
    return [row["id"] for row in service.client.get("/api/v1/queue").json()["data"]]


def _listed_queued(service: Service, **params: Any) -> dict[str, Any]:
    answer: dict[str, Any] = service.client.get(
        "/api/v1/jobs", params={"state": "queued", **params}
    ).json()
    return answer


def _row(service: Service, job_id: str, *columns: str) -> tuple[Any, ...]:
    """Columns of the job's row, read from the store's file as it is on disk."""
    store = service.data_dir / "towerboard.db"
    with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
        row: tuple[Any, ...] = db.execute(
            f"SELECT {', '.join(columns)} FROM jobs WHERE id = ?", (job_id,)
        ).fetchone()
    return row


class _Events:
    """The `state` events of a Server-Sent-Events stream, read on a thread from once the
    stream has answered (the service has subscribed it by then)."""

    def __init__(self, service: Service, path: str) -> None:
        self.states: list[dict[str, Any]] = []
        self._client = httpx.Client(base_url=service.base_url, timeout=60.0)
        self._response = self._client.send(self._client.build_request("GET", path), stream=True)
        assert self._response.status_code == 200
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        event = None
        with contextlib.suppress(httpx.HTTPError):
            for line in self._response.iter_lines():
                if line.startswith("event:"):
                    event = line.partition(":")[2].strip()
                elif line.startswith("data:") and event == "state":
                    self.states.append(json.loads(line.partition(":")[2]))

    def wait_for(self, predicate: Any, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + 30
        while True:
            for state in list(self.states):
                if predicate(state):
                    return state
            assert time.monotonic() < deadline, f"no {what} on the stream: {self.states}"
            time.sleep(0.05)

    def close(self) -> None:
        self._response.close()
        self._client.close()


def test_a_queued_job_moves_in_the_queue_at_once_and_the_scheduler_follows(
    tmp_path: Path,
) -> None:
    with stand_in_service(tmp_path) as service:  # one job slot: the holder keeps it
        holder = service.submit(job_spec(name="holder"))
        service.wait_state(holder["id"], "running")
        a, b, c = (service.submit(job_spec(name=name)) for name in "abc")
        d = service.submit(job_spec(name="d", priority=2))
        assert _queue_ids(service) == [d["id"], a["id"], b["id"], c["id"]]
        version = _row(service, c["id"], "version")[0]
        every = _Events(service, "/api/v1/events")
        own = _Events(service, f"/api/v1/jobs/{c['id']}/events")
        try:
            changed = _patch(service, c["id"], {"priority": 2})
            assert changed.status_code == 200, changed.text
            job = changed.json()
            assert job["id"] == c["id"] and job["state"] == "queued"
            assert job["priority"] == 2 and job["spec"]["priority"] == 2
            # Committed before the answer: in the store's file, the version a step on.
            assert _row(service, c["id"], "priority", "version")[0] == 2
            assert _row(service, c["id"], "version")[0] == version + 1
            assert json.loads(_row(service, c["id"], "spec")[0])["priority"] == 2
            # Every follower sees it: the job's own stream and that of every job.
            for stream in (every, own):
                stream.wait_for(
                    lambda s: s["id"] == c["id"] and s["priority"] == 2, "the new priority"
                )
        finally:
            every.close()
            own.close()
        assert service.job(c["id"])["priority"] == 2
        # It keeps when it joined the queue: submitted before `d` at the same priority, it
        # is where it would be had it been submitted at 2, ahead of `d`.
        order = [c["id"], d["id"], a["id"], b["id"]]
        queue = service.client.get("/api/v1/queue").json()
        assert [row["id"] for row in queue["data"]] == order
        assert [row["priority"] for row in queue["data"]] == [2, 2, 0, 0]
        assert queue["data"][0]["queued_at"] == c["created_at"]
        assert [j["id"] for j in _listed_queued(service)["data"]] == order
        # A page at a time: the cursor of a page that ends with the moved job reads on
        # from its new place, skipping none and repeating none.
        first = _listed_queued(service, limit=1)
        assert [j["id"] for j in first["data"]] == [c["id"]]
        assert first["next_cursor"].startswith("2_"), first
        rest = _listed_queued(service, cursor=first["next_cursor"])
        assert [j["id"] for j in rest["data"]] == order[1:]
        # Lowered: behind every job of a higher priority, whenever they came.
        assert _patch(service, d["id"], {"priority": -1}).status_code == 200
        order = [c["id"], a["id"], b["id"], d["id"]]
        assert _queue_ids(service) == order
        assert [j["id"] for j in _listed_queued(service)["data"]] == order

        # The slot freed, the scheduler starts the bumped job, not the oldest.
        assert service.client.post(f"/api/v1/jobs/{holder['id']}/cancel").status_code == 202
        service.wait_state(c["id"], "running")
        assert _queue_ids(service) == order[1:]
        for job in (a, b, d):
            assert service.job(job["id"])["state"] == "queued"

        # A running job's priority changes too, and counts once it is requeued: lowered,
        # the job killed goes back in the queue behind the jobs of a higher priority.
        running = _patch(service, c["id"], {"priority": -5})
        assert running.status_code == 200, running.text
        assert running.json()["state"] == "running" and running.json()["priority"] == -5
        # Its attempt's spec.json is as it started; the next attempt's has the change.
        spec_json = service.data_dir / "runs" / c["id"] / "spec.json"
        assert json.loads(spec_json.read_text())["priority"] == 2
        # A requeue puts it back by its priority (and submission): behind `b` (0) and `d`
        # (-1), which it was ahead of at 2. `a` raised first, it starts in its place (and
        # its spec.json, written as it starts, says so).
        assert _patch(service, a["id"], {"priority": 7}).status_code == 200
        (pid,) = _row(service, c["id"], "pid")
        os.kill(pid, signal.SIGKILL)  # killed by no one the service knows: requeued
        service.wait_state(a["id"], "running")
        requeued = service.wait_for(c["id"], lambda j: j["attempts"] == 2, what="the requeue")
        assert requeued["state"] == "queued" and requeued["priority"] == -5
        assert _queue_ids(service) == [b["id"], d["id"], c["id"]]
        spec_a = service.data_dir / "runs" / a["id"] / "spec.json"
        assert json.loads(spec_a.read_text())["priority"] == 7


def test_a_priority_change_survives_a_restart(tmp_path: Path) -> None:
    with stand_in_service(tmp_path) as service:
        holder = service.submit(job_spec(name="holder"))
        service.wait_state(holder["id"], "running")
        first, second = (service.submit(job_spec(name=name)) for name in ("first", "second"))
        assert _patch(service, second["id"], {"priority": 9}).status_code == 200
        assert _patch(service, holder["id"], {"priority": -3}).status_code == 200
        service.kill()  # SIGKILL: no shutdown of its own wrote anything after the answers
        service.start()
        assert _queue_ids(service) == [second["id"], first["id"]]
        for job_id, priority in ((second["id"], 9), (holder["id"], -3), (first["id"], 0)):
            job = service.job(job_id)
            assert (job["priority"], job["spec"]["priority"]) == (priority, priority), job
        # Edit & resubmit (the dashboard's) reads the job's spec: it says the new priority.
        assert service.job(holder["id"])["state"] == "running"  # adopted


def test_bad_changes_are_refused_saying_why(tmp_path: Path) -> None:
    with stand_in_service(tmp_path) as service:
        holder = service.submit(job_spec(name="holder"))
        service.wait_state(holder["id"], "running")
        job = service.submit(job_spec(name="queued"))  # its row still while it waits
        path = f"/api/v1/jobs/{job['id']}"
        version = _row(service, job["id"], "version")[0]
        fields = {
            json.dumps({"priority": 1001}): [
                ("priority", "Input should be less than or equal to 1000. Received: 1001")
            ],
            json.dumps({"priority": -1001}): [
                ("priority", "Input should be greater than or equal to -1000. Received: -1001")
            ],
            json.dumps({"priority": "5"}): [
                ("priority", "Input should be a valid integer. Received: '5'")
            ],
            json.dumps({"priority": True}): [
                ("priority", "Input should be a valid integer. Received: true")
            ],
            json.dumps({"priority": 1, "steps": 5}): [
                (
                    "steps",
                    "Unknown key. Remove it or check its spelling. Expected one of: priority.",
                )
            ],
            json.dumps({"priorty": 1}): [
                ("priority", "Expected `priority`, which is required. Received: no `priority`"),
                ("priorty", "Unknown key. Did you mean `priority`?"),
            ],
            "{}": [("priority", "Expected `priority`, which is required. Received: no `priority`")],
            "": [
                (
                    "(body)",
                    'Expected a JSON body: {"priority": N}, the job\'s new priority. '
                    "Received: no body",
                )
            ],
            "[3]": [
                (
                    "(body)",
                    "Input should be a valid dictionary or object to extract fields from. "
                    "Received: [3]",
                )
            ],
            '{"priority": 1, "priority": 2}': [
                (
                    "priority",
                    "Duplicate key here: given at line 1 column 2 and again at line 1 column "
                    "17. Give each key once: only one of its values would be kept.",
                )
            ],
        }
        for body, expected in fields.items():
            refused = service.client.patch(
                path, content=body.encode(), headers={"content-type": "application/json"}
            )
            assert refused.status_code == 422, (body, refused.text)
            errors = [(e["field"], e["message"]) for e in refused.json()["errors"]]
            assert errors == expected, body
        # The spec's own wording for the same value at submission.
        at_submit = service.client.post("/api/v1/jobs", json=job_spec(priority=1001))
        assert at_submit.json()["errors"] == [
            {
                "field": "priority",
                "message": "Input should be less than or equal to 1000. Received: 1001",
            }
        ]
        not_json = service.client.patch(path, content=b'{"priority": 1}')
        assert not_json.status_code == 415, not_json.text
        # Nothing was changed by any of them.
        assert _row(service, job["id"], "priority", "version") == (0, version)

        unknown = _patch(service, "nosuchjob", {"priority": 1})
        assert unknown.status_code == 404
        assert unknown.json()["detail"] == "Job 'nosuchjob' not found."

        # An ended job: said what to do instead, a resume with a priority.
        assert service.client.post(f"{path}/cancel").json()["state"] == "cancelled"
        ended = _patch(service, job["id"], {"priority": 1})
        assert ended.status_code == 409, ended.text
        assert ended.json()["detail"] == (
            f"Job '{job['id']}' has ended (cancelled); only a queued or running job's priority "
            'can be changed. To run it again at another priority, resume it with {"priority": '
            f"P}} (POST /api/v1/jobs/{job['id']}/resume)."
        )
        assert _row(service, job["id"], "priority") == (0,)
        assert service.client.post(f"/api/v1/jobs/{holder['id']}/cancel").status_code == 202
        quick = service.submit(job_spec(name="quick"))
        service.wait_state(quick["id"], "succeeded")
        succeeded = _patch(service, quick["id"], {"priority": 1})
        assert succeeded.status_code == 409, succeeded.text
        assert (
            'resume it with a larger total too, e.g. {"steps": N, "priority": P}'
            in (succeeded.json()["detail"])
        )


def test_a_resume_takes_a_priority_and_a_cancel_before_it_starts_puts_it_back(
    tmp_path: Path,
) -> None:
    with stand_in_service(tmp_path) as service:
        holder = service.submit(job_spec(name="holder"))
        service.wait_state(holder["id"], "running")
        job = service.submit(job_spec(name="resumed"))
        assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
        waiting = service.submit(job_spec(name="waiting", priority=3))
        later = service.submit(job_spec(name="later"))
        path = f"/api/v1/jobs/{job['id']}"

        refused = service.client.post(f"{path}/resume", json={"priority": 1001})
        assert refused.status_code == 422
        assert refused.json()["errors"] == [
            {
                "field": "priority",
                "message": "Input should be less than or equal to 1000. Received: 1001",
            }
        ]
        resumed = service.client.post(f"{path}/resume", json={"priority": 3})
        assert resumed.status_code == 200, resumed.text
        body = resumed.json()
        assert (body["state"], body["priority"], body["spec"]["priority"]) == ("queued", 3, 3)
        assert body["spec"]["steps"] == job["spec"]["steps"]  # nothing else changed
        # Behind the jobs already waiting at its priority, ahead of the lower ones.
        assert _queue_ids(service) == [waiting["id"], job["id"], later["id"]]
        # Changed while it waits, then the resume taken back: the job is as it was.
        assert _patch(service, job["id"], {"priority": 8}).json()["priority"] == 8
        back = service.client.post(f"{path}/cancel")
        assert back.status_code == 200, back.text
        assert back.json()["state"] == "cancelled"
        assert (back.json()["priority"], back.json()["spec"]["priority"]) == (0, 0)
        assert _row(service, job["id"], "priority") == (0,)
        # A job not ended is told how to change its priority.
        not_ended = service.client.post(f"/api/v1/jobs/{later['id']}/resume", json={"priority": 1})
        assert not_ended.status_code == 409
        assert not_ended.json()["detail"].endswith(
            f'To change its priority, PATCH /api/v1/jobs/{later["id"]} with {{"priority": P}}.'
        )


def test_cli_priority(tmp_path: Path) -> None:
    with stand_in_service(tmp_path) as service:
        url = service.base_url
        holder = service.submit(job_spec(name="holder"))
        service.wait_state(holder["id"], "running")
        a, b = (service.submit(job_spec(name=name)) for name in "ab")

        moved = towerboard("priority", b["id"], "4", url=url)
        assert moved.returncode == 0, moved.stderr
        assert moved.stdout == f"{b['id']} 4\n"
        assert moved.stderr == (
            f"job {b['id']} (queued) now has priority 4: its place in the queue: 1st of 2 "
            "(next to start; it waits for 1 job slot; 0 free)\n"
        )
        assert _queue_ids(service) == [b["id"], a["id"]]
        lowered = towerboard("priority", b["id"], "-2", url=url)  # a negative number
        assert lowered.returncode == 0, lowered.stderr
        assert "its place in the queue: 2nd of 2 (1 job ahead)" in lowered.stderr
        running = towerboard("priority", holder["id"], "1", url=url)
        assert running.returncode == 0, running.stderr
        assert running.stderr == (
            f"job {holder['id']} (running) now has priority 1: it runs on; the new priority "
            "counts if it is requeued or resumed\n"
        )

        for bad in ("x", "1001", "1.5"):
            refused = towerboard("priority", a["id"], bad, url=url)
            assert refused.returncode == 2, refused.stderr
            assert (
                f"argument N: expected a whole number from -1000 to 1000. Received: '{bad}'"
                in refused.stderr
            )
        unknown = towerboard("priority", "nosuchjob", "1", url=url)
        assert unknown.returncode == 1
        assert one_error_line(unknown) == "towerboard: error: Job 'nosuchjob' not found."

        assert service.client.post(f"/api/v1/jobs/{a['id']}/cancel").status_code == 200
        ended = towerboard("priority", a["id"], "1", url=url)
        assert ended.returncode == 1
        assert one_error_line(ended) == (
            f"towerboard: error: Job '{a['id']}' has ended (cancelled); only a queued or "
            "running job's priority can be changed. To run it again at another priority, "
            f"resume it with `towerboard resume {a['id']} --priority P`."
        )
        again = towerboard("resume", a["id"], "--priority", "6", url=url)
        assert again.returncode == 0, again.stderr
        assert service.job(a["id"])["priority"] == 6
        assert _queue_ids(service) == [a["id"], b["id"]]
        busy = towerboard("resume", b["id"], "--priority", "6", url=url)
        assert busy.returncode == 1
        assert one_error_line(busy).endswith(
            f"To change its priority, use `towerboard priority {b['id']} P`."
        )
        shown = towerboard("priority", "--help", url=url)
        assert shown.returncode == 0 and "the new priority, from -1000 to 1000" in shown.stdout
