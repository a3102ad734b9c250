"""Deleting ended jobs: the API, the CLI, what is left on disk and in TensorBoard's view."""

from __future__ import annotations

import errno
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from service.store import JobStore, MetricPoint
from service.tensorboard import mirror_logdir
from tests.service.harness import Service, fake_worker_env, job_spec
from tests.service.test_client import one_error_line, towerboard
from tests.service.test_jobs import following
from tests.service.test_supervisor import write_locked


@pytest.fixture
def service(make_service: Callable[..., Service], tmp_path: Path) -> Iterator[Service]:
    """A service whose workers are stand-ins (tests/service/harness.py): jobs end in a blink."""
    service = make_service(env={"TOWERBOARD_CPU_JOBS": "1", **fake_worker_env(tmp_path)})
    service.start()
    yield service


def _until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _exited(service: Service, *jobs: dict[str, Any]) -> None:
    """Wait for the jobs to succeed and their workers to exit: a job's worker can outlive
    its result.json by a moment, and until it has exited the job is not deletable."""
    for job in jobs:
        assert service.wait_state(job["id"], "succeeded")["state"] == "succeeded"
        service.wait_exited(job["id"])


def test_delete_ended_job_removes_record_metrics_and_files(service: Service) -> None:
    kept = service.submit(job_spec(name="points"))
    gone = service.submit(job_spec(name="points"))
    _exited(service, kept, gone)
    assert stored_points(service, gone["id"]) == 3
    runs = service.data_dir / "runs"
    assert (runs / gone["id"] / "result.json").is_file()

    reader, every = following(
        service.client, "/api/v1/events", lambda event: event["event"] == "deleted"
    )

    response = service.client.delete(f"/api/v1/jobs/{gone['id']}")
    assert response.status_code == 204 and response.content == b""
    assert not (runs / gone["id"]).exists()  # at once: moved aside before the answer
    assert _until(lambda: not any((runs / ".deleted").iterdir())), "its files were not removed"
    assert _until(lambda: not stored_points(service, gone["id"])), "its points were not removed"
    assert stored_points(service, kept["id"])
    for path in ("", "/metrics", "/logs", "/checkpoints"):
        missing = service.client.get(f"/api/v1/jobs/{gone['id']}{path}")
        assert missing.status_code == 404, (path, missing.text)
        assert missing.json()["detail"] == f"Job {gone['id']!r} not found."
    listed = [job["id"] for job in service.client.get("/api/v1/jobs").json()["data"]]
    assert listed == [kept["id"]]
    assert service.job(kept["id"])["state"] == "succeeded"  # the other job is untouched
    assert (runs / kept["id"] / "result.json").is_file()

    reader.join(timeout=30)
    assert every[-1]["event"] == "deleted"
    assert every[-1]["data"] == {"job_id": gone["id"], "id": gone["id"]}
    again = service.client.delete(f"/api/v1/jobs/{gone['id']}")
    assert again.status_code == 404


def test_two_deletes_of_one_job_at_once_delete_it_once(service: Service) -> None:
    job = service.submit(job_spec(name="quick"))
    _exited(service, job)
    answers: list[int] = []
    requests = [
        threading.Thread(
            target=lambda: answers.append(
                service.client.delete(f"/api/v1/jobs/{job['id']}").status_code
            )
        )
        for _ in range(4)
    ]
    for request in requests:
        request.start()
    for request in requests:
        request.join(timeout=30)
    assert sorted(answers) == [204, 404, 404, 404]
    runs = service.data_dir / "runs"
    assert not (runs / job["id"]).exists()  # never put back by a losing delete
    assert _until(lambda: not any((runs / ".deleted").iterdir()))


