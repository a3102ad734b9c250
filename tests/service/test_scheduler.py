"""Who runs next, and on which devices."""

from __future__ import annotations

from pathlib import Path

from service.devices import DevicePool
from service.scheduler import never_fit, next_placements
from service.settings import Settings
from service.store import JobRecord, JobStore


def _jobs(tmp_path: Path, towers: list[int]) -> list[JobRecord]:
    store = JobStore(tmp_path / "jobs.db")
    for n in towers:
        store.create({"name": "j", "priority": 0, "towers": n})
    return store.queued()


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
    pool = DevicePool.from_settings(Settings(gpus=[0, 1]))
    fits, too_big = _jobs(tmp_path, [2, 3])
    assert never_fit([fits, too_big], pool) == [too_big]
