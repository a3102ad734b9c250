"""Finding jobs by name: `GET /api/v1/jobs?name=` and `towerboard status --name`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from service.store import JobState, JobStore
from tests.service.harness import Service, fake_worker_env, job_spec
from tests.service.test_client import towerboard


def test_store_page_by_name_any_case_with_wildcards_taken_literally(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.db")
    names = ["mnist-CNN-2towers", "mnist_mlp", "cifar-cnn", "mnist%done", "a\\b"]
    ids = {name: store.create({"name": name, "priority": 0}).id for name in names}

    def named(text: str, **kw: object) -> list[str]:
        page, count = store.page(name=text, **kw)  # type: ignore[arg-type]
        assert count == len(page)
        return sorted(job.name for job in page)

    assert named("cnn") == ["cifar-cnn", "mnist-CNN-2towers"]
    assert named("MNIST") == ["mnist%done", "mnist-CNN-2towers", "mnist_mlp"]
    assert named("_") == ["mnist_mlp"]  # not LIKE's any-one-character
    assert named("%") == ["mnist%done"]  # not LIKE's anything
    assert named("\\") == ["a\\b"]
    assert named("nothing") == []
    # SQLite's LIKE ends a pattern at a NUL: "\0" listed every job, "cnn\0" every name
    # ending "cnn". No name holds one.
    assert named("\x00") == [] and named("cnn\x00") == [] and named("cnn\x00x") == []
    store.cancel_queued(ids["cifar-cnn"])
    assert named("cnn", states=[JobState.CANCELLED]) == ["cifar-cnn"]
    # Paging counts every match, and pages through them newest first.
    first, count = store.page(name="mnist", limit=2)
    rest, _ = store.page(name="mnist", limit=2, before_seq=first[-1].seq)
    assert count == 3 and [job.name for job in first + rest] == [
        "mnist%done", "mnist_mlp", "mnist-CNN-2towers"
    ]  # fmt: skip


@pytest.fixture
def service(make_service: Callable[..., Service], tmp_path: Path) -> Iterator[Service]:
    service = make_service(env={"TOWERBOARD_CPU_JOBS": "1", **fake_worker_env(tmp_path)})
    service.start()
    yield service


def test_list_jobs_by_name_over_the_api_and_the_cli(service: Service) -> None:
    # Stand-ins that wait to be cancelled: named jobs that stay queued or running.
    found = [service.submit(job_spec(name=f"resnet-sweep-{i}"))["id"] for i in range(3)]
    service.submit(job_spec(name="mlp-baseline"))

    response = service.client.get("/api/v1/jobs", params={"name": "SWEEP", "limit": 2})

    assert response.status_code == 200, response.text
    page = response.json()
    assert page["count"] == 3 and [job["id"] for job in page["data"]] == found[:0:-1]
    later = service.client.get(
        "/api/v1/jobs", params={"name": "SWEEP", "cursor": page["next_cursor"]}
    ).json()
    assert [job["id"] for job in later["data"]] == found[:1] and later["next_cursor"] is None
    too_long = service.client.get("/api/v1/jobs", params={"name": "x" * 201})
    assert too_long.status_code == 422
    assert too_long.json()["errors"][0]["field"] == "query.name"

    listed = towerboard("status", "--name", "sweep", url=service.base_url)
    assert listed.returncode == 0, listed.stderr
    assert sorted(line.split()[0] for line in listed.stdout.splitlines()[1:]) == sorted(found)
    none = towerboard("status", "--name", "vgg", "--state", "failed", url=service.base_url)
    assert none.returncode == 0 and none.stdout == "no jobs failed named like 'vgg'\n"