def test_reading_the_log_of_a_job_being_deleted_answers_404_not_416(service: Service) -> None:
    # A delete moves the run directory aside before it deletes the job's record (a record
    # it cannot delete keeps its files). A follower's read in between found no log and
    # answered 416, "offset past the end", for a job that was going: the CLI's `logs
    # --follow` said the service had refused its offset. The window is held open here by
    # the store's file, locked by another connection, which the record's delete waits on.
    job, other = (service.submit(job_spec(name="quick")) for _ in range(2))
    _exited(service, job)
    _exited(service, other)
    path = f"/api/v1/jobs/{job['id']}/logs"
    read = service.client.get(path)
    offset = int(read.headers["X-Log-Offset"])
    assert read.status_code == 200 and offset > 0  # the attempt's first line, at least
    answers: dict[str, Any] = {}

    def ask(name: str, method: str, url: str, **kwargs: Any) -> threading.Thread:
        def send() -> None:
            answers[name] = service.client.request(method, url, **kwargs)

        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        return thread

    with write_locked(service.data_dir / "towerboard.db"):
        deleting = ask("delete", "DELETE", f"/api/v1/jobs/{job['id']}")
        assert _until(lambda: not (service.data_dir / "runs" / job["id"]).exists())
        readers = [
            ask("follow", "GET", path, params={"offset": offset}),
            ask("tail", "GET", path),
        ]
        # Another job's read that finds no log that far waits on no delete but its own
        # (it waited on every one, and on every resume, for up to SQLite's 30 s).
        past = {"offset": 10**9}
        ask("other", "GET", f"/api/v1/jobs/{other['id']}/logs", params=past).join(timeout=10)
        assert "other" in answers, "another job's log read waited on this delete"
        assert answers["other"].status_code == 416, answers["other"].text
        time.sleep(0.5)  # each read answered at once before
    for thread in (deleting, *readers):
        thread.join(timeout=30)
    assert answers["delete"].status_code == 204, answers["delete"].text
    for name in ("follow", "tail"):
        assert answers[name].status_code == 404, (name, answers[name].text)
        assert answers[name].json()["detail"] == f"Job {job['id']!r} not found."


def test_delete_refuses_a_job_that_has_not_ended(service: Service) -> None:
    running = service.submit(job_spec(name="waits"))  # runs until cancelled
    queued = service.submit(job_spec(name="quick"))  # one job slot: waits its turn
    service.wait_state(running["id"], "running")
    for job, state in ((running, "running"), (queued, "queued")):
        refused = service.client.delete(f"/api/v1/jobs/{job['id']}")
        assert refused.status_code == 409
        assert refused.json()["detail"] == (
            f"Job {job['id']!r} is {state}; only an ended job can be deleted. Cancel it first "
            f"(POST /api/v1/jobs/{job['id']}/cancel), then delete it once it has ended."
        )
    assert (service.data_dir / "runs" / running["id"]).is_dir()  # nothing was touched
    assert service.job(running["id"])["state"] == "running"


