"""Worker supervision end to end: crashes, kills, interruptions, a service killed and
restarted, one job's bad output beside the others, and one service per data dir."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from service import supervisor as supervisor_module
from service.devices import DevicePool
from service.events import JobEvent
from service.settings import Settings
from service.store import JobRecord, JobState, JobStore
from service.supervisor import Supervisor
from tests.service.harness import (
    ROOT,
    Service,
    fake_worker_env,
    free_port,
    job_spec,
    kill_processes_under,
    long_job,
    processes_under,
    stepping_worker_env,
    wait_catching_sigterm,
    worker_env,
)
from trainer.rundir import END_PHASES, Outcome
from trainer.spec import JobSpec

pytestmark = pytest.mark.slow


def worker_pids(service: Service, job_id: str) -> list[int]:
    """The job's worker processes, found the way an operator would: by command line."""
    return processes_under(service.data_dir / "runs" / job_id)


def worker_pid(service: Service, job_id: str) -> int:
    pids = worker_pids(service, job_id)
    assert len(pids) == 1, f"expected one worker process for job {job_id}, found {pids}"
    return pids[0]


def checkpoint_step(job: dict[str, Any]) -> int:
    """The step of the job's latest checkpoint (`checkpoints/ckpt-N`), 0 before the first."""
    checkpoint = (job["progress"] or {}).get("checkpoint")
    return int(checkpoint.rsplit("-", 1)[1]) if checkpoint else 0


def saved_checkpoint_step(service: Service, job_id: str) -> int:
    """The step of the checkpoint a restarted worker restores: the one TensorFlow's state
    file (`checkpoints/checkpoint`) names."""
    state = (service.data_dir / "runs" / job_id / "checkpoints" / "checkpoint").read_text()
    match = re.search(r'^model_checkpoint_path: "ckpt-(\d+)"$', state, re.MULTILINE)
    assert match, state
    return int(match.group(1))


def long_job_checkpointed(
    make_service: Callable[..., Service], env: dict[str, str] | None = None, **changes: Any
) -> tuple[Service, str]:
    """A started service (with `env`) running `long_job(**changes)` past its first checkpoint."""
    service = make_service(env=env)
    service.start()
    job_id = service.submit(long_job(**changes))["id"]
    service.wait_checkpoint(job_id)
    return service, job_id


def progress_lines(service: Service, job_id: str) -> list[dict[str, Any]]:
    path = service.data_dir / "runs" / job_id / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_killed_worker_resumes_from_checkpoint_then_fails_past_the_retries(
    make_service: Callable[..., Service],
) -> None:
    # A worker killed by a signal (the OOM killer's SIGKILL, say) lost only the steps since
    # its last checkpoint: the job runs again from there, as often as
    # TOWERBOARD_CRASH_RETRIES allows (1 here), and then fails saying so.
    service, job_id = long_job_checkpointed(make_service, {"TOWERBOARD_CRASH_RETRIES": "1"})
    os.kill(worker_pid(service, job_id), signal.SIGKILL)
    requeued = service.wait_for(job_id, lambda job: job["attempts"] == 2, what="a restart")
    assert requeued["state"] in ("queued", "running") and requeued["error"] is None
    # What the worker saved, not what the service had read of its progress by the kill: a
    # checkpoint saved just before the kill may not have been folded in yet.
    kept = saved_checkpoint_step(service, job_id)

    service.wait_for(
        job_id,
        lambda job: checkpoint_step(job) > kept,
        what="a checkpoint of the second attempt",
    )
    starts = [line["step"] for line in progress_lines(service, job_id) if line["event"] == "start"]
    assert starts == [0, kept], "the second attempt starts from the first one's checkpoint"

    service.wait_for(
        job_id, lambda job: (job["progress"] or {}).get("eta_seconds") is not None, what="an ETA"
    )
    os.kill(worker_pid(service, job_id), signal.SIGKILL)
    failed = service.wait_state(job_id, "failed", "succeeded", "cancelled")
    assert failed["state"] == "failed" and failed["attempts"] == 2
    error = failed["error"]
    assert error["reason"] == (
        "The worker was killed by SIGKILL (9). A SIGKILL no one sent is most often the "
        "kernel's out-of-memory killer (`dmesg` says so): a job holds its images in memory, "
        "three times over as it starts. The job had already been restarted from its "
        "checkpoint once after its worker was killed, the most TOWERBOARD_CRASH_RETRIES allows."
    )
    assert error["signal"] == "SIGKILL" and error["exit_code"] is None
    assert error["log_tail"], "the failure keeps the end of worker.log"
    assert failed["devices"] == []
    # The killed worker wrote no `end` line: its last estimate must not outlive it.
    assert failed["progress"]["eta_seconds"] is None, failed["progress"]


def test_adopted_worker_killed_resumes_from_checkpoint_as_a_child_would(
    make_service: Callable[..., Service],
) -> None:
    # The OOM killer does not care whether the service was restarted since the worker
    # started: an adopted worker killed without a result.json is restarted from its
    # checkpoint as TOWERBOARD_CRASH_RETRIES allows (1 here), like a worker the service
    # started itself, and the next such death fails the job saying so.
    service, job_id = long_job_checkpointed(make_service, {"TOWERBOARD_CRASH_RETRIES": "1"})
    service.kill()
    service.start()
    assert service.job(job_id)["state"] == "running"  # adopted
    os.kill(worker_pid(service, job_id), signal.SIGKILL)
    requeued = service.wait_for(job_id, lambda job: job["attempts"] == 2, what="a restart")
    assert requeued["state"] in ("queued", "running") and requeued["error"] is None

    kept = saved_checkpoint_step(service, job_id)  # the first attempt's, shown until then
    service.wait_for(
        job_id,
        lambda job: checkpoint_step(job) > kept,
        what="a checkpoint of the second attempt",
    )
    service.kill()
    service.start()
    assert service.job(job_id)["state"] == "running"  # adopted again
    os.kill(worker_pid(service, job_id), signal.SIGKILL)
    failed = service.wait_state(job_id, "failed", "succeeded", "cancelled")
    assert failed["state"] == "failed" and failed["attempts"] == 2
    assert failed["error"]["reason"].endswith(
        "The job had already been restarted from its checkpoint once after its worker was "
        "killed, the most TOWERBOARD_CRASH_RETRIES allows."
    )


def test_run_job_worker_rejects_spec_fails_with_reason(service: Service) -> None:
    # The service reads a custom model's module but does not import it (it may need
    # TensorFlow), so whether a name it binds is a function is the worker's to find: here
    # a string, and the worker rejects the job with exit 2.
    job = service.submit(job_spec(name="custom", model={"name": "string:ascii_letters"}))
    failed = service.wait_state(job["id"], "failed", "succeeded")
    assert failed["state"] == "failed"
    assert failed["error"]["exit_code"] == 2
    assert failed["error"]["reason"].startswith("The worker rejected the spec: ")
    assert "Module 'string' has no function 'ascii_letters'" in failed["error"]["reason"]
    assert failed["result"]["outcome"] == "invalid_spec"


