"""Who runs next, and on which devices."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from service.devices import DevicePool
from service.scheduler import head_waits_for, next_placements
from service.settings import Settings
from service.store import JobState, JobStore, QueuedJob
from service.supervisor import Supervisor
from tests.service.harness import (
    Service,
    fake_worker_env,
    job_spec,
    kill_processes_under,
    queue_in_bulk,
    stepping_worker_env,
)
from trainer.spec import JobSpec


def _jobs(tmp_path: Path, towers: list[int]) -> list[QueuedJob]:
    store = JobStore(tmp_path / "jobs.db")
    for n in towers:
        store.create({"name": "j", "priority": 0, "towers": n})
    return store.queue()


def test_place_gpu_jobs_whole_devices_never_shared(tmp_path: Path) -> None:
    pool = DevicePool.from_settings(Settings(gpus=[0, 1, 2, 3]))
    first, second, third = _jobs(tmp_path, [2, 1, 2])
    placements = next_placements([first, second, third], pool, held=["gpu:1"])
    assert [(p.job.id, p.devices) for p in placements] == [
        (first.id, ["gpu:0", "gpu:2"]),
        (second.id, ["gpu:3"]),
    ]
    assert pool.cuda_visible_devices(placements[0].devices) == "0,2"


def test_place_head_of_queue_holds_back_the_rest(tmp_path: Path) -> None:
    pool = DevicePool.from_settings(Settings(gpus=[0, 1]))
    big, small = _jobs(tmp_path, [2, 1])
    assert next_placements([big, small], pool, held=["gpu:0"]) == []


def test_place_cpu_jobs_one_slot_each(tmp_path: Path) -> None:
    pool = DevicePool.from_settings(Settings(gpus=[], cpu_jobs=2, cpu_max_towers=4))
    jobs = _jobs(tmp_path, [4, 1, 2])
    placements = next_placements(jobs, pool, held=[])
    assert [p.devices for p in placements] == [["cpu:0"], ["cpu:1"]]
    assert pool.cuda_visible_devices(["cpu:0"]) == ""
    assert pool.max_towers == 4


def test_never_fit_more_towers_than_gpus(tmp_path: Path) -> None:
    # What the supervisor fails as never able to start: read from the queue's index.
    pool = DevicePool.from_settings(Settings(gpus=[0, 1]))
    store = JobStore(tmp_path / "jobs.db")
    for n in (2, 3, 1, 4):
        store.create({"name": "j", "priority": 0, "towers": n})
    assert pool.most_towers == 2
    assert [job.towers for job in store.queue(towers_over=pool.most_towers)] == [3, 4]


def test_what_the_head_of_the_queue_waits_for() -> None:
    gpus = DevicePool.from_settings(Settings(gpus=[0, 1]))
    assert head_waits_for(2, gpus, free=1) == "2 GPUs; 1 free"
    assert head_waits_for(1, gpus, free=0) == "1 GPU; 0 free"
    # Free enough: the supervisor's next pass starts it (five a second).
    assert (
        head_waits_for(1, gpus, free=2)
        == "nothing: 1 GPU needed, 2 free; it starts at the next pass"
    )
    assert head_waits_for(3, gpus, free=2) == (
        "3 GPUs; the service has 2, so it never starts here (the scheduler fails it)"
    )
    # A CPU-only host: a job takes one slot, whatever its towers.
    cpu = DevicePool.from_settings(Settings(gpus=[], cpu_jobs=2, cpu_max_towers=4))
    assert head_waits_for(4, cpu, free=0) == "1 job slot; 0 free"


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_long_queue_leaves_an_idle_service_idle(tmp_path: Path) -> None:
    # 3,000 jobs queued behind one that holds both GPUs: nothing can start, and the
    # supervisor's passes (five a second) decoded every queued job each time: 0.6 s a
    # pass, a CPU kept busy by a service that had nothing to do.
    data = tmp_path / "data"
    store = JobStore(data / "towerboard.db")
    spec = JobSpec.model_validate(job_spec(towers=2)).model_dump(mode="json")
    store.create(spec)  # the head, which starts
    store.close()
    queue_in_bulk(data / "towerboard.db", spec, 3000)
    env = {"TOWERBOARD_GPUS": "0,1", "TOWERBOARD_POLL_SECONDS": "0.2"}
    service = Service(data, {**env, **stepping_worker_env(tmp_path)})
    service.start()
    try:
        running = {"state": "running"}
        deadline = time.monotonic() + 30
        while service.client.get("/api/v1/jobs", params=running).json()["count"] != 1:
            assert time.monotonic() < deadline, "the head job did not start"
            time.sleep(0.1)
        assert service.process is not None
        before = _cpu_seconds(service.process.pid)
        time.sleep(4)
        used = _cpu_seconds(service.process.pid) - before
        assert used < 1.0, f"the idle service used {used:.2f} s of CPU in 4 s"
    finally:
        service.close()


def test_a_queued_job_that_can_never_fit_fails_and_the_next_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Queued when the host had more GPUs (its settings changed since): at the head of a
    # strict queue it would hold back every job behind it for good.
    for name, value in fake_worker_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    settings = Settings(data_dir=tmp_path / "data", gpus=[0, 1]).resolved()
    store = JobStore(settings.db_path)
    spec = JobSpec.model_validate(job_spec(name="waits")).model_dump(mode="json")
    too_big = store.create({**spec, "towers": 3, "priority": 5})
    fits = store.create({**spec, "towers": 2})
    supervisor = Supervisor(
        settings=settings, store=store, pool=DevicePool.from_settings(settings),
        publish=lambda _: None,
    )  # fmt: skip
    try:
        supervisor.tick()
        failed = store.get(too_big.id)
        assert failed is not None and failed.state is JobState.FAILED
        assert failed.error == {
            "reason": "The job needs 3 devices but this service has 2: 2 GPUs "
            "(TOWERBOARD_GPUS=0,1)."
        }
        started = store.get(fits.id)
        assert started is not None and started.state is JobState.RUNNING
        assert started.devices == ["gpu:0", "gpu:1"]
    finally:
        kill_processes_under(settings.data_dir)
        store.close()