def test_delete_refuses_a_job_whose_worker_is_still_exiting(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    service = make_service(env={"TOWERBOARD_CPU_JOBS": "1", **fake_worker_env(tmp_path)})
    service.start()
    job = service.submit(job_spec(name="linger"))  # exits once released
    assert service.wait_state(job["id"], "succeeded")["state"] == "succeeded"
    refused = service.client.delete(f"/api/v1/jobs/{job['id']}")
    assert refused.status_code == 409
    assert (
        "its worker process is still exiting; try again in a few seconds"
        in (refused.json()["detail"])
    )
    assert (service.data_dir / "runs" / job["id"] / "result.json").is_file()
    service.release(job["id"])
    deleted = _until(
        lambda: service.client.delete(f"/api/v1/jobs/{job['id']}").status_code == 204, 30
    )
    assert deleted, "still refused after its worker exited"


def test_delete_and_resume_wait_a_moment_for_a_worker_that_is_exiting(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # A worker outlives its result by TensorFlow's teardown, about a second: a script's
    # `cancel --wait` (or `submit --watch`) and then `delete` or `resume` got a 409 one
    # time in three. Asked while it exits, each waits (up to 5 s) and goes through.
    service = make_service(env={"TOWERBOARD_CPU_JOBS": "1", **fake_worker_env(tmp_path)})
    service.start()
    for ask in ("resume", "delete"):
        job = service.submit(job_spec(name="linger"))  # exits once released
        assert service.wait_state(job["id"], "succeeded")["state"] == "succeeded"
        threading.Timer(0.5, service.release, (job["id"],)).start()
        began = time.monotonic()
        if ask == "resume":
            answer = service.client.post(f"/api/v1/jobs/{job['id']}/resume", json={"steps": 20})
            assert answer.status_code == 200, answer.text
            assert answer.json()["state"] == "queued"
            service.client.post(f"/api/v1/jobs/{job['id']}/cancel")
        else:
            answer = service.client.delete(f"/api/v1/jobs/{job['id']}")
            assert answer.status_code == 204, answer.text
        # Went through (a worker still there after 5 s gets the 409), once it had exited.
        assert time.monotonic() - began > 0.4


def stored_points(service: Service, job_id: str) -> int:
    with sqlite3.connect(service.data_dir / "towerboard.db") as conn:
        return conn.execute("SELECT COUNT(*) FROM metrics WHERE job_id = ?", (job_id,)).fetchone()[
            0
        ]


def test_start_finishes_removals_a_stopped_service_left(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    service = make_service()
    left = service.data_dir / "runs" / ".deleted" / "abcdefghij-0123abcd" / "checkpoints"
    left.mkdir(parents=True)
    (left / "ckpt-1.data-00000-of-00001").write_bytes(b"\0" * 1024)
    # A deleted job's points, whose removal a stop cut short.
    store = JobStore(service.data_dir / "towerboard.db")
    job = store.create({"name": "gone", "priority": 0, "towers": 1})
    store.record_progress(
        job.id, offset=1, progress=None, eval=None,
        points=[MetricPoint("loss", step, 0.0, 1.0) for step in range(30_000)],
    )  # fmt: skip
    assert store.cancel_queued(job.id) and store.delete(job.id)
    store.close()
    assert stored_points(service, job.id) == 30_000
    service.start()
    assert _until(lambda: not any((service.data_dir / "runs" / ".deleted").iterdir()))
    assert _until(lambda: not stored_points(service, job.id))
    assert service.client.get("/api/v1/jobs").json()["data"] == []  # no job of its name


def test_start_gives_back_the_files_of_a_job_whose_delete_was_cut_short(
    make_service: Callable[..., Service],
) -> None:
    # A service killed after a delete moved the run directory aside and before the store
    # recorded the delete: the job was never deleted (no 204), so its files must stay.
    service = make_service()
    store = JobStore(service.data_dir / "towerboard.db")
    job = store.create({"name": "kept", "priority": 0, "towers": 1})
    assert store.cancel_queued(job.id)
    store.close()
    aside = service.data_dir / "runs" / ".deleted" / f"{job.id}-0123abcd"
    (aside / "checkpoints").mkdir(parents=True)
    (aside / "worker.log").write_text("the job's log\n")
    service.start()
    assert service.job(job.id)["state"] == "cancelled"
    time.sleep(0.5)  # the sweep's time, in the background
    assert (service.data_dir / "runs" / job.id / "worker.log").read_text() == "the job's log\n"
    assert service.client.get(f"/api/v1/jobs/{job.id}/logs").text == "the job's log\n"


def test_cli_delete_of_a_running_job_says_the_verb_that_cancels_it(service: Service) -> None:
    # The service's hint named its route, POST /api/v1/jobs/ID/cancel, to a CLI user.
    job = service.submit(job_spec(name="wait"))
    result = towerboard("delete", job["id"], url=service.base_url)
    assert result.returncode == 1
    assert one_error_line(result).endswith(
        f"Cancel it first (towerboard cancel {job['id']} --wait), then delete it once it has ended."
    )


def test_a_job_stopping_after_its_cancel_is_not_told_to_be_cancelled(service: Service) -> None:
    # Cancel, then delete at once (the usual order): the 409 said "Cancel it first", to a
    # user who just had. A deaf worker stays running, its cancel asked for, for the grace.
    job = service.submit(job_spec(name="deaf"))
    service.wait_reported(job["id"])  # it ignores SIGTERM from then on
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    refused = service.client.delete(f"/api/v1/jobs/{job['id']}")
    assert refused.status_code == 409
    assert refused.json()["detail"] == (
        f"Job {job['id']!r} is stopping (cancel requested); only an ended job can be "
        "deleted: try again once it has ended."
    )
    wait = f"(`towerboard cancel {job['id']} --wait` returns then)."
    for verb in ("delete", "resume"):
        result = towerboard(verb, job["id"], url=service.base_url)
        assert result.returncode == 1, result.stderr
        assert one_error_line(result).endswith(
            f"is stopping (cancel requested); only an ended job can be {verb}d: try again "
            f"once it has ended {wait}"
        )


def test_cli_delete_says_each_and_exits_1_when_one_is_refused(service: Service) -> None:
    first = service.submit(job_spec(name="quick"))
    second = service.submit(job_spec(name="quick"))
    _exited(service, first, second)
    result = towerboard(
        "delete", first["id"], "nosuchjob1", second["id"], first["id"], url=service.base_url
    )
    assert result.returncode == 1
    assert result.stdout == f"{first['id']} deleted\n{second['id']} deleted\n"
    assert one_error_line(result) == "towerboard: error: Job 'nosuchjob1' not found."
    assert service.client.get("/api/v1/jobs").json()["data"] == []


def test_tensorboard_view_drops_a_deleted_job(tmp_path: Path) -> None:
    # The view names a job's folder by its name, then its id; the two jobs share a name.
    runs, logdir = tmp_path / "runs", tmp_path / "view"
    for job_id in ("keptjob123", "gonejob123"):
        (runs / job_id / "tb" / "train").mkdir(parents=True)
        (runs / job_id / "spec.json").write_text(json.dumps({"name": "same"}))
    logdir.mkdir()
    mirror_logdir(logdir, runs, None)
    assert sorted(p.name for p in logdir.iterdir()) == ["same · gonejob123", "same · keptjob123"]
    (runs / "gonejob123").rename(tmp_path / "aside")  # as a delete moves it
    mirror_logdir(logdir, runs, ("keptjob123", "gonejob123"))
    assert [p.name for p in logdir.iterdir()] == ["same · keptjob123"]
    kept = logdir / "same · keptjob123" / "train"
    assert kept.resolve() == (runs / "keptjob123" / "tb" / "train")
    assert (tmp_path / "aside" / "tb" / "train").is_dir()  # never what the links lead to


def test_deletes_waiting_for_an_exit_hold_up_no_other_request(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # Each delete (and resume) waited for the exit on one of the service's 40 threads,
    # which every plain route runs on: dozens asked at once (a script's parallel loop, an
    # impatient client) held up every log, checkpoint list, download and submit of every
    # job for up to 5 s a wave.
    service = make_service(env={"TOWERBOARD_CPU_JOBS": "2", **fake_worker_env(tmp_path)})
    service.start()
    other = service.submit(job_spec(name="quick"))
    service.wait_state(other["id"], "succeeded")
    job = service.submit(job_spec(name="linger"))  # exits once released
    assert service.wait_state(job["id"], "succeeded")["state"] == "succeeded"
    deletes = 60  # past the 40 threads
    with ThreadPoolExecutor(deletes) as pool:
        answers = [
            pool.submit(service.client.delete, f"/api/v1/jobs/{job['id']}") for _ in range(deletes)
        ]
        time.sleep(1.0)  # all asked, and waiting for the worker's exit
        began = time.monotonic()
        logs = service.client.get(f"/api/v1/jobs/{other['id']}/logs")
        took = time.monotonic() - began
        service.release(job["id"])
        statuses = sorted(answer.result().status_code for answer in answers)
    assert logs.status_code == 200
    assert took < 2.0, f"a log read waited {took:.1f} s behind the waiting deletes"
    # Once the worker had gone, one delete went through; the rest found the job gone (or,
    # on a slow host, gave up first, saying the worker was still exiting).
    assert statuses.count(204) == 1, statuses
    assert set(statuses) <= {204, 404, 409}, statuses


def _fill(disk: Path) -> Path:
    """Take every free block of `disk`; the file that holds them."""
    filler = disk / "filler"
    # Unbuffered: a buffered write that fits partly leaves its rest in the buffer, and the
    # close flushes it again, raising ENOSPC out of the `with`.
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as error:
            assert error.errno == errno.ENOSPC, error
    return filler


def test_delete_on_a_full_disk_says_where_the_jobs_files_are_and_loses_nothing(
    make_service: Callable[..., Service], tmp_path: Path, small_disk: Path
) -> None:
    # On a full disk the delete that would free space cannot be recorded: the generic 507
    # said "free space on its disk" and nothing of where this job's files are.
    service = make_service(env=fake_worker_env(tmp_path), data_dir=small_disk / "data")
    service.start()
    try:
        job = service.submit(job_spec(name="quick"))
        _exited(service, job)
        # An empty WAL: a write then needs new blocks, not ones it has written before.
        with sqlite3.connect(service.data_dir / "towerboard.db") as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        filler = _fill(small_disk)
        run_dir = service.data_dir / "runs" / job["id"]
        refused = service.client.delete(f"/api/v1/jobs/{job['id']}")
        assert refused.status_code == 507, refused.text
        assert refused.json()["detail"] == (
            f"Job {job['id']!r} was not deleted: the service's data dir has no space left, "
            f"and recording a delete needs some. Its files are kept, in {run_dir}: remove "
            "its checkpoints/ there (or other files on that disk) to make room, then delete "
            "it again."
        )
        assert (run_dir / "result.json").is_file()  # put back where it said
        assert service.job(job["id"])["state"] == "succeeded"

        filler.unlink()
        assert service.client.delete(f"/api/v1/jobs/{job['id']}").status_code == 204
        assert service.client.get(f"/api/v1/jobs/{job['id']}").status_code == 404
    finally:
        service.stop()  # before the disk goes