def test_a_started_job_is_preparing_until_its_worker_reports(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    """From its worker's start to its first line (TensorFlow's import, the data, the model:
    seconds to minutes) a job says it is `preparing`; a job cancelled then keeps it, as
    where it stopped. The stand-in's "preparing" never writes a line."""
    service = make_service(env=fake_worker_env(tmp_path))
    service.start()
    job = service.submit(job_spec(name="preparing"))
    running = service.wait_state(job["id"], "running")
    assert running["progress"]["phase"] == "preparing", running
    assert running["progress"]["step"] is None
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    cancelled = service.wait_state(job["id"], "cancelled", "failed", "succeeded")
    assert cancelled["state"] == "cancelled" and cancelled["progress"]["phase"] == "preparing"

    reported = service.submit(job_spec(name="wait"))
    assert service.wait_reported(reported["id"])["progress"]["phase"] == "starting"


def test_cancel_job_killed_after_grace(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # The real trainer answers SIGTERM with a checkpoint and exit 3, usually well within
    # any grace; only a worker that ignores SIGTERM makes the SIGKILL certain. So this one
    # is a real process that does exactly that (FAKE_WORKER's "deaf").
    service = make_service(
        env={"TOWERBOARD_CANCEL_GRACE_SECONDS": "0.05", **fake_worker_env(tmp_path)}
    )
    service.start()
    job = service.submit(job_spec(name="deaf"))
    # Its first progress line comes after it has set SIGTERM aside.
    service.wait_reported(job["id"])
    pid = worker_pid(service, job["id"])
    assert service.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    cancelled = service.wait_state(job["id"], "cancelled", "failed", "succeeded")
    assert cancelled["state"] == "cancelled", cancelled
    error = cancelled["error"]
    assert error["reason"] == (
        "Cancelled: the worker did not exit within 0.05 s of SIGTERM and was killed with SIGKILL."
    )
    assert error["signal"] == "SIGKILL" and error["exit_code"] is None
    assert error["log_tail"][0].startswith(f"--- towerboard: attempt 1 of job {job['id']} ")
    assert cancelled["result"] is None  # it never got to write one
    assert pid not in worker_pids(service, job["id"])


def test_job_ends_at_its_result_and_its_device_waits_for_the_worker_to_exit(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # A worker that has written result.json can take seconds more to exit (TensorFlow's
    # teardown at a low CPU priority on a busy host); its job is over, so it says so. Its
    # device is not free until the process is gone: the next job waits for it.
    service = make_service(env={"TOWERBOARD_CPU_JOBS": "1", **fake_worker_env(tmp_path)})
    service.start()
    first = service.submit(job_spec(name="linger"))  # exits once released
    second = service.submit(job_spec(name="quick"))
    done = service.wait_state(first["id"], "succeeded", "failed", "cancelled")
    pid = worker_pid(service, first["id"])  # still there
    devices = service.client.get("/api/v1/devices").json()["data"]
    assert done["state"] == "succeeded" and done["result"]["message"] == "done", done
    assert done["progress"]["phase"] == "done"
    assert [device["job_id"] for device in devices] == [first["id"]]
    assert [device["job_name"] for device in devices] == ["linger"]  # ended: from the store
    assert [device["exiting"] for device in devices] == [True]  # said, so a page can say it
    assert service.job(second["id"])["state"] == "queued"

    service.release(first["id"])
    assert service.wait_state(second["id"], "succeeded")["state"] == "succeeded"
    service.wait_exited(second["id"])
    devices = service.client.get("/api/v1/devices").json()["data"]
    assert [(device["job_id"], device["exiting"]) for device in devices] == [(None, False)]
    assert pid not in worker_pids(service, first["id"])
    assert service.job(first["id"])["state"] == "succeeded"


def test_a_result_json_a_custom_models_code_writes_does_not_end_its_job(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # A custom model's code runs in the worker, in the run directory. A result.json it
    # wrote (notes of its own, with an `outcome`) ended the job at once, in `preparing`,
    # with that file as its result; the worker trained on unseen, to be killed after the
    # grace. The real trainer, on a model whose `build` writes one.
    (tmp_path / "notes_model.py").write_text(
        "import json, keras\n"
        "def build(input_shape, num_classes):\n"
        "    with open('result.json', 'w') as f:  # the working directory: the run's\n"
        "        json.dump({'outcome': 'succeeded', 'message': 'the model built'}, f)\n"
        "    inputs = keras.Input(input_shape)\n"
        "    x = keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs))\n"
        "    return keras.Model(inputs, x)\n"
    )
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    service = make_service(env={"PYTHONPATH": path})
    service.start()
    job = service.submit(job_spec(name="notes", model={"name": "notes_model:build"}))
    ended = service.wait_state(job["id"], "succeeded", "failed", "cancelled")
    assert ended["state"] == "succeeded", ended
    assert ended["result"]["message"] == "Trained 40 steps.", ended["result"]
    assert (ended["progress"]["step"], ended["progress"]["phase"]) == (40, "done")


def test_restarted_service_keeps_an_ended_jobs_devices_until_its_worker_exits(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # The service stops while a finished job's worker is still exiting. The next service
    # must not give that worker's devices to another job (on a GPU, the old process still
    # holds its memory), nor forget to kill it after the grace.
    before = make_service(
        env={"TOWERBOARD_CPU_JOBS": "1", "TOWERBOARD_CANCEL_GRACE_SECONDS": "600",
             **fake_worker_env(tmp_path)},
    )  # fmt: skip
    before.start()
    first = before.submit(job_spec(name="hang"))  # sleeps an hour after its result
    assert before.wait_state(first["id"], "succeeded")["state"] == "succeeded"
    second = before.submit(job_spec(name="quick"))
    pid = worker_pid(before, first["id"])
    before.kill()

    # The grace runs from the service's recovery, before it answers: long enough that a
    # busy host's start-up does not use it up before the look below.
    after = make_service(
        env={"TOWERBOARD_CPU_JOBS": "1", "TOWERBOARD_CANCEL_GRACE_SECONDS": "10",
             **fake_worker_env(tmp_path)},
        data_dir=before.data_dir,
    )  # fmt: skip
    after.start()
    devices = after.client.get("/api/v1/devices").json()["data"]
    assert [(device["job_id"], device["exiting"]) for device in devices] == [(first["id"], True)]
    assert after.job(second["id"])["state"] == "queued"
    assert after.wait_state(second["id"], "succeeded", timeout=60)["state"] == "succeeded"
    assert pid not in worker_pids(after, first["id"])
    assert after.job(first["id"])["state"] == "succeeded"
    assert f"Job {first['id']}: its worker wrote its result 10 s ago" in after.log.read_text()


def test_worker_that_never_exits_after_its_result_is_killed_after_the_grace(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    service = make_service(
        env={
            "TOWERBOARD_CPU_JOBS": "1",
            "TOWERBOARD_CANCEL_GRACE_SECONDS": "1",
            **fake_worker_env(tmp_path),
        }
    )
    service.start()
    first = service.submit(job_spec(name="hang"))  # sleeps an hour after its result
    second = service.submit(job_spec(name="quick"))
    assert service.wait_state(first["id"], "succeeded")["state"] == "succeeded"
    assert service.wait_state(second["id"], "succeeded", timeout=30)["state"] == "succeeded"
    assert worker_pids(service, first["id"]) == []
    assert service.job(first["id"])["state"] == "succeeded"  # the kill changes nothing
    assert (
        f"Job {first['id']}: its worker wrote its result 1 s ago and has not exited; killing it"
        in service.log.read_text()
    )


def test_worker_sigterm_without_cancel_requeued_and_resumes(
    make_service: Callable[..., Service],
) -> None:
    # A SIGTERM nobody asked for through the API (a service manager stopping the whole
    # control group, say) must not end the job "cancelled": the worker checkpoints and
    # exits 3, and the job runs again from that checkpoint. Once while the service
    # watches, once while no service is running.
    service = make_service()
    service.start()
    # Each stop lands some 50 steps after the attempt's start; the third attempt trains
    # the rest (3000 steps took it 11 s, for nothing more checked).
    steps = 1000
    spec = long_job(name="interrupted", steps=steps)
    job = service.submit(spec)
    job_id = job["id"]

    def ends() -> list[dict[str, Any]]:
        return [line for line in progress_lines(service, job_id) if line["event"] == "end"]

    # 1. Live: SIGTERM the worker itself, not through the cancel API.
    service.wait_checkpoint(job_id)
    os.kill(worker_pid(service, job_id), signal.SIGTERM)
    requeued = service.wait_for(job_id, lambda job: job["attempts"] == 2, what="a requeue")
    assert requeued["state"] in ("queued", "running") and requeued["error"] is None
    first_end = ends()[0]
    assert first_end["outcome"] == "cancelled"
    service.wait_for(
        job_id,
        lambda job: job["attempts"] == 2 and checkpoint_step(job) > first_end["step"],
        what="a checkpoint of the second attempt",
    )

    # 2. While no service runs: the worker writes result.json (cancelled) and exits; the
    # next service finds that, with no cancel requested, and requeues the job.
    pid = worker_pid(service, job_id)
    service.kill()
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while worker_pids(service, job_id) or len(ends()) < 2:
        assert time.monotonic() < deadline, "the worker did not stop on SIGTERM"
        time.sleep(0.1)
    result = json.loads((service.data_dir / "runs" / job_id / "result.json").read_text())
    assert result["outcome"] == "cancelled"
    service.start()
    recovered = service.job(job_id)
    assert recovered["attempts"] == 3 and recovered["state"] in ("queued", "running")

    # 3. The third attempt resumes and finishes the job.
    done = service.wait_state(job_id, "succeeded", "failed", "cancelled", timeout=300)
    assert done["state"] == "succeeded", done
    assert done["attempts"] == 3 and done["error"] is None
    assert done["progress"]["step"] == steps
    lines = progress_lines(service, job_id)
    starts = [line["step"] for line in lines if line["event"] == "start"]
    stops = [line for line in lines if line["event"] == "end"]
    assert [line["outcome"] for line in stops] == ["cancelled", "cancelled", "succeeded"]
    # Each attempt starts at the step where the one before checkpointed and stopped.
    assert starts == [0, stops[0]["step"], stops[1]["step"]]
    assert 0 < stops[0]["step"] < stops[1]["step"] < steps
    logs = service.client.get(f"/api/v1/jobs/{job_id}/logs", params={"tail": 100_000}).text
    assert f"attempt 3 of job {job_id} starting" in logs


def test_second_service_on_same_data_dir_refused(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # The job runs on the stand-in worker until cancelled: a real one spent seconds of
    # TensorFlow's start-up and training on what only the service's lock decides.
    first = make_service(env=fake_worker_env(tmp_path))
    first.start()
    job = first.submit(job_spec(name="first"))
    first.wait_state(job["id"], "running")
    second = subprocess.run(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(free_port()),
         "--data-dir", str(first.data_dir), "--no-access-log"],
        cwd=ROOT, env=first.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert second.returncode != 0, second.stderr
    assert (
        f"Another Towerboard service is using the data dir {first.data_dir} (it holds "
        f"{first.data_dir / 'towerboard.lock'}); refusing to start a second one on it."
    ) in second.stderr
    # The first goes on serving, and supervising its job to the end.
    assert first.process is not None and first.process.poll() is None
    assert first.job(job["id"])["state"] == "running"
    assert first.client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 202
    assert first.wait_state(job["id"], "cancelled", "failed")["state"] == "cancelled"
    # Once the first has stopped, the data dir is free again.
    first.stop()
    third = make_service(data_dir=first.data_dir)
    third.start()
    assert third.job(job["id"])["state"] == "cancelled"


def test_bad_progress_of_one_job_does_not_stop_the_others(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    service = make_service(env={"TOWERBOARD_CPU_JOBS": "2", **fake_worker_env(tmp_path)})
    service.start()
    # A worker whose progress line the store cannot take (a step beyond SQLite's integers),
    # beside workers that finish at once.
    poison = service.submit(job_spec(name="poison"))
    service.wait_state(poison["id"], "running")
    quick = [service.submit(job_spec(name="quick")) for _ in range(2)]
    # They are reaped, and the second starts on the slot the first frees (scheduling).
    for job in quick:
        assert service.wait_state(job["id"], "succeeded", "failed")["state"] == "succeeded"
    assert service.job(poison["id"])["state"] == "running"
    # The error is logged once, not every tick.
    failure = f"Job {poison['id']}: reading its progress.jsonl failed"
    assert service.log.read_text().count(failure) == 1

    # The lines that could not be stored were not skipped: once the file can be stored,
    # they all are, from the same offset.
    progress = service.data_dir / "runs" / poison["id"] / "progress.jsonl"
    text = progress.read_text()
    big = str(2**70)
    assert big in text
    fixed = progress.with_name("fixed.jsonl")
    fixed.write_text(text.replace(big, "3".rjust(len(big))))  # same length: JSON whitespace
    os.replace(fixed, progress)
    service.wait_for(
        poison["id"], lambda job: (job["progress"] or {}).get("step") == 3, what="step 3"
    )
    series = service.client.get(f"/api/v1/jobs/{poison['id']}/metrics").json()["series"]
    assert [(point["step"], point["value"]) for point in series["loss"]] == [(1, 0.5), (3, 0.25)]
    assert f"Job {poison['id']}: reading its progress.jsonl works again" in service.log.read_text()


def test_worker_log_link_out_of_run_dir_not_read(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    service = make_service(env=fake_worker_env(tmp_path))
    (service.data_dir.parent / "outside.txt").write_text("a secret beside the data dir\n")
    service.start()
    # The worker swaps a link to that file in for its worker.log, then fails.
    job = service.submit(job_spec(name="leak"))
    failed = service.wait_state(job["id"], "failed", "succeeded")
    assert failed["state"] == "failed"
    assert failed["error"]["reason"] == "leak" and failed["error"]["exit_code"] == 1
    assert failed["error"]["log_tail"] == []


def test_restart_service_adopts_living_worker_then_requeues_dead_one(
    make_service: Callable[..., Service],
) -> None:
    service = make_service()
    service.start()
    first = service.submit(long_job(name="first"))
    second = service.submit(job_spec(name="second"))
    service.wait_checkpoint(first["id"])
    pid = worker_pid(service, first["id"])

    # 1. The service dies; its worker lives on and is adopted by the next service.
    service.kill()
    service.start()
    adopted = service.job(first["id"])
    assert adopted["state"] == "running" and adopted["attempts"] == 1
    assert worker_pid(service, first["id"]) == pid
    assert f"Job {first['id']}: adopted its running worker (pid {pid})" in service.log.read_text()
    assert service.job(second["id"])["state"] == "queued"
    step = adopted["progress"]["step"]
    service.wait_for(
        first["id"], lambda job: job["progress"]["step"] > step, what="progress while adopted"
    )

    # 2. Service and worker both die; the job is requeued and resumes from its checkpoint.
    service.wait_for(
        first["id"],
        lambda job: checkpoint_step(job) > 25,
        what="a later checkpoint",
    )
    service.kill()
    os.kill(pid, signal.SIGKILL)
    service.start()
    resumed = service.job(first["id"])
    assert f"Job {first['id']}: its worker ended while no service watched" in (
        service.log.read_text()
    )
    assert resumed["attempts"] == 2
    assert resumed["state"] in ("queued", "running")
    assert service.job(second["id"])["state"] == "queued"  # the older job goes first
    service.wait_for(
        first["id"],
        lambda job: (
            sum(1 for line in progress_lines(service, job["id"]) if line["event"] == "start") == 2
        ),
        what="the second attempt's start",
    )
    starts = [line for line in progress_lines(service, first["id"]) if line["event"] == "start"]
    assert starts[0]["step"] == 0
    # Resumed from a checkpoint (every 25 steps), not restarted. (Its progress line may be
    # missing: the worker can die between writing a checkpoint and reporting it.)
    assert starts[1]["step"] > 25 and starts[1]["step"] % 25 == 0
    assert worker_pid(service, first["id"]) != pid
    logs = service.client.get(f"/api/v1/jobs/{first['id']}/logs", params={"tail": 100_000}).text
    assert f"attempt 2 of job {first['id']} starting" in logs

    # 3. The queue goes on: cancel the first, and the second runs to the end.
    assert service.client.post(f"/api/v1/jobs/{first['id']}/cancel").status_code == 202
    assert service.wait_state(first["id"], "cancelled", "failed")["state"] == "cancelled"
    assert service.wait_state(second["id"], "succeeded", "failed")["state"] == "succeeded"


def test_restart_with_fewer_devices_still_shows_the_one_an_adopted_job_holds(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # Two jobs on two CPU slots; the service restarts with one. The job on the second slot
    # is adopted and runs on: /devices must still say it holds that slot (it counts in
    # /metrics' busy devices), and that the slot is no longer given out.
    env = {**stepping_worker_env(tmp_path), "TOWERBOARD_CPU_JOBS": "2"}
    service = make_service(env=env)
    service.start()
    first = service.submit(long_job(name="first"))["id"]
    second = service.submit(long_job(name="second"))["id"]
    service.wait_checkpoint(first)
    service.wait_checkpoint(second)
    service.kill()
    service.env["TOWERBOARD_CPU_JOBS"] = "1"
    service.start()

    devices = service.client.get("/api/v1/devices").json()["data"]
    assert devices == [
        {"id": "cpu:0", "kind": "cpu", "job_id": first, "job_name": "first", "exiting": False,
         "configured": True},
        {"id": "cpu:1", "kind": "cpu", "job_id": second, "job_name": "second", "exiting": False,
         "configured": False},
    ]  # fmt: skip
    third = service.submit(long_job(name="third"))["id"]
    service.client.post(f"/api/v1/jobs/{second}/cancel")
    assert service.wait_state(second, "cancelled", "failed")["state"] == "cancelled"
    service.wait_for(
        second,
        lambda _: len(service.client.get("/api/v1/devices").json()["data"]) == 1,
        what="the retired slot to go once its job's worker is gone",
    )
    assert service.job(third)["state"] == "queued"  # never given the retired slot


def test_restart_finds_a_worker_whose_pid_was_never_stored(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # A service that dies between starting a worker and storing its pid leaves a running
    # job with no pid. The next service must find that worker by its argv and adopt it, not
    # requeue the job and start a second worker on the same run dir. (The worker is the
    # stepping stand-in: what is checked is the service's, and the stand-in steps at once.)
    service, job_id = long_job_checkpointed(make_service, stepping_worker_env(tmp_path))
    pid = worker_pid(service, job_id)
    service.kill()
    with sqlite3.connect(service.data_dir / "towerboard.db") as conn:  # the crash window
        conn.execute("UPDATE jobs SET pid = NULL, pid_started = NULL WHERE id = ?", (job_id,))

    service.start()
    adopted = service.job(job_id)
    assert adopted["state"] == "running" and adopted["attempts"] == 1
    assert worker_pids(service, job_id) == [pid]
    step = adopted["progress"]["step"]
    service.wait_for(
        job_id, lambda job: job["progress"]["step"] > step, what="progress while adopted"
    )
    assert service.client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 202
    assert service.wait_state(job_id, "cancelled", "failed", "succeeded")["state"] == "cancelled"
    assert worker_pids(service, job_id) == []


def test_the_jobs_log_says_why_an_attempt_ended_and_the_job_ran_again(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # `towerboard logs ID` read on from the killed attempt's last line to the next one's
    # start: only the service's own log, which an API user may never see, said why.
    service, job_id = long_job_checkpointed(make_service, stepping_worker_env(tmp_path))
    os.kill(worker_pid(service, job_id), signal.SIGKILL)
    second = f"--- towerboard: attempt 2 of job {job_id} starting at"

    def log_lines() -> list[str]:
        return service.client.get(f"/api/v1/jobs/{job_id}/logs").text.splitlines()

    # The line goes in as the job is requeued, before the pass that starts attempt 2.
    service.wait_for(
        job_id, lambda _: any(line.startswith(second) for line in log_lines()), what="attempt 2"
    )
    lines = log_lines()
    starts = [i for i, line in enumerate(lines) if line.startswith("--- towerboard: attempt ")]
    assert len(starts) == 3, lines
    ended = lines[starts[1]]
    assert re.fullmatch(
        rf"--- towerboard: attempt 1 of job {job_id} ended at \S+ \S+: its worker was killed "
        r"by SIGKILL \(9\), most often the kernel's out-of-memory killer \(`dmesg` says so\); "
        r"queued again as attempt 2 to resume from its latest checkpoint ---",
        ended,
    ), ended
    assert lines[starts[2]].startswith(second)


def in_process(
    settings: Settings, store: JobStore, publish: Callable[[JobEvent], None] = lambda _: None
) -> Supervisor:
    """A supervisor in this process over a real store, as a service would make it."""
    return Supervisor(
        settings=settings, store=store, pool=DevicePool.from_settings(settings),
        publish=publish,
    )  # fmt: skip


def with_fake_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **settings: Any
) -> tuple[Settings, JobStore]:
    """Settings and a real store under `tmp_path`, whose workers are the harness's fake
    ones (FAKE_WORKER: a job's name says what its worker does)."""
    return with_workers(tmp_path, monkeypatch, fake_worker_env(tmp_path), **settings)


def with_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], **settings: Any
) -> tuple[Settings, JobStore]:
    """Settings and a real store under `tmp_path`, whose workers the worker settings `env`
    name (`worker_env`'s)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    resolved = Settings(data_dir=tmp_path / "data", **settings).resolved()
    return resolved, JobStore(resolved.db_path)


def created(store: JobStore, name: str) -> JobRecord:
    """A queued job named `name` (for a fake worker, what it does)."""
    return store.create(JobSpec.model_validate(job_spec(name=name)).model_dump(mode="json"))


def test_stop_signal_stops_starting_workers(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # A shutting-down service must start no worker: one started while the server drains
    # its connections would outlive it. The supervisor, in this process on a real store:
    # after stop_starting a queued job stays queued, while ended workers are still reaped.
    settings = Settings(data_dir=tmp_path / "data").resolved()
    store = JobStore(settings.db_path)

    job = store.create(JobSpec.model_validate(job_spec(name="waits")).model_dump(mode="json"))
    stopping = in_process(settings, store)
    stopping.stop_starting()
    stopping.tick()
    assert store.get(job.id).state.value == "queued"  # type: ignore[union-attr]
    assert processes_under(settings.data_dir) == []
    in_process(settings, store).tick()  # the same store and job, not shutting down: it starts
    assert store.get(job.id).state.value == "running"  # type: ignore[union-attr]
    for pid in processes_under(settings.data_dir):
        os.kill(pid, signal.SIGKILL)
    store.close()

    # And `towerboard serve` tells it so at the stop signal itself.
    service = make_service()
    service.start()
    service.stop()  # SIGTERM
    assert "no more workers will be started" in service.log.read_text()


def test_service_killed_before_a_resumed_jobs_worker_starts_runs_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A service killed after marking a resumed job running and before starting its worker
    # (which removes the attempt before's result.json) left that result.json beside a
    # running job with no worker: the next service read it as this attempt's and ended the
    # job at once with the old outcome, a resume to train longer "succeeded" untrained.
    settings = Settings(data_dir=tmp_path / "data").resolved()
    store = JobStore(settings.db_path)
    job = store.create(JobSpec.model_validate(job_spec(name="longer")).model_dump(mode="json"))
    run = settings.runs_dir / job.id
    run.mkdir(parents=True)
    (run / "result.json").write_text(json.dumps({"outcome": "succeeded", "message": "old"}))

    class Killed(BaseException):
        pass

    def killed(**_: Any) -> None:
        raise Killed

    # The kill, at that exact point (a window of milliseconds), stands in as spawn_worker
    # raising; the store, run directory and supervisors are real.
    monkeypatch.setattr("service.supervisor.spawn_worker", killed)
    with pytest.raises(Killed):
        in_process(settings, store).tick()
    assert store.get(job.id).state.value == "running"  # type: ignore[union-attr]
    in_process(settings, store).recover()
    after = store.get(job.id)
    assert after is not None
    assert (after.state.value, after.attempts, after.result) == ("queued", 2, None)
    store.close()


# What a worker wrote, its third line with a step too large for a SQLite integer: the store
# refuses that write (OverflowError) until the file is fixed, a failure of the real store's
# own that a test can lift.
_UNSTORABLE = str(2**70)
_PROGRESS = "".join(
    json.dumps(line) + "\n"
    for line in [
        {"event": "start", "step": 0, "total": 2},
        {"event": "progress", "step": 1, "total": 2, "loss": 0.5},
        {"event": "progress", "step": 2**70, "total": 2, "loss": 0.25},
        {"event": "end", "step": 2, "total": 2, "outcome": "succeeded", "phase": "done"},
    ]
)
_RESULT = json.dumps({"outcome": "succeeded", "message": "done"})


def _make_storable(progress: Path) -> None:
    """The unstorable step made 2, at the same length (JSON whitespace): the offsets hold."""
    fixed = progress.with_name("fixed.jsonl")
    fixed.write_text(progress.read_text().replace(_UNSTORABLE, "2".rjust(len(_UNSTORABLE))))
    os.replace(fixed, progress)


def _gone_worker_with_an_unstorable_line(settings: Settings, store: JobStore) -> JobRecord:
    """A running job whose worker ended while no service watched, leaving its result.json
    and a progress.jsonl whose third line the store cannot take."""
    job = store.create(JobSpec.model_validate(job_spec(name="gone")).model_dump(mode="json"))
    assert store.mark_running(job.id, devices=["cpu:0"])  # its worker never recorded: gone
    run = settings.runs_dir / job.id
    run.mkdir(parents=True)
    (run / "progress.jsonl").write_text(_PROGRESS)
    (run / "result.json").write_text(_RESULT)
    return job


def _running(store: JobStore, job_id: str) -> bool:
    job = store.get(job_id)
    assert job is not None
    return job.state is JobState.RUNNING and job.devices == ["cpu:0"]


def _settled(supervisor: Supervisor, store: JobStore, job_id: str) -> JobRecord:
    """The job once the supervisor's ticks have ended or requeued it."""
    for _ in range(20):
        supervisor.tick()
        job = store.get(job_id)
        assert job is not None
        if job.state is not JobState.RUNNING:
            return job
    raise AssertionError(f"job {job_id} still running after 20 ticks")


def _assert_every_line_stored(store: JobStore, job: JobRecord, progress: Path) -> None:
    assert (job.state, job.devices) == (JobState.SUCCEEDED, [])
    assert job.progress_offset == progress.stat().st_size
    assert (job.progress or {}).get("phase") == "done", "its end line was stored"
    loss = store.metrics(job.id, names=["loss"])
    assert [(point.step, point.value) for point in loss] == [(1, 0.5), (2, 0.25)]


def test_gone_workers_job_ends_only_once_its_last_lines_are_stored(tmp_path: Path) -> None:
    # A failed read or store write (a full disk, a store locked past its busy timeout) was
    # taken for "nothing new": the job ended from its result.json, the lines not yet stored
    # (here its last point and its end line) dropped for good.
    settings = Settings(data_dir=tmp_path / "data").resolved()
    store = JobStore(settings.db_path)
    job = _gone_worker_with_an_unstorable_line(settings, store)
    supervisor = in_process(settings, store)
    supervisor.recover()
    for _ in range(3):
        supervisor.tick()
    assert _running(store, job.id), "ended without its last lines"

    progress = settings.runs_dir / job.id / "progress.jsonl"
    _make_storable(progress)
    _assert_every_line_stored(store, _settled(supervisor, store, job.id), progress)
    store.close()


def test_gone_workers_job_ends_without_lines_the_store_refuses_past_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A line the store never takes held the job running, its devices and the queue behind
    # it, for good. Past SETTLE_WAIT_SECONDS (0 here, 60 s in the service) it ends without.
    settings = Settings(data_dir=tmp_path / "data").resolved()
    store = JobStore(settings.db_path)
    job = _gone_worker_with_an_unstorable_line(settings, store)
    supervisor = in_process(settings, store)
    supervisor.recover()
    supervisor.tick()
    assert _running(store, job.id), "ended at once, the wait not given"
    monkeypatch.setattr(supervisor_module, "SETTLE_WAIT_SECONDS", 0.0)
    ended = _settled(supervisor, store, job.id)
    assert (ended.state, ended.devices) == (JobState.SUCCEEDED, [])  # from its result.json
    # The part of the file that holds the line is stored in one write: it is lost whole.
    assert store.metrics(job.id, names=["loss"]) == []
    store.close()


@contextmanager
def write_locked(db_path: Path) -> Iterator[None]:
    """The store's file held in a write transaction by another connection (a backup tool,
    a sqlite3 shell): every write of the store fails with "database is locked"; its reads
    go on."""
    holder = sqlite3.connect(db_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_gone_workers_job_settles_after_the_store_failed_to_end_it(tmp_path: Path) -> None:
    # A store that could not finish the job (locked, a full disk) left it running, its
    # devices held, until the service restarted: the job had been dropped from
    # supervision before the finish was tried.
    settings = Settings(data_dir=tmp_path / "data").resolved()
    store = JobStore(settings.db_path)
    # The store waits 30 s for another connection's lock before it fails; here it fails at
    # once. The lock and the error are SQLite's own, through the store's own code.
    store._writer.execute("PRAGMA busy_timeout = 0")
    job = _gone_worker_with_an_unstorable_line(settings, store)
    progress = settings.runs_dir / job.id / "progress.jsonl"
    supervisor = in_process(settings, store)
    supervisor.recover()  # it stays running: its lines cannot be stored
    _make_storable(progress)
    for _ in range(20):  # until every line is stored and only the job's end is left
        supervisor.tick()
        assert _running(store, job.id)
        if store.get(job.id).progress_offset == progress.stat().st_size:  # type: ignore[union-attr]
            break
    with write_locked(settings.db_path):
        for _ in range(3):
            supervisor.tick()  # nothing left to read: each tick tries to end it, and fails
    assert _running(store, job.id)
    _assert_every_line_stored(store, _settled(supervisor, store, job.id), progress)
    store.close()


# A worker that writes _PROGRESS and its result.json, and exits once the test releases it
# (`release` in its run directory), 120 s at most.
_UNSTORABLE_WORKER = f"""\
import sys, time
from pathlib import Path

job_dir = Path(sys.argv[sys.argv.index("--job-dir") + 1])
(job_dir / "progress.jsonl").write_text({_PROGRESS!r})
(job_dir / "result.json").write_text({_RESULT!r})
until = time.time() + 120
while time.time() < until and not (job_dir / "release").exists():
    time.sleep(0.05)
"""


def _wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.05)


def test_watched_workers_job_ends_only_once_its_last_lines_are_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same of a worker the service watches: one that has said its result, or exited,
    # ended its job with its last lines unstored when their read or write failed.
    env = worker_env(tmp_path, "unstorable_worker", _UNSTORABLE_WORKER)
    settings, store = with_workers(tmp_path, monkeypatch, env)
    job = created(store, "told")
    run = settings.runs_dir / job.id
    supervisor = in_process(settings, store)
    try:
        supervisor.tick()  # starts its worker
        _wait_until((run / "result.json").exists, "result.json")
        supervisor.tick()
        assert _running(store, job.id), "ended at its result without its last lines"
        pid = store.get(job.id).pid  # type: ignore[union-attr]
        assert pid is not None
        (run / "release").touch()
        # Exited, and left for the supervisor to reap (WNOWAIT): a look at /proc was not
        # enough, as an exiting process drops its command line before it can be waited for.
        exited = os.WEXITED | os.WNOHANG | os.WNOWAIT
        _wait_until(lambda: os.waitid(os.P_PID, pid, exited) is not None, "exit")
        supervisor.tick()
        assert _running(store, job.id), "ended at its exit without its last lines"

        _make_storable(run / "progress.jsonl")
        done = _settled(supervisor, store, job.id)
        _assert_every_line_stored(store, done, run / "progress.jsonl")
        assert done.exiting is None
    finally:
        if run.is_dir():
            (run / "release").touch()
        kill_processes_under(run)
        store.close()


def test_stop_workers_on_exit_checkpoints_them_for_the_next_service(
    make_service: Callable[..., Service],
) -> None:
    # In a container the stop kills every process, so with TOWERBOARD_STOP_WORKERS_ON_EXIT
    # the service SIGTERMs its workers on the way out and waits while they checkpoint: the
    # next service resumes the job from the step it stopped at.
    service, job_id = long_job_checkpointed(
        make_service, {"TOWERBOARD_STOP_WORKERS_ON_EXIT": "true"}
    )
    # SIGTERM; it waits while the worker checkpoints and exits (TensorFlow's teardown,
    # at a low priority on a busy host, took up to 30 s).
    service.stop(timeout=120)
    assert service.process is not None and service.process.returncode is not None
    assert worker_pids(service, job_id) == [], "the worker outlived the service"
    (stopped,) = [line for line in progress_lines(service, job_id) if line["event"] == "end"]
    assert stopped["outcome"] == "cancelled"
    assert (
        service.data_dir / "runs" / job_id / "checkpoints" / f"ckpt-{stopped['step']}.index"
    ).exists()

    service.start()
    service.wait_for(
        job_id, lambda job: job["attempts"] == 2 and job["state"] == "running", what="the restart"
    )
    service.wait_for(
        job_id, lambda job: job["progress"]["step"] > stopped["step"], what="progress after it"
    )
    starts = [line["step"] for line in progress_lines(service, job_id) if line["event"] == "start"]
    assert starts == [0, stopped["step"]]
    assert service.client.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 202
    assert service.wait_state(job_id, "cancelled", "failed", "succeeded")["state"] == "cancelled"


def test_stop_workers_on_exit_logs_what_it_does(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    # With TOWERBOARD_STOP_WORKERS_ON_EXIT the stop said "running ones are left to the next
    # service" and then warned of "a SIGTERM nobody asked for" (now "that no cancel asked
    # for"): the service's own.
    env = {**fake_worker_env(tmp_path), "TOWERBOARD_STOP_WORKERS_ON_EXIT": "true"}
    service = make_service(env=env)
    service.start()
    job = service.submit(job_spec(name="sleepy"))  # the stand-in runs until SIGTERM, exits 3
    service.wait_reported(job["id"])  # it catches SIGTERM from then on
    service.stop()
    log = service.log.read_text()
    assert "running ones are left to the next service" not in log
    assert "no cancel asked for" not in log
    assert (
        "Shutting down: no more workers will be started; running ones are stopped at a "
        "checkpoint (TOWERBOARD_STOP_WORKERS_ON_EXIT), to resume on the next start"
    ) in log
    assert re.search(
        rf"INFO service\.supervisor: Job {job['id']}: its worker stopped after a checkpoint "
        r"as the service shut down; requeued as attempt 2 to resume from its "
        r"latest checkpoint",
        log,
    ), log


_START = {"event": "start", "step": 0, "total": 5, "phase": "starting"}
_END = {"event": "end", "step": 5, "total": 5, "outcome": "succeeded", "phase": "done"}


def _gone_worker(
    settings: Settings,
    store: JobStore,
    name: str,
    result: str,
    lines: tuple[dict[str, Any], ...] = (_START, _END),
) -> JobRecord:
    """A running job whose worker ended while no service watched, leaving `result` as its
    result.json, after its progress `lines` (the trainer's start and end lines)."""
    job = store.create(JobSpec.model_validate(job_spec(name=name)).model_dump(mode="json"))
    assert store.mark_running(job.id, devices=["cpu:0"])  # its worker never recorded: gone
    run = settings.runs_dir / job.id
    run.mkdir(parents=True)
    written = "".join(json.dumps({**line, "time": time.time()}) + "\n" for line in lines)
    (run / "progress.jsonl").write_text(written)
    (run / "result.json").write_text(result)
    return job


def test_a_gone_workers_result_json_between_its_start_and_end_is_not_its_result(
    tmp_path: Path,
) -> None:
    # A custom model's code runs in the run directory and may write a result.json as it
    # trains; a worker killed then, while no service ran, ended its job with that file.
    # One written before the start line is the trainer's: a set-up it refused.
    settings = Settings(data_dir=tmp_path / "data").resolved()
    store = JobStore(settings.db_path)
    trained = _gone_worker(settings, store, "notes", _RESULT, lines=(_START,))
    refused = json.dumps({"outcome": "invalid_spec", "message": "No such data.", "errors": []})
    unstarted = _gone_worker(settings, store, "refused", refused, lines=())
    in_process(settings, store).recover()
    requeued = store.get(trained.id)
    assert requeued is not None
    assert (requeued.state, requeued.result, requeued.attempts) == (JobState.QUEUED, None, 2)
    failed = store.get(unstarted.id)
    assert failed is not None and failed.state is JobState.FAILED
    assert failed.error is not None
    assert failed.error["reason"] == "The worker rejected the spec: No such data."
    store.close()


def test_a_gone_workers_result_after_its_stored_failed_end_line_ends_its_job(
    tmp_path: Path,
) -> None:
    # The service stored a failed run's end line (its phase `failed`, not `done`), then
    # stopped before the worker's result.json came. The next one reads that end as in:
    # the result.json is the trainer's, and the job fails with its reason, not run again.
    settings = Settings(data_dir=tmp_path / "data").resolved()
    store = JobStore(settings.db_path)
    end = {**_END, "outcome": "failed", "phase": END_PHASES[Outcome.FAILED]}
    result = json.dumps({"outcome": "failed", "message": "Loss is NaN at step 5."})
    job = _gone_worker(settings, store, "nan", result, lines=(_START, end))
    size = (settings.runs_dir / job.id / "progress.jsonl").stat().st_size
    stored = {"step": 5, "total": 5, "phase": end["phase"]}
    store.record_progress(job.id, offset=size, progress=stored, eval=None, points=[])
    in_process(settings, store).recover()
    failed = store.get(job.id)
    assert failed is not None and (failed.state, failed.attempts) == (JobState.FAILED, 1)
    assert failed.error is not None and failed.error["reason"] == "Loss is NaN at step 5."
    store.close()


def test_an_adopted_worker_killed_after_its_model_wrote_a_result_json_is_requeued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same file, found as an adopted worker (its exit status unknown) dies: the OOM
    # killer, say, as it trained. The job ended `succeeded` with the model's file.
    settings, store = with_fake_workers(tmp_path, monkeypatch)
    job = created(store, "waits")  # runs until stopped
    first = in_process(settings, store)
    try:
        deadline = time.monotonic() + 60
        while ((store.get(job.id) or job).progress or {}).get("phase") != "starting":
            first.tick()
            assert time.monotonic() < deadline, "the worker's start line never came"
            time.sleep(0.05)
        run = settings.runs_dir / job.id
        (run / "result.json").write_text(_RESULT)
        second = in_process(settings, store)  # the service restarted: it adopts the worker
        second.recover()
        pid = (store.get(job.id) or job).pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        while (now := store.get(job.id)) is not None and now.attempts == 1:
            second.tick()
            assert time.monotonic() < deadline, "the killed worker's job was never settled"
            time.sleep(0.05)
        assert now is not None
        assert (now.result, now.crashes, now.attempts) == (None, 1, 2), now
    finally:
        kill_processes_under(settings.data_dir)
        store.close()


def test_restart_after_a_gone_worker_left_a_result_json_that_is_no_object(
    tmp_path: Path,
) -> None:
    # A custom model runs in its worker with the run directory as its working directory,
    # so it can write result.json. A list there raised in `recover()` (`.get` on it), and
    # the service failed to start, every time; the job after it was never settled.
    settings = Settings(data_dir=tmp_path / "data", crash_retries=0).resolved()
    store = JobStore(settings.db_path)
    bad = _gone_worker(settings, store, "bad", "[]")
    good = _gone_worker(settings, store, "good", _RESULT)
    in_process(settings, store).recover()
    ended = store.get(bad.id)
    assert ended is not None
    assert (ended.state, ended.devices, ended.result) == (JobState.FAILED, [], None)
    assert ended.error is not None
    assert ended.error["reason"] == (
        "The worker ended with a result.json that is not a JSON object while the service "
        "was not its parent, so its exit status is unknown; it most likely crashed."
    )
    other = store.get(good.id)
    assert other is not None and other.state is JobState.SUCCEEDED
    store.close()


# A worker that writes a result.json that is valid JSON but no object, and exits 0.
_LIST_RESULT_WORKER = """\
import sys
from pathlib import Path

(Path(sys.argv[sys.argv.index("--job-dir") + 1]) / "result.json").write_text("[]")
"""


def _tick_until_ended(
    supervisor: Supervisor, store: JobStore, job_id: str, timeout: float = 60.0
) -> JobRecord:
    """The job once the supervisor's ticks have ended it (its worker has `timeout` s)."""
    deadline = time.monotonic() + timeout
    while True:
        supervisor.tick()
        job = store.get(job_id)
        assert job is not None
        if job.state.is_terminal:
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job.state} after {timeout} s"
        time.sleep(0.05)


def test_watched_worker_that_left_a_result_json_that_is_no_object_fails_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same of a worker the service watches: its end raised every pass, and the job
    # stayed running, its device held, for good.
    env = worker_env(tmp_path, "list_worker", _LIST_RESULT_WORKER)
    settings, store = with_workers(tmp_path, monkeypatch, env)
    job = created(store, "list")
    supervisor = in_process(settings, store)
    try:
        ended = _tick_until_ended(supervisor, store, job.id)
        assert (ended.state, ended.devices) == (JobState.FAILED, [])
        assert ended.error is not None
        assert ended.error["reason"] == (
            "The worker exited with code 0 but result.json is not a JSON object."
        )
    finally:
        kill_processes_under(settings.runs_dir / job.id)
        store.close()


def test_exiting_worker_whose_exit_the_store_refuses_holds_back_no_other_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Recording that an ended job's worker has exited ran first in each pass, outside any
    # guard: one the store refused stopped the whole pass (no progress, cancels, ends or
    # starts for any job), every pass, its traceback logged five times a second.
    caplog.set_level(logging.INFO, logger="service.supervisor")
    settings, store = with_fake_workers(tmp_path, monkeypatch, cpu_jobs=2)
    lingers, sleepy = created(store, "linger"), created(store, "sleepy")  # see FAKE_WORKER
    supervisor = in_process(settings, store)
    try:
        ended = _tick_until_ended(supervisor, store, lingers.id)  # starts both
        assert ended.state is JobState.SUCCEEDED and ended.exiting is not None
        wait_catching_sigterm(lambda: processes_under(settings.runs_dir / sleepy.id))

        # The fault is injected into the store (a full disk, say): its `exited` fails.
        def refused(job_id: str) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        exited = store.exited
        monkeypatch.setattr(store, "exited", refused)
        (settings.runs_dir / lingers.id / "release").touch()
        pid = ended.exiting["pid"]
        waited = os.WEXITED | os.WNOHANG | os.WNOWAIT  # left for the supervisor to reap
        _wait_until(lambda: os.waitid(os.P_PID, pid, waited) is not None, "its exit")

        assert store.request_cancel(sleepy.id)
        cancelled = _tick_until_ended(supervisor, store, sleepy.id)
        assert (cancelled.state, cancelled.devices) == (JobState.CANCELLED, [])
        for _ in range(5):
            supervisor.tick()
        held = store.get(lingers.id)
        assert held is not None and held.exiting is not None, "the store took it after all"
        failed = f"Job {lingers.id}: reaping its exiting worker failed"
        assert [r.getMessage() for r in caplog.records].count(
            f"{failed}; retrying each tick, logged again if it changes"
        ) == 1

        monkeypatch.setattr(store, "exited", exited)
        supervisor.tick()
        gone = store.get(lingers.id)
        assert gone is not None and gone.exiting is None
        assert f"Job {lingers.id}: reaping its exiting worker works again" in caplog.messages
    finally:
        for job in (lingers, sleepy):
            (settings.runs_dir / job.id / "release").touch()
            kill_processes_under(settings.runs_dir / job.id)
        store.close()


def test_restart_goes_on_past_a_job_whose_end_the_store_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each job's recovery ran outside any guard: one the store refused to end (a full
    # disk) raised out of `recover()`, and the service did not start, every time.
    settings = Settings(data_dir=tmp_path / "data").resolved()
    store = JobStore(settings.db_path)
    refused, settled = (_gone_worker(settings, store, name, _RESULT) for name in "ab")
    finish = store.finish

    # The fault is injected into the store: its finish of the one job fails.
    def full(job_id: str, *args: Any, **kwargs: Any) -> bool:
        if job_id == refused.id:
            raise sqlite3.OperationalError("database or disk is full")
        return finish(job_id, *args, **kwargs)

    monkeypatch.setattr(store, "finish", full)
    supervisor = in_process(settings, store)
    supervisor.recover()
    assert _running(store, refused.id), "its end was recorded after all"
    done = store.get(settled.id)
    assert done is not None and done.state is JobState.SUCCEEDED

    monkeypatch.setattr(store, "finish", finish)  # left to the ticks, which end it
    ended = _settled(supervisor, store, refused.id)
    assert (ended.state, ended.devices) == (JobState.SUCCEEDED, [])
    store.close()


def test_restart_goes_on_past_an_exited_worker_the_store_cannot_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same of an ended job's worker, exiting when the last service stopped and gone
    # since: the store refusing to record that stopped the service starting.
    settings = Settings(data_dir=tmp_path / "data").resolved()
    store = JobStore(settings.db_path)
    job = store.create(JobSpec.model_validate(job_spec(name="ended")).model_dump(mode="json"))
    assert store.mark_running(job.id, devices=["cpu:0"])
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    exiting = {"pid": int(gone.stdout), "pid_started": 1, "devices": ["cpu:0"]}
    assert store.finish(job.id, JobState.SUCCEEDED, result=None, error=None, exiting=exiting)
    exited = store.exited

    # The fault is injected into the store: its `exited` fails.
    def refused(job_id: str) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store, "exited", refused)
    events: list[JobEvent] = []
    supervisor = in_process(settings, store, events.append)
    supervisor.recover()
    assert store.get(job.id).exiting == exiting  # type: ignore[union-attr]
    # Held, as the store says, until it has the exit: a devices list that showed the
    # device free had a resume or delete of the job wait, then refused.
    assert supervisor.held_after_their_jobs() == {"cpu:0": job.id}
    assert events == []

    monkeypatch.setattr(store, "exited", exited)
    supervisor.tick()
    assert store.get(job.id).exiting is None  # type: ignore[union-attr]
    assert supervisor.held_after_their_jobs() == {}
    assert [(e.event, e.data) for e in events] == [("exited", {"id": job.id, "devices": ["cpu:0"]})]
    store.close()


def test_a_job_whose_end_the_store_refuses_sends_no_exited_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker that wrote its result and lingers, its job's end refused by the store: its
    # exit was taken for an ended job's, and `exited` went out (on the job's own stream
    # too) while the job was still running, before its `succeeded`.
    settings, store = with_fake_workers(tmp_path, monkeypatch)
    job = created(store, "linger")
    run = settings.runs_dir / job.id
    events: list[JobEvent] = []
    supervisor = in_process(settings, store, events.append)
    finish = store.finish

    # The fault is injected into the store: its `finish` fails.
    def refused(*args: Any, **kwargs: Any) -> bool:
        raise sqlite3.OperationalError("database or disk is full")

    try:
        monkeypatch.setattr(store, "finish", refused)

        def ticked_to_a_result() -> bool:
            supervisor.tick()
            return (run / "result.json").exists()

        _wait_until(ticked_to_a_result, "a result")
        supervisor.tick()  # its end, refused
        assert supervisor.held_after_their_jobs() == {}, "a running job's devices, held over"
        (run / "release").touch()
        _wait_until(lambda: not processes_under(run), "its exit")
        supervisor.tick()
        assert [e.event for e in events if e.event == "exited"] == []

        monkeypatch.setattr(store, "finish", finish)
        supervisor.tick()
        ended = store.get(job.id)
        assert ended is not None and ended.state is JobState.SUCCEEDED
        states = [e.data["state"] for e in events if e.event == "state"]
        assert states[-1] == "succeeded" and "exited" not in [e.event for e in events]
    finally:
        (run / "release").touch()
        kill_processes_under(run)
        store.close()


def test_worker_whose_pid_the_store_refused_is_watched_and_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its worker started, then the store refused its pid (locked past its busy timeout):
    # the job was running in the store and nothing watched the process. Its progress was
    # never read, a cancel never reached it and its end was never recorded: its device
    # stayed held until the service restarted.
    settings, store = with_fake_workers(tmp_path, monkeypatch)
    # The store waits 30 s for another connection's lock before it fails; here it fails at
    # once. The lock and the error are SQLite's own, through the store's own code.
    store._writer.execute("PRAGMA busy_timeout = 0")
    job = created(store, "sleepy")
    run = settings.runs_dir / job.id
    spawn = supervisor_module.spawn_worker
    supervisor = in_process(settings, store)
    try:
        with ExitStack() as locked:

            def spawn_then_lock(**kwargs: Any) -> Any:
                """The worker started, and the store's file locked by another connection
                (a backup tool, a sqlite3 shell) at once, before its pid is stored."""
                worker = spawn(**kwargs)
                locked.enter_context(write_locked(settings.db_path))
                return worker

            monkeypatch.setattr(supervisor_module, "spawn_worker", spawn_then_lock)
            supervisor.tick()  # starts its worker; the store refuses its pid
            assert _running(store, job.id)
            assert store.get(job.id).pid is None  # type: ignore[union-attr]
            wait_catching_sigterm(lambda: processes_under(run))
            (pid,) = processes_under(run)
            progress = run / "progress.jsonl"
            _wait_until(lambda: progress.exists() and progress.read_text().endswith("\n"),
                        "its first line")  # fmt: skip
            supervisor.tick()  # the store still refuses its pid, and its first line
        supervisor.tick()
        watched = store.get(job.id)
        assert watched is not None
        assert watched.pid == pid, "its pid was not stored once the store took it"
        assert (watched.progress or {}).get("phase") == "starting", "its progress not read"

        assert store.request_cancel(job.id)
        ended = _tick_until_ended(supervisor, store, job.id)
        assert (ended.state, ended.devices) == (JobState.CANCELLED, [])
        # Ended at its result.json: the process may still be exiting for a moment.
        _wait_until(lambda: processes_under(run) == [], "its exit")
    finally:
        kill_processes_under(run)
        store.close()


def test_job_marked_running_whose_worker_never_started_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store failed to read a job back after marking it running, before its worker
    # started: the job sat running with no worker and nothing watching it, its device
    # held, until the service restarted.
    settings, store = with_fake_workers(tmp_path, monkeypatch)
    job = created(store, "quick")
    get, mark_running = store.get, store.mark_running
    marked: list[str] = []

    # The fault is injected into the store: its first read after a job is marked running
    # fails, as on a disk I/O error.
    def marks(job_id: str, **kwargs: Any) -> bool:
        marked.append(job_id)
        return mark_running(job_id, **kwargs)

    def reads(job_id: str) -> JobRecord | None:
        if marked:
            marked.clear()
            raise sqlite3.OperationalError("disk I/O error")
        return get(job_id)

    monkeypatch.setattr(store, "mark_running", marks)
    monkeypatch.setattr(store, "get", reads)
    supervisor = in_process(settings, store)
    try:
        supervisor.tick()  # marks it running; reading it back fails: no worker
        assert _running(store, job.id)
        assert processes_under(settings.runs_dir / job.id) == []
        monkeypatch.setattr(store, "mark_running", mark_running)
        supervisor.tick()  # nothing watches it: requeued as gone, and started again
        again = store.get(job.id)
        assert again is not None and again.attempts == 2 and again.pid is not None
        ended = _tick_until_ended(supervisor, store, job.id)
        assert (ended.state, ended.devices, ended.attempts) == (JobState.SUCCEEDED, [], 2)
    finally:
        kill_processes_under(settings.runs_dir / job.id)
        store.close()


def test_a_job_whose_old_result_cannot_be_removed_fails_and_holds_back_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A start removes the attempt before's result.json before it marks the job running.
    # A job's code runs in its run directory and can leave a folder of that name: the
    # removal raised out of the pass, and the job stayed queued for good, at the head of a
    # strict queue, so no job behind it ever started.
    settings, store = with_fake_workers(tmp_path, monkeypatch)
    stuck, behind = created(store, "quick"), created(store, "quick")
    (settings.runs_dir / stuck.id / "result.json").mkdir(parents=True)
    supervisor = in_process(settings, store)
    try:
        ended = _tick_until_ended(supervisor, store, behind.id)
        assert (ended.state, ended.devices) == (JobState.SUCCEEDED, [])
        failed = store.get(stuck.id)
        assert failed is not None and (failed.state, failed.devices) == (JobState.FAILED, [])
        assert failed.error == {
            "reason": "Could not start the worker: [Errno 21] Is a directory: "
            f"'{settings.runs_dir / stuck.id / 'result.json'}'"
        }
    finally:
        kill_processes_under(settings.runs_dir)
        store.close()


def test_a_worker_start_that_raises_anything_fails_the_job_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only an OSError of the worker's start failed its job. Anything else left the job
    # running with no worker; the next pass requeued it as one whose worker was gone and
    # started it again, every pass, its attempts counting up, and the job behind it (one
    # slot) never started. Nothing known raises anything else there (the start's inputs
    # are all checked before it): the fault is injected, standing in for what a later
    # change or another platform may raise; the store and the job behind are real.
    settings, store = with_fake_workers(tmp_path, monkeypatch)
    broken, behind = created(store, "quick"), created(store, "quick")
    spawn = supervisor_module.spawn_worker

    def refused(**kwargs: Any) -> Any:
        if kwargs["job_id"] == broken.id:
            raise ValueError("embedded null byte")
        return spawn(**kwargs)

    monkeypatch.setattr(supervisor_module, "spawn_worker", refused)
    supervisor = in_process(settings, store)
    try:
        ended = _tick_until_ended(supervisor, store, behind.id)
        assert ended.state is JobState.SUCCEEDED
        failed = store.get(broken.id)
        assert failed is not None
        assert (failed.state, failed.devices, failed.attempts) == (JobState.FAILED, [], 1)
        assert failed.error == {
            "reason": "Could not start the worker: ValueError: embedded null byte"
        }
    finally:
        kill_processes_under(settings.runs_dir)
        store.close()


def test_a_store_that_fails_every_tick_is_logged_once_until_it_works_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A tick reads the store's running jobs outside its parts' guards. A store that
    # refused that read (a locked or failing database) logged a full traceback each tick,
    # five times a second, for as long as it did.
    caplog.set_level(logging.INFO, logger="service.supervisor")
    settings = Settings(data_dir=tmp_path / "data", poll_seconds=0.02).resolved()
    store = JobStore(settings.db_path)
    ticks = 0
    running = store.running

    # The fault is injected into the store: its read of the running jobs fails.
    def refused() -> list[JobRecord]:
        nonlocal ticks
        ticks += 1
        raise sqlite3.OperationalError("disk I/O error")

    supervisor = in_process(settings, store)
    try:
        supervisor.start()  # its recovery reads the store before the fault is injected
        monkeypatch.setattr(store, "running", refused)
        _wait_until(lambda: ticks >= 10, "ten ticks")
        failed = "A supervisor tick failed; retrying each tick, logged again if it changes"
        assert caplog.messages.count(failed) == 1
        monkeypatch.setattr(store, "running", running)
        _wait_until(lambda: "A supervisor tick works again" in caplog.messages, "a good tick")
    finally:
        supervisor.stop()
        store.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
def test_a_cancel_asked_for_as_the_supervisor_requeues_the_job_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: signal.Signals
) -> None:
    # A worker stopped by a SIGTERM nobody sent through the API, or killed (the OOM
    # killer), is requeued, judged by the job as the pass read it: no cancel asked for. A
    # cancel that came between that read and the requeue (answered 202, "the job ends
    # soon") was lost: the job went back in the queue, its cancel request cleared as it
    # started again, and trained on. The cancel is injected at that point (a window of
    # milliseconds, often the moment a user cancels a job that keeps dying); the store,
    # the supervisor and the worker are real.
    settings, store = with_fake_workers(tmp_path, monkeypatch)
    job = created(store, "sleepy")  # see FAKE_WORKER: runs until SIGTERM, then exits 3
    supervisor = in_process(settings, store)
    requeue = store.requeue

    def cancelled_meanwhile(job_id: str, **kwargs: Any) -> bool:
        assert store.request_cancel(job_id)  # the cancel route, on another thread
        return requeue(job_id, **kwargs)

    try:
        supervisor.tick()  # starts it
        wait_catching_sigterm(lambda: processes_under(settings.runs_dir / job.id))
        pid = worker_pid_of(settings, job.id)
        os.kill(pid, signum)
        waited = os.WEXITED | os.WNOHANG | os.WNOWAIT  # left for the supervisor to reap
        _wait_until(lambda: os.waitid(os.P_PID, pid, waited) is not None, "its exit")
        monkeypatch.setattr(store, "requeue", cancelled_meanwhile)
        supervisor.tick()
        monkeypatch.setattr(store, "requeue", requeue)
        supervisor.tick()  # a requeued job would start again here
        ended = store.get(job.id)
        assert ended is not None
        assert (ended.state, ended.attempts) == (JobState.CANCELLED, 1), ended
        assert processes_under(settings.runs_dir / job.id) == []
    finally:
        kill_processes_under(settings.runs_dir / job.id)
        store.close()


def worker_pid_of(settings: Settings, job_id: str) -> int:
    pids = processes_under(settings.runs_dir / job_id)
    assert len(pids) == 1, f"expected one worker process for job {job_id}, found {pids}"
    return pids[0]
